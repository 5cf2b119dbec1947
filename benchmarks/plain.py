"""The same agent loop with no durability: ``agent.loop.run_turn`` on plain asyncio.

The durable agent's only difference is where the two effects run: here the
model call and the tool run in-process, awaited directly; on Temporal each is
an activity and the loop is a workflow. Everything else is shared: the loop
(``run_turn``), the LiteLLM call (``agent.llm.complete``), the tools and their
argument checks (``agent.tools``), the scripted model server, and the effect
ledger's execution records (the durable activities write them too, so the
comparison does not count them as Temporal's cost).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from agent import llm
from agent.errors import ToolExecutionError, ToolRetryableError, ToolValidationError
from harness.recording import EffectLedger, ExecutionIdentity
from agent.loop import EXECUTION_ERROR, FAILED, OK, VALIDATION_ERROR, ToolCall, ToolResult, initial_messages, run_turn
from agent.tools import TOOLS, ToolContext, run_tool, tool_specs, validate_arguments, workspace_for


class PlainEffects:
    """``AgentEffects`` that call the model and the tools directly, in this process."""

    def __init__(self, *, model: str, scripted_base_url: str | None, ledger: EffectLedger, sandbox_root: Path,
                 run_key: str, model_timeout_s: float = 60.0) -> None:
        self.model = model
        self.scripted_base_url = scripted_base_url
        self.ledger = ledger
        self.workspace = workspace_for(sandbox_root, run_key)
        self.run_key = run_key
        self.model_timeout_s = model_timeout_s
        self.model_ms = 0.0  # the model's own latency, summed since the last reset
        self.model_calls = 0
        self.tool_calls = 0
        self._ids = itertools.count(1)

    def _identity(self) -> ExecutionIdentity:
        return ExecutionIdentity(workflow_id=self.run_key, run_id="plain", activity_id=str(next(self._ids)),
                                 attempt=1, worker="plain")

    async def plan(self, messages: list[dict[str, Any]], tools: list[str]) -> dict[str, Any]:
        execution = self.ledger.begin_execution(self._identity(), "plan_next_action", model_call=True)
        outcome = "error"
        try:
            message, _usage, latency_ms = await llm.complete(
                self.model, messages, tool_specs(tools), scripted_base_url=self.scripted_base_url,
                run_key=self.run_key, timeout_s=self.model_timeout_s)
            outcome = "ok"
        finally:
            self.ledger.end_execution(execution, outcome)
        self.model_ms += latency_ms
        self.model_calls += 1
        return message

    async def call_tool(self, call: ToolCall) -> ToolResult:
        tool = TOOLS[call.name]
        ident = self._identity()
        ctx = ToolContext(workspace=self.workspace, ledger=self.ledger, ident=ident)
        execution = self.ledger.begin_execution(ident, call.name)
        self.tool_calls += 1
        outcome = "error"
        try:
            validate_arguments(tool, call.arguments)
            ctx.workspace.mkdir(parents=True, exist_ok=True)
            content = await run_tool(tool, call.arguments, ctx)
            outcome = OK
            return ToolResult(call.id, call.name, OK, content)
        except ToolValidationError as exc:
            outcome = VALIDATION_ERROR
            return ToolResult(call.id, call.name, VALIDATION_ERROR, str(exc))
        except ToolExecutionError as exc:
            outcome = EXECUTION_ERROR
            return ToolResult(call.id, call.name, EXECUTION_ERROR, str(exc))
        except ToolRetryableError as exc:  # no retries without a durability layer: the model is told
            return ToolResult(call.id, call.name, FAILED, str(exc))
        finally:
            self.ledger.end_execution(execution, outcome)


class PlainConversation:
    """One conversation on the plain loop: ``await send(text)`` returns the reply, like the durable Update."""

    def __init__(self, effects: PlainEffects, tools: list[str], max_steps: int = 10,
                 system_prompt: str | None = None) -> None:
        self.effects = effects
        self.tools = tools
        self.max_steps = max_steps
        self.messages = initial_messages(system_prompt)

    async def send(self, text: str) -> tuple[str, int]:
        """(reply, model steps taken)."""
        result = await run_turn(self.messages, text, self.effects, self.tools, self.max_steps)
        return result.reply, result.steps
