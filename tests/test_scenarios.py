"""The scenario matrix on the real embedded Temporal dev server.

Each scenario declares its scripted model route, the sandbox side effects it
must leave and the Temporal history shape it must produce; ``run_walkthrough``
checks all three, plus the effect ledger.
"""

from __future__ import annotations

import os

import pytest

from agent.contracts import ChatMessage
from harness.event_history import activity_shape
from testbed.walkthroughs import WALKTHROUGHS
from testbed.stack import Stack
from testbed.walkthroughs import run_walkthrough
from agent.workflow import AgentWorkflow
from testbed.engines.temporal.cluster import start_conversation


@pytest.mark.parametrize("name", list(WALKTHROUGHS))
async def test_scenario(stack: Stack, name: str) -> None:
    outcome = await run_walkthrough(stack, WALKTHROUGHS[name])
    assert outcome.problems == [], "\n".join(outcome.problems)


async def test_direct_tool_use_has_one_plan_before_and_one_after_the_tool(stack: Stack) -> None:
    outcome = await run_walkthrough(stack, WALKTHROUGHS["direct"])
    assert outcome.replies == ["25 * 4 = 100"]
    assert [a for a, _, _ in activity_shape(outcome.runs)] == ["plan_next_action", "calculator", "plan_next_action"]


async def test_path_escape_never_leaves_the_workspace(stack: Stack) -> None:
    sandbox = stack.settings.sandbox_root
    # Where '../../etc/passwd' would land from <sandbox>/<workflow id>/: nothing may appear there.
    escape_target = (sandbox / "wf" / "../../etc/passwd").resolve()
    before = {p for p in stack.settings.sandbox_root.parent.rglob("*")}
    with open("/etc/passwd", "rb") as f:
        passwd = f.read()
    outcome = await run_walkthrough(stack, WALKTHROUGHS["path_escape"])
    assert outcome.problems == []
    assert not escape_target.exists()
    with open("/etc/passwd", "rb") as f:
        assert f.read() == passwd
    workspace = stack.workspace(outcome.workflow_id)
    created = {p for p in stack.settings.sandbox_root.parent.rglob("*")} - before
    outside = [p for p in created if p != workspace and workspace not in p.parents and not p.name.startswith("ledger")]
    assert outside == [], f"files created outside the workspace: {outside}"
    # The model saw both refusals as validation errors it can act on.
    tool_results = [m for m in await _history(stack, outcome.workflow_id) if m["role"] == "tool"]
    assert "escapes the workspace" in tool_results[0]["content"]
    assert "is absolute" in tool_results[1]["content"]
    assert os.path.isfile(workspace / "safe.txt")


async def _history(stack: Stack, workflow_id: str) -> list[dict]:
    # A completed one-shot workflow still answers queries (the worker replays it).
    return await stack.client.get_workflow_handle(workflow_id).query(AgentWorkflow.get_history)


async def test_continue_as_new_carries_the_whole_conversation(stack: Stack) -> None:
    scenario = WALKTHROUGHS["conversation"]
    outcome = await run_walkthrough(stack, scenario)
    assert outcome.problems == []
    assert len(outcome.runs) >= 2
    assert [r.status for r in outcome.runs] == ["continued_as_new"] * (len(outcome.runs) - 1) + ["completed"]
    messages = await _history(stack, outcome.workflow_id)
    assert [m["content"] for m in messages if m["role"] == "user"] == list(scenario.prompts)
    # Every run but the last stayed under the configured size (plus the turn that crossed it).
    assert all(r.events < scenario.max_history_events * 2 for r in outcome.runs)


async def test_validation_error_is_not_an_infrastructure_retry(stack: Stack) -> None:
    outcome = await run_walkthrough(stack, WALKTHROUGHS["validation_repair"])
    calculators = [a for a in outcome.runs[0].activities if a.activity_type == "calculator"]
    assert [a.attempts for a in calculators] == [1, 1]
    messages = await _history(stack, outcome.workflow_id)
    first_result = next(m for m in messages if m["role"] == "tool")
    assert first_result["content"].startswith("ERROR (validation_error): calculator: cannot evaluate '25 x 4'")


async def test_terminal_failure_is_model_visible_and_not_retried(stack: Stack) -> None:
    outcome = await run_walkthrough(stack, WALKTHROUGHS["terminal"])
    broken = next(a for a in outcome.runs[0].activities if a.activity_type == "broken_service")
    assert (broken.attempts, broken.outcome) == (1, "failed")
    assert "execution_error" in outcome.replies[0]


async def test_conversation_queries_validator_and_end_chat(stack: Stack) -> None:
    from temporalio.client import WorkflowUpdateFailedError

    handle = await start_conversation(stack, WALKTHROUGHS["direct"].config())
    reply = await handle.execute_update(AgentWorkflow.send_message, ChatMessage("What is 1 + 1?"))
    assert reply.text == "1 + 1 = 2" and reply.turn == 1
    status = await handle.query(AgentWorkflow.get_status)
    assert (status.state, status.turns) == ("idle", 1)
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update(AgentWorkflow.send_message, ChatMessage("   "))
    await handle.signal(AgentWorkflow.end_chat)
    result = await handle.result()
    assert (result.ended_by, result.turns) == ("end_chat", 1)
