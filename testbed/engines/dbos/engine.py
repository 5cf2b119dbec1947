"""The reference agent on DBOS Transact: the same load, faults and checkers as on Temporal.

    python -m chaos run kill_mid_turn model_outage --durability dbos

The cluster is the scripted model server (behind the model fault proxy) and N supervised worker processes
(``dah worker --durability dbos``) sharing one DBOS system database: a SQLite file in the run's state
dir, or (``database="postgres"``) a PostgreSQL server this harness starts (``testbed.engines.dbos.postgres``), exposed as the
stack's server so ``restart_server`` restarts the database, and reached through the stack's first fault proxy so a
``partition`` of the ``temporal`` link cuts the workers from the database. Each worker's DBOS executor id is its
stable name (``w1``, ``w2``): when the supervisor restarts a killed worker under that name, DBOS recovers the runs
it held (``testbed.engines.dbos.agent``). The client is the same seeded workload; each message is a one-shot run (a
DBOS workflow whose id is ``<conversation>-msg-<n>``) enqueued with DBOS's client, the messages of a conversation
sharing its workspace.

What each checker sees here:

* ``lost``: every acknowledged message's reply is in the final read (each run's result, read from the system
  database), as on Temporal;
* ``effects``: the effect ledger, written by the steps themselves (``testbed.engines.steps``), so a tool whose effect
  was applied twice shows here whatever DBOS recorded;
* ``injection_evidence``: the kill's evidence is the ledger's unfinished model call on the frozen worker; the
  outage's is the model server's refused requests;
* ``stats``: the operation log;
* ``temporal_history``, ``workflow_tasks``, ``replay``: they read Temporal event histories. DBOS has none: it keeps
  each workflow's step outputs (``operation_outputs``) and re-runs the workflow function from the start on
  recovery, returning recorded outputs for the steps that completed; there is no history to replay against the
  code. They are ``not_applicable``, with that reason;
* ``dbos_steps`` is their twin here: at the end of the run every run's status and recorded steps are read from the
  system database (``dbos_steps.json``) and held against the ledger: no step ran again once DBOS had recorded it,
  every recorded step was executed, and a completed run executed no step it did not record.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness import SAFE_PATH
from harness.operations import OperationLog
from harness.rundir import DBOS_STEPS, RunDir
from harness.commands import tool
from testbed.engines.dbos import agent as dbos_agent
from testbed.engines import SessionSpec
from testbed.engines.base import Engine, Scenario, without_event_histories
from testbed.engines.oneshot import OneShotDriver, RunFailedError, running_from_ledger
from testbed.engines.byo.target import REFERENCE, Target
from testbed.model_server import LatencyModel
from testbed.stack import Endpoints, Stack, StackSpec
from testbed.worker_process import WorkerProcess

#: the DBOS worker; ``{database_url}`` and ``{executor_id}`` are this backend's own placeholders
DBOS_WORKER = ("{python}", SAFE_PATH, "-m", "testbed", "worker", "--durability", "dbos", "--database-url", "{database_url}",
               "--state-dir", "{state_dir}", "--identity", "{identity}", "--executor-id", "{executor_id}",
               "--model-base-url", "{model_url}")
DBOS_TARGET = replace(REFERENCE, name="reference-agent (dbos)", worker=DBOS_WORKER, ready_line=dbos_agent.READY,
                      warm_line=dbos_agent.WARM, driver="testbed.engines.dbos.engine:DbosDriver")
NO_EVENT_HISTORIES = ("reads Temporal event histories; DBOS keeps step outputs (operation_outputs), not an event "
                      "history to replay (its step log is checked by dbos_steps)")
POSTGRES_DIR = "postgres"  # the PostgreSQL data dir, in the state dir
#: the scenarios with a twin on each database (the others fault Temporal itself, or need it to observe)
DBOS_SCENARIOS = {"sqlite": ("kill_mid_turn", "model_outage", "crash_after_effect", "partition_model"),
             "postgres": ("kill_mid_turn", "model_outage", "crash_after_effect", "partition_model", "server_restart",
                          "partition_temporal_blackhole", "partition_temporal_reset")}


@dataclass
class DbosEngine(Engine):
    database: str = "sqlite"  # the system database: "sqlite" (a file in the state dir) or "postgres"
    name: str = "dbos"
    target: Target = field(default_factory=lambda: DBOS_TARGET)
    not_applicable: dict[str, str] = field(default_factory=lambda: without_event_histories(NO_EVENT_HISTORIES))
    scenarios: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.database not in DBOS_SCENARIOS:
            raise ValueError(f"database={self.database!r}: use one of {', '.join(DBOS_SCENARIOS)}")
        self.scenarios = DBOS_SCENARIOS[self.database]
        if self.database != "sqlite":
            self.name = f"dbos-{self.database}"

    def reproduce(self) -> dict[str, Any]:
        return {"--durability": self.name}

    def record(self) -> dict[str, Any]:
        """What ran (the system database's measured durability settings are added by ``save``)."""
        return {**super().record(), "temporal": None, "database": self.database, "dbos": dbos_agent.dbos_version(),
                "executor_ids": "each worker's stable name (w1, w2), kept across its restarts"}

    def database_url(self, run: RunDir | Path, stack: Stack | None = None, at: Endpoints | None = None) -> str:
        """Where the system database is: the SQLite file in the state dir, or the PostgreSQL server (through the
        stack's proxy for workers, ``at``)."""
        state = run.state if isinstance(run, RunDir) else Path(run)
        if self.database == "sqlite":
            return dbos_agent.sqlite_url(state / dbos_agent.SQLITE_FILE)
        if at is not None:
            from testbed.engines.dbos.postgres import database_url, password_file

            host, _, port = at.address.rpartition(":")
            return database_url(host, int(port), password_file(state / POSTGRES_DIR))
        assert stack is not None and stack.server is not None, "the PostgreSQL server is not started"
        return stack.server.url

    def stack_spec(self, scenario: Scenario, run: RunDir, seed: int, oplog: OperationLog, ui: bool) -> StackSpec:
        def worker(name: str, at: Endpoints) -> WorkerProcess:
            values = {"model_url": at.model_url, "state_dir": str(run.state), "executor_id": name,
                      "database_url": self.database_url(run, at=at)}
            return WorkerProcess(self.target.worker, values, identity_prefix=name, ready_line=self.target.ready_line,
                                 warm_line=self.target.warm_line, faults=scenario.cluster.faults, log_dir=run.logs,
                                 start_timeout_s=self.target.ready_timeout_s)

        return StackSpec(state_dir=run.state, logs_dir=run.logs, engine=self, proxies=True,
                         model_latency=LatencyModel.parse(scenario.cluster.model_latency), seed=seed,
                         worker_processes=scenario.cluster.workers, make_worker=worker, oplog=oplog)

    def make_driver(self, stack: Stack, oplog: OperationLog, scenario: Scenario, seed: int) -> Any:
        driver = DbosDriver(client=None, history=oplog, task_queue="", workload=scenario.workload, seed=seed,
                            database_url=self.database_url(stack.spec.state_dir, stack))
        if scenario.planning_max_attempts:
            driver.config.planning.maximum_attempts = scenario.planning_max_attempts
        return driver

    running = running_from_ledger

    def server(self, spec: StackSpec) -> Any | None:
        """The PostgreSQL server, with ``database="postgres"`` (its data dir in the state dir)."""
        if self.database != "postgres":
            return None
        from testbed.engines.dbos.postgres import PostgresServer

        return PostgresServer(spec.state_dir / POSTGRES_DIR, log_dir=spec.logs)

    async def save(self, stack: Stack, run: RunDir, driver: Any) -> None:
        """The system database's durability settings, as the database reports them, into ``run.json``; every
        run's status and recorded steps into ``dbos_steps.json`` (what the ``dbos_steps`` checker reads)."""
        url = self.database_url(run, stack)
        measured = await asyncio.to_thread(dbos_agent.durability, url)
        run.update(backend={**run.run.get("backend", {}), "durability": measured})
        client = dbos_agent.DbosClient(url)
        try:
            runs = [r for conv in driver.to_json().get("runs", {}).values() for r in conv]
            run.write_json(DBOS_STEPS, {"engine_run_id": dbos_agent.ENGINE_RUN_ID,
                                        "workflows": await client.step_log(runs)})
        finally:
            await asyncio.to_thread(client.close)


    def in_process(self, spec: SessionSpec) -> contextlib.AbstractAsyncContextManager[dbos_agent.InProcessDbos]:
        """DBOS launched in this process on this engine's system database (``dbos_agent.engine``)."""
        if not spec.worker:
            raise ValueError(f"--no-worker: --durability {self.name} runs its workflow in this process (workers of "
                             "its own: " + tool("testbed") + " worker --durability dbos)")
        return dbos_agent.engine(spec.state_dir, spec.model_url or "", database=self.database, ledger=spec.ledger)

@dataclass
class DbosDriver(OneShotDriver):
    """The chaos client on DBOS: each message a run enqueued on the workers' queue with DBOS's client."""

    engine: str = "dbos"
    database_url: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.database_url:
            raise ValueError("DbosDriver needs database_url (the DBOS system database)")
        self.dbos = dbos_agent.DbosClient(self.database_url)

    async def submit(self, run_id: str, prompt: str, workspace: str) -> None:
        await self.dbos.submit(run_id, self.config, prompt, workspace)

    async def wait(self, run_id: str, timeout_s: float) -> dict[str, Any]:
        try:
            return await self.dbos.wait(run_id, timeout_s)
        except RuntimeError as exc:  # the run failed (a step gave up)
            raise RunFailedError(str(exc)) from exc

    async def outcome(self, run_id: str) -> tuple[str, Any, str | None] | None:
        return await self.dbos.outcome(run_id)

    async def close_client(self) -> None:
        await asyncio.to_thread(self.dbos.close)
