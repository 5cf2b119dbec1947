"""Temporal in this process, for ``dah run`` / ``dah demo`` (``testbed.engines.base.Session``): the embedded dev
server (or the cluster the connection names) and a worker here (none with ``--no-worker``: one runs elsewhere),
each prompt one workflow. Beside it, what a command shows of a workflow (``dah chat`` too): what it is retrying and
why (``retry_line``), and one line for a failed workflow (``failure_line``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from agent.contracts import AgentConfig
from testbed.engines import SessionSpec
from testbed.engines.oneshot import RunFailedError
from testbed.engines.temporal.cluster import TemporalCluster, start_prompt
from testbed.engines.temporal.connection import TemporalConnection
from testbed.stack import Stack, StackSpec, stack


@contextlib.asynccontextmanager
async def in_process(connection: TemporalConnection, spec: SessionSpec) -> AsyncIterator[TemporalSession]:
    """The server (embedded unless ``connection`` names a cluster) and, with ``spec.worker``, a worker in this
    process on ``spec.task_queue``, sharing the model and the effect ledger ``spec`` gives; stopped on exit."""
    from agent.worker import WorkerSettings

    workers = [WorkerSettings.in_state_dir(spec.state_dir, task_queue=spec.task_queue)] if spec.worker else []
    cluster = TemporalCluster(connection, ui=spec.ui, worker_settings=workers)
    stack_spec = StackSpec(state_dir=spec.state_dir, engine=cluster, model=False, model_url=spec.model_url,
                           effect_ledger=spec.ledger, task_queue=spec.task_queue)
    logging.getLogger("agent.activities").addFilter(_not_a_model_failure)  # idempotent
    async with stack(stack_spec) as s:
        yield TemporalSession(s, spec)


@dataclass
class TemporalSession:
    """Each prompt one workflow (its id the run id); ``describe_run``: its event history tree, subagents indented."""

    stack: Stack
    spec: SessionSpec
    #: workflow id -> its first run (a chain of runs is read from there)
    _first_runs: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    @property
    def banner(self) -> str:
        s = self.stack
        where = f"embedded dev server at {s.server.address}" if s.server else s.client.service_client.config.target_host
        lines = ["durable-agent-harness demo: a durable agent loop on a real Temporal server",
                 f"Temporal:  {where} (namespace {s.client.namespace}, task queue {s.task_queue})"]
        if s.server and s.server.ui_url:
            lines.append(f"Web UI:    {s.server.ui_url}")
        return "\n".join(lines)

    async def run_turn(self, config: AgentConfig, prompt: str, run_id: str) -> dict[str, Any]:
        """The workflow ``run_id`` to its result, and its workflow and run ids; meanwhile, what it retries and why
        (``spec.say``). A failed workflow: ``RunFailedError`` with ``failure_line``."""
        from temporalio.client import WorkflowFailureError

        handle = await start_prompt(self.stack, config, prompt, run_id)
        ids = {"workflow_id": run_id, "run_id": handle.result_run_id or ""}
        self._first_runs[run_id] = ids["run_id"]
        try:
            result = await await_with_progress(handle, self.spec.say)
        except WorkflowFailureError as exc:
            raise RunFailedError(failure_line(exc, config.planning.maximum_attempts), ids) from exc
        return {**ids, **asdict(result)}

    async def describe_run(self, run_id: str) -> list[str]:
        """The workflow id; the workflow's event history tree and, indented below it, every subagent it started
        (each a child workflow with its own history); its page in the Web UI; with ``spec.transcript``, the
        conversation with the environment state the model saw at each step."""
        from harness.event_history import fetch_tree, render

        lines = [f"workflow id: {run_id}"]
        tree = await fetch_tree(self.stack.client, run_id, self._first_runs.get(run_id) or None)
        for wid, runs in tree.items():
            lines += [line if wid == run_id else "    " + line for line in render(runs).split("\n")]
        if self.stack.server is not None and self.stack.server.ui_url:
            lines.append(f"  web ui: {self.stack.server.ui_url}/namespaces/{self.stack.spec.engine.namespace}"
                         f"/workflows/{run_id}")
        if self.spec.transcript:
            from agent.transcript import transcript

            lines += ["", "transcript (with the environment state the model saw before each answer):",
                      await transcript(self.stack.client, run_id)]
        return lines

    async def walkthrough(self, walkthrough: Any) -> Any:
        """Run ``walkthrough`` and check every expectation it declares (``testbed.walkthroughs.run_walkthrough``)."""
        from testbed.walkthroughs import run_walkthrough

        outcome = await run_walkthrough(self.stack, walkthrough)
        self._first_runs[outcome.workflow_id] = outcome.runs[0].run_id
        return outcome


# -- what a command shows of a workflow -------------------------------------------------------------------------


def retry_line(p: Any, state: dict[str, Any]) -> str | None:
    """The line to show about one pending activity's retries, or None when it would be no news: news is its first
    failure, a new cause, and 4, 8, 16, ... failed attempts (not every one)."""
    from agent import llm

    if not p.HasField("last_failure"):
        return None
    failure = p.last_failure
    message = failure.message
    failed = max(1, p.attempt - 1)  # the attempt now scheduled (or running) follows the one that failed
    first = "message" not in state
    changed = not first and message != state["message"]
    if not (first or changed or (failed != state["failed"] and failed >= 4 and failed & (failed - 1) == 0)):
        return None
    state.update(message=message, failed=failed)
    at = p.next_attempt_schedule_time
    wait = at.seconds + at.nanos / 1e9 - time.time()  # unset (0): in the past, "now"
    when = f" in {wait:.0f} s" if wait >= 1 else " now"
    if p.maximum_attempts:
        limit = f"retrying{when} (attempt {failed + 1} of {p.maximum_attempts}, --max-attempts {p.maximum_attempts})"
    else:
        limit = (f"retrying{when}, with no limit on attempts: --max-attempts N bounds them "
                 "(Ctrl-C stops this command)")
    model = (failure.application_failure_info.type in llm.MODEL_FAILURE_TYPES
             or p.activity_type.name == "plan_next_action")
    what = "model call" if model else p.activity_type.name
    if first or changed:
        return f"{what} failed (attempt {failed}): {llm.clean_message(message)}; {limit}"
    return f"{what} still failing after {failed} attempts, same cause; {limit}"


async def _retry_news(handle: Any, states: dict[str, dict[str, Any]]) -> tuple[list[str], int | None]:
    """Describe the workflow once: what is news about its retried activities (``retry_line``), and how many
    activities are pending (None: the workflow could not be described)."""
    try:
        desc = await handle.describe()
    except Exception:  # progress is best effort; the result is what matters
        return [], None
    pending = desc.raw_description.pending_activities
    lines = [retry_line(p, states.setdefault(p.activity_id, {})) for p in pending]
    return [line for line in lines if line], len(pending)


async def await_with_progress(handle: Any, say: Callable[[str], None], waiting: Any = None,
                              idle: Callable[[], None] | None = None, every_s: float = 1.0) -> Any:
    """``waiting``'s result (default: the workflow's); meanwhile, ``say`` what the workflow is retrying and why
    (``_retry_news``), and call ``idle`` once if nothing of it has started after 5 s."""
    result = asyncio.ensure_future(handle.result() if waiting is None else waiting)
    states: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    try:
        while True:
            done, _ = await asyncio.wait({result}, timeout=every_s)
            if done:
                return result.result()
            news, pending = await _retry_news(handle, states)
            for line in news:
                say(line)
            if idle is not None and pending == 0 and time.monotonic() - started >= 5.0:
                idle()
                idle = None
    finally:
        if not result.done():
            result.cancel()
            with contextlib.suppress(BaseException):
                await result


def failure_line(exc: BaseException, max_attempts: int = 0) -> str:
    """One line that explains a failed run: the classified model failure when that is what ended it (with how
    many attempts it took), else the run's own failure message."""
    from temporalio.exceptions import ActivityError, ApplicationError, FailureError, RetryState

    from agent import llm

    top = getattr(exc, "cause", None) or exc
    deepest, activity, cur = top, None, top
    while cur is not None:
        if isinstance(cur, ActivityError):
            activity = cur
        deepest = cur
        cur = cur.cause if isinstance(cur, FailureError) else None
    if isinstance(deepest, ApplicationError) and deepest.type in llm.MODEL_FAILURE_TYPES:
        line = llm.clean_message(deepest.message, 600)
        if activity is not None and activity.retry_state == RetryState.MAXIMUM_ATTEMPTS_REACHED:
            tried = (f"{max_attempts} attempt{'s' if max_attempts != 1 else ''} (--max-attempts {max_attempts})"
                     if max_attempts else "--max-attempts attempts")
            line += f"; gave up after {tried}"
        elif activity is not None and activity.retry_state == RetryState.NON_RETRYABLE_FAILURE:
            line += " (not retried)"
        return line
    if isinstance(deepest, ApplicationError) and deepest is not top:
        # a classified failure below the turn's (an environment that cannot be built, a failed tool): its words
        return llm.clean_message(f"the run failed: {deepest.message} ({deepest.type or 'ApplicationError'})", 600)
    kind = getattr(top, "type", None) or type(top).__name__
    return llm.clean_message(f"the run failed ({kind}): {getattr(top, 'message', None) or top}", 600)


def _not_a_model_failure(record: logging.LogRecord) -> bool:
    """Leaves out the in-process worker's log of a failed model call: the command shows the run's failure itself."""
    from agent.activities import MODEL_FAILURE_LOG

    return not getattr(record, MODEL_FAILURE_LOG, False)
