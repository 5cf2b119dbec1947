"""Subagents (child workflows) and programmatic tool calling (workflow-native), on the real dev server.

The scenario matrix itself (``testbed.walkthroughs``: ptc, spawn, spawn_failure, spawn_detached,
spawn_limits, ptc_retry, ptc_validation, ptc_parallel_fail, ptc_hostile) runs in
``test_scenarios.py``; this file checks what a shape cannot show: that the orchestration tools never
become activities, the model-visible texts, cancellation of a run in flight (direct, child and
PTC-inner work), and that replaying the recorded histories reproduces every decision.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import CancelledError
from temporalio.worker import Replayer

from agent.contracts import AgentConfig, ChatMessage
from harness.event_history import activity_shape, fetch_tree
from testbed.walkthroughs import ORCH_FAULT_TOOLS, WALKTHROUGHS
from testbed.scripted_routes import HOSTILE_PROGRAMS
from testbed.stack import Stack
from testbed.walkthroughs import run_walkthrough
from agent.workflow import AgentWorkflow
from testbed.engines.temporal.cluster import start_conversation, start_prompt
from tests.events import HANG_S, wait_for_async

ORCHESTRATION = ["ptc", "spawn", "spawn_failure", "spawn_detached", "spawn_limits", "ptc_retry",
                 "ptc_validation", "ptc_parallel_fail", "ptc_hostile"]


async def _tool_messages(stack: Stack, workflow_id: str) -> list[str]:
    messages = await stack.client.get_workflow_handle(workflow_id).query(AgentWorkflow.get_history)
    return [m["content"] for m in messages if m["role"] == "tool"]


@pytest.mark.parametrize("name", ["ptc", "spawn_detached", "ptc_parallel_fail"])
async def test_orchestration_tools_are_never_activities_and_replay_exactly(stack: Stack, name: str) -> None:
    outcome = await run_walkthrough(stack, WALKTHROUGHS[name])
    assert outcome.problems == []
    every_run = [*outcome.runs, *(r for chain in outcome.children.values() for r in chain)]
    types = {a.activity_type for r in every_run for a in r.activities}
    assert not types & {"spawn", "wait", "run_ptc"}, types
    # Replay-safe: each recorded history, replayed by a fresh worker, makes exactly the same decisions.
    replayer = Replayer(workflows=[AgentWorkflow])
    for wid in [outcome.workflow_id, *(f"{outcome.workflow_id}/{cid}" for cid in outcome.children)]:
        history = await stack.client.get_workflow_handle(wid).fetch_history()
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert result.replay_failure is None, f"{wid}: {result.replay_failure}"


async def test_ptc_inner_spawn_is_the_same_child_workflow_as_a_direct_spawn(stack: Stack) -> None:
    direct = await run_walkthrough(stack, WALKTHROUGHS["spawn"])
    inner = await run_walkthrough(stack, WALKTHROUGHS["ptc"])
    for outcome in (direct, inner):
        (child,) = outcome.runs[0].children
        assert child.workflow_type == "AgentWorkflow" and child.outcome == "completed"
        assert child.workflow_id.startswith(outcome.workflow_id + "/")
    # The PTC-inner file writes are the write_file activities a direct call schedules.
    writes = [a for a in inner.runs[0].activities if a.activity_type == "write_file"]
    assert [a.summary for a in writes] == ['write_file({"content": "alpha", "path": "notes/a.txt"})',
                                          'write_file({"content": "beta", "path": "notes/b.txt"})']


async def test_spawn_refusals_and_failures_are_model_visible(stack: Stack) -> None:
    limits = await run_walkthrough(stack, WALKTHROUGHS["spawn_limits"])
    assert limits.problems == []
    results = await _tool_messages(stack, limits.workflow_id)
    assert results[2].startswith("ERROR (execution_error): spawn refused: this run has used its budget of 2")
    planner = await _tool_messages(stack, f"{limits.workflow_id}/planner-1")
    assert planner == ["ERROR (execution_error): spawn refused: the subagent depth limit is 1 and this agent is "
                       "at depth 1; do this task yourself with your own tools"]

    failure = await run_walkthrough(stack, WALKTHROUGHS["spawn_failure"])
    assert failure.problems == [] and failure.runs[0].status == "completed"
    (result,) = await _tool_messages(stack, failure.workflow_id)
    assert result.startswith("ERROR (execution_error): subagent generic (")
    assert "the scripted subagent cannot do" in result  # the child's own reason, not a generic wrapper


async def test_hostile_programs_are_refused_with_their_line(stack: Stack) -> None:
    outcome = await run_walkthrough(stack, WALKTHROUGHS["ptc_hostile"])
    assert outcome.problems == []
    results = await _tool_messages(stack, outcome.workflow_id)
    expected = {
        "import": "line 1: imports are not allowed",
        "dunder_walk": "line 1: attribute '__class__' is not accessible",
        "infinite_loop": "line 2: loop exceeded 1000 iterations",
        "huge_allocation": "line 1: repeating a list would create 1000000000 elements, over the limit",
        "huge_string": "line 1: repeating a str would create 10000000000 elements, over the limit",
        "open_file": "line 1: builtin 'open' is not available",
    }
    assert list(HOSTILE_PROGRAMS) == list(expected)
    for text, want in zip(results, expected.values(), strict=True):
        assert text.startswith("ERROR (validation_error): run_ptc: " + want), text
    assert outcome.runs[0].activities and all(a.activity_type == "plan_next_action" for a in outcome.runs[0].activities)


# -- cancellation ------------------------------------------------------------------------------


def _cancel_config() -> AgentConfig:
    cfg = AgentConfig(model="scripted:cancel", tools=[*ORCH_FAULT_TOOLS])
    cfg.subagents["generic"].tools.append("slow_task")
    cfg.tool.heartbeat_s = 2.0  # the activity hears of a cancellation at its next heartbeat
    return cfg


async def _wait_for_slow_tasks(stack: Stack, workflow_ids: list[str], count: int) -> None:
    async def running() -> bool:
        return len([e for wid in workflow_ids for e in stack.ledger.executions(wid)
                    if e["tool"] == "slow_task" and e["finished_at"] is None]) >= count

    await wait_for_async(running, f"the start of {count} slow_task(s) in {workflow_ids}", every_s=0.1)


@pytest.mark.parametrize("where", ["direct", "child", "ptc", "conversation"])
async def test_cancelling_the_parent_stops_its_work_without_another_model_turn(stack: Stack, where: str
                                                                               ) -> None:
    workflow_id = f"cancel-{where}-{uuid.uuid4().hex[:8]}"
    child_id = f"{workflow_id}/generic-1"
    update: asyncio.Task | None = None
    if where == "conversation":
        handle = await start_conversation(stack, _cancel_config(), workflow_id)
        update = asyncio.create_task(handle.execute_update(AgentWorkflow.send_message, ChatMessage("run direct")))
    else:
        handle = await start_prompt(stack, _cancel_config(), f"run {where}", workflow_id)
    slow_in = [child_id] if where == "child" else [workflow_id]
    await _wait_for_slow_tasks(stack, slow_in, count=2 if where == "ptc" else 1)
    started = time.monotonic()
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(handle.result(), HANG_S)
    took = time.monotonic() - started
    assert isinstance(failure.value.cause, CancelledError)
    if update is not None:
        with pytest.raises(Exception):
            await update  # the in-flight turn ends with the run; it produces no reply
    tree = await fetch_tree(stack.client, workflow_id)
    root = tree[workflow_id]
    assert [r.status for r in root] == ["canceled"]
    # Exactly one model call: the cancellation did not hand the interrupted turn back to the model.
    assert [a.activity_type for a in root[0].activities].count("plan_next_action") == 1
    slow = [(wid, a) for wid, chain in tree.items() for r in chain for a in r.activities
            if a.activity_type == "slow_task"]
    assert len(slow) == (2 if where == "ptc" else 1)
    assert all(a.outcome == "canceled" for _, a in slow), activity_shape(root)
    if where == "child":
        assert [c.outcome for c in root[0].children] == ["canceled"]
        assert [r.status for r in tree[child_id]] == ["canceled"]
        assert [a.activity_type for a in tree[child_id][0].activities].count("plan_next_action") == 1
    # Each activity stopped its work when told (the ledger saw it end as cancelled), well before it would finish.
    executions = [e for wid in slow_in for e in stack.ledger.executions(wid) if e["tool"] == "slow_task"]
    assert [e["outcome"] for e in executions] == ["cancelled"] * len(slow)
    assert took < 60, f"cancellation took {took:.1f} s"  # at a heartbeat (2 s), not at the tasks' end (120 s)
