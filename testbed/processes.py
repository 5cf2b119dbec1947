"""Child processes that cannot outlive us.

Every process the harness starts goes through ``spawn``: it gets its own
session (so a terminal's Ctrl-C reaches us first and we stop children in
order) and a parent-death signal (so even if we are SIGKILLed, the kernel
kills it). ``stop`` terminates by the pid we started, never by name.
Where the kernel's signal alone is not enough: PostgreSQL (``setpriv`` clears it
and sets it again: ``testbed.postgres``), and dockerd and the containers
(a supervisor and a reaper that outlive us on purpose: ``testbed.dockerd``,
``ensure_reaper``), and what a worker leaves running on purpose (its browser:
``harness.owner``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import functools
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

from harness.exit import before_exit
from harness.owner import owner_value

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> None:
    """Ask the kernel for ``sig`` when our parent dies; if ``parent`` (its pid) already died, act on it now."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if parent is not None and os.getppid() != parent:  # it died before the prctl: no signal will come
            os.kill(os.getpid(), sig)


class _Spawner:
    """One long-lived thread that starts every child.

    The kernel's parent-death signal fires when the parent *thread* exits, not
    the process: a child started from a short-lived thread (a thread pool's, an
    ``asyncio.to_thread``'s) would be killed when that thread ends. Starting
    all children from this one daemon thread ties them to the process.
    """

    def __init__(self) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], subprocess.Popen], concurrent.futures.Future]] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="child-spawner", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            start, future = self._jobs.get()
            try:
                future.set_result(start())
            except BaseException as exc:  # handed to the caller
                future.set_exception(exc)

    def submit(self, start: Callable[[], subprocess.Popen]) -> subprocess.Popen:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((start, future))
        return future.result()


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def spawn(args: Sequence[str], *, pdeathsig: int = signal.SIGKILL, **kwargs: object) -> subprocess.Popen:
    """Start a child in its own session that the kernel signals (``pdeathsig``) if this process dies.

    A child that changes its user ids (``setpriv``, ``su``) loses the signal and must set it again itself
    (``setpriv --pdeathsig``); one that must stop cleanly (``dockerd``: its containers) takes SIGTERM."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = _Spawner()
    preexec = functools.partial(die_with_parent, os.getpid(), pdeathsig)
    return _spawner.submit(lambda: subprocess.Popen(  # type: ignore[call-overload]
        list(args), start_new_session=True, preexec_fn=preexec, **kwargs))


_reaper: subprocess.Popen | None = None  # started with this process's first container or worker process
_reaper_lock = threading.Lock()  # workers start side by side, from threads


def ensure_reaper() -> None:
    """Start this process's container reaper once (``python -m testbed.containers reap``): it removes the containers
    labelled with this process's owner (``harness.owner``) when this process is gone, however it ended: the
    workers' containers and the browser containers its worker processes start."""
    global _reaper
    with _reaper_lock:
        if _reaper is not None and _reaper.poll() is None:
            return
        # No parent-death signal: the reaper must outlive us; our end of its stdin closing is its signal.
        _reaper = spawn(python_module_command("testbed.containers", "reap", owner_value()), pdeathsig=0,
                        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        before_exit(functools.partial(_reap_now, _reaper))


def _reap_now(reaper: subprocess.Popen, wait_s: float = 15.0) -> None:
    """On a normal exit the reaper's work is done before we are: nothing we started outlives us (a SIGKILL leaves
    it to finish alone)."""
    with contextlib.suppress(OSError):
        reaper.stdin.close()  # type: ignore[union-attr]
    try:
        reaper.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        log.warning("the container reaper (pid %s) is still removing containers after %.0f s; leaving it to finish",
                    reaper.pid, wait_s)


def stop(proc: subprocess.Popen, *, grace_s: float = 10.0) -> int | None:
    """SIGTERM the child we started, wait, then SIGKILL it. Idempotent."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning("pid %s ignored SIGTERM for %.0f s; killing it", proc.pid, grace_s)
            proc.kill()
            proc.wait()
        except ProcessLookupError:
            pass
    return proc.returncode


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def python_module_command(module: str, *args: str) -> list[str]:
    """Run a module of this project with the current interpreter."""
    return [sys.executable, "-m", module, *args]

