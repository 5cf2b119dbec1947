"""A run's servers admit only the run: a network namespace of its own where the platform allows it, and every
server of ours admitting only this user's sockets.

Every server a run starts listens on 127.0.0.1 (Temporal, the fault proxies, the scripted model, the effects
service, Restate, PostgreSQL). Two layers keep other local users out:

1. **A private network** (``enter_private_network``): a command that runs chaos moves itself, before it starts
   anything, into a new network namespace with only its loopback up, so every server and worker it starts lives
   there; another user's ``127.0.0.1:PORT`` is their own loopback, not the run's. As root: ``unshare(CLONE_NEWNET)``;
   as another user: a user namespace that maps only that user, with a network namespace inside it. Not possible
   (no permission, threads already running) or not wanted (an external cluster, Docker workers, ``--network
   shared``): the run's network is ``shared`` and run.json says why.
2. **Admission by owner** (``admitted``): the harness's own servers (the scripted model, the effects service, the
   fault proxies, the Web UI's bridge) serve a TCP connection only if the connecting socket belongs to this user
   or root (``/proc/net/tcp``'s owner of the peer socket); others are closed before they are read.

In a shared network, Temporal's and Restate's ports stay open to local users (servers with no authentication
in the form the harness runs them); PostgreSQL has its password. ``--ui`` in a private network is reached through
a bridge in the shared one, admitting only this user.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import os
import socket
import signal
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
PRIVATE, SHARED = "private", "shared"
#: what stays reachable by other local users when the network is shared
OPEN_IN_SHARED = ("Temporal's dev server (gRPC, HTTP, metrics)", "Restate's ingress and admin ports")


@dataclass(frozen=True)
class Isolation:
    """Where this process's servers listen: ``private`` (a network namespace of its own) or ``shared`` (the
    machine's loopback), and why it is shared."""

    network: str = SHARED
    why: str | None = "this process did not ask for a private network"

    def record(self) -> dict[str, Any]:
        """run.json's ``network``."""
        return {"isolation": self.network, "why": self.why,
                "open_to_local_users": [] if self.network == PRIVATE else list(OPEN_IN_SHARED)}

    def line(self) -> str:
        """One line for the terminal."""
        if self.network == PRIVATE:
            return "network: private (the run's servers are in a network namespace of their own: no other local " \
                   "user can reach them)"
        return (f"network: shared ({self.why}): the model server, effects service and fault proxies admit only "
                f"your uid; {' and '.join(OPEN_IN_SHARED)} are open to local users while the run lasts")


_current = Isolation()
_ui_bridge: _Bridge | None = None


def current() -> Isolation:
    return _current


def enter_private_network(why_not: str | None = None, ui: bool = False) -> Isolation:
    """Move this process into a network namespace of its own, with loopback up; everything it starts from now on
    is there. ``why_not``: a reason to stay in the shared network (an external cluster, Docker workers...).
    ``ui``: the Temporal Web UI of the run will be watched from outside: a bridge, bound here before moving, stays
    in the shared network (``ui_port``). Must run before any thread starts (a thread stays where it was)."""
    global _current, _ui_bridge
    if _current.network == PRIVATE:
        return _current
    if why_not:
        _current = Isolation(SHARED, why_not)
        return _current
    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 0
    if threads != 1:
        _current = Isolation(SHARED, f"this process already runs {threads} threads, which would stay outside")
        return _current
    bridge = _Bridge() if ui else None
    try:
        _unshare_network()
        _loopback_up()
    except OSError as exc:
        if bridge is not None:
            bridge.close()
        _current = Isolation(SHARED, f"no network namespace here ({exc.strerror or exc})")
        return _current
    if bridge is not None:
        bridge.start()
        _ui_bridge = bridge
    _current = Isolation(PRIVATE, None)
    log.info("entered a private network namespace")
    return _current


def ui_port() -> int:
    """The port the run's Web UI must listen on, inside, for the bridge outside to reach it (0: any)."""
    return _ui_bridge.port if _ui_bridge is not None else 0


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _unshare_network() -> None:
    libc = _libc()
    if os.geteuid() == 0:
        if libc.unshare(CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        return
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    # Only this user is mapped, to itself: files it makes are its own, outside as inside.
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))


# -- admission -------------------------------------------------------------------------------------------------------


def _hex_address(host: str, port: int, family: int) -> str:
    """An address as /proc/net/tcp{,6} writes it: the address's bytes as native-order 32-bit words, the port."""
    packed = socket.inet_pton(family, host)
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def peer_uid(sock: socket.socket, net: str = "/proc/net") -> int | None:
    """The uid owning the other end of ``sock``, a TCP connection over this machine's loopback (None: not found,
    e.g. the peer has closed, or is not on this host). ``net``: the /proc view of the socket's network namespace
    (default: this process's)."""
    try:
        peer, local = sock.getpeername(), sock.getsockname()
    except OSError:
        return None
    family = sock.family
    table = f"{net}/tcp6" if family == socket.AF_INET6 else f"{net}/tcp"
    try:
        want_local = _hex_address(peer[0], peer[1], family)
        want_remote = _hex_address(local[0], local[1], family)
        with open(table) as f:
            next(f, None)
            for line in f:
                parts = line.split()
                if len(parts) > 7 and parts[1] == want_local and parts[2] == want_remote:
                    return int(parts[7])
    except (OSError, ValueError):
        return None
    return None


def admitted(sock: socket.socket, net: str = "/proc/net") -> bool:
    """Whether a connection accepted by one of our servers comes from this user (or root)."""
    uid = peer_uid(sock, net)
    if uid in (os.geteuid(), 0):
        return True
    log.warning("refused a connection from uid %s (only uid %d and root are admitted)", uid, os.geteuid())
    return False


# -- the Web UI's bridge -----------------------------------------------------------------------------------------------


class _Bridge:
    """A listening socket in the shared network, bound before this process moves, forwarding each connection
    from this user to the same port on the private network's loopback. Who connects is read from the shared
    network's table, seen through an anchor: a child left there, which dies with this process."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        # Started directly, not through testbed.processes.spawn: its thread would stay in the shared network.
        self.anchor = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"],
                                       preexec_fn=_die_with_us, stdin=subprocess.DEVNULL, start_new_session=True)

    def start(self) -> None:
        threading.Thread(target=self._accept, name="ui-bridge", daemon=True).start()

    def close(self) -> None:
        self.sock.close()
        self.anchor.kill()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if not admitted(client, f"/proc/{self.anchor.pid}/net"):
                client.close()
                continue
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _die_with_us() -> None:
    _libc().prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError as exc:
        if exc.errno not in (errno.EBADF, errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN):
            log.debug("ui bridge: %s", exc)
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
