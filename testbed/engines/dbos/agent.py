"""The reference agent's loop on DBOS Transact: one DBOS workflow per user message, each model and tool call a step.

    python -m testbed.engines.dbos.agent worker --database-url sqlite:///.dah/dbos.sqlite3 --state-dir .dah \\
        --identity w1-1 --executor-id w1 --model-base-url http://127.0.0.1:PORT/v1

A run is the workflow ``agent_turn`` (one prompt to a final answer, like the checkpoint engine's ``agent_task``);
its workflow id is the run id the caller gives (the same id again is the same run: DBOS returns the existing
workflow), its input the agent config (a dict), the prompt and the workspace key its tools share (the messages
of one conversation share one). The loop is ``agent.loop.run_turn`` unchanged; its two effects are DBOS steps
running ``testbed.engines.steps.plan`` / ``tool``:

* **Retry policies** come from the run's config (``planning`` for the model, ``tool`` for tools), so the steps run
  through ``DBOS.run_step_async`` with per-run ``StepOptions`` (a ``@DBOS.step`` decorator fixes its policy at
  import). DBOS retries with ``interval * backoff ** attempt``; it has no maximum interval (its own cap is an hour),
  so ``maximum_interval_s`` is not honoured, and "retry forever" (``maximum_attempts`` 0) is ``UNLIMITED``
  attempts. ``start_to_close_s`` is DBOS's per-attempt ``timeout_seconds``. A model configuration error is not
  retried (``should_retry``), as on the other engines.
* **Identity**: ``ExecutionIdentity(workflow_id=<workflow id>, run_id="dbos", activity_id=<DBOS function id of the
  step>, attempt, worker=<process identity>)``. DBOS assigns function ids in call order, so a recovered workflow
  gives each step the same id: the idempotency key is stable across retries and recovery. DBOS exposes the attempt
  (``DBOS.step_status.current_attempt``, 0-based) only within one process's retry loop: a recovered workflow runs
  an interrupted step again from attempt 0. The attempt recorded is therefore derived from the effect ledger: one
  more than the executions it already holds of that step (the interrupted one included, as Temporal counts it).

Workers take runs from the DBOS queue ``QUEUE`` in one system database (SQLite file or PostgreSQL). Recovery:
at launch DBOS re-enqueues the PENDING workflows whose ``executor_id`` is its own, and nobody else's. So each
supervised worker uses its stable name (``w1``, ``w2``) as executor id and keeps it across restarts (its identity,
``w1-<generation>``, changes): a killed worker's runs are put back on the queue when the supervisor restarts it,
and any worker takes them from there. Two live processes sharing one executor id would be wrong: a starting one re-enqueues the runs the other
is still running, and both run them (DBOS checks ownership only when a step's output is recorded: the step itself,
and its side effect, would run twice). ``worker`` refuses to start while another live worker holds its executor
id in the same state dir (``_claim_executor``: a lock file there; workers on another machine sharing only the
database are not covered), and the supervisor restarts a name only after its previous process is dead. DBOS has
no lease: a dead worker's PENDING runs wait until a process with its executor id starts again (or someone calls
DBOS's recovery for that id); live workers with other ids never take them over.

``engine()`` runs the same workflow in this process (``dah run --durability dbos``, the benchmarks); ``DbosClient``
submits and watches runs for the chaos driver.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fcntl
import logging
import os
import signal
import sqlite3
import sys
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dbos import DBOS, DBOSClient, SetWorkflowID
from dbos._error import DBOSNonExistentWorkflowError

from agent import loop
from testbed.engines.checkpoint.agent_task import config_from  # the config a run's input carries, as the checkpoint task reads it
from agent.contracts import WORKFLOW_NATIVE_TOOLS, ActivityPolicy, AgentConfig
from testbed.engines import steps
from testbed.engines.steps import StepResources
from agent.errors import ModelConfigurationError
from harness.recording import EffectLedger, ExecutionIdentity

if __name__ == "__main__":
    # ``python -m testbed.engines.dbos.agent``: run as the module ``testbed.engines.dbos.agent``, before anything below
    # registers with DBOS here, so the process has one copy of the workflow and of the resources its steps use.
    from testbed.engines.dbos.agent import main as _main

    sys.exit(_main())

APP = "durable-agent"
WORKFLOW = "agent_turn"
QUEUE = "agent-turns"
ENGINE_RUN_ID = "dbos"  # ExecutionIdentity.run_id of every step (the run itself is the workflow id)
SQLITE_FILE = "dbos.sqlite3"  # the system database in a state dir
QUEUE_POLL_S = 0.05  # how often a worker looks for queued runs (DBOS's default is 1 s)
#: "retry until it succeeds" (a policy's maximum_attempts 0): DBOS needs a number; its backoff is capped at 1 h
UNLIMITED = 1_000_000
READY, WARM = "READY dbos worker", "WARM model client loaded"

_resources: StepResources | None = None


def configure(resources: StepResources) -> None:
    """What this process's steps use: the ledger, the workspaces, the model, this process's identity."""
    global _resources
    _resources = resources


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


# -- the workflow and its steps -----------------------------------------------------------------------------------


def _identity() -> ExecutionIdentity:
    """The running step's identity (see the module docstring: the attempt comes from the effect ledger)."""
    assert _resources is not None, "dbos_agent.configure() was not called in this process"
    status, workflow_id = DBOS.step_status, DBOS.workflow_id
    assert status is not None and workflow_id is not None, "not inside a DBOS step"
    activity_id = str(status.step_id)
    attempt = (status.current_attempt or 0) + 1
    if _resources.ledger is not None:
        earlier = sum(1 for e in _resources.ledger.executions(workflow_id)
                      if e["run_id"] == ENGINE_RUN_ID and e["activity_id"] == activity_id)
        attempt = max(attempt, earlier + 1)
    return ExecutionIdentity(workflow_id=workflow_id, run_id=ENGINE_RUN_ID, activity_id=activity_id,
                             attempt=attempt, worker=_resources.worker)


async def plan_step(model: str, messages: list[dict[str, Any]], tools: list[str], timeout_s: float) -> dict[str, Any]:
    """One model call: ``{"message", "latency_ms"}`` (``steps.plan``)."""
    assert _resources is not None
    return await steps.plan(_resources, _identity(), model, messages, tools, timeout_s)


async def tool_step(name: str, arguments: dict[str, Any], max_attempts: int, workspace: str | None
                    ) -> dict[str, str]:
    """One tool call: ``{"status", "content"}`` (``steps.tool``)."""
    assert _resources is not None
    return await steps.tool(_resources, _identity(), name, arguments, max_attempts, workspace)


def _not_configuration_error(exc: BaseException) -> bool:
    return not isinstance(exc, ModelConfigurationError)


def step_options(name: str, policy: ActivityPolicy, *, model: bool = False) -> dict[str, Any]:
    """DBOS ``StepOptions`` for one of the agent's policies (see the module docstring for what DBOS cannot say)."""
    options: dict[str, Any] = {"name": name, "retries_allowed": True,
                               "max_attempts": policy.maximum_attempts or UNLIMITED,
                               "interval_seconds": policy.initial_interval_s,
                               "backoff_rate": policy.backoff_coefficient,
                               "timeout_seconds": policy.start_to_close_s}
    if model:
        options["should_retry"] = _not_configuration_error
    return options


class DbosEffects:
    """``loop.AgentEffects`` on DBOS: the model call and each tool call are steps of the running workflow."""

    def __init__(self, config: AgentConfig, workspace: str | None) -> None:
        self.config = config
        self.workspace = workspace

    async def plan(self, messages: list[dict[str, Any]], tools: list[str]) -> dict[str, Any]:
        cfg = self.config
        out = await DBOS.run_step_async(step_options("plan", cfg.planning, model=True), plan_step, cfg.model,
                                        list(messages), tools, max(1.0, cfg.planning.start_to_close_s - 1.0))
        return out["message"]

    async def call_tool(self, call: loop.ToolCall) -> loop.ToolResult:
        if call.name in WORKFLOW_NATIVE_TOOLS:
            return loop.ToolResult(call.id, call.name, loop.BAD_CALL,
                                   f"{call.name} is not available on DBOS (Temporal only)")
        out = await DBOS.run_step_async(step_options(f"tool:{call.name}", self.config.tool), tool_step, call.name,
                                        call.arguments, self.config.tool.maximum_attempts, self.workspace)
        return loop.ToolResult(call.id, call.name, out["status"], out["content"])


def run_input(config: AgentConfig, prompt: str, workspace: str | None = None) -> dict[str, Any]:
    """A run's input: the config as a dict, the prompt, the workspace key (None: the run's own, by run id)."""
    return {"config": dataclasses.asdict(config), "prompt": prompt, "workspace": workspace}


@DBOS.workflow(name=WORKFLOW)
async def agent_turn(data: dict[str, Any]) -> dict[str, Any]:
    """One prompt to a final answer: ``steps.turn_result``."""
    cfg = config_from(data["config"])
    messages = loop.initial_messages(cfg.system_prompt)
    result = await loop.run_turn(messages, data["prompt"], DbosEffects(cfg, data.get("workspace")), cfg.tools,
                                 cfg.max_steps_per_turn)
    return steps.turn_result(result, messages)


async def _noop(i: int) -> int:
    return i


@DBOS.workflow(name="noop_steps")
async def noop_steps(n: int) -> list[float]:
    """``n`` no-op steps, each timed (ms): what a step costs DBOS itself (the engines benchmark)."""
    return await steps.timed(n, lambda i: DBOS.run_step_async({"name": "noop"}, _noop, i))


# -- DBOS in this process -----------------------------------------------------------------------------------------


def dbos_config(database_url: str, executor_id: str, log_level: str = "WARNING") -> dict[str, Any]:
    return {"name": APP, "system_database_url": database_url, "executor_id": executor_id, "log_level": log_level,
            "notification_listener_polling_interval_sec": 0.05}


@contextlib.asynccontextmanager
async def launched(database_url: str, executor_id: str, *, queue: bool, log_level: str = "WARNING"
                   ) -> AsyncIterator[None]:
    """DBOS launched in this process (a process-wide singleton: destroyed on exit, so it can be launched again);
    ``queue``: this process also takes runs from ``QUEUE``."""
    DBOS(config=dbos_config(database_url, executor_id, log_level))  # type: ignore[arg-type]
    running = asyncio.get_running_loop()
    try:
        await asyncio.to_thread(DBOS.launch)
        if queue:
            await DBOS.register_queue_async(QUEUE, polling_interval_sec=QUEUE_POLL_S)
        yield
    finally:
        # DBOS made its thread pool this loop's default executor, and shuts it down: off the loop in a thread of
        # our own, then the loop gets a default executor again (asyncio.to_thread would fail after that shutdown).
        with ThreadPoolExecutor(1, thread_name_prefix="dbos-destroy") as own:
            await running.run_in_executor(own, DBOS.destroy)
        running.set_default_executor(ThreadPoolExecutor(thread_name_prefix="asyncio"))


def durability(database_url: str) -> dict[str, Any]:
    """How durable the system database's commits are, read from the database itself."""
    if database_url.startswith("sqlite"):
        path = database_url.removeprefix("sqlite:///")
        db = sqlite3.connect(path)
        try:
            journal = db.execute("PRAGMA journal_mode").fetchone()[0]
            sync = db.execute("PRAGMA synchronous").fetchone()[0]
        finally:
            db.close()
        return {"database": "sqlite", "path": path, "journal_mode": journal,
                "synchronous": {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(sync, sync),
                "note": "DBOS sets neither pragma: SQLite's defaults (a rollback journal, fsync at every commit)"}
    import sqlalchemy as sa

    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            settings = {name: conn.execute(sa.text(f"SHOW {name}")).scalar()
                        for name in ("fsync", "synchronous_commit", "wal_level", "full_page_writes", "wal_sync_method",
                                     "server_version")}
    finally:
        engine.dispose()
    return {"database": "postgres", "url": database_url, **settings}


# -- the in-process engine ----------------------------------------------------------------------------------------


@dataclass
class InProcessDbos:
    """DBOS in this process: ``run_turn`` runs one prompt as the workflow ``agent_turn``."""

    name: str
    database_url: str
    ledger: EffectLedger

    def record(self) -> dict[str, Any]:
        return {"engine": self.name, "dbos": dbos_version(), "workflow": WORKFLOW, "executor_id": "in-process",
                "retry": "DBOS step retries: interval * backoff ** attempt (no maximum interval; capped at 1 h)",
                "durability": durability(self.database_url)}

    async def run_turn(self, config: AgentConfig, prompt: str, run_id: str, workspace: str | None = None
                       ) -> dict[str, Any]:
        """The run ``run_id`` to its result (``steps.turn_result``); the same id again returns the same run."""
        with SetWorkflowID(run_id):
            handle = await DBOS.start_workflow_async(agent_turn, run_input(config, prompt, workspace))
        return await handle.get_result()

    async def noop_steps(self, n: int) -> list[float]:
        """The time of each of ``n`` no-op steps of one workflow (ms)."""
        with SetWorkflowID(f"noop-steps-{uuid.uuid4().hex[:12]}"):
            handle = await DBOS.start_workflow_async(noop_steps, n)
        return await handle.get_result()

    async def steps(self, run_id: str) -> list[dict[str, Any]]:
        """The run's recorded steps, as DBOS lists them."""
        return await DBOS.list_workflow_steps_async(run_id)

    @property
    def banner(self) -> str:
        """What ``dah demo`` says first (``testbed.engines.base.Session``)."""
        return (f"durable-agent-harness demo: the agent loop on DBOS Transact ({self.name}: each model and tool call "
                f"a step)\nSystem database: {self.database_url}")

    async def describe_run(self, run_id: str) -> list[str]:
        """Where the run is, then its steps as DBOS recorded them (``dah run``)."""
        lines = [f"run id:      {run_id} (DBOS workflow; system database {self.database_url})"]
        for step in await self.steps(run_id):
            took = (step["completed_at_epoch_ms"] or 0) - (step["started_at_epoch_ms"] or 0)
            status = "error" if step["error"] is not None else "ok"
            lines.append(f"  ├─ step {step['function_id']:<3} {step['function_name']:<28} {status:<6} {took:8.0f} ms")
        return lines


def dbos_version() -> str:
    from importlib.metadata import version

    return version("dbos")


@contextlib.asynccontextmanager
async def engine(state_dir: Path, model_url: str, *, database: str = "sqlite", ledger: EffectLedger
                 ) -> AsyncIterator[InProcessDbos]:
    """DBOS launched in this process on a system database under ``state_dir``: ``database`` "sqlite" (a file) or
    "postgres" (a PostgreSQL server started here, ``testbed.engines.dbos.postgres``, stopped on exit). ``ledger``: the open effect
    ledger the steps record in."""
    from agent.worker import WorkerSettings

    if database not in ("sqlite", "postgres"):
        raise ValueError(f"database={database!r}: use 'sqlite' or 'postgres'")
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    settings = WorkerSettings.in_state_dir(state_dir)
    async with contextlib.AsyncExitStack() as exits:
        if database == "postgres":
            from testbed.engines.dbos.postgres import PostgresServer

            server = PostgresServer(state_dir / "postgres", log_dir=state_dir / "logs")
            await asyncio.to_thread(exits.enter_context, server)
            url = server.url
        else:
            url = sqlite_url(state_dir / SQLITE_FILE)
        configure(StepResources(ledger=ledger, sandbox_root=settings.sandbox_root, model_base_url=model_url,
                                worker="in-process"))
        await exits.enter_async_context(launched(url, "in-process", queue=False, log_level="ERROR"))
        yield InProcessDbos(name="dbos" if database == "sqlite" else f"dbos-{database}", database_url=url, ledger=ledger)


# -- the client ---------------------------------------------------------------------------------------------------

QUEUED, DONE, FAILED = "queued", "done", "failed"
_FAILED = ("ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED")


class DbosClient:
    """Submits runs to the workers' queue and reads them back (DBOS's ``DBOSClient``: the system database only)."""

    def __init__(self, database_url: str) -> None:
        # DBOS's client retries a lost database itself and says so at WARNING on every try (a database restart
        # under chaos): the driver records what each operation saw, so only DBOS's errors are shown.
        logging.getLogger("dbos").setLevel(logging.ERROR)
        self.client = DBOSClient(system_database_url=database_url, application_name=APP)

    def close(self) -> None:
        self.client.destroy()

    async def submit(self, run_id: str, config: AgentConfig, prompt: str, workspace: str | None = None) -> None:
        """Enqueue the run ``run_id`` (idempotent: an id already there is left as it is)."""
        await self.client.enqueue_async({"workflow_name": WORKFLOW, "queue_name": QUEUE, "workflow_id": run_id},
                                        run_input(config, prompt, workspace))

    async def outcome(self, run_id: str) -> tuple[str, Any, str | None] | None:
        """(QUEUED / DONE / FAILED, result, error), or None if there is no such run."""
        try:
            status = await (await self.client.retrieve_workflow_async(run_id)).get_status()
        except DBOSNonExistentWorkflowError:
            return None
        if status.status == "SUCCESS":
            return DONE, status.output, None
        if status.status in _FAILED:
            return FAILED, None, f"{status.status}: {status.error}"
        return QUEUED, None, None

    async def step_log(self, run_ids: list[str]) -> list[dict[str, Any]]:
        """Each run's status and the steps DBOS recorded for it (ids, names, errors, times; not the outputs)."""
        out = []
        for run_id in run_ids:
            try:
                status = await (await self.client.retrieve_workflow_async(run_id)).get_status()
            except DBOSNonExistentWorkflowError:
                continue
            steps_ = await self.client.list_workflow_steps_async(run_id)
            out.append({"workflow_id": run_id, "status": status.status, "executor_id": status.executor_id,
                        "steps": [{"function_id": s["function_id"], "function_name": s["function_name"],
                                   "error": None if s["error"] is None else str(s["error"]),
                                   "started_at_epoch_ms": s["started_at_epoch_ms"],
                                   "completed_at_epoch_ms": s["completed_at_epoch_ms"]} for s in steps_]})
        return out

    async def wait(self, run_id: str, timeout_s: float, poll_s: float = 0.05) -> dict[str, Any]:
        """The run's result; ``RuntimeError`` if it failed, ``TimeoutError`` if it is still running after
        ``timeout_s``."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            out = await self.outcome(run_id)
            if out is None:
                raise KeyError(f"run {run_id!r} was never submitted")
            if out[0] == DONE:
                return out[1]
            if out[0] == FAILED:
                raise RuntimeError(f"run {run_id!r} failed: {out[2]}")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"run {run_id!r} did not finish within {timeout_s:g} s")
            await asyncio.sleep(poll_s)


# -- the worker process -------------------------------------------------------------------------------------------


def _claim_executor(state_dir: Path, executor_id: str) -> Any:
    """An exclusive lock on ``STATE_DIR/dbos-executors/<executor id>.lock``, held while this process lives (the OS
    drops it when the process dies, even by SIGKILL): a second live worker with the same executor id would recover
    (re-enqueue) the first one's running workflows and run them again. Raises SystemExit naming the holder."""
    locks = state_dir / "dbos-executors"
    locks.mkdir(parents=True, exist_ok=True)
    handle = open(locks / f"{executor_id}.lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        raise SystemExit(f"error: executor id {executor_id!r} is held by a live worker ({handle.read().strip()}); "
                         "give this worker another --executor-id") from None
    handle.truncate(0)
    handle.write(f"pid {os.getpid()}")
    handle.flush()
    return handle


async def _worker(args: argparse.Namespace) -> int:
    from agent import llm
    from agent.worker import WorkerSettings

    lock = _claim_executor(args.state_dir, args.executor_id)
    stop = asyncio.Event()
    running = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        running.add_signal_handler(sig, stop.set)
    settings = WorkerSettings.in_state_dir(args.state_dir)
    try:
        # The ledger carries the in-agent faults the harness asks for in this process's environment (crash points).
        with EffectLedger(settings.resolved_ledger_path) as ledger:
            configure(StepResources(ledger=ledger, sandbox_root=settings.sandbox_root,
                                    model_base_url=args.model_base_url, worker=args.identity))
            llm.preload_in_background()  # LiteLLM's import takes seconds: not inside the first model step
            async with launched(args.database_url, args.executor_id, queue=True):
                print(f"{READY} identity={args.identity} executor_id={args.executor_id} "
                      f"database={args.database_url} model={args.model_base_url}", flush=True)
                await llm.wait_loaded()
                print(WARM, flush=True)  # supervisors may wait for this before sending load
                await stop.wait()
    finally:
        lock.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testbed.engines.dbos.agent",
                                     description="The reference agent on DBOS Transact.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = sub.add_parser("worker", help="take runs from the DBOS queue until SIGTERM/Ctrl-C")
    p.add_argument("--database-url", required=True,
                   help="the DBOS system database: sqlite:///PATH or postgresql://USER@HOST:PORT/DB")
    p.add_argument("--state-dir", type=Path, default=Path(".dah"),
                   help="tool workspaces and the effect ledger live in STATE_DIR/sandbox (default .dah)")
    p.add_argument("--identity", required=True, help="this process's identity, recorded in the effect ledger")
    p.add_argument("--executor-id", required=True,
                   help="the DBOS executor id: stable across restarts of one worker (its PENDING runs are recovered "
                        "by the next process with this id), never shared by two live workers")
    p.add_argument("--model-base-url", required=True,
                   help="the scripted model server's URL, e.g. http://127.0.0.1:PORT/v1 (dah server starts one)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(_worker(args))
    except KeyboardInterrupt:
        return 130
