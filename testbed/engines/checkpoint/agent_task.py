"""The reference agent's loop as a substrate task: the same ``loop.run_turn`` the Temporal workflow runs.

Each model call is an ``llm`` step and each tool call a ``tool`` step, both
``step_call``s of module-level functions, so the task runs unchanged on the
checkpoint runner (``run_durable``) and on Temporal (``DurableTaskWorkflow``).
Retry policies come from the agent config's planning and tool policies, as
on Temporal. A tool's side effect goes through the effect ledger
with the step's identity (``<run id>/checkpoint/<step index>``), stable across
retries and across a takeover by another worker.

The workflow-native tools (``spawn``, ``wait``, ``run_ptc``) and environments
are Temporal-only for now; on this backend the model is told so.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from agent import loop
from agent.contracts import WORKFLOW_NATIVE_TOOLS, ActivityPolicy, AgentConfig
from testbed.engines import steps
from testbed.engines.steps import StepResources
from agent.errors import ModelConfigurationError
from testbed.engines.checkpoint.records import DurableRunManifest
from testbed.engines.checkpoint.durable_run import StepRetry, run_durable
from testbed.engines.checkpoint.steps import current_step, step_call, worker_resources

PROJECT_ID = "durable-agent"
TASK = "testbed.engines.checkpoint.agent_task:agent_task"
NOOP_TASK = "testbed.engines.checkpoint.agent_task:noop_task"


def manifest_for(config: AgentConfig, prompt: str, workspace: str | None = None) -> DurableRunManifest:
    """``workspace``: the workspace key the run's tools share (default: the run's own, by run id)."""
    data: dict[str, Any] = {"config": dataclasses.asdict(config), "prompt": prompt}
    if workspace is not None:
        data["workspace"] = workspace
    return DurableRunManifest(project_id=PROJECT_ID, task={"id": "agent-turn", "intent": "answer the prompt"},
                              input=data)


def config_from(data: dict[str, Any]) -> AgentConfig:
    cfg = AgentConfig()
    for name in ("model", "tools", "system_prompt", "max_steps_per_turn"):
        setattr(cfg, name, data[name])
    cfg.planning = ActivityPolicy(**data["planning"])
    cfg.tool = ActivityPolicy(**data["tool"])
    return cfg


def _retry(policy: ActivityPolicy, non_retryable: tuple[str, ...] = ()) -> StepRetry:
    return StepRetry(initial_interval_s=policy.initial_interval_s, backoff_coefficient=policy.backoff_coefficient,
                     maximum_interval_s=policy.maximum_interval_s, maximum_attempts=policy.maximum_attempts,
                     non_retryable=non_retryable)


def _identity() -> Any:
    from harness.recording import ExecutionIdentity

    info = current_step()
    return ExecutionIdentity(workflow_id=info.run_id, run_id="checkpoint", activity_id=str(info.step_index),
                             attempt=info.attempt, worker=info.worker_id)


def _resources() -> StepResources:
    r = worker_resources()
    return StepResources(ledger=r.get("ledger"), sandbox_root=r.get("sandbox_root"),
                         model_base_url=r.get("model_base_url"), worker=current_step().worker_id)


async def plan_step(model: str, messages: list[dict[str, Any]], tools: list[str], timeout_s: float) -> dict[str, Any]:
    """One model call (a step of kind ``llm``), recorded in the ledger like the plan_next_action activity:
    ``{"message": <assistant message>, "latency_ms": <the call's own latency>}``."""
    return await steps.plan(_resources(), _identity(), model, messages, tools, timeout_s)


async def tool_step(name: str, arguments: dict[str, Any], max_attempts: int, workspace: str | None = None
                    ) -> dict[str, str]:
    """One tool call (a step of kind ``tool``): ``{"status", "content"}`` as the model will see it."""
    return await steps.tool(_resources(), _identity(), name, arguments, max_attempts, workspace)


class StepEffects:
    """``loop.AgentEffects`` on the substrate: the model and each tool call are checkpointed steps."""

    def __init__(self, ctx: Any, config: AgentConfig, workspace: str | None = None) -> None:
        self.ctx = ctx
        self.config = config
        self.workspace = workspace

    async def plan(self, messages: list[dict[str, Any]], tools: list[str]) -> dict[str, Any]:
        cfg = self.config
        out = await self.ctx.step(
            "llm:plan", step_call(plan_step, model=cfg.model, messages=list(messages), tools=tools,
                                  timeout_s=max(1.0, cfg.planning.start_to_close_s - 1.0)),
            kind="llm", input_fingerprint=messages,
            retry=_retry(cfg.planning, (ModelConfigurationError.error_type, "ModelConfigurationError")))
        return out["message"]

    async def call_tool(self, call: loop.ToolCall) -> loop.ToolResult:
        if call.name in WORKFLOW_NATIVE_TOOLS:
            return loop.ToolResult(call.id, call.name, loop.BAD_CALL,
                                   f"{call.name} is not available on the checkpoint engine (Temporal only)")
        out = await self.ctx.step(
            f"tool:{call.name}", step_call(tool_step, name=call.name, arguments=call.arguments,
                                           max_attempts=self.config.tool.maximum_attempts,
                                           workspace=self.workspace),
            kind="tool", input_fingerprint={"name": call.name, "arguments": call.arguments},
            retry=_retry(self.config.tool))
        return loop.ToolResult(call.id, call.name, out["status"], out["content"])


async def agent_task(ctx: Any) -> dict[str, Any]:
    """One prompt to a final answer (a one-shot run), on whichever backend ``ctx`` belongs to."""
    cfg = config_from(ctx.input["config"])
    messages = loop.initial_messages(cfg.system_prompt)
    result = await loop.run_turn(messages, ctx.input["prompt"], StepEffects(ctx, cfg, ctx.input.get("workspace")),
                                 cfg.tools, cfg.max_steps_per_turn)
    return steps.turn_result(result, messages)


async def noop_step(i: int) -> int:
    return i


async def noop_task(ctx: Any) -> int:
    """``ctx.input["n"]`` no-op steps: what a step's checkpoint alone costs (on Temporal: an activity each)."""
    for i in range(ctx.input["n"]):
        await ctx.step(f"noop:{i}", step_call(noop_step, i=i), kind="logic")
    return ctx.input["n"]


async def noop_steps(store: Any, n: int) -> list[float]:
    """The time of each of ``n`` no-op steps of one run on ``store`` (``DurableRunStore``), around ``ctx.step``."""
    timings: list[float] = []

    async def task(ctx: Any) -> int:
        timings.extend(await steps.timed(n, lambda i: ctx.step(f"noop:{i}", step_call(noop_step, i=i), kind="logic")))
        return n

    manifest = DurableRunManifest(project_id="bench", task={"id": "noop-steps"}, input={"n": n})
    await run_durable(f"noop-{uuid.uuid4().hex[:8]}", manifest, store, task, worker_id="bench")
    return timings
