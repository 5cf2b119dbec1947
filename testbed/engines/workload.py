"""The load every engine's chaos run gets: the seeded messages (``Workload``, ``plan_message``) and the agent's
settings under each timeouts profile (``TIMEOUTS``, ``chaos_agent_config``)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from agent.contracts import AgentConfig
from agent.tools import TOOL_SETS


@dataclass
class Workload:
    conversations: int = 3
    messages: int = 4  # per conversation, at least: each keeps sending until the load is stopped (at heal)
    until_heal: bool = True  # False: exactly `messages` each, then stop (the load may end before the faults)
    think_s: float = 0.4  # mean pause between a reply and the next message (seeded)
    op_timeout_s: float = 60.0  # past this a send is recorded as info
    # The first try of a send (each try that runs out of time doubles the next, up to 8x: chat_driver.next_try_s):
    # past it the message is re-sent under the same update id (an update lost with the workflow task that carried
    # it, on a killed worker, is answered only once re-sent; a live one is simply re-attached to).
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
