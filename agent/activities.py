"""Activities: the agent's only contact with the world on Temporal.

``plan_next_action`` calls the model; every tool is an activity of its own
name (``calculator``, ``write_file``, ...), so a history says which tools ran
and how many attempts each took. Each activity heartbeats while it works, so
a killed worker is noticed after the heartbeat timeout rather than after the
whole start-to-close timeout.

Error routing (see ``agent.errors``): a validation error is *returned* (the
activity succeeds and the model sees the feedback); a known execution failure
is raised as a non-retryable ApplicationError; a retryable error or an
unclassified exception is raised and retried by the workflow's policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.service import RPCError, RPCStatusCode
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from agent import llm
from agent.contracts import (
    EnvBuildInput,
    EnvRecord,
    EnvRef,
    EnvToolInput,
    EnvToolOutput,
    PlanInput,
    PlanOutput,
    ToolInput,
    ToolOutput,
)
from agent.envs.base import Env, EnvConfigError, EnvContext, EnvUnavailableError
from agent.env_options import option
from agent.envs.registry import get_env
from agent.errors import (
    ENV_UNAVAILABLE,
    ModelConfigurationError,
    ToolExecutionError,
    ToolRetryableError,
    ToolValidationError,
)
from harness.recording import EffectLedger, ExecutionIdentity
from agent.loop import VALIDATION_ERROR
from agent.tools import TOOLS, Tool, ToolContext, run_tool, tool_specs, validate_arguments, workspace_for


def stale_check_enabled() -> bool:
    """Check with the server that an attempt is still the live one before the model call (``DAH_STALE_CHECK=0``:
    don't). Read per call: a worker forked from a warm parent has its own environment."""
    return option("DAH_STALE_CHECK") == "1"


#: the execution outcome of an attempt that found itself stale and did not call the model
STALE_SKIPPED = "stale_skipped"


async def attempt_is_current() -> bool:
    """Whether the server still holds this activity attempt as the running one: a heartbeat round trip with its
    task token. ``False`` only when the server says the attempt is gone (timed out and retried, or the activity
    closed); any other error says nothing, and the attempt goes on (at-least-once is the fallback)."""
    info = activity.info()
    if info.is_local:
        return True
    try:
        await activity.client().get_async_activity_handle(task_token=info.task_token).heartbeat()
    except RPCError as exc:
        return exc.status != RPCStatusCode.NOT_FOUND
    except Exception:  # cancelled, paused, reset: the SDK's own handling takes it from here
        return True
    return True


def may_be_stale(info: activity.Info, now: datetime | None = None) -> bool:
    """Whether the server could already have timed this attempt out, so that asking it is worth a round trip.

    Not while the attempt is younger than half its shortest timeout (heartbeat or start-to-close): the server
    cannot have given up on it yet. A worker that was paused or cut off after it got the task is older than
    that by then, and asks. ``started_time`` is the server's clock; a worker clock behind it by more than half
    a timeout could skip a check that was needed, and the fallback is at-least-once (the model is called).
    """
    if info.is_local:
        return False  # a local activity has no server-side attempt to lose
    limits = [t.total_seconds() for t in (info.heartbeat_timeout, info.start_to_close_timeout) if t]
    if not limits:
        return True
    elapsed = ((now or datetime.now(timezone.utc)) - info.started_time).total_seconds()
    return elapsed < 0 or elapsed >= min(limits) / 2


log = logging.getLogger(__name__)
#: the ``extra`` flag on the log record of a model call that failed for good (see plan_next_action)
MODEL_FAILURE_LOG = "dah_model_failure"


@contextlib.asynccontextmanager
async def heartbeating(every_s: float | None = None) -> AsyncIterator[None]:
    """Heartbeat in the background while the body runs (the SDK throttles what it sends to 80% of the
    heartbeat timeout). By default every quarter of the timeout, at most every second: a short timeout (fast
    recovery from a dead worker) still leaves three beats of slack for a busy event loop."""
    if activity.info().is_local:  # a local activity has no heartbeat: the workflow task's lease covers it
        yield
        return
    if every_s is None:
        timeout = activity.info().heartbeat_timeout
        every_s = min(1.0, timeout.total_seconds() / 4) if timeout else 1.0

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(every_s)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class AgentActivities:
    """The activity implementations of one worker process."""

    def __init__(
        self,
        *,
        sandbox_root: Path,
        ledger: EffectLedger,
        worker_identity: str,
        model_base_url: str | None,
        envs_root: Path | None = None,
    ) -> None:
        self.sandbox_root = sandbox_root
        # Environments (agent.envs) keep their workspaces, tokens and logs here, one directory each.
        # Absolute: the shell environment tells the model (and the operator) where its workspace is on the host.
        self.env_ctx = EnvContext(root=(envs_root or sandbox_root.parent / "envs").resolve(), ledger=ledger)
        self.ledger = ledger
        self.worker_identity = worker_identity
        self.model_base_url = model_base_url

    def _identity(self) -> ExecutionIdentity:
        return ExecutionIdentity.current(self.worker_identity)

    def all(self) -> list[Callable[..., Any]]:
        return [self.plan_next_action, self.env_build, self.env_tool, self.env_cleanup,
                *(self._tool_activity(name) for name in TOOLS)]

    # -- environments -------------------------------------------------------------------------------

    async def _open_env(self, ref: EnvRef) -> tuple[Env, str]:
        """Attach to the environment the record describes (or rebuild it); the note says which."""
        env = get_env(ref.config, self.env_ctx, ref.record.env_id)
        try:
            note = await env.attach(ref.record)
        except (EnvUnavailableError, EnvConfigError) as exc:
            raise _env_unavailable(exc) from None
        if note.startswith("rebuilt"):
            log.warning("environment %s of %s: %s", ref.config.name, ref.record.env_id, note)
        else:
            log.debug("environment %s of %s: %s", ref.config.name, ref.record.env_id, note)
        return env, note

    @activity.defn(name="env_build")
    async def env_build(self, inp: EnvBuildInput) -> EnvRecord:
        try:
            env = get_env(inp.config, self.env_ctx, inp.env_id)
            async with heartbeating():
                record = await env.build()
        except (EnvUnavailableError, EnvConfigError) as exc:
            log.warning("environment %s for %s cannot be built: %s", inp.config.name, inp.env_id, exc)
            raise _env_unavailable(exc) from None
        log.info("environment %s for %s: %s", inp.config.name, inp.env_id, record.note)
        return record

    @activity.defn(name="env_cleanup")
    async def env_cleanup(self, ref: EnvRef) -> str:
        env = get_env(ref.config, self.env_ctx, ref.record.env_id)
        env.record = ref.record
        async with heartbeating():
            done = await env.cleanup()
        log.info("environment %s of %s cleaned up: %s", ref.config.name, ref.record.env_id, done)
        return done

    @activity.defn(name="env_tool")
    async def env_tool(self, inp: EnvToolInput) -> EnvToolOutput:
        ident = self._identity()
        before = repr(inp.env.record)
        env, note = await self._open_env(inp.env)
        tool = next((t for t in env.get_tools() if t.name == inp.name), None)
        if tool is None:
            names = ", ".join(t.name for t in env.get_tools()) or "none"
            return EnvToolOutput(VALIDATION_ERROR, f"{inp.name}: not a tool of this environment; its tools: {names}")
        ctx = ToolContext(workspace=env.directory, ledger=self.ledger, ident=ident)
        out = await self._execute(inp.name, tool, inp.arguments, ctx)
        changed = env.record is not None and repr(env.record) != before
        return EnvToolOutput(out.status, out.content, env_record=env.record if changed else None, env_note=note)

    @activity.defn(name="plan_next_action")
    async def plan_next_action(self, inp: PlanInput) -> PlanOutput:
        info = activity.info()
        timeout = info.start_to_close_timeout.total_seconds() if info.start_to_close_timeout else 60.0
        # Model calls are recorded like side effects: they cost money, and a checker counts them. (The ledger is
        # also where harness.faults acts: a worker built to crash after a model call dies in end_execution.)
        messages, specs = inp.message_list(), tool_specs(inp.tools)
        env_state = env_record = env_note = None
        if inp.env is not None:
            # The environment's state is read here, in the activity, and shown to the model as the last message.
            before = repr(inp.env.record)
            env, env_note = await self._open_env(inp.env)
            async with heartbeating():
                env_state = await env.get_state()
            env_record = env.record if repr(env.record) != before else None
            specs = specs + [t.spec() for t in env.get_tools()]
            messages = [*messages, {"role": "system",
                                    "content": f"Environment state ({inp.env.config.name}):\n{env_state}"}]
        execution = self.ledger.begin_execution(self._identity(), "plan_next_action", model_call=True)
        if stale_check_enabled() and may_be_stale(info) and not await attempt_is_current():
            # A paused or cut-off worker got this attempt, and the server has since timed it out and retried it
            # elsewhere: calling the model now would only waste a call whose answer nobody will read.
            self.ledger.end_execution(execution, STALE_SKIPPED)
            raise ApplicationError(f"stale attempt {info.attempt}: the server has moved on; the model was not called",
                                   type="StaleAttempt", non_retryable=False, category=ApplicationErrorCategory.BENIGN)
        outcome = "error"
        try:
            async with heartbeating():
                message, usage, latency_ms = await llm.complete(
                    inp.model,
                    messages,
                    specs,
                    scripted_base_url=self.model_base_url,
                    run_key=info.workflow_id,
                    timeout_s=max(1.0, timeout - 1.0),  # fail inside the activity, before Temporal's timeout
                )
            outcome = "ok"
        except ModelConfigurationError as exc:
            # One line for the operator (a bad key or model name needs fixing); BENIGN keeps the SDK from
            # adding a traceback. The run's caller gets the same message as the turn's failure. (A CLI that
            # prints the run's failure itself drops this record: it is marked MODEL_FAILURE_LOG.)
            message = llm.clean_message(str(exc))
            log.warning("model call refused, not retried: %s", message, extra={MODEL_FAILURE_LOG: True})
            raise ApplicationError(message, {"cause": getattr(exc, "cause", "configuration")},
                                   type=ModelConfigurationError.error_type, non_retryable=True,
                                   category=ApplicationErrorCategory.BENIGN) from None
        except llm.ModelUnavailableError as exc:
            # Expected during an outage: recorded in history, retried by policy, logged without a traceback.
            # The type names the cause (ModelUnreachable, ModelTimeout, ModelRateLimited, ModelServerError);
            # the message is llm's one line (provider, cause, what to do).
            outcome = exc.kind
            raise ApplicationError(llm.clean_message(str(exc)), {"cause": exc.cause}, type=exc.error_type,
                                   category=ApplicationErrorCategory.BENIGN) from None
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self.ledger.end_execution(execution, outcome)
        return PlanOutput(message=message, model=inp.model, latency_ms=latency_ms, usage=usage, env_state=env_state,
                          env_record=env_record, env_note=env_note)

    def _tool_activity(self, name: str) -> Callable[[ToolInput], Any]:
        async def run_tool(inp: ToolInput) -> ToolOutput:
            return await self._run_tool(name, inp)

        run_tool.__name__ = run_tool.__qualname__ = f"tool_{name}"
        return activity.defn(name=name)(run_tool)

    async def _run_tool(self, name: str, inp: ToolInput) -> ToolOutput:
        ident = self._identity()
        # A subagent works in its root agent's workspace (inp.workspace); everyone else in their own.
        ctx = ToolContext(workspace=workspace_for(self.sandbox_root, inp.workspace or ident.workflow_id),
                          ledger=self.ledger, ident=ident)
        ctx.workspace.mkdir(parents=True, exist_ok=True)
        return await self._execute(name, TOOLS[name], inp.arguments, ctx)

    async def _execute(self, name: str, tool: Tool, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        """Run one tool call in this activity, recorded in the ledger, its errors classified."""
        # Every physical run, side effect or not (a worker built with a logic bug in this tool raises here).
        execution = self.ledger.begin_execution(ctx.ident, name)
        outcome = "error"
        faults = self.ledger.faults
        try:
            validate_arguments(tool, arguments)
            if faults.mutated("slow_tool_without_heartbeat"):  # a planted bug (harness.faults.MUTATIONS)
                self.ledger.record_mutation("slow_tool_without_heartbeat", ctx.ident, name)
                hb = activity.info().heartbeat_timeout
                await asyncio.sleep((hb.total_seconds() if hb else 3.0) + 1.0)  # BUG: long work, no heartbeat
            try:
                async with heartbeating():
                    content = await run_tool(tool, arguments, ctx)
            except ToolRetryableError:
                if not faults.mutated("swallow_tool_errors"):
                    raise
                self.ledger.record_mutation("swallow_tool_errors", ctx.ident, name)
                content = "ok"  # BUG: a failure swallowed into a made-up answer
            outcome = "ok"
            return ToolOutput(status="ok", content=content)
        except ToolValidationError as exc:
            outcome = VALIDATION_ERROR
            return ToolOutput(status=VALIDATION_ERROR, content=str(exc))
        except ToolExecutionError as exc:
            outcome = "execution_error"
            # BENIGN: an expected, classified failure; the SDK logs it quietly instead of with a traceback.
            raise ApplicationError(str(exc), type=exc.error_type, non_retryable=True,
                                   category=ApplicationErrorCategory.BENIGN) from None
        except ToolRetryableError as exc:
            outcome = "retryable_error"
            raise ApplicationError(str(exc), type=exc.error_type, category=ApplicationErrorCategory.BENIGN) from None
        except (EnvUnavailableError, EnvConfigError) as exc:
            outcome = "env_unavailable"  # an environment's tool found it cannot work here: the operator's to fix
            raise _env_unavailable(exc) from None
        except asyncio.CancelledError:
            outcome = "cancelled"  # the workflow asked (seen through a heartbeat); the tool stopped
            raise
        finally:
            self.ledger.end_execution(execution, outcome)


def _env_unavailable(exc: Exception) -> ApplicationError:
    # Not retried: installing bubblewrap or fixing the config is the operator's job, not the retry policy's.
    return ApplicationError(str(exc), type=ENV_UNAVAILABLE, non_retryable=True,
                            category=ApplicationErrorCategory.BENIGN)
