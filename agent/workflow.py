"""The durable agent workflow: the deterministic orchestrator.

It never does I/O. Each model call is the ``plan_next_action`` activity and
each tool call an activity named after the tool, every one with explicit
timeouts, heartbeat timeout and retry policy from ``AgentConfig``. The loop's
decisions come from ``agent.loop``, which knows nothing of Temporal.

Interaction, as in the reference: a long-running conversation where
``send_message`` is an Update returning the reply, ``end_chat`` a Signal, and
``get_history`` / ``get_status`` Queries. With ``AgentInput.prompt`` set it
runs one-shot: answer, then complete. At a turn boundary the workflow
continues-as-new when the server suggests it (or past the configured history
size), carrying the conversation forward.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from agent import loop
    from agent.contracts import (
        ActivityPolicy,
        AgentInput,
        AgentReply,
        AgentResult,
        AgentStatus,
        ChatMessage,
        PlanInput,
        PlanOutput,
        ToolCallRecord,
        ToolInput,
        ToolOutput,
    )
    from agent.errors import NON_RETRYABLE_ERROR_TYPES, ToolExecutionError


def _activity_options(policy: ActivityPolicy) -> dict[str, Any]:
    return {
        "start_to_close_timeout": timedelta(seconds=policy.start_to_close_s),
        "heartbeat_timeout": timedelta(seconds=policy.heartbeat_s) if policy.heartbeat_s else None,
        "retry_policy": RetryPolicy(
            initial_interval=timedelta(seconds=policy.initial_interval_s),
            backoff_coefficient=policy.backoff_coefficient,
            maximum_interval=timedelta(seconds=policy.maximum_interval_s),
            maximum_attempts=policy.maximum_attempts,
            non_retryable_error_types=NON_RETRYABLE_ERROR_TYPES,
        ),
    }


def _failure_text(err: BaseException) -> str:
    cause = err.cause if isinstance(err, ActivityError) and err.cause is not None else err
    return getattr(cause, "message", None) or str(cause)


class _ActivityEffects:
    """``loop.AgentEffects`` on Temporal: every effect is an activity."""

    def __init__(self, wf: AgentWorkflow) -> None:
        self._wf = wf

    async def plan(self, messages: list[dict[str, Any]], tools: list[str]) -> dict[str, Any]:
        cfg = self._wf.config
        self._wf.state = "planning"
        out = await workflow.execute_activity(
            "plan_next_action",
            PlanInput(model=cfg.model, messages=list(messages), tools=tools),
            result_type=PlanOutput,
            summary=f"model {cfg.model}",
            **_activity_options(cfg.planning),
        )
        return out.message

    async def call_tool(self, call: loop.ToolCall) -> loop.ToolResult:
        self._wf.state = "running_tools"
        args = json.dumps(call.arguments, sort_keys=True)
        try:
            out = await workflow.execute_activity(
                call.name,
                ToolInput(call_id=call.id, arguments=call.arguments),
                result_type=ToolOutput,
                summary=f"{call.name}({args[:120]})",
                **_activity_options(self._wf.config.tool),
            )
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                raise
            if isinstance(err.cause, ApplicationError) and err.cause.type == ToolExecutionError.error_type:
                return loop.ToolResult(call.id, call.name, loop.EXECUTION_ERROR, err.cause.message)
            # Retries exhausted or timed out: the infrastructure gave up; the model decides what next.
            return loop.ToolResult(call.id, call.name, loop.FAILED, f"{call.name} failed: {_failure_text(err)}")
        return loop.ToolResult(call.id, call.name, out.status, out.content)


@workflow.defn
class AgentWorkflow:
    @workflow.init
    def __init__(self, inp: AgentInput) -> None:
        self.config = inp.config
        self.messages: list[dict[str, Any]] = inp.messages or loop.initial_messages(inp.config.system_prompt)
        self.turns = inp.turns
        self.run_index = inp.run_index
        self.state = "idle"
        self.last_error: str | None = None
        self._ended = False
        self._continue_due = False
        self._turn_lock = asyncio.Lock()  # turns run one at a time, in the order their updates were accepted

    @workflow.run
    async def run(self, inp: AgentInput) -> AgentResult:
        if inp.prompt is not None:
            reply = await self._turn(inp.prompt)
            self.state = "ended"
            return AgentResult(reply.text, self.turns, len(self.messages), self.run_index, "one_shot")
        await workflow.wait_condition(
            lambda: (self._ended or self._continue_due) and workflow.all_handlers_finished()
        )
        if self._ended:
            self.state = "ended"
            return AgentResult(None, self.turns, len(self.messages), self.run_index, "end_chat")
        workflow.continue_as_new(
            AgentInput(config=self.config, messages=self.messages, turns=self.turns, run_index=self.run_index + 1)
        )

    @workflow.update
    async def send_message(self, message: ChatMessage) -> AgentReply:
        async with self._turn_lock:
            return await self._turn(message.text)

    @send_message.validator
    def _validate_message(self, message: ChatMessage) -> None:
        if self._ended:
            raise ValueError("this conversation has ended (end_chat was received); start a new one")
        if not message.text or not message.text.strip():
            raise ValueError("message text is empty")

    @workflow.signal
    def end_chat(self) -> None:
        self._ended = True

    @workflow.query
    def get_history(self) -> list[dict[str, Any]]:
        return self.messages

    @workflow.query
    def get_status(self) -> AgentStatus:
        return AgentStatus(
            state=self.state,
            turns=self.turns,
            messages=len(self.messages),
            run_index=self.run_index,
            history_events=workflow.info().get_current_history_length(),
            last_error=self.last_error,
        )

    async def _turn(self, text: str) -> AgentReply:
        checkpoint = len(self.messages)
        try:
            result = await loop.run_turn(
                self.messages, text, _ActivityEffects(self), self.config.tools, self.config.max_steps_per_turn
            )
        except ActivityError as err:
            # Planning gave up (bad model configuration, or retries exhausted): this turn fails,
            # the conversation does not; roll the turn back so it can be sent again.
            del self.messages[checkpoint:]
            self.state = "idle"
            self.last_error = f"model call failed: {_failure_text(err)}"
            raise ApplicationError(self.last_error, type="TurnFailed", non_retryable=True) from err
        self.turns += 1
        self.state = "idle"
        self._continue_due = self._continue_due or self._history_too_long()
        return AgentReply(
            text=result.reply,
            turn=self.turns,
            steps=result.steps,
            tool_calls=[ToolCallRecord(r.name, r.status, r.content) for r in result.tool_results],
            stopped_early=result.stopped_early,
        )

    def _history_too_long(self) -> bool:
        info = workflow.info()
        cfg = self.config
        return (
            info.is_continue_as_new_suggested()
            or (cfg.max_history_events > 0 and info.get_current_history_length() >= cfg.max_history_events)
            or (cfg.max_history_bytes > 0 and info.get_current_history_size() >= cfg.max_history_bytes)
        )
