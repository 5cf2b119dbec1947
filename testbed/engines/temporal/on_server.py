"""The reference agent on a Temporal server this process already runs, with an in-process worker polling it
(``make_engine("temporal", on_server=...)``): how the benchmarks' engines section runs Temporal through the engine,
on the suite's tuned server (``benchmarks.sections.LocalServer``) that its other sections share."""

from __future__ import annotations

import contextlib
import time
import uuid
from dataclasses import dataclass
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from agent.contracts import AgentConfig, AgentInput
from agent.workflow import AgentWorkflow
from testbed.engines import SessionSpec
from testbed.engines.base import Session
from testbed.engines.checkpoint.agent_task import NOOP_TASK
from testbed.engines.checkpoint.temporal_adapter import DurableTaskInput, DurableTaskWorkflow
from testbed.engines.temporal.engine import ReferenceOnTemporal


@dataclass
class ReferenceOnServer(ReferenceOnTemporal):
    #: the running server: ``client``, ``task_queue()`` (its in-process worker's), ``profile`` ("tuned", "stock",
    #: "external") and ``server`` (the embedded one; None: a cluster)
    on_server: Any = None

    def in_process(self, spec: SessionSpec) -> contextlib.AbstractAsyncContextManager[ServerSession]:
        """A session on the running server (its worker has its own state dir, model and ledger)."""
        return contextlib.nullcontext(ServerSession(self.on_server))


@dataclass
class ServerSession(Session):
    """Each prompt one ``AgentWorkflow`` run on the server's worker."""

    local: Any  # ReferenceOnServer.on_server

    def record(self) -> dict[str, Any]:
        embedded = self.local.server is not None
        return {"server": f"the embedded dev server ({self.local.profile} profile)" if embedded else
                          "an external cluster",
                "persistence": "SQLite file (--db-filename); its connection settings are the server's own and "
                               "not readable from outside it" if embedded else "the cluster's",
                "worker": "in-process, eager activities, sandboxed workflow"}

    banner = "the reference agent's workflow on a Temporal server this process runs"

    async def run_turn(self, config: AgentConfig, prompt: str, run_id: str) -> dict[str, Any]:
        result = await self.local.client.execute_workflow(AgentWorkflow.run, AgentInput(config=config, prompt=prompt),
                                                          id=run_id, task_queue=self.local.task_queue())
        return {"reply": result.reply or ""}

    async def noop_steps(self, n: int) -> list[float]:
        return (await noop_steps(self.local.client, self.local.task_queue(), n))[0]

    async def describe_run(self, run_id: str) -> list[str]:
        return [f"run id:      {run_id} (workflow on {self.record()['server']})"]


async def noop_steps(client: Client, task_queue: str, n: int) -> tuple[list[float], float]:
    """``n`` no-op steps of one ``DurableTaskWorkflow`` (an activity each): the time between consecutive steps'
    scheduling in its event history, and the workflow's wall time (ms)."""
    wid = f"bench-noop-steps-{uuid.uuid4().hex[:8]}"
    manifest = {"project_id": "bench", "task": {"id": "noop-steps"}, "input": {"n": n}}
    t0 = time.perf_counter()
    await client.execute_workflow(DurableTaskWorkflow.run, DurableTaskInput(NOOP_TASK, wid, manifest), id=wid,
                                  task_queue=task_queue)
    wall_ms = (time.perf_counter() - t0) * 1000
    scheduled = [event.event_time.ToDatetime().timestamp()
                 async for event in client.get_workflow_handle(wid).fetch_history_events()
                 if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    return [(b - a) * 1000 for a, b in zip(scheduled, scheduled[1:])], wall_ms
