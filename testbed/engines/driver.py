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
from agent.tools import TOOL_SETS
from agent.workflow import AgentWorkflow
from harness.operations import FAIL, INFO, OK, History


@dataclass
class Workload:
    conversations: int = 3
    messages: int = 4  # per conversation, at least: each keeps sending until the load is stopped (at heal)
    until_heal: bool = True  # False: exactly `messages` each, then stop (the load may end before the faults)
    think_s: float = 0.4  # mean pause between a reply and the next message (seeded)
    op_timeout_s: float = 60.0  # past this a send is recorded as info
    # One try of a send: past it the message is re-sent under the same update id (an update lost with the workflow
    # task that carried it, on a killed worker, is answered only once re-sent; a live one is simply re-attached to).
    try_timeout_s: float = 2.0
    # A try that ran out of time is re-sent at once (True), or after agent.messaging's pause (0.5 s, growing), as
    # after an error. At once, the client hears of a reply that came just after its try ended without waiting out
    # the pause (the re-send re-attaches to the update).
    resend_at_once: bool = True
    append_ratio: float = 0.4
    flaky_ratio: float = 0.0  # messages whose tool fails transiently twice (Temporal retries it)
    repair_ratio: float = 0.0  # messages whose first tool call is refused as invalid (the model repairs it)


@dataclass
class PlannedMessage:
    text: str
    expect: str  # the exact reply
    kind: str  # "calc" | "append"
    path: str | None = None
    content: str | None = None
    match: str = "exact"  # "prefix": the reply starts with ``expect`` (the rest may vary, e.g. an attempt number)


def plan_message(conversation: str, i: int, rng: random.Random, append_ratio: float, flaky_ratio: float = 0.0,
                 repair_ratio: float = 0.0) -> PlannedMessage:
    """Message ``i`` of a conversation: arithmetic, an append to the conversation's own file, a call to a
    flaky service (retryable tool errors), or arithmetic written so the first tool call is invalid."""
    path = f"log-{conversation.rsplit('-', 1)[-1]}.txt"
    draw = rng.random()
    if draw < flaky_ratio:
        key = f"k{i}-{rng.randrange(10**4):04d}"
        # Usually "on attempt 3"; a slow or broken link can make it later, which is still correct.
        return PlannedMessage(f"check the flaky service for {key}", f"flaky_service answered '{key}' on attempt ",
                              "flaky", match="prefix")
    if draw < flaky_ratio + repair_ratio:
        a, b = rng.randrange(2, 999), rng.randrange(2, 99)
        return PlannedMessage(f"compute {a} x {b} exactly", f"{a} * {b} = {a * b}", "repair")
    if rng.random() < append_ratio:
        token = f"line-{i}-{rng.randrange(10**6):06d};"
        return PlannedMessage(f"append {token} to {path}", f"appended {len(token)} bytes to {path}", "append", path,
                              token)
    a, b = rng.randrange(2, 999), rng.randrange(2, 99)
    return PlannedMessage(f"What is {a} * {b}?", f"{a} * {b} = {a * b}", "calc")


@dataclass(frozen=True)
class Timeouts:
    """How fast the agent notices a dead worker: what its activities, workflow tasks and workers are given."""

    name: str
    description: str
    workflow_task_timeout_s: float  # a workflow task started on a worker that died is retried after this
    sticky_timeout_s: float  # a task waits this long on a dead worker's sticky queue before any worker may take it
    # The activity policies of model calls and tools; None: the agent's own (agent.contracts) are kept.
    heartbeat_s: float | None = None  # model calls and tools heartbeat four times in this (at most every second)
    # The most the SDK holds an activity's heartbeats back (``dah worker --heartbeat-throttle``): the heartbeat
    # timeout minus this is the slack a busy worker has before a false timeout; half of it, on average, is how much
    # sooner than the heartbeat timeout the server notices a killed worker.
    heartbeat_throttle_s: float = 0.5
    initial_interval_s: float | None = None  # the first retry's backoff (doubling, up to maximum_interval_s)
    maximum_interval_s: float | None = None
    start_to_close_s: float | None = None


TIMEOUTS = {t.name: t for t in [
    Timeouts("fast", "tuned for recovery: heartbeat 0.4 s (held back at most 0.1 s), retry after 0.1 s, "
             "workflow task 1 s, sticky 0.1 s",
             workflow_task_timeout_s=1.0, sticky_timeout_s=0.1, heartbeat_s=0.4, heartbeat_throttle_s=0.1,
             initial_interval_s=0.1, maximum_interval_s=4.0, start_to_close_s=10.0),
    Timeouts("defaults", "the agent's and the SDK's defaults: heartbeat 20 s (tools 10 s), retry after 5 s "
             "(tools 2 s), workflow task 10 s, sticky 10 s",
             workflow_task_timeout_s=10.0, sticky_timeout_s=10.0),
    Timeouts("distinct", "four moderate settings, each a different length, so each part of a recovery shows whose "
             "it is: heartbeat 10 s, retry after 6 s, sticky 7 s, workflow task 8 s (tests/test_diagnosis.py "
             "checks the diagnoses against them)",
             workflow_task_timeout_s=8.0, sticky_timeout_s=7.0, heartbeat_s=10.0, initial_interval_s=6.0,
             maximum_interval_s=12.0, start_to_close_s=60.0),
]}
DEFAULT_TIMEOUTS = "fast"


def chaos_agent_config(timeouts: str = DEFAULT_TIMEOUTS) -> AgentConfig:
    """The agent configuration of a chaos run: the fault tools, and the timeouts of the ``timeouts`` profile
    (``defaults``: the agent's own, untouched)."""
    cfg = AgentConfig(model="scripted", tools=list(TOOL_SETS["faults"]))
    t = TIMEOUTS[timeouts]
    for policy in (cfg.planning, cfg.tool):
        for name in ("heartbeat_s", "initial_interval_s", "maximum_interval_s", "start_to_close_s"):
            if getattr(t, name) is not None:
                setattr(policy, name, getattr(t, name))
    return cfg


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
    client: Client
    history: History
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
