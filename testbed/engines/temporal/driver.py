"""The reference agent's chat driver on Temporal: it starts conversations and sends messages.

Each conversation sends a seeded list of messages, one at a time, as
``send_message`` Updates: arithmetic (checked against the exact expected
reply) and appends to a per-conversation file (a non-idempotent side effect,
checked in the workspace and the effect ledger). Every call is recorded as
invoke then ok / fail / info. A timeout or a lost connection is not the end
of a message: it is re-sent under the same update id until it is answered
(``agent.messaging``; each re-send is a ``resend_message`` event); only a
message still unanswered at the deadline, or when its workflow has closed,
is ``info`` (it may or may not have been processed).
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowUpdateFailedError

from agent.contracts import AgentConfig, AgentInput
from agent.messaging import MessageNotDelivered, send_message
from agent.workflow import AgentWorkflow
from harness.operations import FAIL, INFO, OK, OperationLog
from testbed.engines.workload import (DEFAULT_TIMEOUTS, TIMEOUTS, PlannedMessage, Workload, chaos_agent_config,
                                     plan_message)


@dataclass
class Conversation:
    workflow_id: str
    planned: list[PlannedMessage]
    started: bool = False
    final_history: list[dict[str, Any]] | None = None
    final_status: str | None = None
    result: dict[str, Any] | None = None


@dataclass
class Driver:
    """The default driver of a target file (``harness.driver_api``): its fields are the driver API's keywords."""

    client: Client
    history: OperationLog  # the run's operation log, under the driver API's name for it
    task_queue: str
    workload: Workload
    seed: int
    config: AgentConfig = field(default_factory=chaos_agent_config)
    workflow_task_timeout_s: float = TIMEOUTS[DEFAULT_TIMEOUTS].workflow_task_timeout_s
    run_tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    conversations: list[Conversation] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = asyncio.Event()
        self._rngs: dict[str, random.Random] = {}
        for i in range(self.workload.conversations):
            wid = f"chaos-{self.run_tag}-{i}"
            self._rngs[wid] = random.Random(f"{self.seed}-messages-{i}")
            self.conversations.append(Conversation(wid, []))

    def stop(self) -> None:
        """No new messages after the ones in flight (the generator calls this at heal)."""
        self._stop.set()

    def _next_message(self, conv: Conversation) -> PlannedMessage | None:
        n = len(conv.planned)
        if n >= self.workload.messages and (self._stop.is_set() or not self.workload.until_heal):
            return None
        msg = plan_message(conv.workflow_id, n, self._rngs[conv.workflow_id], self.workload.append_ratio,
                           self.workload.flaky_ratio, self.workload.repair_ratio)
        conv.planned.append(msg)
        return msg

    @property
    def workflow_ids(self) -> list[str]:
        return [c.workflow_id for c in self.conversations]

    async def _messages(self, conv: Conversation, rng: random.Random) -> AsyncIterator[tuple[int, PlannedMessage]]:
        """The conversation's next messages, each after a seeded think time, until the load stops."""
        while True:
            await asyncio.sleep(rng.expovariate(1.0 / self.workload.think_s) if self.workload.think_s else 0)
            msg = self._next_message(conv)
            if msg is None:
                return
            yield len(conv.planned) - 1, msg

    async def run(self) -> None:
        """Drive every conversation through its messages, concurrently."""
        await asyncio.gather(*(self._drive(i, c) for i, c in enumerate(self.conversations)))

    async def _drive(self, i: int, conv: Conversation) -> None:
        process = f"client-{i}"
        rng = random.Random(f"{self.seed}-{i}")
        op = self.history.invoke(process, "start_conversation", {"conversation": conv.workflow_id})
        try:
            await self.client.start_workflow(AgentWorkflow.run, AgentInput(config=self.config), id=conv.workflow_id,
                                             task_queue=self.task_queue,
                                             task_timeout=timedelta(seconds=self.workflow_task_timeout_s))
            conv.started = True
            self.history.complete(op, OK)
        except Exception as exc:  # nothing else can proceed on this conversation
            self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")
            return
        handle = self.client.get_workflow_handle(conv.workflow_id)
        async for n, msg in self._messages(conv, rng):
            op = self.history.invoke(process, "send_message", {"conversation": conv.workflow_id, "n": n,
                                                               "text": msg.text, "expect": msg.expect, "match": msg.match})

            def resent(attempt: int, error: str, n: int = n) -> None:
                self.history.event(process, "resend_message", {"conversation": conv.workflow_id, "n": n,
                                                               "attempt": attempt, "after": error})

            try:
                # The same update id until it is answered (agent.messaging): a lost update is sent again, and
                # Temporal (and the workflow, across continue-as-new) keeps a re-send from becoming a second turn.
                got = await send_message(handle, msg.text, f"msg-{n}", deadline_s=self.workload.op_timeout_s,
                                         try_timeout_s=self.workload.try_timeout_s,
                                         pause_after_timeout=not self.workload.resend_at_once,
                                         on_retry=resent)
                self.history.complete(op, OK, {"reply": got.reply.text, "turn": got.reply.turn,
                                               "attempts": got.attempts})
            except WorkflowUpdateFailedError as exc:
                self.history.complete(op, FAIL, error=f"update failed: {exc.cause}")
            except MessageNotDelivered as exc:
                self.history.complete(op, INFO, {"attempts": exc.attempts, "closed": exc.closed}, error=str(exc))
            except Exception as exc:  # anything else: the message may or may not have been processed
                self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")

    async def submit(self, run_id: str, prompt: str, workspace: str) -> None:
        """Start ``prompt`` as a run of its own, as the one-shot engines' drivers do (``oneshot.OneShotDriver``);
        its workspace is its workflow id's, so ``workspace`` must be ``run_id``."""
        assert workspace == run_id, "a workflow's workspace is its id's"
        await self.client.start_workflow(AgentWorkflow.run, AgentInput(config=self.config, prompt=prompt), id=run_id,
                                         task_queue=self.task_queue,
                                         task_timeout=timedelta(seconds=self.workflow_task_timeout_s))

    async def wait(self, run_id: str, timeout_s: float) -> dict[str, Any]:
        """The result of a run ``submit`` started (``AgentResult`` as a dict); TimeoutError past ``timeout_s``."""
        handle = self.client.get_workflow_handle_for(AgentWorkflow.run, run_id)
        return asdict(await asyncio.wait_for(handle.result(), timeout_s))

    async def finish(self, timeout_s: float = 60.0) -> None:
        """End every conversation and read its final state from the server (the final check's data)."""
        await asyncio.gather(*(self._finish(i, c, timeout_s) for i, c in enumerate(self.conversations) if c.started))

    async def _finish(self, i: int, conv: Conversation, timeout_s: float) -> None:
        """``end_chat``, then the result and status as the server holds them (no worker needed: the lost check
        reads the conversation from the saved event history); the Query of the conversation, which needs a live
        worker, is kept only as a cross-check of what the model saw, and its failure is recorded, not fatal."""
        process = f"client-{i}"
        handle = self.client.get_workflow_handle(conv.workflow_id)
        op = self.history.invoke(process, "end_chat", {"conversation": conv.workflow_id})
        try:
            await handle.signal(AgentWorkflow.end_chat, rpc_timeout=timedelta(seconds=10))
            result = await asyncio.wait_for(handle.result(), timeout=timeout_s)
            conv.result = asdict(result) if hasattr(result, "__dataclass_fields__") else result
            self.history.complete(op, OK, conv.result)
        except Exception as exc:
            self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")
        op = self.history.invoke(process, "read_conversation", {"conversation": conv.workflow_id})
        try:
            conv.final_status = (await handle.describe(rpc_timeout=timedelta(seconds=10))).status.name
            self.history.complete(op, OK, {"status": conv.final_status})
        except Exception as exc:
            self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")
        op = self.history.invoke(process, "query_conversation", {"conversation": conv.workflow_id})
        try:
            conv.final_history = await handle.query(AgentWorkflow.get_history, rpc_timeout=timedelta(seconds=10))
            self.history.complete(op, OK, {"messages": len(conv.final_history)})
        except Exception as exc:
            self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": asdict(self.workload),
            "config": asdict(self.config),
            "conversations": [asdict(c) for c in self.conversations],
        }
