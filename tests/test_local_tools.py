"""Short tools without side effects as local activities (``AgentConfig.local_tools``): only those may, the
turn's answer is the same, and the history shows a local activity marker instead of a dispatched activity.
Model calls as local activities (``AgentConfig.local_model``): the whole turn in one workflow task, read back
from the markers by the history parser and the benchmark's breakdown."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType

from agent.config_file import ConfigFileError, load_agent_config
from agent.contracts import AgentConfig
from agent.tools import check_local_tools, local_tool_problem
from benchmarks.breakdown import turn_breakdown
from harness.event_history import parse_events
from testbed.stack import Stack
from testbed.engines.temporal.cluster import run_prompt


def test_only_short_tools_without_side_effects_may_run_locally() -> None:
    check_local_tools(["calculator", "weather", "read_file", "list_files"])
    assert "side effects" in (local_tool_problem("append_file") or "")
    assert "may take" in (local_tool_problem("slow_task") or "")
    assert "workflow runs it itself" in (local_tool_problem("spawn") or "")
    with pytest.raises(ValueError, match="write_file"):
        check_local_tools(["calculator", "write_file"])


def test_a_config_file_naming_an_effectful_local_tool_is_refused(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("local_tools: [calculator]\n")
    bad.write_text("local_tools: [append_file]\n")
    assert load_agent_config(good).local_tools == ["calculator"]
    with pytest.raises(ConfigFileError, match="append_file.*side effects"):
        load_agent_config(bad)


async def test_the_calculator_as_a_local_activity_answers_the_same_without_a_dispatch(stack: Stack) -> None:
    answers, kinds = {}, {}
    for local in ([], ["calculator"]):
        cfg = AgentConfig(model="scripted", local_tools=local)
        result, handle = await run_prompt(stack, cfg, "What is 25 * 4?")
        answers[bool(local)] = result.reply
        events = [e async for e in handle.fetch_history_events()]
        scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name for e in events
                     if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
        markers = [e for e in events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
        kinds[bool(local)] = (scheduled, len(markers))
    assert answers[False] == answers[True] == "25 * 4 = 100"
    assert kinds[False] == (["plan_next_action", "calculator", "plan_next_action"], 0)
    assert kinds[True] == (["plan_next_action", "plan_next_action"], 1)  # the calculator: one local-activity marker


def test_a_config_file_sets_local_model_only_to_a_boolean(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("local_model: true\nlocal_tools: [calculator]\n")
    bad.write_text("local_model: 'yes'\n")
    assert load_agent_config(good).local_model is True
    with pytest.raises(ConfigFileError, match="'local_model' must be true or false .*, got 'yes'"):
        load_agent_config(bad)


async def test_with_local_model_calls_a_tool_turn_is_one_workflow_task_of_markers(stack: Stack) -> None:
    cfg = AgentConfig(model="scripted", local_tools=["calculator"], local_model=True)
    result, handle = await run_prompt(stack, cfg, "What is 25 * 4?")
    assert result.reply == "25 * 4 = 100"
    history = await handle.fetch_history()
    run = parse_events(handle.id, history.events[0].workflow_execution_started_event_attributes.original_execution_run_id,
                       list(history.events))
    assert run.activities == []
    assert [(la.activity_type, la.attempt, la.outcome) for la in run.local_activities] == [
        ("plan_next_action", 1, "completed"), ("calculator", 1, "completed"), ("plan_next_action", 1, "completed")]
    assert all(la.worker and la.completed_at and la.completed_at <= la.recorded_at for la in run.local_activities)
    assert run.local_activities[1].result == {"content": "100", "status": "ok"}
    events = list(history.events)
    parts = turn_breakdown(events, 0, len(events) - 1)  # the model's latency is read from the two markers
    assert parts["local_count"] == 3 and parts["act_count"] == 0 and parts["model_ms"] > 0
