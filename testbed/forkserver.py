"""Warm workers: the reference worker forked from a parent that has already imported it (LiteLLM included).

A reference worker started from scratch spends ~3 s of CPU importing (LiteLLM alone ~2.5 s); a chaos run starts
two per scenario and one per restart, the migration fuzz three, on a 2-core machine. The fork server imports the
worker's code once, with nothing else running (no thread, no Temporal runtime, no event loop), and then forks a
worker per request: the child sets its own environment, working directory and output, and runs ``dah worker``
from its argument list, connecting to Temporal itself. It is a new process with its own pid, killed, paused and
stopped by that pid like any other; nothing of the parent's state but imported modules carries over.

Used by ``WorkerProcess`` for the harness's own interpreter running ``-m testbed worker`` (the reference worker):
a target's own interpreter or command always starts the ordinary way. ``DAH_FORKSERVER=0`` turns it off. A
source file of the worker's packages changed since the server started: a new server forks the next workers (a
worker must never mix the code it was forked with and the files its workflow sandbox reads); the old one stays
until exit, with the workers it forked. In ``ps`` a forked worker
shows the server's command line (``python -m testbed.forkserver``): fork does not exec.

The protocol, one JSON object per line: requests on the server's stdin ``{"argv", "env", "cwd", "log"}``, replies
on its stdout ``{"ready"}`` once, then ``{"pid"}`` or ``{"error"}`` per request, and ``{"exit": pid, "code"}``
whenever a child ends (a signal's death is ``-signal``, as ``subprocess`` reports it).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from harness import SAFE_PATH, own_module

log = logging.getLogger(__name__)

#: what a request's argv must start with (after the interpreter) for the fork server to run it
MODULE = (SAFE_PATH, "-m", "testbed", "worker")
#: what that command runs (testbed/__main__.py): named, not imported here, as cli sits above testbed
DAH = "cli.dah"
READY_TIMEOUT_S = 120.0


# -- the server (its own process) -----------------------------------------------------------------------------------


def private_pycache() -> Path | None:
    """A bytecode cache of this user's own, outside the source tree (None: none can be had safely: a directory
    another user made first could hold planted bytecode, which would run)."""
    import tempfile

    from harness.private import private_dir

    return private_dir(Path(tempfile.gettempdir()) / f"dah-pycache-{os.geteuid()}")


def _serve() -> int:
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
    out = sys.stdout
    print(json.dumps({"ready": True, "pid": os.getpid()}), file=out, flush=True)
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin, selectors.EVENT_READ)
    children: set[int] = set()
    while True:
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                print(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}), file=out, flush=True)
        if not sel.select(timeout=0.05):
            continue
        line = sys.stdin.readline()
        if not line:  # the harness closed the pipe (or died): the children go with us (parent-death signal)
            for pid in children:
                os.kill(pid, signal.SIGKILL)
            return 0
        try:
            req = json.loads(line)
            pid = _fork(req["argv"], req["env"], req["cwd"], req["log"])
        except Exception as exc:  # a bad request, or fork failed: said, and the server goes on
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), file=out, flush=True)
            continue
        children.add(pid)
        print(json.dumps({"pid": pid}), file=out, flush=True)


def _fork(argv: list[str], env: dict[str, str], cwd: str | None, log_path: str) -> int:
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

        os.setsid()
        die_with_parent(server)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(devnull)
        os.close(out)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        if cwd:
            os.chdir(cwd)
        sys.argv = [argv[0], *argv[len(MODULE):]]  # as ``python -m testbed worker ...`` has it
        code = importlib.import_module(DAH).main(list(argv[len(MODULE):]))
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
    """The harness's handle on one fork server process (started on first use, stopped at exit)."""

    def __init__(self) -> None:
        self.stamp = source_stamp()  # a worker forked from code older than its files would mix two versions
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()  # one request at a time
        self._news = threading.Condition()
        self._exits: dict[int, int] = {}
        self._replies: list[dict] = []
        self._reader: threading.Thread | None = None
        self._dead = False

    def start(self) -> ForkServer:
        from testbed.processes import spawn

        self._proc = spawn(own_module("testbed.forkserver"), stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self._reader = threading.Thread(target=self._read, name="forkserver-reader", daemon=True)
        self._reader.start()
        ready = self._reply(READY_TIMEOUT_S)
        if not ready.get("ready"):
            self.close()
            raise ForkServerError(f"the fork server did not start: {ready.get('error', ready)}")
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
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
        with self._news:  # the server is gone: so are its children (their parent-death signal)
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
                return -signal.SIGKILL  # died with the server
            return None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def fork(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, log_path: Path) -> ForkedProcess:
        with self._lock:
            if not self.alive or self._proc is None or self._proc.stdin is None:
                raise ForkServerError("the fork server is not running")
            self._proc.stdin.write(json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd,
                                               "log": str(log_path)}) + "\n")
            self._proc.stdin.flush()
            reply = self._reply(30.0)
        if "pid" not in reply:
            raise ForkServerError(f"the fork server could not start the worker: {reply.get('error', reply)}")
        return ForkedProcess(self, int(reply["pid"]))

    def close(self) -> None:
        if self._proc is None:
            return
        from testbed.processes import stop

        try:
            if self._proc.stdin is not None:
                self._proc.stdin.close()  # it kills its children and exits
        except OSError:
            pass
        stop(self._proc, grace_s=5.0)


_server: ForkServer | None = None
_retired: list[ForkServer] = []  # replaced servers: their workers run on (closing one kills them), until exit
_server_lock = threading.Lock()


def enabled() -> bool:
    from agent.env_options import option

    return option("DAH_FORKSERVER") == "1" and hasattr(os, "fork") and sys.platform.startswith("linux")


def can_fork(argv: Sequence[str]) -> bool:
    """Whether this command is the reference worker on the harness's own interpreter (what the server forks)."""
    return (enabled() and len(argv) > len(MODULE) + 1 and argv[0] == sys.executable
            and tuple(argv[1:len(MODULE) + 1]) == MODULE and "--durability" not in argv)  # another engine's: its own


def shared() -> ForkServer:
    """The process's fork server, started on first use (its import takes a few seconds, once)."""
    global _server
    with _server_lock:
        if _server is not None and _server.alive and source_stamp() != _server.stamp:
            log.info("the worker's source changed since the fork server started; starting a new one")
            _retired.append(_server)  # not closed: that would kill the workers it forked, which are still running
            _server = None
        if _server is None or not _server.alive:
            _server = ForkServer().start()
            import atexit

            atexit.register(_server.close)
        return _server


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
