"""The cluster under test: Temporal, the model, fault proxies and supervised workers.

    Temporal server (db file) <-- proxy "temporal" <-- worker-1..N --> proxy "model" --> scripted model

Workers reach Temporal and the model only through the two ``FaultProxy``s,
so network faults land on exactly the links that matter. The driver (the
client) talks to Temporal directly. The ``Supervisor`` restarts any worker
that dies, whatever killed it (a nemesis, a crash point, a worker that gave
up after a long partition), after a delay, and records each restart in the
history.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from testbed.temporal_server import EmbeddedTemporal
from harness.faults import AgentFaults, FaultRule
from testbed.model_server import LatencyModel, ScriptedModelServer
from testbed.scripted_routes import respond
from testbed.worker_process import WorkerProcess
from harness.operations import History
from chaos.net import FaultProxy
from chaos.target import REFERENCE, Target

log = logging.getLogger(__name__)


@dataclass
class ClusterSpec:
    workers: int = 2
    task_queue: str = "chaos"
    model_latency: str = "fixed:100"
    bugs: tuple[str, ...] = ()  # tools with a logic bug in the first worker build (the hot-fix scenario)
    crash_at: tuple[str, ...] = ()  # worker self-SIGKILL points
    mutations: tuple[str, ...] = ()  # deliberate agent bugs, to check the checkers
    workflow: str = "agent.workflow:AgentWorkflow"  # the workflow class the workers run (and replay checks)
    restart_delay_s: float = 1.0
    seed: int = 0
    ui: bool = False  # start the Temporal Web UI, to watch the run
    backend: str = "process"  # "process" (default) or "docker": workers in containers (needs an engine)
    image: str | None = None  # for the docker backend: an image with the worker installed

    @property
    def faults(self) -> AgentFaults:
        """What the workers carry (harness.faults): they reach any agent that records through harness.recording."""
        return AgentFaults(frozenset(self.crash_at), frozenset(self.bugs), frozenset(self.mutations))


@dataclass
class SupervisedWorker:
    process: WorkerProcess
    lock: threading.Lock = field(default_factory=threading.Lock)
    down_until: float = 0.0  # a nemesis holds it down until then (monotonic)
    restarts: int = 0

    @property
    def name(self) -> str:
        return self.process.identity_prefix

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[WorkerProcess]:
        """Hold the worker away from the supervisor, acquiring off the event loop (a restart takes seconds)."""
        await asyncio.to_thread(self.lock.acquire)
        try:
            yield self.process
        finally:
            self.lock.release()


class Cluster:
    def __init__(self, run_dir: Path, spec: ClusterSpec, history: History, target: Target = REFERENCE) -> None:
        self.run_dir = run_dir
        self.spec = spec
        self.target = target
        self.history = history
        self.server = EmbeddedTemporal(db_filename=run_dir / "temporal.db", log_file=run_dir / "logs" / "temporal.log",
                                       log_level="warn", ui=spec.ui)
        self.model = ScriptedModelServer(respond, latency=LatencyModel.parse(spec.model_latency), seed=spec.seed)
        self.temporal_proxy: FaultProxy | None = None
        self.model_proxy: FaultProxy | None = None
        self.workers: list[SupervisedWorker] = []
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None

    @property
    def state_dir(self) -> Path:
        return self.run_dir / "state"

    @property
    def ledger_path(self) -> Path:
        return self.state_dir / "sandbox" / "ledger.sqlite3"

    def start(self) -> Cluster:
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.server.start()
        self.model.start()
        self.temporal_proxy = FaultProxy("temporal", ("127.0.0.1", self.server.port), seed=self.spec.seed).start()
        self.model_proxy = FaultProxy("model", ("127.0.0.1", self.model.port), seed=self.spec.seed + 1).start()
        extra: list[str] = []
        if self.target.is_reference:
            extra += ["--workflow", self.spec.workflow]
        if self.spec.backend == "docker":
            self._add_container_workers(extra)
        else:
            for i in range(1, self.spec.workers + 1):
                self.workers.append(SupervisedWorker(WorkerProcess(
                    self.temporal_proxy.address, self.spec.task_queue, f"http://{self.model_proxy.address}/v1",
                    state_dir=self.state_dir, identity_prefix=f"w{i}", faults=self.spec.faults, extra_args=tuple(extra),
                    log_dir=self.run_dir / "logs", command_template=self.target.worker,
                    ready_line=self.target.ready_line, cwd=self.target.cwd, env=self.target.env,
                )))
        # Workers take seconds each to import LiteLLM: start them side by side.
        with ThreadPoolExecutor(len(self.workers)) as pool:
            list(pool.map(lambda w: w.process.start(), self.workers))
            if self.target.is_reference:
                # Load starts once every worker has its model client loaded (a cold one takes seconds).
                list(pool.map(lambda w: w.process.wait_for("WARM", 90.0), self.workers))
        self._supervisor = threading.Thread(target=self._supervise, name="supervisor", daemon=True)
        self._supervisor.start()
        return self

    def _add_container_workers(self, extra: list[str]) -> None:
        from agent.envs.docker_engine import docker_engine_available
        from chaos.docker_backend import ContainerWorker, DockerBackend

        ok, reason = docker_engine_available()
        if not ok:
            raise RuntimeError(f"backend docker: {reason}; the process backend (the default) needs no engine")
        if not self.spec.image:
            raise RuntimeError("backend docker needs an image with the worker installed (--image NAME)")
        assert self.temporal_proxy is not None and self.model_proxy is not None
        backend = DockerBackend()
        for i in range(1, self.spec.workers + 1):
            template = list(self.target.worker or [
                "python", "-m", "agent", "worker", "--address", "{address}", "--task-queue", "{task_queue}",
                "--identity", "{identity}", "--model-base-url", "{model_url}", "--state-dir", "/tmp/dah-state", *extra])
            values = {"{python}": "python", "{address}": self.temporal_proxy.address, "{namespace}": "default",
                      "{model_url}": f"http://{self.model_proxy.address}/v1", "{state_dir}": "/tmp/dah-state"}
            command = []
            for part in template:
                for key, value in values.items():
                    part = part.replace(key, value)
                command.append(part)
            worker = backend.worker(image=self.spec.image, command=command, task_queue=self.spec.task_queue,
                                    network="host", identity_prefix=f"w{i}", ready_line=self.target.ready_line)
            self.workers.append(SupervisedWorker(ContainerWorker(worker, self.spec.faults)))  # type: ignore[arg-type]

    def _supervise(self) -> None:
        while not self._stop.wait(0.2):
            for w in self.workers:
                with w.lock:
                    if w.process.alive or time.monotonic() < w.down_until or self._stop.is_set():
                        continue
                    code = w.process.returncode
                    tail = w.process.output()[-400:]
                    reason = "crash point" if "crash point" in tail else \
                        "fatal worker failure" if "failed fatally" in tail else "process died"
                    op = self.history.invoke("supervisor", "restart_worker",
                                             {"worker": w.name, "exit_code": code, "reason": reason})
                    try:
                        w.process.start()
                        w.restarts += 1
                        self.history.complete(op, "ok", {"worker": w.name, "identity": w.process.identity})
                    except Exception as exc:  # recorded; the supervisor tries again next round
                        self.history.complete(op, "fail", error=f"{type(exc).__name__}: {exc}")

    def worker(self, name: str) -> SupervisedWorker:
        for w in self.workers:
            if w.name == name:
                return w
        raise KeyError(f"no worker {name!r}; workers are {', '.join(w.name for w in self.workers)}")

    def heal(self) -> None:
        """Undo every fault: links clean and up, workers resumed, the model healthy."""
        for proxy in (self.temporal_proxy, self.model_proxy):
            if proxy is not None:
                proxy.clear_toxics()
                if not proxy.enabled:
                    proxy.enable()
        self.model.set_faults([])
        for w in self.workers:
            with w.lock:
                w.process.resume()
                w.down_until = 0.0

    def set_model_faults(self, rules: list[FaultRule]) -> None:
        self.model.set_faults(rules)

    def stop(self) -> None:
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
        def stop_worker(w: SupervisedWorker) -> None:
            # Everything the checkers need is saved by now: no graceful drain, just make sure it is gone.
            with w.lock:
                w.process.kill()

        if self.workers:
            with ThreadPoolExecutor(len(self.workers)) as pool:
                list(pool.map(stop_worker, self.workers))
        for closer in (self.temporal_proxy, self.model_proxy):
            if closer is not None:
                closer.stop()
        self.model.stop()
        self.server.stop()

