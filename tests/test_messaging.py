"""A message is not dropped when its update gets no answer: it is re-sent under the same update id
(agent.messaging), and a re-send is never a second turn, within a run or across continue-as-new."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

from agent.contracts import AgentConfig, AgentInput
from agent import messaging
from agent.messaging import MessageNotDelivered, send_message
from agent.worker import build_worker
from agent.workflow import AgentWorkflow
from testbed.stack import Stack
from testbed.engines.temporal.cluster import start_conversation
from tests.events import HANG_S, wait_for_async


async def test_a_message_sent_before_any_worker_polls_is_answered_once(stack: Stack) -> None:
    queue = f"late-{uuid.uuid4().hex[:8]}"
    handle = await stack.client.start_workflow(AgentWorkflow.run, AgentInput(config=AgentConfig(model="scripted")),
                                               id=f"late-{uuid.uuid4().hex[:8]}", task_queue=queue)
    retries: list[int] = []
    sending = asyncio.create_task(send_message(handle, "What is 6 * 7?", "m-1", deadline_s=HANG_S,
                                               try_timeout_s=1.0, on_retry=lambda n, _err: retries.append(n)))

    async def re_sent() -> bool:
        return bool(retries)

    await wait_for_async(re_sent, "the unanswered update's re-send")
    assert not sending.done(), "nothing can answer yet: no worker polls this task queue"
    async with build_worker(stack.client, dataclasses.replace(stack.settings, task_queue=queue), stack.ledger):
        got = await sending
        assert got.attempts >= 2 and got.reply.text == "6 * 7 = 42"
        again = await send_message(handle, "What is 6 * 7?", "m-1")  # a client that never saw the reply
        assert (again.attempts, again.reply.turn, again.reply.text) == (1, got.reply.turn, got.reply.text)
        await handle.signal(AgentWorkflow.end_chat)
        assert (await handle.result()).turns == 1


async def test_a_try_that_ran_out_of_time_is_re_sent_at_once_when_asked(stack: Stack, monkeypatch) -> None:
    # No worker polls: every try runs out of time. The pause after a try is made 600 s long here, so the client
    # that pauses re-sends once (then waits) and the one told not to re-sends try after try: counts of re-sends,
    # not a measured gap, tell them apart.
    monkeypatch.setattr(messaging, "RETRY_PAUSE_S", (600.0, 600.0))
    queue = f"idle-{uuid.uuid4().hex[:8]}"
    resent: dict[bool, list[int]] = {True: [], False: []}
    sends = []
    for pause in (True, False):
        handle = await stack.client.start_workflow(AgentWorkflow.run, AgentInput(config=AgentConfig(model="scripted")),
                                                   id=f"idle-{uuid.uuid4().hex[:8]}", task_queue=queue)
        sends.append(asyncio.create_task(messaging.send_message(
            handle, "What is 6 * 7?", "m-1", deadline_s=600, try_timeout_s=1.0, pause_after_timeout=pause,
            on_retry=lambda n, _err, pause=pause: resent[pause].append(n))))

    async def both_re_sent() -> bool:  # a try lasts 1-3 s on an idle machine
        return bool(resent[True]) and len(resent[False]) >= 2

    await wait_for_async(both_re_sent, "a re-send by the pausing client and two by the other")
    assert not any(s.done() for s in sends)
    for s in sends:
        s.cancel()
    assert resent[True] == [2], resent  # one re-send, then the 600 s pause
    assert len(resent[False]) >= 2, resent  # the next try at once, each time


def test_each_try_that_ran_out_of_time_doubles_the_next_up_to_eight_times_the_first() -> None:
    from harness.chat_driver import next_try_s

    assert [next_try_s(2.0, k) for k in range(6)] == [2.0, 4.0, 8.0, 16.0, 16.0, 16.0]


async def test_a_re_send_after_continue_as_new_gets_the_earlier_reply(stack: Stack) -> None:
    cfg = AgentConfig(model="scripted", max_history_events=10)  # continue-as-new after every turn
    handle = await start_conversation(stack, cfg)
    first = await send_message(handle, "What is 6 * 7?", "m-1")
    async def continued_as_new() -> bool:
        return (await handle.describe()).run_id != handle.result_run_id

    await wait_for_async(continued_as_new, "the conversation's next run (continue-as-new)")
    again = await send_message(handle, "What is 6 * 7?", "m-1")
    assert (again.reply.turn, again.reply.text) == (first.reply.turn, first.reply.text)
    await handle.signal(AgentWorkflow.end_chat)
    result = await handle.result()
    assert result.turns == 1 and result.run_index >= 1


async def test_a_closed_conversation_ends_the_re_sending(stack: Stack) -> None:
    handle = await start_conversation(stack, AgentConfig(model="scripted"))
    await handle.signal(AgentWorkflow.end_chat)
    await handle.result()
    try:
        await send_message(handle, "What is 6 * 7?", "m-late", deadline_s=30, try_timeout_s=1.0)
    except MessageNotDelivered as exc:
        assert exc.closed and exc.attempts == 1
    else:
        raise AssertionError("a message to a closed conversation cannot be answered")


def test_only_an_attempt_old_enough_to_have_timed_out_asks_the_server_whether_it_is_stale() -> None:
    import datetime as dt

    from temporalio import activity
    from temporalio.testing import ActivityEnvironment

    from agent.activities import may_be_stale

    started = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)

    def info(heartbeat_s: float | None, start_to_close_s: float | None, local: bool = False) -> activity.Info:
        td = (lambda s: dt.timedelta(seconds=s) if s else None)  # noqa: E731
        return dataclasses.replace(ActivityEnvironment.default_info(), heartbeat_timeout=td(heartbeat_s),
                                   start_to_close_timeout=td(start_to_close_s), started_time=started, is_local=local)

    at = lambda s: started + dt.timedelta(seconds=s)  # noqa: E731
    assert not may_be_stale(info(3.0, 10.0), at(0.2))  # fresh: the server cannot have timed it out
    assert may_be_stale(info(3.0, 10.0), at(1.5))  # half the heartbeat timeout: ask
    assert may_be_stale(info(3.0, 10.0), at(7.0))  # a worker paused after it got the task: ask
    assert may_be_stale(info(3.0, 10.0), at(-2.0))  # a worker clock behind the server's: ask
    assert not may_be_stale(info(None, 10.0), at(4.0)) and may_be_stale(info(None, 10.0), at(5.0))
    assert may_be_stale(info(None, None), at(0.0))  # no timeout to reason with: ask
    assert not may_be_stale(info(3.0, 10.0, local=True), at(7.0))
