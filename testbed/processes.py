"""Child processes that cannot outlive us.

Every process the harness starts goes through ``spawn``: it gets its own
session (so a terminal's Ctrl-C reaches us first and we stop children in
order) and a parent-death signal (so even if we are SIGKILLed, the kernel
kills it). ``stop`` terminates by the pid we started, never by name.
Where the kernel's signal alone is not enough: PostgreSQL (``setpriv`` clears it
and sets it again: ``testbed.engines.dbos.postgres``), and dockerd and the containers
(a supervisor and a reaper that outlive us on purpose: ``testbed.dockerd``,
``ensure_reaper``), and what a worker leaves running on purpose (its browser:
``harness.owner``).

``ServerProcess`` is the one lifecycle of everything we start and own (the Temporal, Restate and PostgreSQL servers,
worker processes): start, wait until it answers, stop, kill, ``with``.
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
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from harness import own_module
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


#: where the harness's fork server takes its own commands (``testbed.forkserver.export``): never passed on to what
#: ``spawn`` starts (named here, not imported: the fork server uses this module)
FORKSERVER_SOCKET_ENV = "DAH_FORKSERVER_SOCKET"


def spawn(args: Sequence[str], *, pdeathsig: int = signal.SIGKILL, **kwargs: object) -> subprocess.Popen:
    """Start a child in its own session that the kernel signals (``pdeathsig``) if this process dies.

    A child that changes its user ids (``setpriv``, ``su``) loses the signal and must set it again itself
    (``setpriv --pdeathsig``); one that must stop cleanly (``dockerd``: its containers) takes SIGTERM."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = _Spawner()
    preexec = functools.partial(die_with_parent, os.getpid(), pdeathsig)
    if kwargs.get("env") is None and FORKSERVER_SOCKET_ENV in os.environ:  # the harness's own commands' only
        kwargs["env"] = {k: v for k, v in os.environ.items() if k != FORKSERVER_SOCKET_ENV}
    return _spawner.submit(lambda: subprocess.Popen(  # type: ignore[call-overload]
        list(args), start_new_session=True, preexec_fn=preexec, **kwargs))


_reaper: subprocess.Popen | None = None  # started with this process's first container or worker process
_reaper_lock = threading.Lock()  # workers start side by side, from threads


def ensure_reaper() -> None:
    """Start this process's container reaper once (``python -m testbed.containers reap``): it removes the containers
    labelled with this process's owner (``harness.owner``) when this process is gone, however it ended: the
    workers' containers and the browser containers its worker processes start; and the temporary directories
    this process made for itself (``harness.owner.owned_tempdir``)."""
    global _reaper
    with _reaper_lock:
        if _reaper is not None and _reaper.poll() is None:
            return
        # No parent-death signal: the reaper must outlive us; our end of its stdin closing is its signal.
        _reaper = spawn(own_module("testbed.containers", "reap", owner_value()), pdeathsig=0,
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



class ServerProcess:
    """A process we start and own (a server, a worker): started by ``spawn``, ready once it answers, stopped by the
    pid we started, and a context manager (``with`` and ``async with``) that stops it on any exit.

    A subclass gives what differs: ``argv()`` (its command line), ``prepare()`` (files and ports before a start),
    ``ready()`` (does it answer yet?), ``log_path()`` (where its output goes; None: a temporary file), its ``name``
    and ``error`` class for the two start-up errors (``start_exited``, ``start_timed_out``: one line naming what
    failed and the log, then the log's tail) and ``awaited()`` (what the time-out says it waited for). ``start``
    returns at once if it is running; a start that fails stops what it started and raises. ``stop``/``kill`` forget
    the process (``pid`` is None after) unless the subclass keeps it (``_ended``).
    """

    _proc: Any = None  # the subprocess.Popen (or testbed.forkserver.ForkedProcess) of this start
    _log: IO[bytes] | None = None
    _log_start: int = 0
    #: what errors and logs call the process, and the class of its start-up errors
    name: str = "process"
    error: type[Exception] = RuntimeError
    startup_timeout_s: float = 60.0
    #: seconds between two readiness probes
    ready_interval_s: float = 0.1

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    # -- what a subclass gives --------------------------------------------------------------------------------------

    def argv(self) -> list[str]:
        """The command line of the next start."""
        raise NotImplementedError

    def prepare(self) -> None:
        """Before each start: ports, directories, configuration files."""

    def ready(self) -> bool:
        """Does the process answer yet (asked every ``ready_interval_s`` until the start-up deadline)?"""
        raise NotImplementedError

    def log_path(self) -> Path | None:
        return None

    def awaited(self) -> str:
        """What start-up waits for, as its time-out error says it (``name`` did not answer ...)."""
        return ""

    def describe(self) -> str:
        """What ``start`` logs once the process answers."""
        return self.name

    def start_exited(self, returncode: int) -> Exception:
        path = self.log_path()
        return self.error(f"{self.name} exited with code {returncode} during start-up"
                          + (f" (log {path})" if path else "") + f":\n{self.log_since_start()[-2000:]}")

    def start_timed_out(self, timeout_s: float) -> Exception:
        path = self.log_path()
        return self.error(f"{self.name} did not answer {self.awaited()} within {timeout_s:g} s"
                          + (f" (log {path})" if path else ""))

    # -- the lifecycle ----------------------------------------------------------------------------------------------

    def start(self) -> Any:
        """Start the process and return (self) once it answers; at once if it is running."""
        if self.alive:
            return self
        self.prepare()
        started = time.monotonic()
        self.launch(self.argv())
        self.wait_until_ready(self.startup_timeout_s)
        log.info("%s ready in %.1f s (pid %s)", self.describe(), time.monotonic() - started, self.pid)
        return self

    def launch(self, argv: Sequence[str], **kwargs: Any) -> None:
        """Spawn ``argv`` with its output appended to ``log_path()`` (a file, never a pipe: nobody drains a pipe,
        and a full one would block the process; readable: a failed start is explained from it)."""
        path = self.log_path()
        self._log = open(path, "a+b") if path else tempfile.TemporaryFile()
        self._log_start = self._log.seek(0, os.SEEK_END)
        self._proc = spawn(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **kwargs)

    def log_since_start(self) -> str:
        """What the process wrote since this start."""
        if self._log is None or self._log.closed:
            return ""
        self._log.flush()
        self._log.seek(self._log_start)
        return self._log.read().decode(errors="replace")

    def wait_until_ready(self, timeout_s: float, ready: Callable[[], bool] | None = None,
                         exited: Callable[[int], Exception] | None = None,
                         timed_out: Callable[[float], Exception] | None = None,
                         interval_s: float | None = None) -> None:
        """Return once ``ready()`` (default: ``self.ready``) is true; if the process exits first, or the deadline
        passes, stop it and raise ``exited(returncode)`` or ``timed_out(timeout_s)`` (default: the start errors)."""
        ready, exited = ready or self.ready, exited or self.start_exited
        timed_out = timed_out or self.start_timed_out
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if ready():
                    return
                if self._proc is not None and self._proc.poll() is not None:
                    error = exited(self._proc.returncode)
                    break
                time.sleep(self.ready_interval_s if interval_s is None else interval_s)
            else:
                error = timed_out(timeout_s)
        except BaseException:
            self.stop()
            raise
        self.stop()
        raise error

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process we started (SIGCONT first: a stopped process cannot handle it), then SIGKILL it
        after ``grace_s``. Idempotent."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                if self._proc.poll() is None:
                    self._proc.send_signal(signal.SIGCONT)
            stop(self._proc, grace_s=grace_s)
            self._ended()

    def kill(self) -> None:
        """SIGKILL: a crash, mid-whatever; nothing of the process runs any more."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._ended()

    def _ended(self) -> None:
        """After a stop or a kill: forget the process and close its log."""
        self._proc = None
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Any:
        import asyncio

        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        import asyncio

        await asyncio.to_thread(self.stop)


# -- Ctrl-C of a command (dah)

INTERRUPT_GRACE_S = 30.0


async def with_interrupt_watchdog(coro: Any) -> Any:
    """Ctrl-C cancels the command and its clean-up stops what it started; if that clean-up hangs, a
    watchdog dumps every thread's stack (to find out why), kills this process's children and exits 130."""
    previous = signal.getsignal(signal.SIGINT)  # asyncio.run's handler: cancel the main task
    if callable(previous):
        def on_sigint(signum: int, frame: Any) -> None:
            threading.Thread(target=_interrupt_watchdog, name="interrupt-watchdog", daemon=True).start()
            previous(signum, frame)

        signal.signal(signal.SIGINT, on_sigint)
    return await coro


def _interrupt_watchdog() -> None:
    import faulthandler

    import psutil

    time.sleep(INTERRUPT_GRACE_S)
    print(f"\nshutdown took longer than {INTERRUPT_GRACE_S:.0f} s; thread stacks follow", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    for child in psutil.Process().children(recursive=True):  # only what this process started
        with contextlib.suppress(psutil.Error):
            child.kill()
    print("interrupted; everything this command started has been stopped", file=sys.stderr, flush=True)
    os._exit(130)
