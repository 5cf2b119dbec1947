"""The agent loop's decision logic, with no durability engine in it.

Messages in, next action out; tool results appended. This module imports
nothing from Temporal and does no I/O of its own: the engine hands it an
``AgentEffects`` whose two methods (plan, call a tool) are the only places
where the outside world is touched. On Temporal those are activities and the
loop runs inside the workflow, so everything here must be deterministic: no
clock, no randomness, no iteration over unordered sets.

A second backend (the checkpoint substrate) reuses ``run_turn`` unchanged.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

DEFAULT_SYSTEM_PROMPT = (
    "You are a durable agent. Use the tools for arithmetic, weather and files; "
    "files live in your private workspace and paths are relative to it. "
    "When a tool reports an error, repair your call or explain the failure. "
    "Answer concisely."
)

# Tool result statuses; every one but "ok" is shown to the model as an error.
OK = "ok"
VALIDATION_ERROR = "validation_error"  # bad arguments: repair and call again
EXECUTION_ERROR = "execution_error"  # known terminal failure of the tool's work
FAILED = "failed"  # retries exhausted or timed out: infrastructure gave up
BAD_CALL = "bad_call"  # unknown tool or unparseable arguments (never reached a tool)


@dataclass
class ToolCall:
    """One tool call the model asked for."""

    id: str
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    #: set when the model's argument string is not a JSON object
    parse_error: str | None = None


@dataclass
class ToolResult:
    """What a tool call produced, as the model will see it."""

    call_id: str
    name: str
    status: str
    content: str

    def as_message(self) -> dict[str, Any]:
        text = self.content if self.status == OK else f"ERROR ({self.status}): {self.content}"
        return {"role": "tool", "tool_call_id": self.call_id, "name": self.name, "content": text}


@dataclass
class FinalAnswer:
    text: str


@dataclass
class ToolCalls:
    calls: list[ToolCall]


Action = FinalAnswer | ToolCalls


@dataclass
class TurnResult:
    """The outcome of one user turn."""

    reply: str
    steps: int  # model calls made in this turn
    tool_results: list[ToolResult]
    stopped_early: bool = False  # the step budget ran out before a final answer


class AgentEffects(Protocol):
    """The two ways the loop touches the world; the engine makes them durable."""

    async def plan(self, messages: list[dict[str, Any]], tools: list[str]) -> dict[str, Any]:
        """Ask the model for the next assistant message (OpenAI chat format), offering these tools."""

    async def call_tool(self, call: ToolCall) -> ToolResult:
        """Run one well-formed tool call and classify its outcome."""


def initial_messages(system_prompt: str | None = None) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system_prompt or DEFAULT_SYSTEM_PROMPT}]


def normalise_assistant_message(message: dict[str, Any]) -> dict[str, Any]:
    """Keep only the fields the conversation needs, in a stable shape."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            {
                "id": c.get("id") or f"call_{i}",
                "type": "function",
                "function": {
                    "name": (c.get("function") or {}).get("name", ""),
                    "arguments": (c.get("function") or {}).get("arguments") or "{}",
                },
            }
            for i, c in enumerate(calls)
        ]
    return out


def decide(message: dict[str, Any]) -> Action:
    """The next action an assistant message asks for."""
    calls = message.get("tool_calls") or []
    if not calls:
        return FinalAnswer(text=(message.get("content") or "").strip())
    parsed: list[ToolCall] = []
    for c in calls:
        fn = c["function"]
        raw = fn.get("arguments") or "{}"
        try:
            args = json.loads(raw)
            error = None if isinstance(args, dict) else f"arguments must be a JSON object, got {type(args).__name__}"
        except json.JSONDecodeError as exc:
            args, error = {}, f"arguments are not valid JSON ({exc.msg} at position {exc.pos}): {raw[:200]!r}"
        parsed.append(ToolCall(id=c["id"], name=fn["name"], arguments=args if error is None else {}, parse_error=error))
    return ToolCalls(calls=parsed)


async def _dispatch(call: ToolCall, effects: AgentEffects, tool_names: set[str]) -> ToolResult:
    if call.parse_error is not None:
        return ToolResult(call.id, call.name, BAD_CALL, call.parse_error + "; send the call again with a JSON object")
    if call.name not in tool_names:
        known = ", ".join(sorted(tool_names)) or "none"
        return ToolResult(call.id, call.name, BAD_CALL, f"unknown tool {call.name!r}; available tools: {known}")
    return await effects.call_tool(call)


async def run_turn(
    messages: list[dict[str, Any]],
    user_text: str,
    effects: AgentEffects,
    tools: list[str],
    max_steps: int = 10,
) -> TurnResult:
    """Run one user turn to a final answer, appending everything to ``messages``.

    ``messages`` is mutated in place so that a backend's own state (and its
    continue-as-new payload) always holds the whole conversation. Tool calls
    of one assistant message run concurrently; their results are appended in
    the order the model asked for them, whatever order they finish in.
    """
    messages.append({"role": "user", "content": user_text})
    tool_names = set(tools)
    results: list[ToolResult] = []
    for step in range(1, max_steps + 1):
        assistant = normalise_assistant_message(await effects.plan(messages, tools))
        messages.append(assistant)
        action = decide(assistant)
        if isinstance(action, FinalAnswer):
            return TurnResult(reply=action.text, steps=step, tool_results=results)
        batch = await asyncio.gather(*(_dispatch(c, effects, tool_names) for c in action.calls))
        for result in batch:
            messages.append(result.as_message())
        results.extend(batch)
    reply = f"I stopped after {max_steps} model steps without reaching a final answer."
    messages.append({"role": "assistant", "content": reply})
    return TurnResult(reply=reply, steps=max_steps, tool_results=results, stopped_early=True)
