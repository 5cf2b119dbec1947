"""The checkpoint engine (``CheckpointEngine``): the reference agent with its steps checkpointed in SQLite, no
Temporal; the same load, faults and checkers as on Temporal.

    python -m chaos run kill_mid_turn --durability checkpoint
    python -m chaos run model_outage --durability checkpoint

The cluster is the scripted model server and N checkpoint worker processes
(``dah checkpoint worker``) sharing one SQLite file, under the same
supervisor; the client is the same seeded workload (arithmetic and
non-idempotent appends), each message a one-shot run submitted to the
checkpoint queue, the messages of a conversation sharing its workspace. The
faults are the same nemeses: a SIGKILL of the worker holding a run whose model
call is in flight (what is in flight comes from the effect ledger's unfinished
executions; its runs are resumed by another worker once its lease expires),
and the model API refusing requests.

The checkers are the same: ``lost``, ``effects``, ``injection_evidence`` and
``stats``. ``temporal_history``, ``workflow_tasks`` and ``replay`` read Temporal event histories,
which this engine does not have: they are reported as ``not_applicable`` with
the reason, which is neither a pass nor counted in the verdict.

In this process (``dah run --durability checkpoint``, the benchmarks' engines section: ``in_process``): the stack
creates the database, and each prompt is a run the session runs here or, with ``--no-worker``, submits to the queue
for workers elsewhere (``dah checkpoint worker`` on the same file).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent.contracts import AgentConfig
from agent.worker import WorkerSettings
from harness.operations import OperationLog
from harness.rundir import RunDir
from testbed.engines import SessionSpec
from testbed.engines.base import Engine, Scenario, Session, without_event_histories
from testbed.engines.checkpoint import CHECKPOINT_DB
from testbed.engines.checkpoint.agent_task import TASK, agent_task, manifest_for, noop_steps
from testbed.engines.checkpoint.durable_run import run_durable
from testbed.engines.checkpoint.service import CheckpointQueue
from testbed.engines.checkpoint.stores import SqliteStore, epoch
from testbed.engines.oneshot import OneShotDriver, RunFailedError, running_from_ledger
from testbed.engines.byo.target import REFERENCE, Target
from testbed.model_server import LatencyModel
from testbed.stack import Endpoints, Stack, StackSpec, stack
from testbed.worker_process import CHECKPOINT_WORKER, WorkerProcess

LEASE_MS = 2000  # a killed worker's runs are taken over after this
#: the reference agent, as this engine runs it (its workers, its driver; the same ledger and workspaces)
CHECKPOINT_TARGET = replace(REFERENCE, name="reference-agent (checkpoint)",
                            worker=(*CHECKPOINT_WORKER, "--lease-ms", str(LEASE_MS)),
                            driver="testbed.engines.checkpoint.engine:CheckpointDriver")
NO_EVENT_HISTORIES = ("reads Temporal event histories; the checkpoint engine has none (its runs are checked by lost, "
                      "effects and injection_evidence)")


@dataclass
class CheckpointEngine(Engine):
    name: str = "checkpoint"
    target: Target = field(default_factory=lambda: CHECKPOINT_TARGET)
    not_applicable: dict[str, str] = field(default_factory=lambda: without_event_histories(NO_EVENT_HISTORIES))
    #: the scenarios with a twin here (the others fault Temporal itself or its links)
    scenarios: tuple[str, ...] | None = ("kill_mid_turn", "model_outage")
    #: the steps run in the stack's process (``in_process``); the chaos runs' workers are processes
    worker_in_process: bool = False

    def reproduce(self) -> dict[str, Any]:
        return {"--durability": "checkpoint"}

    def record(self) -> dict[str, Any]:
        return {**super().record(), "lease_ms": LEASE_MS, "temporal": None}  # no Temporal on this engine

    def stack_spec(self, scenario: Scenario, run: RunDir, seed: int, oplog: OperationLog, ui: bool) -> StackSpec:
        def worker(name: str, at: Endpoints) -> WorkerProcess:
            values = {"model_url": at.model_url, "state_dir": str(run.state),
                      "checkpoint_db": str(run.state / CHECKPOINT_DB)}
            return WorkerProcess(self.target.worker, values, identity_prefix=name, ready_line=self.target.ready_line,
                                 warm_line=self.target.warm_line, faults=scenario.cluster.faults, log_dir=run.logs,
                                 start_timeout_s=self.target.ready_timeout_s)

        return StackSpec(state_dir=run.state, logs_dir=run.logs, engine=self,
                         model_latency=LatencyModel.parse(scenario.cluster.model_latency), seed=seed,
                         worker_processes=scenario.cluster.workers, make_worker=worker, oplog=oplog)

    def make_driver(self, stack: Stack, oplog: OperationLog, scenario: Scenario, seed: int) -> Any:
        driver = CheckpointDriver(client=None, history=oplog, task_queue="", workload=scenario.workload, seed=seed,
                                  db=stack.spec.state_dir / CHECKPOINT_DB)
        if scenario.planning_max_attempts:
            driver.config.planning.maximum_attempts = scenario.planning_max_attempts
        return driver

    running = running_from_ledger

    async def save(self, stack: Stack, run: RunDir, driver: Any) -> None:
        pass  # the checkpoints are in the state dir already; there are no event histories

    async def start_in_stack(self, stack: Stack, exits: contextlib.AsyncExitStack) -> None:
        """The database's tables (before any worker or queue opens it) and, with ``worker_in_process``, what the
        steps run here use: the effect ledger, the workspaces, the model."""
        await SqliteStore(stack.spec.state_dir / CHECKPOINT_DB).close()
        if self.worker_in_process:
            from agent import llm
            from testbed.engines.checkpoint.steps import configure_worker

            llm.preload_in_background()  # LiteLLM's ~5 s import, off the first model step
            configure_worker(ledger=stack.ledger, model_base_url=stack.model_url, identity="in-process",
                             sandbox_root=WorkerSettings.in_state_dir(stack.spec.state_dir).sandbox_root)

    @contextlib.asynccontextmanager
    async def in_process(self, spec: SessionSpec) -> AsyncIterator[CheckpointSession]:
        """The database in ``spec.state_dir``; each prompt a run, run here (``spec.worker``) or queued for workers
        elsewhere."""
        engine = replace(self, worker_in_process=spec.worker)
        async with stack(StackSpec(state_dir=spec.state_dir, model=False, model_url=spec.model_url,
                                   engine=engine, effect_ledger=spec.ledger)):
            session = CheckpointSession(spec.state_dir / CHECKPOINT_DB, here=spec.worker)
            try:
                yield session
            finally:
                session.queue.close()
                await session.store.close()


class CheckpointSession(Session):
    """The checkpoint engine in this process (``base.Session``): each prompt one run. ``here``: the session runs it
    as a worker would (``run_durable`` on the store), with no queue between it and the steps (its two 10 ms polls);
    else it submits the run to the queue and waits for a worker elsewhere (``dah checkpoint worker``)."""

    def __init__(self, db: Path, *, here: bool) -> None:
        self.db, self.here = db, here
        self.store = SqliteStore(db)
        self.queue = CheckpointQueue(db)
        self.banner = ("durable-agent-harness demo: the agent loop on the checkpoint engine (steps checkpointed in "
                       f"SQLite)\nCheckpoints: {db}")

    def record(self) -> dict[str, Any]:
        return {"store": f"SQLite {self.db.name}", **self.store.durability()}

    async def run_turn(self, config: AgentConfig, prompt: str, run_id: str) -> dict[str, Any]:
        if self.here:
            return (await run_durable(run_id, manifest_for(config, prompt), self.store, agent_task,
                                      worker_id="in-process", end_on_failure=True)).result
        self.queue.submit(run_id, TASK, manifest_for(config, prompt))
        return await self.queue.wait(run_id, timeout_s=300.0)

    async def noop_steps(self, n: int) -> list[float]:
        return await noop_steps(self.store, n)

    async def describe_run(self, run_id: str) -> list[str]:
        lines = [f"run id:      {run_id} (checkpoints in {self.db})"]
        while (step := await self.store.load_step(run_id, len(lines) - 1)) is not None:
            took = ""
            if step.started_at and step.completed_at:
                took = f"{(epoch(step.completed_at) - epoch(step.started_at)) * 1000:8.0f} ms"
            lines.append(f"  ├─ step {step.step_index:<3} {step.intent:<28} {step.kind:<6} {step.status:<10} "
                         f"attempts {step.attempts} {took}")
        return lines


@dataclass
class CheckpointDriver(OneShotDriver):
    """The chaos client on the checkpoint engine: each message a one-shot run submitted to the checkpoint queue."""

    engine: str = "checkpoint"
    db: Path | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        assert self.db is not None, "CheckpointDriver needs db (the checkpoint engine's SQLite file)"
        self.queue = CheckpointQueue(self.db)

    async def submit(self, run_id: str, prompt: str, workspace: str) -> None:
        self.queue.submit(run_id, TASK, manifest_for(self.config, prompt, workspace=workspace))

    async def wait(self, run_id: str, timeout_s: float) -> dict[str, Any]:
        try:
            return await self.queue.wait(run_id, timeout_s=timeout_s)
        except RuntimeError as exc:  # the run failed (a step gave up)
            raise RunFailedError(str(exc)) from exc

    async def outcome(self, run_id: str) -> tuple[str, Any, str | None] | None:
        return self.queue.outcome(run_id)

    async def close_client(self) -> None:
        self.queue.close()
