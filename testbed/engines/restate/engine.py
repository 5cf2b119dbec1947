"""The reference agent on Restate: the same load, faults and checkers, with a Restate server holding the journal.

    python -m chaos run kill_mid_turn model_outage --durability restate

The cluster is a ``restate-server`` (``testbed.engines.restate.server``, its state in ``<run>/state/restate``, exposed as
``Stack.server`` so ``restart_server`` SIGKILLs it and starts it again from that base dir), the scripted model
server, and one supervised endpoint process (``dah worker --durability restate``) serving the
``DahAgent`` service on a fixed port behind the stack's server proxy (``StackSpec.server_proxy_to``): the
deployment registered with the server is the proxy's address. Each message is one invocation of ``DahAgent/run`` sent through the ingress with the run id as
its idempotency key (``RestateDriver``).

One endpoint, whatever the scenario's ``cluster.workers``: Restate sends every new invocation of a service to its
latest deployment, so a second endpoint registered for ``DahAgent`` would receive nothing but the invocations
pinned to it. An invocation is pinned to its deployment's URI, which is why the endpoint restarts on the same
port (behind the same proxy): after a kill, the server retries the invocation there (its default retry policy,
capped at 2 s here: ``testbed.engines.restate.server.RETRY_POLICY``) and replays its journal; completed ``ctx.run``
actions are not run again.

Faults, as on the other engines: ``kill_mid_turn`` (SIGKILL the endpoint while the effect ledger shows a model
call in flight on it), ``model_outage`` (the model refuses requests), ``crash_after_effect`` (the endpoint
SIGKILLs itself right after a tool's side effect, before its ``ctx.run`` completes), ``server_restart`` (SIGKILL
``restate-server`` and start it from its base dir) and ``partition_temporal_blackhole`` / ``_reset``, whose
"temporal" link is here the server <-> endpoint link (the proxy in front of the endpoint: Restate's server calls
the endpoint, not the other way round).

What the checkers see: ``lost`` reads each conversation's runs back through the ingress (a run's output, in
order); ``effects`` and ``injection_evidence`` read the effect ledger and the nemeses' records, as on every
backend; ``stats`` the operation log. ``temporal_history``, ``workflow_tasks`` and ``replay`` read Temporal event
histories, which Restate does not have: ``not_applicable``. Restate's own journal is read at the end
(``save``): ``restate_journal.json`` in the run directory says when the journal completed each action, and the
``restate_journal`` checker holds it against the ledger (no execution of an action may start after its completion:
a journaled action is replayed, never run again).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from harness import SAFE_PATH
from harness.operations import OperationLog
from harness.rundir import RESTATE_JOURNAL, RunDir
from testbed.engines import SessionSpec
from testbed.engines.base import Engine, Scenario, without_event_histories
from testbed.engines.checkpoint.engine import NO_EVENT_HISTORIES
from testbed.engines.oneshot import OneShotDriver, RunFailedError, running_from_ledger
from testbed.engines.restate.agent import NAME, InProcessRestate, engine, request_body
from testbed.engines.restate.client import RestateClient, RestateRunError
from testbed.engines.byo.target import REFERENCE, Target
from testbed.model_server import LatencyModel
from testbed.processes import free_port
from testbed.engines.restate.server import RestateServer, settings
from testbed.stack import Endpoints, Stack, StackSpec
from testbed.worker_process import WorkerProcess

#: the endpoint process (its ``--port`` is added per run: fixed for the run, see the module docstring)
RESTATE_ENDPOINT = ("{python}", SAFE_PATH, "-m", "testbed", "worker", "--durability", "restate",
                    "--state-dir", "{state_dir}", "--identity", "{identity}", "--model-base-url", "{model_url}")
RESTATE_TARGET = replace(REFERENCE, name="reference-agent (restate)", worker=RESTATE_ENDPOINT,
                         driver="testbed.engines.restate.engine:RestateDriver")
NO_HISTORIES = NO_EVENT_HISTORIES.replace("the checkpoint engine", "Restate").replace(
    "effects and injection_evidence", "effects, injection_evidence and restate_journal, its journal's own check")


@dataclass
class RestateEngine(Engine):
    name: str = "restate"
    target: Target = field(default_factory=lambda: RESTATE_TARGET)
    not_applicable: dict[str, str] = field(default_factory=lambda: without_event_histories(NO_HISTORIES))
    scenarios: tuple[str, ...] | None = ("kill_mid_turn", "model_outage", "crash_after_effect", "server_restart",
                                         "partition_model", "partition_temporal_blackhole",
                                         "partition_temporal_reset")

    def reproduce(self) -> dict[str, Any]:
        return {"--durability": "restate"}

    def record(self) -> dict[str, Any]:
        return {**super().record(), "temporal": None, "endpoints": 1,
                "endpoint_link": "the proxy in front of the endpoint is the 'temporal' link of partition nemeses",
                "restate_server": settings(RestateServer(Path(".")).config())}

    def stack_spec(self, scenario: Scenario, run: RunDir, seed: int, oplog: OperationLog, ui: bool) -> StackSpec:
        port = free_port("127.0.0.1")

        def endpoint(name: str, at: Endpoints) -> WorkerProcess:
            values = {"model_url": at.model_url, "state_dir": str(run.state)}
            return WorkerProcess((*self.target.worker, "--port", str(port)), values, identity_prefix=name,
                                 ready_line=self.target.ready_line, warm_line=self.target.warm_line,
                                 faults=scenario.cluster.faults, log_dir=run.logs,
                                 start_timeout_s=self.target.ready_timeout_s)

        # The server calls the endpoint: the stack's server proxy stands in front of the endpoint (the link the
        # partition nemeses cut), and the endpoint reaches the model through the stack's model proxy.
        return StackSpec(state_dir=run.state, logs_dir=run.logs, engine=self,
                         model_latency=LatencyModel.parse(scenario.cluster.model_latency), seed=seed,
                         worker_processes=1, make_worker=endpoint, oplog=oplog, ledger=True,
                         proxies=True, server_proxy_to=("127.0.0.1", port))

    def server(self, spec: StackSpec) -> RestateServer:
        """The ``restate-server``, its state in ``<state dir>/restate``."""
        return RestateServer(spec.state_dir / "restate", log_file=spec.logs / "restate.log")

    async def make_driver(self, stack: Stack, oplog: OperationLog, scenario: Scenario, seed: int) -> Any:
        """Register the endpoint (through the stack's server proxy: the endpoint link), then the driver."""
        assert stack.server_proxy is not None, "stack_spec asks for the proxy in front of the endpoint"
        await asyncio.to_thread(stack.server.register, f"http://{stack.server_proxy.address}")
        driver = RestateDriver(client=None, history=oplog, task_queue="", workload=scenario.workload, seed=seed,
                               ingress_url=stack.server.ingress_url)
        if scenario.planning_max_attempts:
            driver.config.planning.maximum_attempts = scenario.planning_max_attempts
        return driver

    running = running_from_ledger

    async def save(self, stack: Stack, run: RunDir, driver: Any) -> None:
        """When Restate's journal completed each action (``restate_journal.json``: what the ``restate_journal``
        checker holds against the ledger)."""
        try:
            report = await asyncio.to_thread(journal_completions, stack.server)
        except Exception as exc:  # the server is unreachable: the checker says unknown, with this
            report = {"error": f"{type(exc).__name__}: {exc}"}
        (run.path / RESTATE_JOURNAL).write_text(json.dumps(report, indent=2))


    def in_process(self, spec: SessionSpec) -> contextlib.AbstractAsyncContextManager[InProcessRestate]:
        """A Restate server and the endpoint in this process (``restate_agent.engine``); ``EngineUnavailable``
        without a restate-server binary."""
        if not spec.worker:
            raise ValueError("--no-worker: on --durability restate the endpoint runs in this process")
        return engine(spec.state_dir, spec.model_url or "", ledger=spec.ledger)

def journal_completions(server: RestateServer) -> dict[str, Any]:
    """Every ``ctx.run`` the journal shows, and when it completed each. The k-th Run command of an invocation is the
    action with ``activity_id`` k (the handler journals nothing but its actions); its completion is the Run
    notification carrying the command's ``completion_id``."""
    rows = server.query(
        "SELECT i.idempotency_key AS run_id, j.entry_type, j.entry_lite_json, j.appended_at FROM sys_journal j "
        "JOIN sys_invocation i ON j.id = i.id WHERE j.entry_type IN ('Command: Run', 'Notification: Run') "
        "ORDER BY i.idempotency_key, j.index")
    actions: dict[tuple[str, int], str] = {}  # (run id, completion id) -> activity id
    completions = []
    for row in rows:
        entry = json.loads(row["entry_lite_json"])
        if row["entry_type"] == "Command: Run":
            ordinal = sum(1 for run_id, _ in actions if run_id == row["run_id"])
            actions[(row["run_id"], entry["Command"]["Run"]["completion_id"])] = str(ordinal)
        else:
            activity = actions.get((row["run_id"], entry["Notification"]["id"]["CompletionId"]))
            if activity is not None:
                completions.append({"run_id": row["run_id"], "activity_id": activity,
                                    "completed_at": _epoch(row["appended_at"])})
    return {"engine_run_id": NAME, "actions_journaled": len(actions), "completions": completions}


def _epoch(value: Any) -> float:
    """The query API's timestamp (ISO 8601, UTC) as seconds since the epoch."""
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


@dataclass
class RestateDriver(OneShotDriver):
    """The chaos client on Restate: each message an invocation of ``DahAgent/run`` keyed by its run id."""

    engine: str = "restate"
    ingress_url: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        assert self.ingress_url, "RestateDriver needs ingress_url (the Restate server's ingress)"
        self.restate = RestateClient(self.ingress_url)

    async def submit(self, run_id: str, prompt: str, workspace: str) -> None:
        await self.restate.submit(run_id, request_body(self.config, prompt, run_id, workspace))

    async def wait(self, run_id: str, timeout_s: float) -> dict[str, Any]:
        try:
            return await self.restate.wait(run_id, timeout_s)
        except RestateRunError as exc:
            raise RunFailedError(str(exc)) from exc

    async def outcome(self, run_id: str) -> tuple[str, Any, str | None] | None:
        return await self.restate.outcome(run_id)

    async def close_client(self) -> None:
        await self.restate.close()
