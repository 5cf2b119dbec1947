"""A worker in its own process: started, signalled and stopped by its pid. The one class for every worker.

    with reference_worker(address, task_queue="q", model_url=url, state_dir=d) as w:
        w.kill()      # SIGKILL: a crash, mid-whatever
        w.start()     # a new process, a new identity

A worker is a command *template* whose placeholders are filled per start:
``{python}`` (the interpreter: the harness's, or a target's own), ``{address}``
``{namespace}`` ``{task_queue}`` (Temporal, usually through a fault proxy),
``{identity}`` (``<prefix>-<generation>``, new at every start), ``{model_url}``,
``{state_dir}``, ``{ledger}``, ``{checkpoint_db}``, ``{sticky_timeout}``, ``{heartbeat_throttle}`` and ``{effects_url}`` (the external
effects service's base URL, ``testbed.effects_service``; also ``$DAH_EFFECTS_URL``). ``REFERENCE_WORKER`` and
``CHECKPOINT_WORKER`` are the reference agent's two (Temporal, checkpoint);
a target file names its own. Plain replacement, never ``str.format``: commands
often carry code with literal braces.

``start`` returns once the output shows ``ready_line`` (it polls) or, with no
ready line, once the server lists the worker's identity among its task queue's
pollers (``ready_check``, e.g. ``TaskQueuePollers.polling``: each start has a
fresh identity, because the server keeps listing a killed worker's for a
while; a command without ``{identity}`` is taken to use the SDKs' default,
``<pid>@<hostname>``, with the pid of the process started here), and, with
``warm_line``, once that shows too (its model client is loaded: load can
start). Faults the harness injects into the agent (``harness.faults``) reach
the process through its environment, and so does its owner (``harness.owner``:
this process, with which the worker's browser ends). Output goes to a log file,
never to a pipe nobody drains; a worker that cannot start (it exits first, or is silent
for ``start_timeout_s``) raises ``WorkerStartError`` at once: one line naming
that log's path, then the log's last lines.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from harness import SAFE_PATH
from harness.faults import NO_FAULTS, AgentFaults
from harness.owner import owner_environment
from harness.placeholders import fill
from testbed import forkserver
from testbed.processes import ServerProcess, ensure_reaper, spawn

log = logging.getLogger(__name__)

PLACEHOLDERS = ("python", "address", "namespace", "task_queue", "identity", "model_url", "state_dir", "ledger",
                "checkpoint_db", "sticky_timeout", "heartbeat_throttle", "effects_url")
#: placeholders a caller may leave out: their value when it does
PLACEHOLDER_DEFAULTS = {"sticky_timeout": "1", "heartbeat_throttle": "0.5"}
#: the reference agent's Temporal worker (``dah worker``): READY once polling, WARM once LiteLLM is loaded.
#: Deployed with a short sticky timeout (``{sticky_timeout}``, 1 s unless the chaos timeouts profile says otherwise):
#: after a worker dies its workflows wait that long, not the SDK's 10 s, before another worker takes their next
#: task (the price, on a busy live worker, is a replay elsewhere).
REFERENCE_WORKER = ("{python}", SAFE_PATH, "-m", "testbed", "worker", "--address", "{address}",
                    "--namespace", "{namespace}", "--task-queue", "{task_queue}", "--identity", "{identity}",
                    "--state-dir", "{state_dir}", "--model-base-url", "{model_url}",
                    "--sticky-timeout", "{sticky_timeout}", "--heartbeat-throttle", "{heartbeat_throttle}")
#: the reference agent's checkpoint-backend worker (``dah checkpoint worker``)
CHECKPOINT_WORKER = ("{python}", SAFE_PATH, "-m", "testbed", "worker", "--durability", "checkpoint", "--db", "{checkpoint_db}",
                     "--state-dir", "{state_dir}", "--identity", "{identity}", "--model-base-url", "{model_url}")


#: how many of its log's last lines a worker that cannot start shows
TAIL_LINES = 12


class WorkerStartError(RuntimeError):
    """A worker that cannot start: the first line says why and names its log; the log's last lines follow."""


def tail(output: str, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of a log (each cut to 300 characters), or that it is empty."""
    last = [line[:300] for line in output.splitlines()[-lines:]]
    return "\n".join(last) if last else "(the log is empty)"




@dataclass
class WorkerProcess(ServerProcess):
    command: tuple[str, ...]  # a template (see the module docstring)
    values: dict[str, str]  # its placeholders' values, but identity (and python, unless given)
    identity_prefix: str = "worker"
    ready_line: str | None = "READY"  # None: ready once ``ready_check(polling_identity)`` says so
    ready_check: Callable[[str], bool] | None = None
    warm_line: str | None = None
    faults: AgentFaults = NO_FAULTS
    cwd: str | None = None
    env: dict[str, str] | None = None
    log_dir: Path = Path(".dah/logs")
    start_timeout_s: float = 60.0
    warm_timeout_s: float = 90.0
    generation: int = field(default=0, init=False)
    _proc: subprocess.Popen | forkserver.ForkedProcess | None = field(default=None, init=False, repr=False)
    _log_path: Path | None = field(default=None, init=False, repr=False)

    @property
    def identity(self) -> str:
        return f"{self.identity_prefix}-{self.generation}"

    @property
    def polling_identity(self) -> str:
        """The identity the server lists this worker's polls under: ``{identity}`` when its command takes one, else
        the SDKs' default (Python's and TypeScript's ``<pid>@<hostname>``; a wrapper such as ``npm`` or ``sh`` in
        front of the worker makes that another pid: give the worker ``{identity}`` then)."""
        if any("{identity}" in part for part in self.command):
            return self.identity
        return f"{self.pid}@{socket.gethostname()}"

    def argv(self) -> list[str]:
        return fill(self.command, {"python": sys.executable, **PLACEHOLDER_DEFAULTS, **self.values,
                                   "identity": self.identity})

    def start(self, *, faults: AgentFaults | None = None) -> WorkerProcess:
        """Start a new process (a new generation and identity); return once it is ready (and warm). ``faults``:
        from now on (the hot-fix starts the next build without its bugs)."""
        if self.alive:
            raise WorkerStartError(f"worker {self.identity} (pid {self.pid}) is still running")
        if faults is not None:
            self.faults = faults
        self.generation += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._log_path = self.log_dir / f"{self.identity}.log"
        argv = self.argv()
        # What the worker leaves running on purpose (its browser) ends with this process; the reaper takes containers.
        env = {**os.environ, **(self.env or {}), **self.faults.environment(), **owner_environment()}
        env.pop(forkserver.SOCKET_ENV, None)  # the harness's own: a worker (an agent we did not write) never sees it
        ensure_reaper()
        try:
            with open(self._log_path, "wb") as out:
                self._proc = self._forked(argv, env) if forkserver.can_fork(argv) else None
                if self._proc is None:
                    self._proc = spawn(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       cwd=self.cwd, env=env)
        except OSError as exc:
            raise WorkerStartError(f"worker {self.identity}: cannot run {argv[0]!r} ({exc.strerror}); "
                                   f"the command was: {' '.join(argv)}") from None
        if self.ready_line is not None or self.ready_check is None:
            self._wait_for_line(self.ready_line or "READY", self.start_timeout_s)
        else:
            self._wait_until_polling(self.ready_check, self.start_timeout_s)
        if self.warm_line and self.generation == 1:
            self._wait_for_line(self.warm_line, self.warm_timeout_s)
        log.info("worker %s ready (pid %s)", self.identity, self.pid)
        return self

    def _forked(self, argv: list[str], env: dict[str, str]) -> forkserver.ForkedProcess | None:
        """The reference worker forked from the warm fork server (None: it is unavailable; start it as usual)."""
        try:
            return forkserver.shared().fork(argv, env, self.cwd, self._log_path)  # type: ignore[arg-type]
        except forkserver.ForkServerError as exc:
            log.warning("worker %s: %s; starting it from scratch", self.identity, exc)
            return None

    def _wait_for_line(self, line: str, timeout_s: float) -> None:
        """Return once the output has ``line``; a worker that exits first, or is still silent at the deadline, is
        stopped and raises: one line with its log's path, then that log's last lines."""
        self.wait_until_ready(
            timeout_s, lambda: line in self.output(), interval_s=0.05,
            exited=lambda code: WorkerStartError(f"worker {self.identity} exited with {code} before printing "
                                                 f"{line!r} (log {self._log_path}):\n{tail(self.output())}"),
            timed_out=lambda t: WorkerStartError(f"worker {self.identity} did not print {line!r} within {t:g} s "
                                                 f"(log {self._log_path}):\n{tail(self.output())}"))

    def _wait_until_polling(self, check: Callable[[str], bool], timeout_s: float) -> None:
        """Return once the server lists this worker polling; raise as ``_wait_for_line`` does otherwise."""
        identity = self.polling_identity
        error = ""

        def polling() -> bool:
            nonlocal error
            try:
                return check(identity)
            except Exception as exc:  # noqa: BLE001 - the server unreachable for a moment: ask again
                error = f"; the last check failed: {type(exc).__name__}: {exc}"[:300]
                return False

        self.wait_until_ready(
            timeout_s, polling, interval_s=0.2,
            exited=lambda code: WorkerStartError(
                f"worker {self.identity} exited with {code} before the server listed {identity!r} polling "
                f"(log {self._log_path}):\n{tail(self.output())}"),
            timed_out=lambda t: WorkerStartError(
                f"worker {self.identity} was not seen polling its task queue as {identity!r} within {t:g} s{error} "
                f"(does it connect with that identity? log {self._log_path}):\n{tail(self.output())}"))

    def wait_for(self, text: str, timeout_s: float = 60.0) -> bool:
        """Wait until this generation's output contains ``text`` (False on timeout or exit)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.output():
                return True
            if not self.alive:
                return False
            time.sleep(0.05)
        return False

    def output(self) -> str:
        return self._log_path.read_text(errors="replace") if self._log_path and self._log_path.exists() else ""

    def terminate(self) -> None:
        """SIGTERM, without waiting: the worker drains (finishes what is in flight) and exits by itself."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)

    def pause(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)

    def stop(self, grace_s: float = 10.0) -> None:
        """Graceful: SIGTERM, wait for the worker to finish shutting down (SIGKILL after ``grace_s``). The worker
        drains (up to 30 s); a harness tearing down waits 10 s for that, then SIGKILLs: the run is over, and a model
        call hung by a fault must not hold up every teardown."""
        super().stop(grace_s)

    def _ended(self) -> None:
        """A worker's process is kept after it ends: its pid and exit code are still asked (``returncode``)."""


class TaskQueuePollers:
    """Which worker identities the server lists polling a task queue (DescribeTaskQueue, workflow and activity
    pollers), asked from any thread: one client, on an event loop of its own (``close`` ends both)."""

    def __init__(self, connect: Callable[[], object], namespace: str, task_queue: str) -> None:
        self._connect = connect  # a zero-argument coroutine function returning a connected temporalio Client
        self.namespace, self.task_queue = namespace, task_queue
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client = None
        self._lock = threading.Lock()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="task-queue-pollers", daemon=True).start()
            return self._loop

    async def _identities(self) -> set[str]:
        from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
        from temporalio.api.taskqueue.v1 import TaskQueue
        from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

        if self._client is None:
            self._client = await self._connect()  # type: ignore[misc]
        seen: set[str] = set()
        for kind in (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
            resp = await self._client.workflow_service.describe_task_queue(  # type: ignore[attr-defined]
                DescribeTaskQueueRequest(namespace=self.namespace, task_queue_type=kind, task_queue=TaskQueue(
                    name=self.task_queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL)), timeout=timedelta(seconds=5))
            seen |= {p.identity for p in resp.pollers}
        return seen

    def polling(self, identity: str) -> bool:
        return identity in asyncio.run_coroutine_threadsafe(self._identities(), self._running_loop()).result(10)

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)


def reference_worker(address: str, task_queue: str, model_url: str, state_dir: Path, *, namespace: str = "default",
                     identity_prefix: str = "worker", extra_args: tuple[str, ...] = (), **kwargs: object
                     ) -> WorkerProcess:
    """The reference agent's Temporal worker as a process (``dah worker``), logging to ``state_dir/logs``."""
    values = {"address": address, "namespace": namespace, "task_queue": task_queue, "model_url": model_url,
              "state_dir": str(Path(state_dir).resolve())}
    kwargs.setdefault("log_dir", Path(state_dir) / "logs")
    return WorkerProcess((*REFERENCE_WORKER, *extra_args), values, identity_prefix=identity_prefix,
                         **kwargs)  # type: ignore[arg-type]
