"""Warm workers: the reference worker forked from a parent that has already imported it (LiteLLM included).

A reference worker started from scratch spends ~3 s of CPU importing (LiteLLM alone ~2.5 s); a chaos run starts
two per scenario and one per restart, the migration fuzz three, on a 2-core machine. The fork server imports the
worker's code once, with nothing else running (no thread, no Temporal runtime, no event loop), and then forks a
worker per request: the child sets its own environment, working directory and output, and runs ``dah worker``
from its argument list, connecting to Temporal itself. It is a new process with its own pid, killed, paused and
stopped by that pid like any other; nothing of the parent's state but imported modules carries over.

Used by ``WorkerProcess`` for the harness's own interpreter running ``-m testbed worker`` (the reference worker, and
with ``--durability NAME`` another engine's, run as ``python -m testbed`` runs it):
a target's own interpreter or command always starts the ordinary way. ``DAH_FORKSERVER=0`` turns it off. A
source file of the worker's packages changed since the server started: a new server forks the next workers (a
worker must never mix the code it was forked with and the files its workflow sandbox reads); the old one stays
until exit, with the workers it forked. In ``ps`` a forked worker
shows the server's command line (``python -m testbed.forkserver``): fork does not exec.

One server can serve the harness processes its owner starts (``export``; the test suite does): it listens on a
Unix socket in a directory of the user's alone (``SOCKET_ENV`` names it, for the children), admits only the same
uid, and refuses a client whose source stamp or interpreter differs (that one starts its own server). A worker
forked for a client joins the client's network namespace (``dah-chaos run`` moves into a private network,
``testbed.isolation``) and dies when the client's connection closes (the client exited, or was SIGKILLed): as if
the client had forked it. A client in a user namespace of its own (a private network, not as root) is refused.
A ``dah-chaos run`` started this way saves its own server's ~3.5 s of CPU.

The protocol, one JSON object per line: requests on the server's stdin ``{"argv", "env", "cwd", "log"}``, replies
on its stdout ``{"ready"}`` once, then ``{"pid"}`` or ``{"error"}`` per request, and ``{"exit": pid, "code"}``
whenever a child ends (a signal's death is ``-signal``, as ``subprocess`` reports it). A socket client sends
``{"hello": {"stamp", "python"}}`` first and gets ``{"ready"}`` or ``{"error"}``; then the same, for its own
children only.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness import SAFE_PATH, own_module
from testbed.processes import FORKSERVER_SOCKET_ENV

log = logging.getLogger(__name__)

#: what a request's argv must start with (after the interpreter) for the fork server to run it
MODULE = (SAFE_PATH, "-m", "testbed", "worker")
#: what that command runs (testbed/__main__.py): named, not imported here, as cli sits above testbed
DAH = "cli.dah"
READY_TIMEOUT_S = 120.0
#: where a harness process's fork server listens, for the harness processes it starts (set by ``shared``)
SOCKET_ENV = FORKSERVER_SOCKET_ENV  # spawn never passes it on
#: the server's own: where to listen, and the source stamp its clients must match (popped at its start)
LISTEN_ENV, STAMP_ENV = "DAH_FORKSERVER_LISTEN", "DAH_FORKSERVER_STAMP"
MAX_REQUEST_BYTES = 1 << 20


# -- the server (its own process) -----------------------------------------------------------------------------------


def private_pycache() -> Path | None:
    """A bytecode cache of this user's own, outside the source tree (None: none can be had safely: a directory
    another user made first could hold planted bytecode, which would run)."""
    from harness.private import user_temp_dir

    return user_temp_dir("dah-pycache")


def _serve() -> int:
    listen_path, stamp = os.environ.pop(LISTEN_ENV, None), os.environ.pop(STAMP_ENV, None)
    os.environ.pop(SOCKET_ENV, None)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if sys.dont_write_bytecode:
        # With PYTHONDONTWRITEBYTECODE there is no bytecode cache, and the workflow sandbox imports the workflow's
        # module afresh for every workflow it runs: without a cache that is a compile from source each time (~22% of
        # a worker's CPU in the migration fuzz). The workers keep one of their own, outside the source tree.
        cache = private_pycache()
        if cache is not None:
            sys.pycache_prefix = str(cache)
            sys.dont_write_bytecode = False
    importlib.import_module(DAH)  # dah, and its worker command (testbed.worker_main) with what it imports
    import testbed.worker_main  # noqa: F401
    import agent.worker  # noqa: F401
    import temporalio.worker  # noqa: F401
    from agent import llm

    llm.preload()  # LiteLLM and what it imports lazily on the first call with tools
    agent.worker.source_build_id()  # memoised: the forked workers share it
    if threading.active_count() != 1:  # forking a process with threads would copy their locks mid-use
        print(json.dumps({"error": f"{threading.active_count()} threads after import; cannot fork safely"}),
              flush=True)
        return 1
    listening = _listen(listen_path) if listen_path else None
    owner = _Owner()
    owner.send({"ready": True, "pid": os.getpid(), **({"listen": listen_path} if listening else {})})
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin, selectors.EVENT_READ, owner)
    if listening is not None:
        sel.register(listening, selectors.EVENT_READ, "listen")
    children: dict[int, _Owner] = {}  # pid -> whom it was forked for

    def drop(client: _Client) -> None:  # a process that asked for workers is gone: so are they
        sel.unregister(client.sock)
        client.sock.close()
        for pid, whose in children.items():
            if whose is client:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    try:
        while True:
            for pid in list(children):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    children.pop(pid).send({"exit": pid, "code": os.waitstatus_to_exitcode(status)})
            for key, _ in sel.select(timeout=0.05):
                if key.data == "listen":
                    _accept(listening, sel)  # type: ignore[arg-type]
                    continue
                if key.data is owner:
                    lines = [sys.stdin.readline()]
                    if not lines[0]:  # the harness closed the pipe (or died): the children go with us
                        for pid in children:
                            with contextlib.suppress(ProcessLookupError):
                                os.kill(pid, signal.SIGKILL)
                        return 0
                else:
                    lines = key.data.read()
                    if lines is None:
                        drop(key.data)
                        continue
                for line in lines:
                    whom: _Owner = key.data
                    if isinstance(whom, _Client) and not whom.greeted:
                        if not whom.greet(line, stamp):
                            drop(whom)
                            break
                        continue
                    network = None
                    try:
                        req = json.loads(line)
                        fds = [k.fileobj.fileno() for k in sel.get_map().values() if k.fileobj is not sys.stdin]
                        network = _network_of(whom.pid) if isinstance(whom, _Client) else None
                        pid = _fork(req["argv"], req["env"], req["cwd"], req["log"], close=fds, network=network)
                    except Exception as exc:  # a bad request, or fork failed: said, and the server goes on
                        whom.send({"error": f"{type(exc).__name__}: {exc}"})
                        continue
                    finally:
                        if network is not None:
                            os.close(network)
                    children[pid] = whom
                    whom.send({"pid": pid})
    finally:
        if listening is not None:
            with contextlib.suppress(OSError):
                os.unlink(listen_path)  # type: ignore[arg-type]


class _Owner:
    """Whom the server answers: the harness that started it, on its stdout."""

    def send(self, msg: dict) -> None:
        print(json.dumps(msg), file=sys.stdout, flush=True)


class _Client(_Owner):
    """Another process of the harness's user, connected to the server's socket (``SOCKET_ENV``): a ``dah-chaos
    run`` the harness started. Its first line is a hello naming its source stamp and interpreter; a client whose
    code differs is refused (it starts a server of its own). The workers forked for it die when it disconnects."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock, self.pid, self.buf, self.greeted = sock, pid, b"", False

    def send(self, msg: dict) -> None:
        with contextlib.suppress(OSError):  # gone: its read end says so
            self.sock.sendall(json.dumps(msg).encode() + b"\n")

    def read(self) -> list[str] | None:
        """The complete lines received (None: it disconnected)."""
        try:
            data = self.sock.recv(65536)
        except OSError:
            return None
        if not data or len(self.buf) > MAX_REQUEST_BYTES:
            return None
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        return [line.decode(errors="replace") for line in lines]

    def greet(self, line: str, stamp: str | None) -> bool:
        try:
            hello = json.loads(line)["hello"]
            same = hello["python"] == sys.executable and stamp is not None and hello["stamp"] == stamp
        except (ValueError, KeyError, TypeError):
            same = False
        why = None if same else "this fork server runs other code (its source stamp or interpreter differs)"
        if why is None and _namespace(self.pid, "user") != _namespace(os.getpid(), "user"):
            # Not root, in a private network: a user namespace of its own, which a forked worker would have to join
            # before its network (untried): it forks its own workers, from a server of its own, as before.
            why = "the client runs in a user namespace of its own: it starts its own fork server"
        if why is None:
            self.greeted = True
            self.send({"ready": True, "pid": os.getpid()})
        else:
            self.send({"error": why})
        return why is None


def _listen(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock.bind(path)  # in a directory of the user's alone (``harness.private``)
    os.chmod(path, 0o600)
    sock.listen(16)
    return sock


def _accept(listening: socket.socket, sel: selectors.BaseSelector) -> None:
    """A new client, if it runs as this user (the socket's directory admits no one else; checked again here)."""
    try:
        sock, _ = listening.accept()
    except OSError:
        return
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    if uid != os.geteuid():
        sock.close()
        return
    sock.settimeout(10.0)  # a client that stops reading cannot hold the server for long
    sel.register(sock, selectors.EVENT_READ, _Client(sock, pid))


def _namespace(pid: int, kind: str) -> tuple[int, int] | None:
    """The identity of a process's namespace of ``kind`` (None: it cannot be read, e.g. the process is gone)."""
    try:
        st = os.stat(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _network_of(pid: int) -> int | None:
    """The network namespace of a client (``pid``), opened, if it differs from the server's: a ``dah-chaos run``
    moves into a network of its own (``testbed.isolation``), and the workers forked for it must run there, beside
    the servers it started. (A client in a user namespace of its own was refused at its hello.)"""
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    theirs = os.fstat(fd)
    if (theirs.st_dev, theirs.st_ino) == _namespace(os.getpid(), "net"):
        os.close(fd)
        return None
    return fd


def _join_network(fd: int) -> None:
    """In a forked child (one thread): enter the client's network namespace (``_network_of``)."""
    import ctypes

    from testbed.isolation import CLONE_NEWNET

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot join the harness's network namespace: {os.strerror(err)}")


def _fork(argv: list[str], env: dict[str, str], cwd: str | None, log_path: str, close: Sequence[int] = (),
          network: int | None = None) -> int:
    if list(argv[1:len(MODULE) + 1]) != list(MODULE):
        raise ValueError(f"not a reference worker command: {argv[:len(MODULE) + 1]}")
    sys.stdout.flush()
    sys.stderr.flush()
    out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    server = os.getpid()
    pid = os.fork()
    if pid:
        os.close(out)
        return pid
    # the child: never returns
    code = 1
    try:
        from testbed.processes import die_with_parent

        for fd in close:  # the server's socket and its clients': a worker holding one would keep it open
            with contextlib.suppress(OSError):
                os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(devnull)
        os.close(out)
        if network is not None:
            _join_network(network)
        os.setsid()
        die_with_parent(server)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        if cwd:
            os.chdir(cwd)
        sys.argv = [argv[0], *argv[len(MODULE):]]  # as ``python -m testbed worker ...`` has it
        from testbed.engines import engine_worker

        args = list(argv[len(MODULE):])
        code = engine_worker(args)  # another engine's worker (--durability NAME), as ``python -m testbed`` runs it
        if code is None:
            code = importlib.import_module(DAH).main(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - the child's last words go to its log
        import traceback

        traceback.print_exc()
    finally:
        try:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


# -- the harness's side ---------------------------------------------------------------------------------------------


class ForkServerError(RuntimeError):
    pass


class ForkedProcess:
    """A worker the fork server started: the ``subprocess.Popen`` surface ``WorkerProcess`` and ``stop`` use.

    Signals go to its pid only while the server has not reported it ended (a pid is never signalled after it
    could have been reused)."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server, self.pid = server, pid
        self.args = ["<forked worker>"]

    @property
    def returncode(self) -> int | None:
        return self.server.exit_code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.server.wait_for_news(0.05)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


#: the packages a worker's code comes from: a fork server older than any of their files is replaced
SOURCE_PACKAGES = ("agent", "testbed", "harness", "chaos", "cli")
ROOT = Path(__file__).resolve().parent.parent


def source_stamp() -> float:
    """The newest modification time among the worker's own source files (a few hundred stats, ~1 ms)."""
    newest = 0.0
    for package in SOURCE_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            try:
                newest = max(newest, path.stat().st_mtime)
            except OSError:
                pass
    return newest


class ForkServer:
    """The harness's handle on one fork server: a process it started (and stops at exit), or, with ``connect``,
    the socket of one another harness process started and shares (``SOCKET_ENV``)."""

    def __init__(self, connect: str | None = None, listen: str | None = None) -> None:
        self.stamp = source_stamp()  # a worker forked from code older than its files would mix two versions
        self.connect = connect
        self.listen = listen  # where a server started here takes clients (None: a new path, if one can be had)
        self.pid: int | None = None
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._rfile: Any = None
        self._wfile: Any = None
        self._lock = threading.Lock()  # one request at a time
        self._news = threading.Condition()
        self._exits: dict[int, int] = {}
        self._replies: list[dict] = []
        self._reader: threading.Thread | None = None
        self._dead = False

    def start(self) -> ForkServer:
        if self.connect:
            self._open_connection(self.connect)
        else:
            from testbed.processes import spawn

            listen = self.listen or _socket_path()
            env = {**os.environ, LISTEN_ENV: listen, STAMP_ENV: repr(self.stamp)} if listen else None
            self._proc = spawn(own_module("testbed.forkserver"), stdin=subprocess.PIPE, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
            self._rfile, self._wfile = self._proc.stdout, self._proc.stdin
        self._reader = threading.Thread(target=self._read, name="forkserver-reader", daemon=True)
        self._reader.start()
        if self.connect:
            self._write({"hello": {"stamp": repr(self.stamp), "python": sys.executable}})
        ready = self._reply(READY_TIMEOUT_S)
        if not ready.get("ready"):
            self.close()
            raise ForkServerError(f"the fork server did not start: {ready.get('error', ready)}")
        self.listen = ready.get("listen") if not self.connect else None
        self.pid = int(ready["pid"])  # the server's (another process's child, when connected)
        return self

    def _open_connection(self, path: str) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5.0)
        try:
            sock.connect(path)
        except OSError as exc:
            sock.close()
            raise ForkServerError(f"no fork server at {path} ({exc.strerror or exc})") from None
        sock.settimeout(None)
        self._sock = sock
        self._rfile = sock.makefile("r", encoding="utf-8", newline="\n")
        self._wfile = sock.makefile("w", encoding="utf-8", newline="\n")

    def _write(self, msg: dict) -> None:
        try:
            self._wfile.write(json.dumps(msg) + "\n")
            self._wfile.flush()
        except (OSError, ValueError) as exc:  # the server (or its socket) is gone
            raise ForkServerError(f"the fork server is gone ({exc})") from None

    def _read(self) -> None:
        try:
            for line in self._rfile:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                with self._news:
                    if "exit" in msg:
                        self._exits[int(msg["exit"])] = int(msg["code"])
                    else:
                        self._replies.append(msg)
                    self._news.notify_all()
        except (OSError, ValueError):  # the connection closed under the reader (close)
            pass
        with self._news:  # the server is gone: so are its children (their parent-death signal), or ours on it
            self._replies.append({"error": "the fork server exited"})
            self._dead = True
            self._news.notify_all()

    def _reply(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        with self._news:
            while not self._replies:
                left = deadline - time.monotonic()
                if left <= 0:
                    return {"error": f"no answer from the fork server within {timeout_s:g} s"}
                self._news.wait(left)
            return self._replies.pop(0)

    def wait_for_news(self, timeout_s: float) -> None:
        with self._news:
            self._news.wait(timeout_s)

    def exit_code(self, pid: int) -> int | None:
        with self._news:
            if pid in self._exits:
                return self._exits[pid]
            if self._dead:
                return -signal.SIGKILL  # died with the server (or with our connection to it)
            return None

    @property
    def alive(self) -> bool:
        if self._sock is not None:
            with self._news:
                return not self._dead
        return self._proc is not None and self._proc.poll() is None

    def fork(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, log_path: Path) -> ForkedProcess:
        with self._lock:
            if not self.alive or self._wfile is None:
                raise ForkServerError("the fork server is not running")
            self._write({"argv": list(argv), "env": dict(env), "cwd": cwd, "log": str(log_path)})
            reply = self._reply(30.0)
        if "pid" not in reply:
            raise ForkServerError(f"the fork server could not start the worker: {reply.get('error', reply)}")
        return ForkedProcess(self, int(reply["pid"]))

    def close(self) -> None:
        if self._sock is not None:  # the server kills the workers it forked for us, and goes on serving others
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            return
        if self._proc is None:
            return
        from testbed.processes import stop

        try:
            if self._proc.stdin is not None:
                self._proc.stdin.close()  # it kills its children and exits
        except OSError:
            pass
        stop(self._proc, grace_s=5.0)


def _socket_path() -> str | None:
    """A new socket path for a server started here, in a directory of this user's alone; sockets left there by
    servers that died without removing theirs (SIGKILL) go first. None: no such directory, or a path too long."""
    import secrets

    from harness.private import user_temp_dir

    folder = user_temp_dir("dah-forkserver")
    if folder is None:
        return None
    for old in folder.glob("*.sock"):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(old))
        except ConnectionRefusedError:  # nobody listens: its server died
            with contextlib.suppress(OSError):
                old.unlink()
        except OSError:
            pass
        finally:
            probe.close()
    path = str(folder / f"{os.getpid()}-{secrets.token_hex(4)}.sock")
    return path if len(path.encode()) < 100 else None  # sun_path holds 108 bytes


_server: ForkServer | None = None
_retired: list[ForkServer] = []  # replaced servers: their workers run on (closing one kills them), until exit
_server_lock = threading.Lock()


def enabled() -> bool:
    from agent.env_options import option

    return option("DAH_FORKSERVER") == "1" and hasattr(os, "fork") and sys.platform.startswith("linux")


def can_fork(argv: Sequence[str]) -> bool:
    """Whether this command is the reference worker (of any engine: ``--durability NAME`` runs that engine's, as
    ``python -m testbed`` does) on the harness's own interpreter: what the server forks."""
    return (enabled() and len(argv) > len(MODULE) + 1 and argv[0] == sys.executable
            and tuple(argv[1:len(MODULE) + 1]) == MODULE)


def shared() -> ForkServer:
    """The process's fork server, started on first use (its import takes a few seconds, once). If another harness
    process exported its own (``export``: ``SOCKET_ENV`` names its socket) and runs the same code, this process's
    workers are forked there instead, and no import is paid here."""
    global _server, _exported_started
    with _server_lock:
        if _server is not None and _server.alive and source_stamp() != _server.stamp:
            log.info("the worker's source changed since the fork server started; starting a new one")
            _retired.append(_server)  # not closed: that would kill the workers it forked, which are still running
            _server = None
        if _server is None or not _server.alive:
            _server, path, listen = None, os.environ.get(SOCKET_ENV), None
            if path and path == _exported and not _exported_started:
                _exported_started, listen = True, path  # the server export() promised: this is it
            elif path:
                try:
                    _server = ForkServer(connect=path).start()
                except ForkServerError as exc:
                    log.info("not forking workers from the harness's shared fork server (%s); starting one", exc)
            if _server is None:
                _server = ForkServer(listen=listen).start()
            import atexit

            atexit.register(_server.close)
        return _server


_exported: str | None = None  # the socket export() named in SOCKET_ENV
_exported_started = False


def export() -> None:
    """Let the harness processes this one starts fork their reference workers from this process's fork server
    (``SOCKET_ENV`` names its socket), which starts now in the background: each skips the seconds of import a
    server of its own costs (~3.5 s of CPU), and its workers die when it exits, as if it had forked them. One
    started before the server listens, or running other code, starts its own. Call it from the main thread (it
    sets an environment variable); nothing happens if fork servers are off or one is already exported."""
    global _exported
    if not enabled() or _exported or os.environ.get(SOCKET_ENV):
        return
    path = _socket_path()
    if path is None:
        return
    _exported = os.environ[SOCKET_ENV] = path
    start_soon()


def start_soon() -> None:
    """Start the process's fork server in the background (``shared`` then waits for it, if it is not ready yet): a
    caller that will fork workers starts it before its first cluster, so the imports overlap that start-up."""
    def start() -> None:
        try:
            shared()
        except Exception as exc:  # noqa: BLE001 - the first worker to need it starts it again, and says why
            log.warning("the fork server did not start in the background: %s", exc)

    if enabled():
        threading.Thread(target=start, name="forkserver-start", daemon=True).start()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    raise SystemExit(_serve())
