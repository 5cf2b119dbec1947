"""Automated twins of MANUAL_TESTS.md: the reference's three fault scenarios,
with real worker processes killed by pid, on the real dev server.

1. Infrastructure fault: SIGKILL the worker mid-turn; a new worker finishes
   the turn; the completed model call is not made again.
2. Model API unavailable: 503 for the first calls; Temporal's backoff retries
   the planning activity until the reply arrives.
3. Logic bug and hot-fix: a worker build whose tool raises on every attempt;
   the run stays Running; a fixed worker finishes it reusing the stored plan.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from agent.contracts import AgentConfig, AgentInput, ChatMessage
from harness.event_history import fetch_run
from harness.faults import NO_FAULTS, AgentFaults
from testbed.faults.model import FaultRule
from testbed.model_server import LatencyModel, ScriptedModelServer
from testbed.scripted_routes import respond
from testbed.stack import Stack
from testbed.worker_process import reference_worker
from agent.workflow import AgentWorkflow
from testbed.engines.temporal.cluster import run_prompt, start_conversation
from tests.events import HANG_S, wait_for_async


async def _pending(stack: Stack, workflow_id: str) -> list:
    desc = await stack.client.get_workflow_handle(workflow_id).describe()
    return list(desc.raw_description.pending_activities)


async def test_worker_sigkill_mid_turn_loses_nothing_and_repeats_no_completed_model_call(
        stack: Stack, tmp_path) -> None:
    task_queue = f"kill-{uuid.uuid4().hex[:8]}"
    # A slow model, so the kill lands while a planning call is in flight.
    with ScriptedModelServer(respond, latency=LatencyModel.parse("fixed:1500")) as model:
        with reference_worker(stack.server.address, task_queue, model.url, state_dir=tmp_path) as worker:
            cfg = AgentConfig(model="scripted")
            cfg.planning.heartbeat_s = 2.0  # a dead worker's model call is retried after 2 s, not 60
            cfg.planning.initial_interval_s = 0.2
            workflow_id = f"kill-{uuid.uuid4().hex[:8]}"
            handle = await stack.client.start_workflow(AgentWorkflow.run, AgentInput(config=cfg), id=workflow_id,
                                                       task_queue=task_queue)
            update = asyncio.create_task(
                handle.execute_update(AgentWorkflow.send_message, ChatMessage("What is 25 * 4?")))

            async def second_plan_running() -> bool:
                # The model has received the second call (it answers after 1.5 s): the kill lands mid-call.
                return model.stats()["by_run"].get(workflow_id, 0) == 2

            await wait_for_async(second_plan_running, "the second model call in flight")
            worker.kill()
            assert not update.done()
            worker.start()  # a new process, identity worker-2
            reply = await asyncio.wait_for(update, timeout=HANG_S)
            assert reply.text == "25 * 4 = 100"
            await handle.signal(AgentWorkflow.end_chat)
            await handle.result()
        run = await fetch_run(stack.client, workflow_id)
        shape = [(a.activity_type, a.attempts, a.outcome) for a in run.activities]
        assert shape == [("plan_next_action", 1, "completed"), ("calculator", 1, "completed"),
                         ("plan_next_action", 2, "completed")]
        assert run.activities[-1].worker == "worker-2"
        # Three HTTP calls in all: the first plan once (from history after the kill), the second twice.
        assert model.stats()["by_run"][workflow_id] == 3


async def test_model_outage_is_retried_with_backoff_until_the_reply_arrives(stack: Stack, model_faults) -> None:
    model_faults([FaultRule(mode="status", status=503, first_n=3, scenario="direct")])
    cfg = AgentConfig(model="scripted:direct")
    cfg.planning.initial_interval_s = 0.2
    started = time.monotonic()
    result, handle = await run_prompt(stack, cfg, "What is 25 * 4?")
    elapsed = time.monotonic() - started
    assert result.reply == "25 * 4 = 100"
    run = await fetch_run(stack.client, handle.id, handle.result_run_id)
    assert [(a.activity_type, a.attempts) for a in run.activities] == [
        ("plan_next_action", 4), ("calculator", 1), ("plan_next_action", 1)]
    assert "ServiceUnavailableError" in run.activities[0].failure
    assert elapsed >= 0.2 + 0.4 + 0.8  # the backoff was honoured: 0.2 s doubling, three times


async def test_model_configuration_error_fails_the_turn_not_the_conversation(stack: Stack) -> None:
    from temporalio.client import WorkflowUpdateFailedError

    # the migration route refuses a prompt that is not its FUZZ line: the model server answers 400
    handle = await start_conversation(stack, AgentConfig(model="scripted:migration"))
    try:
        await handle.execute_update(AgentWorkflow.send_message, ChatMessage("hello"))
        raise AssertionError("the update should have failed")
    except WorkflowUpdateFailedError as err:
        assert "the migration route expects" in str(err.cause.message) or "migration route" in str(err.cause)
    status = await handle.query(AgentWorkflow.get_status)
    assert status.state == "idle" and status.turns == 0 and "model call failed" in status.last_error
    assert len(await handle.query(AgentWorkflow.get_history)) == 1  # the failed turn was rolled back
    await handle.signal(AgentWorkflow.end_chat)
    await handle.result()


async def test_logic_bug_hot_fix_reuses_the_stored_plan(stack: Stack, tmp_path) -> None:
    task_queue = f"hotfix-{uuid.uuid4().hex[:8]}"
    with ScriptedModelServer(respond) as model:
        worker = reference_worker(stack.server.address, task_queue, model.url, state_dir=tmp_path,
                               faults=AgentFaults(bugs=frozenset({"calculator"})))
        with worker:
            cfg = AgentConfig(model="scripted")
            cfg.tool.initial_interval_s = 0.2
            cfg.tool.maximum_interval_s = 0.5
            workflow_id = f"hotfix-{uuid.uuid4().hex[:8]}"
            handle = await stack.client.start_workflow(AgentWorkflow.run, AgentInput(config=cfg, prompt="What is 25 * 4?"),
                                                       id=workflow_id, task_queue=task_queue)

            async def failing_repeatedly() -> bool:
                return any(p.activity_type.name == "calculator" and p.attempt >= 3
                           for p in await _pending(stack, workflow_id))

            await wait_for_async(failing_repeatedly, "the buggy calculator's third failure")
            desc = await handle.describe()
            assert desc.status.name == "RUNNING"
            (pending,) = await _pending(stack, workflow_id)
            assert "injected logic bug in calculator" in pending.last_failure.message
            worker.stop()
            worker.start(faults=NO_FAULTS)  # the fixed build
            result = await asyncio.wait_for(handle.result(), timeout=HANG_S)
        assert result.reply == "25 * 4 = 100"
        run = await fetch_run(stack.client, workflow_id)
        calc = next(a for a in run.activities if a.activity_type == "calculator")
        assert calc.attempts >= 3 and calc.worker == "worker-2"
        # The plan made before the fix was reused from history: two model calls in all.
        assert model.stats()["by_run"][workflow_id] == 2
