"""The backend-free loop logic: decisions, error feedback, ordering, budget."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agent import loop


class ScriptEffects:
    """An AgentEffects that plays assistant messages and runs tools as plain functions."""

    def __init__(self, plans: list[dict[str, Any]], delays: dict[str, float] | None = None) -> None:
        self.plans = plans
        self.delays = delays or {}
        self.tool_calls: list[str] = []

    async def plan(self, messages: list[dict[str, Any]], tools: list[str]) -> dict[str, Any]:
        return self.plans.pop(0)

    async def call_tool(self, call: loop.ToolCall) -> loop.ToolResult:
        await asyncio.sleep(self.delays.get(call.id, 0))
        self.tool_calls.append(call.id)
        return loop.ToolResult(call.id, call.name, loop.OK, f"ran {call.arguments}")


def _call(id_: str, name: str, args: Any) -> dict[str, Any]:
    raw = args if isinstance(args, str) else json.dumps(args)
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": raw}}


async def test_final_answer_without_tools() -> None:
    messages = loop.initial_messages()
    result = await loop.run_turn(messages, "hi", ScriptEffects([{"role": "assistant", "content": " hello "}]), [])
    assert (result.reply, result.steps) == ("hello", 1)
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]


async def test_parallel_results_are_appended_in_call_order_not_finish_order() -> None:
    effects = ScriptEffects(
        [{"role": "assistant", "content": None, "tool_calls": [_call("a", "calculator", {"expression": "1"}),
                                                               _call("b", "calculator", {"expression": "2"})]},
         {"role": "assistant", "content": "done"}],
        delays={"a": 0.05, "b": 0.0},
    )
    messages = loop.initial_messages()
    result = await loop.run_turn(messages, "go", effects, ["calculator"])
    assert effects.tool_calls == ["b", "a"]  # b finished first
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == ["a", "b"]
    assert result.reply == "done"


async def test_malformed_arguments_and_unknown_tools_are_model_visible_without_running_anything() -> None:
    effects = ScriptEffects(
        [{"role": "assistant", "content": None, "tool_calls": [_call("a", "calculator", '{"expression": "1"'),
                                                               _call("b", "rm_rf", {}),
                                                               _call("c", "calculator", "[1, 2]")]},
         {"role": "assistant", "content": "sorry"}],
    )
    messages = loop.initial_messages()
    result = await loop.run_turn(messages, "go", effects, ["calculator"])
    assert effects.tool_calls == []
    contents = [m["content"] for m in messages if m["role"] == "tool"]
    assert contents[0].startswith("ERROR (bad_call): arguments are not valid JSON")
    assert contents[1] == "ERROR (bad_call): unknown tool 'rm_rf'; available tools: calculator"
    assert "must be a JSON object" in contents[2]
    assert [r.status for r in result.tool_results] == [loop.BAD_CALL] * 3


async def test_step_budget_stops_a_model_that_never_answers() -> None:
    forever = [{"role": "assistant", "content": None, "tool_calls": [_call(f"c{i}", "calculator", {"expression": "1"})]}
               for i in range(5)]
    result = await loop.run_turn(loop.initial_messages(), "go", ScriptEffects(forever), ["calculator"], max_steps=3)
    assert result.stopped_early and result.steps == 3
    assert "stopped after 3 model steps" in result.reply


def test_normalise_keeps_only_conversation_fields() -> None:
    msg = loop.normalise_assistant_message(
        {"role": "assistant", "content": "x", "provider_specific_fields": {"a": 1}, "tool_calls": None})
    assert msg == {"role": "assistant", "content": "x"}


def test_loop_module_does_not_import_temporal() -> None:
    import ast
    from pathlib import Path

    tree = ast.parse(Path(loop.__file__).read_text())
    imported = {n.names[0].name if isinstance(n, ast.Import) else n.module
                for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))}
    assert not any(m and m.startswith("temporalio") for m in imported), imported
