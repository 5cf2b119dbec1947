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
import dataclasses
import json
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    FailureError,
    is_cancelled_exception,
)
from temporalio.workflow import ActivityCancellationType, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from agent import loop, ptc
    from agent.contracts import (
        ActivityPolicy,
        AgentInput,
        AgentReply,
        AgentResult,
        AgentStatus,
        ChatMessage,
        EnvBuildInput,
        EnvRecord,
        EnvRef,
        EnvToolInput,
        EnvToolOutput,
        PlanInput,
        PlanOutput,
        ToolCallRecord,
        ToolInput,
        ToolOutput,
        WORKFLOW_NATIVE_TOOLS,
    )
    from agent.errors import NON_RETRYABLE_ERROR_TYPES, ToolExecutionError, ToolValidationError
    from agent.tools import NATIVE_TOOLS, TOOLS, validate_arguments


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
        # Cancelling a turn waits until the activity has stopped (it learns of it through a heartbeat),
        # so a cancelled run's history ends with ActivityTaskCanceled, not with work still running.
        "cancellation_type": ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
    }


async def _run_activity(activity: str, arg: Any, result_type: type, summary: str, options: dict[str, Any], *,
                        local: bool) -> Any:
    """An activity, or (``local``) a local activity: run by the worker that runs the workflow task, no dispatch
    through the server, its result recorded as a marker when the task completes. A local activity has no heartbeat
    (the workflow task's own lease covers it) and the same retry policy."""
    if local:
        return await workflow.execute_local_activity(
            activity, arg, result_type=result_type, summary=summary,
            **{k: v for k, v in options.items() if k != "heartbeat_timeout"})
    return await workflow.execute_activity(activity, arg, result_type=result_type, summary=summary, **options)


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class _InnerToolFailure(Exception):
    """A tool called from a ``run_ptc`` program did not succeed; the interpreter reports it with the line."""


def _failure_text(err: BaseException) -> str:
    """The message that explains a failure: the innermost cause below activity/child wrappers."""
    while isinstance(err, (ActivityError, ChildWorkflowError)) and err.cause is not None:
        err = err.cause
    return getattr(err, "message", None) or str(err)


class _ActivityEffects:
    """``loop.AgentEffects`` on Temporal: the model and every tool are activities, except the
    workflow-native tools (``spawn``, ``wait``, ``run_ptc``), which the workflow runs itself."""

    def __init__(self, wf: AgentWorkflow) -> None:
        self._wf = wf

    async def plan(self, messages: list[dict[str, Any]], tools: list[str]) -> dict[str, Any]:
        cfg = self._wf.config
        self._wf.state = "planning"
        env = self._wf.env_ref()
        builtin = [t for t in tools if t not in self._wf.env_tool_names()]
        try:
            out = await _run_activity(
                "plan_next_action", PlanInput.of(cfg.model, messages, builtin, env),
                PlanOutput, f"model {cfg.model}", _activity_options(cfg.planning), local=cfg.local_model)
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise asyncio.CancelledError("model call cancelled") from err  # no further model turn
            raise
        self._wf.env_updated(out.env_record)
        return out.message

    async def call_tool(self, call: loop.ToolCall) -> loop.ToolResult:
        if call.name in WORKFLOW_NATIVE_TOOLS:
            return await self._wf.native_tool(call)
        if call.name in self._wf.env_tool_names():
            return await self.env_tool(call)
        return await self.activity_tool(call)

    async def env_tool(self, call: loop.ToolCall) -> loop.ToolResult:
        """A tool of the environment (``bash``, ``click_element``...): the ``env_tool`` activity runs it."""
        env = self._wf.env_ref()
        assert env is not None
        options = _activity_options(self._wf.config.tool)
        # The environment's own time limit plus a margin: a command may use all of it.
        limit = float(env.record.data.get("tool_timeout_s", 0)) + 30.0
        options["start_to_close_timeout"] = max(options["start_to_close_timeout"], timedelta(seconds=limit))
        out = await self._tool_activity(
            call, "env_tool", EnvToolInput(env=env, call_id=call.id, name=call.name, arguments=call.arguments),
            EnvToolOutput, options)
        if isinstance(out, EnvToolOutput):
            self._wf.env_updated(out.env_record)
            return loop.ToolResult(call.id, call.name, out.status, out.content)
        return out

    async def activity_tool(self, call: loop.ToolCall) -> loop.ToolResult:
        out = await self._tool_activity(
            call, call.name, ToolInput(call_id=call.id, arguments=call.arguments, workspace=self._wf.workspace),
            ToolOutput, _activity_options(self._wf.config.tool), local=call.name in self._wf.config.local_tools)
        return loop.ToolResult(call.id, call.name, out.status, out.content) if isinstance(out, ToolOutput) else out

    async def _tool_activity(self, call: loop.ToolCall, activity: str, arg: Any, result_type: type,
                             options: dict[str, Any], local: bool = False) -> Any:
        """Run a tool call's activity (``local``: as a local activity): its output, or the model-visible result of
        its failure."""
        self._wf.state = "running_tools"
        args = json.dumps(call.arguments, sort_keys=True)
        try:
            return await _run_activity(activity, arg, result_type, f"{call.name}({args[:120]})", options, local=local)
        except ActivityError as err:
            if is_cancelled_exception(err):
                raise asyncio.CancelledError(f"{call.name} cancelled") from err
            if isinstance(err.cause, ApplicationError) and err.cause.type == ToolExecutionError.error_type:
                return loop.ToolResult(call.id, call.name, loop.EXECUTION_ERROR, err.cause.message)
            # Retries exhausted or timed out: the infrastructure gave up; the model decides what next.
            return loop.ToolResult(call.id, call.name, loop.FAILED, f"{call.name} failed: {_failure_text(err)}")


#: how many answered updates a conversation remembers across continue-as-new (a re-send comes soon after)
ANSWERED_UPDATES_KEPT = 32


def _reply_from_dict(d: dict[str, Any]) -> AgentReply:
    return AgentReply(text=d["text"], turn=d["turn"], steps=d["steps"],
                      tool_calls=[ToolCallRecord(**t) for t in d.get("tool_calls") or []],
                      stopped_early=d.get("stopped_early", False))


@workflow.defn
class AgentWorkflow:
    @workflow.init
    def __init__(self, inp: AgentInput) -> None:
        self.config = inp.config
        self.messages: list[dict[str, Any]] = inp.messages or loop.initial_messages(inp.config.system_prompt)
        self.turns = inp.turns
        self.run_index = inp.run_index
        self.depth = inp.depth
        self.workspace = inp.workspace  # None: this run's own workspace (its workflow id)
        self.children_started = inp.children_started
        self.state = "idle"
        self.last_error: str | None = None
        self._ended = False
        self._continue_due = False
        self._turn_lock = asyncio.Lock()  # turns run one at a time, in the order their updates were accepted
        self._turn_tasks: list[asyncio.Task] = []  # running send_message handlers (cancelled with the run)
        self._detached: dict[str, asyncio.Task] = {}  # spawn(wait=False) handle -> the task awaiting that child
        self._carried: dict[str, list[str]] = dict(inp.detached_results)  # finished before continue-as-new
        self._inner_calls = 0
        self.env_record: EnvRecord | None = inp.env_record  # None until env_build has run (or no environment)
        self.owns_env = inp.owns_env
        self._answered: dict[str, dict[str, Any]] = dict(inp.answered_updates)  # update id -> its reply

    @workflow.run
    async def run(self, inp: AgentInput) -> AgentResult:
        """Build the environment (if any), run the conversation, and clean the environment up at the end,
        whether the run completed, failed or was cancelled (not at continue-as-new: the next run keeps it)."""
        try:
            await self._build_env()
            result = await self._run(inp)
        except asyncio.CancelledError:
            await self._cleanup_env("cancelled")
            raise
        except FailureError:
            await self._cleanup_env("failed")
            raise
        if result is not None:
            await self._cleanup_env("ended")
            return result
        workflow.continue_as_new(
            AgentInput(config=self.config, messages=self.messages, turns=self.turns, run_index=self.run_index + 1,
                       depth=self.depth, workspace=self.workspace, children_started=self.children_started,
                       detached_results={**self._carried, **{h: [t.result().status, t.result().content]
                                                             for h, t in self._detached.items()}},
                       env_record=self.env_record, owns_env=self.owns_env, answered_updates=self._answered)
        )

    async def _run(self, inp: AgentInput) -> AgentResult | None:
        """The conversation; None when it is time to continue as new."""
        try:
            if inp.prompt is not None:
                reply = await self._turn(inp.prompt)
                self.state = "ended"
                return AgentResult(reply.text, self.turns, len(self.messages), self.run_index, "one_shot")
            await workflow.wait_condition(
                lambda: (self._ended or (self._continue_due and not self._children_running()))
                and workflow.all_handlers_finished()
            )
        except asyncio.CancelledError:
            # The run was cancelled: stop every turn and subagent it has in flight (each waits for its own
            # activities and children to stop), and end as cancelled, without asking the model again.
            self.state = "cancelled"
            await self._cancel_in_flight()
            raise
        if self._ended:
            self.state = "ended"
            return AgentResult(None, self.turns, len(self.messages), self.run_index, "end_chat")
        return None

    # -- the environment ----------------------------------------------------------------------------

    def env_ref(self) -> EnvRef | None:
        if self.env_record is None or self.config.env.name == "base":
            return None
        return EnvRef(config=self.config.env, record=self.env_record)

    def env_tool_names(self) -> list[str]:
        return self.env_record.tool_names() if self.env_ref() is not None else []  # type: ignore[union-attr]

    def tools(self) -> list[str]:
        """What the model is offered: the configured tools, then the environment's."""
        return [*self.config.tools, *[t for t in self.env_tool_names() if t not in self.config.tools]]

    def env_updated(self, record: EnvRecord | None) -> None:
        if record is not None:
            self.env_record = record

    def _env_options(self, minimum_s: float, attempts: int) -> dict[str, Any]:
        options = _activity_options(self.config.tool)
        options["start_to_close_timeout"] = max(options["start_to_close_timeout"], timedelta(seconds=minimum_s))
        options["retry_policy"].maximum_attempts = attempts
        return options

    async def _build_env(self) -> None:
        if self.config.env.name == "base" or self.env_record is not None:
            return  # no environment, or built by an earlier run of the chain (or the parent agent)
        info = workflow.info()
        self.state = "building_env"
        self.env_record = await workflow.execute_activity(
            "env_build",
            EnvBuildInput(config=self.config.env, env_id=f"{info.workflow_id}-{info.first_execution_run_id[:8]}"),
            result_type=EnvRecord,
            summary=f"build environment {self.config.env.name}",
            **self._env_options(180.0, 0),
        )
        self.state = "idle"

    async def _cleanup_env(self, why: str) -> None:
        ref = self.env_ref()
        if ref is None or not self.owns_env:
            return
        try:
            await workflow.execute_activity(
                "env_cleanup", ref, result_type=str, summary=f"clean up environment {ref.config.name} ({why})",
                **self._env_options(120.0, 5),
            )
        except ActivityError as err:
            # The run ends anyway; the operator learns what was left behind from the history and this error.
            self.last_error = f"environment cleanup failed: {_failure_text(err)}"
            workflow.logger.warning(self.last_error)

    @workflow.update
    async def send_message(self, message: ChatMessage) -> AgentReply:
        update = workflow.current_update_info()
        update_id = update.id if update is not None else None
        if update_id is not None and update_id in self._answered:
            # A client re-sent an update it got no answer to, after continue-as-new: the same reply, no new turn.
            return _reply_from_dict(self._answered[update_id])
        task = asyncio.current_task()
        if task is not None:
            self._turn_tasks.append(task)
        try:
            async with self._turn_lock:
                reply = await self._turn(message.text)
        finally:
            if task is not None:
                self._turn_tasks.remove(task)
        if update_id is not None:
            self._answered[update_id] = dataclasses.asdict(reply)
            while len(self._answered) > ANSWERED_UPDATES_KEPT:
                del self._answered[next(iter(self._answered))]
        return reply

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
            depth=self.depth,
            children_started=self.children_started,
            children_running=sum(1 for t in self._detached.values() if not t.done()),
            env=f"{self.env_record.name}: {self.env_record.note}" if self.env_record else None,
        )

    async def _turn(self, text: str) -> AgentReply:
        checkpoint = len(self.messages)
        try:
            result = await loop.run_turn(
                self.messages, text, _ActivityEffects(self), self.tools(), self.config.max_steps_per_turn
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

    def _children_running(self) -> bool:
        # A detached child must not be cut off by continue-as-new (the parent-close policy terminates it).
        return any(not t.done() for t in self._detached.values())

    async def _cancel_in_flight(self) -> None:
        tasks = [t for t in [*self._turn_tasks, *self._detached.values()] if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            await workflow.wait_condition(lambda: all(t.done() for t in tasks))

    # -- workflow-native tools --------------------------------------------------------------------

    async def native_tool(self, call: loop.ToolCall) -> loop.ToolResult:
        """``spawn``, ``wait`` and ``run_ptc``: orchestration the workflow does itself, no activity."""
        try:
            validate_arguments(NATIVE_TOOLS[call.name], call.arguments)  # the same check an activity makes
        except ToolValidationError as err:
            return loop.ToolResult(call.id, call.name, loop.VALIDATION_ERROR, str(err))
        if call.name == "spawn":
            args = call.arguments
            return await self._spawn(call, args["agent_name"], args["task"], args.get("wait", True))
        if call.name == "wait":
            return await self._wait(call, call.arguments["handle"])
        return await self._run_ptc(call, call.arguments["code"])

    async def _spawn(self, call: loop.ToolCall, agent_name: str, task: str, wait: bool) -> loop.ToolResult:
        cfg = self.config

        def refuse(status: str, text: str) -> loop.ToolResult:
            return loop.ToolResult(call.id, "spawn", status, text)

        profile = cfg.subagents.get(agent_name)
        if profile is None:
            known = ", ".join(cfg.subagents) or "none are configured"
            return refuse(loop.VALIDATION_ERROR, f"spawn: unknown agent_name {agent_name!r}; profiles: {known}")
        if not task.strip():
            return refuse(loop.VALIDATION_ERROR, "spawn: task is empty; describe what the subagent must do")
        if self.depth >= cfg.max_depth:
            return refuse(loop.EXECUTION_ERROR,
                          f"spawn refused: the subagent depth limit is {cfg.max_depth} and this agent is at depth "
                          f"{self.depth}; do this task yourself with your own tools")
        if self.children_started >= cfg.max_children:
            return refuse(loop.EXECUTION_ERROR,
                          f"spawn refused: this run has used its budget of {cfg.max_children} subagents; "
                          "finish with what you have or do the rest yourself")
        self.children_started += 1
        info = workflow.info()
        child_id = f"{info.workflow_id}/{agent_name}-{self.children_started}"
        child_input = AgentInput(
            config=dataclasses.replace(
                cfg, model=profile.model or cfg.model, tools=list(profile.tools), system_prompt=profile.instructions,
                max_steps_per_turn=profile.max_steps_per_turn, max_history_events=0, max_history_bytes=0,
            ),
            prompt=task,
            depth=self.depth + 1,
            workspace=self.workspace or info.workflow_id,  # subagents share the root agent's workspace
            env_record=self.env_record,  # ... and its environment, which they neither build nor clean up
            owns_env=False,
        )
        if wait:
            return await self._run_child(call.id, agent_name, child_id, child_input)
        handle = child_id.rsplit("/", 1)[1]
        self._detached[handle] = asyncio.create_task(self._run_child(call.id, agent_name, child_id, child_input))
        return loop.ToolResult(call.id, "spawn", loop.OK, handle)

    async def _run_child(self, call_id: str, agent_name: str, child_id: str, child_input: AgentInput
                         ) -> loop.ToolResult:
        self.state = "running_tools"
        try:
            result = await workflow.execute_child_workflow(
                workflow.info().workflow_type,  # this class, or the subclass a worker registered
                child_input,
                id=child_id,
                task_queue=workflow.info().task_queue,
                task_timeout=workflow.info().task_timeout,  # a subagent notices a dead worker as fast as its parent
                result_type=AgentResult,
                parent_close_policy=ParentClosePolicy.TERMINATE,
                static_summary=f"subagent {agent_name}: {child_input.prompt or ''}"[:200],
            )
        except ChildWorkflowError as err:
            if is_cancelled_exception(err) and _cancelling():
                raise asyncio.CancelledError(f"subagent {child_id} cancelled") from err
            return loop.ToolResult(call_id, "spawn", loop.EXECUTION_ERROR,
                                   f"subagent {agent_name} ({child_id}) failed: {_failure_text(err)}")
        return loop.ToolResult(call_id, "spawn", loop.OK, result.reply or "")

    async def _wait(self, call: loop.ToolCall, handle: str) -> loop.ToolResult:
        if handle in self._carried:
            status, content = self._carried[handle]
            return loop.ToolResult(call.id, "wait", status, content)
        task = self._detached.get(handle)
        if task is None:
            known = ", ".join([*self._carried, *self._detached]) or "none; start one with spawn(..., wait=false)"
            return loop.ToolResult(call.id, "wait", loop.VALIDATION_ERROR,
                                   f"wait: unknown handle {handle!r}; open handles: {known}")
        # Shielded: if this wait is cancelled (a failed sibling in a run_ptc gather), the child keeps running.
        done = await asyncio.shield(task)
        return loop.ToolResult(call.id, "wait", done.status, done.content)

    async def _run_ptc(self, call: loop.ToolCall, code: str) -> loop.ToolResult:
        cfg = self.config
        tools = {name: self._ptc_tool(call, name) for name in self.tools() if name != "run_ptc"}
        try:
            result = await ptc.run_ptc(code, tools, limits=cfg.ptc)
        except ptc.PtcToolError as err:
            return loop.ToolResult(call.id, "run_ptc", loop.EXECUTION_ERROR,
                                   f"run_ptc: {err}; fix the program or its tool call and run it again")
        except ptc.PtcError as err:
            return loop.ToolResult(call.id, "run_ptc", loop.VALIDATION_ERROR,
                                   f"run_ptc: {err} (the program did not finish; nothing after that line ran)")
        value = ptc.render_value(result.value)  # deterministic: sets sorted, no memory addresses
        text = f"printed:\n{result.output.rstrip()}\nresult: {value}" if result.output else value
        return loop.ToolResult(call.id, "run_ptc", loop.OK, text)

    def _ptc_tool(self, parent: loop.ToolCall, name: str) -> ptc.ToolFn:
        """A tool as a ``run_ptc`` program sees it: the same transport as a direct call of that tool."""
        env_specs = {t["function"]["name"]: t["function"] for t in (self.env_record.tools if self.env_ref() else [])}
        if name in env_specs:
            params = list(env_specs[name].get("parameters", {}).get("properties", {}))
        else:
            params = list((TOOLS.get(name) or NATIVE_TOOLS[name]).parameters.get("properties", {}))
        effects = _ActivityEffects(self)

        async def call_tool(*args: Any, **kwargs: Any) -> str:
            if len(args) > len(params):
                raise _InnerToolFailure(f"takes at most {len(params)} positional argument(s) ({', '.join(params)})")
            arguments = dict(zip(params, args))
            for key, value in kwargs.items():
                if key in arguments:
                    raise _InnerToolFailure(f"got two values for argument {key!r}")
                arguments[key] = value
            self._inner_calls += 1
            inner = loop.ToolCall(id=f"{parent.id}.ptc{self._inner_calls}", name=name, arguments=arguments)
            result = await effects.call_tool(inner)
            if result.status != loop.OK:
                raise _InnerToolFailure(f"{result.status}: {result.content}")
            return result.content

        return call_tool
