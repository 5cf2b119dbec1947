"""Sending a message to a conversation without dropping it: the same update id, re-sent until it lands.

A ``send_message`` Update can end without an answer for reasons that say
nothing about the message: the RPC timed out, the connection broke, the
server restarted, or the server lost an admitted-but-not-yet-accepted update
when the workflow task carrying it timed out on a partitioned worker. Giving
up there drops the message. Sending it again under a *new* id may process it
twice. So ``send_message`` re-sends under the *same* update id: Temporal
deduplicates updates by id within a run, and the reference workflow carries
the ids (and replies) of the updates it answered into the next run at
continue-as-new, so a re-send that arrives after continue-as-new gets the
earlier reply instead of a second turn (``AgentWorkflow.send_message``).

A try that simply ran out of time is followed by one twice as long, up to
8 times the first (``harness.chat_driver.next_try_s``); an error (a broken
connection, a restarting server) starts over from the first length. A live
update is only re-attached to by a re-send, so a fixed try re-sends a slow
turn's update again and again: with many conversations on a busy machine a turn
can take many tries, and each re-send is an RPC and a recorded event (issue 44:
30 conversations x 20 messages on 2 busy cores made 3.8 re-sends a message;
with the growing try, 0.37 at 30 and 1.35 at 100). The
price: an update lost while a long try waits is re-sent at the end of that try.

It stops when the update completes (the reply), when it fails (the
workflow rejected or failed the turn: ``WorkflowUpdateFailedError``, a
conclusive answer), when the workflow has closed, or at the overall
deadline (``MessageNotDelivered``, which says how many tries were made and
what each ended with: the caller records that as indeterminate).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError

from agent.contracts import AgentReply, ChatMessage
from harness.chat_driver import next_try_s, ran_out_of_time, workflow_closed

#: one try's deadline: long enough for a turn through a short outage, short enough to re-send a lost update soon
TRY_TIMEOUT_S = 10.0
#: the pause between tries grows from the first to the last value
RETRY_PAUSE_S = (0.5, 2.0)


class MessageNotDelivered(Exception):
    """No reply: the deadline passed or the workflow closed; the message may or may not have been processed."""

    def __init__(self, reason: str, attempts: int, errors: list[str], closed: bool = False) -> None:
        super().__init__(f"{reason} after {attempts} tr{'y' if attempts == 1 else 'ies'}; last: "
                         f"{errors[-1] if errors else 'none'}")
        self.reason, self.attempts, self.errors, self.closed = reason, attempts, errors, closed


@dataclass
class Delivery:
    """A reply and how it was got."""

    reply: AgentReply
    attempts: int
    errors: list[str] = field(default_factory=list)  # what each earlier try ended with


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


async def send_message(handle: WorkflowHandle, text: str, update_id: str, *, deadline_s: float = 120.0,
                       try_timeout_s: float = TRY_TIMEOUT_S, pause_after_timeout: bool = True,
                       on_retry: Callable[[int, str], None] | None = None) -> Delivery:
    """Send ``text`` as the update ``update_id`` until it is answered; see the module docstring.

    ``on_retry(attempt, error)`` is called before each re-send (to record or show it). ``pause_after_timeout``
    False: a try that simply ran out of time is re-sent at once (the re-send re-attaches to the update if the server
    still has it, so the client hears of the reply as soon as it exists, and re-admits it if the server lost it);
    the pause is kept after errors (a broken connection, a restarting server)."""
    from agent.workflow import AgentWorkflow

    started = time.monotonic()
    errors: list[str] = []
    attempt = in_a_row = 0  # in_a_row: the tries just before this one that simply ran out of time
    while True:
        attempt += 1
        left = deadline_s - (time.monotonic() - started)
        this_try = max(0.5, min(next_try_s(try_timeout_s, in_a_row), left))
        call = asyncio.ensure_future(handle.execute_update(AgentWorkflow.send_message, ChatMessage(text),
                                                           id=update_id, rpc_timeout=timedelta(seconds=this_try)))
        call.add_done_callback(_retrieve)  # a try abandoned at the deadline must not log "never retrieved"
        try:
            reply = await asyncio.wait_for(call, timeout=this_try + 1.0)
            return Delivery(reply, attempt, errors)
        except WorkflowUpdateFailedError:
            raise  # the workflow's own answer: the turn was refused or failed
        except (asyncio.TimeoutError, RPCError, WorkflowUpdateRPCTimeoutOrCancelledError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
            timed_out = ran_out_of_time(exc)
            in_a_row = in_a_row + 1 if timed_out else 0
        if await workflow_closed(handle):
            raise MessageNotDelivered("the workflow has closed", attempt, errors, closed=True)
        if time.monotonic() - started >= deadline_s:
            raise MessageNotDelivered(f"no reply within {deadline_s:.0f}s", attempt, errors)
        if on_retry is not None:
            on_retry(attempt + 1, errors[-1])
        if timed_out and not pause_after_timeout:
            continue
        low, high = RETRY_PAUSE_S
        await asyncio.sleep(min(high, low * attempt))
