"""The reference agent on the checkpoint backend: the same load, faults and checkers, no Temporal.

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
which this backend does not have: they are reported as ``not_applicable`` with
the reason, which is neither a pass nor counted in the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent.checkpoint.agent_task import TASK, manifest_for
from agent.checkpoint.service import CheckpointQueue
from agent.worker import CHECKPOINT_DB
from chaos.backends.base import Backend
from chaos.backends.oneshot import OneShotDriver, RunFailedError, running_from_ledger
from chaos.scenarios import ChaosScenario
from chaos.target import REFERENCE, Target
from harness.operations import History
from harness.rundir import RunDir
from testbed.model_server import LatencyModel
from testbed.stack import Endpoints, Stack, StackSpec
from testbed.worker_process import CHECKPOINT_WORKER, WorkerProcess

LEASE_MS = 2000  # a killed worker's runs are taken over after this
#: the reference agent, as this backend runs it (its workers, its driver; the same ledger and workspaces)
CHECKPOINT_TARGET = replace(REFERENCE, name="reference-agent (checkpoint)",
                            worker=(*CHECKPOINT_WORKER, "--lease-ms", str(LEASE_MS)),
                            driver="chaos.backends.checkpoint:CheckpointDriver")
NO_EVENT_HISTORIES = ("reads Temporal event histories; the checkpoint backend has none (its runs are checked by lost, "
                      "effects and injection_evidence)")


@dataclass
class CheckpointBackend(Backend):
    name: str = "checkpoint"
    suffix: str = "@checkpoint"
    target: Target = field(default_factory=lambda: CHECKPOINT_TARGET)
    not_applicable: dict[str, str] = field(default_factory=lambda: {"temporal_history": NO_EVENT_HISTORIES,
                                                                    "workflow_tasks": NO_EVENT_HISTORIES,
                                                                    "replay": NO_EVENT_HISTORIES})
    #: the scenarios with a twin here (the others fault Temporal itself or its links)
    scenarios: tuple[str, ...] | None = ("kill_mid_turn", "model_outage")

    def reproduce(self) -> dict[str, Any]:
        return {"--durability": "checkpoint"}

    def record(self) -> dict[str, Any]:
        return {**super().record(), "lease_ms": LEASE_MS, "temporal": None}  # no Temporal on this backend

    def stack_spec(self, scenario: ChaosScenario, run: RunDir, seed: int, history: History, ui: bool) -> StackSpec:
        def worker(name: str, at: Endpoints) -> WorkerProcess:
            values = {"model_url": at.model_url, "state_dir": str(run.state),
                      "checkpoint_db": str(run.state / CHECKPOINT_DB)}
            return WorkerProcess(self.target.worker, values, identity_prefix=name, ready_line=self.target.ready_line,
                                 warm_line=self.target.warm_line, faults=scenario.cluster.faults, log_dir=run.logs,
                                 start_timeout_s=self.target.ready_timeout_s)

        return StackSpec(state_dir=run.state, logs_dir=run.logs, temporal="none", checkpoint=True,
                         model_latency=LatencyModel.parse(scenario.cluster.model_latency), seed=seed,
                         worker_processes=scenario.cluster.workers, make_worker=worker, history=history)

    def make_driver(self, stack: Stack, history: History, scenario: ChaosScenario, seed: int) -> Any:
        driver = CheckpointDriver(client=None, history=history, task_queue="", workload=scenario.workload, seed=seed,
                                  db=stack.spec.checkpoint_db)
        if scenario.planning_max_attempts:
            driver.config.planning.maximum_attempts = scenario.planning_max_attempts
        return driver

    running = running_from_ledger

    async def save(self, stack: Stack, run: RunDir, driver: Any) -> None:
        pass  # the checkpoints are in the state dir already; there are no event histories


@dataclass
class CheckpointDriver(OneShotDriver):
    """The chaos client on the checkpoint backend: each message a one-shot run submitted to the checkpoint queue."""

    engine: str = "checkpoint"
    db: Path | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        assert self.db is not None, "CheckpointDriver needs db (the checkpoint backend's SQLite file)"
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
