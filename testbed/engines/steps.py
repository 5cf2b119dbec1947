"""What a durable step of the agent does, whatever engine runs it: one model call, or one tool call.

Every engine (the checkpoint engine, DBOS, Restate) wraps these two coroutines in its own notion of a
step; what they do inside is the same, so the effect ledger (``harness.recording``) records them the same way and
the chaos checkers read every engine's runs alike:

* ``plan``: one model call through ``agent.llm``, recorded as a model-call execution; model unavailability
  (``llm.ModelUnavailableError``) is raised for the engine's retry policy to retry;
* ``tool``: one tool call, its side effect applied through the ledger under ``ident.idempotency_key`` (stable
  across the step's retries and a recovery by another process), its outcome classified as the model sees it.

``ident`` says which step and attempt: ``workflow_id`` is the run (a message's workflow or invocation),
``run_id`` the engine's name, ``activity_id`` the step's position in the run (the engine's own step id, the same
when the step is retried or replayed), ``attempt`` counts from 1, ``worker`` is the process running it (what an
aimed kill looks for).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import loop
from agent.errors import ToolExecutionError, ToolRetryableError, ToolValidationError
from harness.recording import EffectLedger, ExecutionIdentity


@dataclass
class StepResources:
    """What steps of this process use: the effect ledger (None: nothing recorded, tools still need one), the
    workspaces' root, the scripted model's URL (None: a live provider) and this process's identity."""

    ledger: EffectLedger | None
    sandbox_root: Path
    model_base_url: str | None
    worker: str


async def plan(res: StepResources, ident: ExecutionIdentity, model: str, messages: list[dict[str, Any]],
               tools: list[str], timeout_s: float) -> dict[str, Any]:
    """One model call: ``{"message": <assistant message>, "latency_ms": <the call's own latency>}``."""
    from agent import llm
    from agent.tools import tool_specs

    ledger = res.ledger
    execution = ledger.begin_execution(ident, "plan_next_action", model_call=True) if ledger else None
    outcome = "error"
    try:
        message, _, latency_ms = await llm.complete(model, messages, tool_specs(tools),
                                                    scripted_base_url=res.model_base_url,
                                                    run_key=ident.workflow_id, timeout_s=timeout_s)
        outcome = "ok"
        return {"message": message, "latency_ms": round(latency_ms, 3)}
    except llm.ModelUnavailableError as exc:  # retried by the engine's policy
        outcome = exc.kind
        raise
    finally:
        if execution is not None:
            ledger.end_execution(execution, outcome)


async def tool(res: StepResources, ident: ExecutionIdentity, name: str, arguments: dict[str, Any],
               max_attempts: int, workspace: str | None = None) -> dict[str, str]:
    """One tool call: ``{"status", "content"}`` as the model will see it. A retryable failure raises (the engine
    retries the step) until ``ident.attempt`` reaches ``max_attempts``; then it is a ``failed`` result."""
    from agent.tools import TOOLS, ToolContext, run_tool, validate_arguments, workspace_for

    ledger = res.ledger
    if ledger is None:
        raise RuntimeError("tool steps need an effect ledger (their side effects are applied through it)")
    spec = TOOLS[name]
    ctx = ToolContext(workspace=workspace_for(res.sandbox_root, workspace or ident.workflow_id), ledger=ledger,
                      ident=ident)
    execution = ledger.begin_execution(ident, name)
    outcome = "error"
    try:
        validate_arguments(spec, arguments)
        ctx.workspace.mkdir(parents=True, exist_ok=True)
        content = await run_tool(spec, arguments, ctx)
        outcome = "ok"
        return {"status": loop.OK, "content": content}
    except ToolValidationError as exc:
        outcome = loop.VALIDATION_ERROR
        return {"status": loop.VALIDATION_ERROR, "content": str(exc)}
    except ToolExecutionError as exc:
        outcome = "execution_error"
        return {"status": loop.EXECUTION_ERROR, "content": str(exc)}
    except ToolRetryableError as exc:
        outcome = "retryable_error"
        if max_attempts and ident.attempt >= max_attempts:  # the last attempt: give up, the model decides
            return {"status": loop.FAILED, "content": f"{name} failed after {ident.attempt} attempts: {exc}"}
        raise
    finally:
        ledger.end_execution(execution, outcome)


def turn_result(result: loop.TurnResult, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A one-shot run's result, the same on every engine: the reply, the steps, the tool calls and the turn's
    messages (without the system prompt)."""
    return {"reply": result.reply, "steps": result.steps, "stopped_early": result.stopped_early,
            "tool_calls": [[r.name, r.status, r.content] for r in result.tool_results],
            "messages": messages[1:]}


async def timed(n: int, step: Callable[[int], Awaitable[Any]]) -> list[float]:
    """``step(i)`` awaited for each ``i`` below ``n``, one after another: each one's time (ms), what a step costs
    (the engines benchmark's no-op steps)."""
    timings = []
    for i in range(n):
        t0 = time.perf_counter()
        await step(i)
        timings.append((time.perf_counter() - t0) * 1000.0)
    return timings
