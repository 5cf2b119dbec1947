"""``run_durable``: a plain async task function, checkpointed step by step in a ``DurableRunStore``.

    async def task(ctx: DurableContext) -> str:
        plan = await ctx.step("llm:plan", lambda: call_model(...), kind="llm", input_fingerprint=messages)
        when = await ctx.now()
        return plan["content"]

    result = await run_durable("run-1", manifest, SqliteStore("runs.db"), task, worker_id=derive_worker_id())

On the first execution each ``ctx.step`` runs its function and commits the
result before returning it. After a crash, the next ``run_durable`` with the
same run id (once the dead worker's lease has expired) returns the committed
results *without running the functions again*, in order, until it reaches
the first step with no committed result, and executes from there. A step at
a position whose recorded intent differs raises ``DivergenceError``; a
different input fingerprint raises ``StepInputMismatchError``.

The lease is renewed every ``lease_ms / 3`` in the background. If a renewal
finds that another worker holds the run, the current step's function is
cancelled and ``LeaseHeldError`` is raised: steps already committed stay.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import traceback
import uuid as uuid_module
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from testbed.engines.checkpoint.records import (
    DEFAULT_LEASE_MS,
    AwaitEventTimeoutError,
    DivergenceError,
    DurableRunManifest,
    LeaseHeldError,
    RunOutcome,
    RunRecord,
    StepError,
    StepInputMismatchError,
    StepRecord,
    canonical_hash,
    derive_worker_id,
)
from testbed.engines.checkpoint.steps import StepInfo, reset_current_step, set_current_step
from testbed.engines.checkpoint.stores import DurableRunStore

T = TypeVar("T")


@dataclass(frozen=True)
class StepRetry:
    """How ``ctx.step`` retries a failing step function in place (same position, ``attempts`` + 1).

    ``maximum_attempts`` 0 retries until it succeeds (a model outage); exceptions whose class name is in
    ``non_retryable`` fail the step at once. Without a policy a step runs once and its error propagates.
    """

    initial_interval_s: float = 1.0
    backoff_coefficient: float = 2.0
    maximum_interval_s: float = 60.0
    maximum_attempts: int = 0
    non_retryable: tuple[str, ...] = ()

    def delay(self, attempt: int) -> float:
        return min(self.initial_interval_s * self.backoff_coefficient ** (attempt - 1), self.maximum_interval_s)

    def gives_up(self, attempt: int, exc: BaseException) -> bool:
        if type(exc).__name__ in self.non_retryable or getattr(exc, "error_type", None) in self.non_retryable:
            return True
        return self.maximum_attempts > 0 and attempt >= self.maximum_attempts


class DurableContext:
    """What a task function sees: checkpointed steps, events, clock and uuids."""

    def __init__(self, run_id: str, manifest: DurableRunManifest, store: DurableRunStore, worker_id: str,
                 completed: list[StepRecord], lease_lost: asyncio.Event, begun_before: int = 0) -> None:
        self.run_id = run_id
        self.project_id = manifest.project_id
        self.scenario_id = manifest.scenario_id
        self.input = manifest.input
        self.store = store
        self.worker_id = worker_id
        self._recorded = {s.step_index: s for s in completed}
        self._next = 0
        self._lease_lost = lease_lost
        self._begun_before = begun_before  # positions an earlier execution began (completed or not)
        self._in_steps: set[asyncio.Task] = set()  # tasks running a step function now (cancelled on lease loss)
        self.steps: list[StepRecord] = []  # every step of this execution, replayed or run
        self.replayed = 0
        self.executed = 0

    def _position(self) -> int:
        index = self._next
        self._next += 1
        return index

    def _check(self, recorded: StepRecord, intent: str, input_hash: str) -> None:
        if recorded.intent != intent:
            raise DivergenceError(f"run {self.run_id!r} step {recorded.step_index}: recorded as {recorded.intent!r}, "
                                  f"now {intent!r}; the task function changed the order of its steps")
        if input_hash and recorded.input_hash and recorded.input_hash != input_hash:
            raise StepInputMismatchError(f"run {self.run_id!r} step {recorded.step_index} ({intent!r}): its input "
                                         "differs from the recorded one")

    async def step(self, intent: str, fn: Callable[[], Awaitable[T] | T], *, kind: str = "logic",
                   input_fingerprint: Any = None, retry: StepRetry | None = None) -> T:
        index = self._position()
        input_hash = canonical_hash(input_fingerprint) if input_fingerprint is not None else ""
        recorded = self._recorded.get(index)
        if recorded is not None:
            self._check(recorded, intent, input_hash)
            self.steps.append(recorded)
            self.replayed += 1
            return recorded.result  # type: ignore[no-any-return]
        if self._lease_lost.is_set():
            raise LeaseHeldError(f"run {self.run_id!r}: worker {self.worker_id} lost its lease")
        if index < self._begun_before:  # begun (or failed) by an earlier execution, never completed
            previous = await self.store.load_step(self.run_id, index)
            if previous is not None:
                self._check(previous, intent, input_hash)
        while True:
            begun = await self.store.begin_step(self.run_id, index, intent, kind, input_hash,
                                                worker_id=self.worker_id)
            try:
                result = await self._guarded(fn, StepInfo(self.run_id, index, begun.attempts, self.worker_id))
                break
            except LeaseHeldError:
                raise
            except Exception as exc:
                error = StepError(message=str(exc) or type(exc).__name__, code=type(exc).__name__,
                                  stack="".join(traceback.format_exception(exc))[-4000:])
                with contextlib.suppress(LeaseHeldError):
                    await self.store.fail_step(self.run_id, index, error, worker_id=self.worker_id)
                if retry is None or retry.gives_up(begun.attempts, exc):
                    raise
                await self._sleep_unless_lost(retry.delay(begun.attempts))
        record = await self.store.complete_step(self.run_id, index, result, worker_id=self.worker_id)
        self.steps.append(record)
        self.executed += 1
        return result

    async def _sleep_unless_lost(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._lease_lost.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            return
        raise LeaseHeldError(f"run {self.run_id!r}: worker {self.worker_id} lost its lease while backing off")

    async def _guarded(self, fn: Callable[[], Awaitable[T] | T], info: StepInfo) -> T:
        """Run the step's function (``current_step()`` tells it which step). If the lease is lost meanwhile,
        ``lease_lost()`` cancels it and the step raises ``LeaseHeldError``."""
        token = set_current_step(info)
        task = asyncio.current_task()
        try:
            value = fn()
            if not inspect.isawaitable(value):
                return value
            if task is not None:
                self._in_steps.add(task)
            return await value
        except asyncio.CancelledError:
            if self._lease_lost.is_set():
                if task is not None:
                    task.uncancel()  # the cancellation was ours, and is answered by the error below
                raise LeaseHeldError(f"run {self.run_id!r}: worker {self.worker_id} lost its lease mid-step") from None
            raise
        finally:
            self._in_steps.discard(task)  # type: ignore[arg-type]
            reset_current_step(token)

    def lease_lost(self) -> None:
        """Called by the lease renewer: stop every step function that is running now."""
        self._lease_lost.set()
        for task in list(self._in_steps):
            task.cancel()

    async def now(self) -> dt.datetime:
        text = await self.step("now", lambda: dt.datetime.now(dt.timezone.utc).isoformat(), kind="deterministic")
        return dt.datetime.fromisoformat(text)

    async def uuid(self) -> str:
        return await self.step("uuid", lambda: str(uuid_module.uuid4()), kind="deterministic")

    async def emit_event(self, key: str, payload: Any) -> bool:
        accepted, _ = await self.store.emit_event(self.run_id, key, payload)
        return accepted

    async def await_event(self, key: str, timeout_s: float = 60.0, poll_s: float = 0.05) -> Any:
        """Wait for the event (first emit wins); its payload is checkpointed as an ``event`` step."""

        async def wait() -> Any:
            deadline = asyncio.get_running_loop().time() + timeout_s
            while True:
                event = await self.store.load_event(self.run_id, key)
                if event is not None:
                    return event.payload
                if asyncio.get_running_loop().time() >= deadline:
                    raise AwaitEventTimeoutError(f"run {self.run_id!r}: no event {key!r} within {timeout_s:g} s")
                await asyncio.sleep(poll_s)

        return await self.step(f"event:{key}", wait, kind="event")


@dataclass
class RunDurableResult:
    result: Any
    record: RunRecord
    steps: list[StepRecord] = field(default_factory=list)  # replayed and freshly executed
    replayed: int = 0
    executed: int = 0


async def run_durable(run_id: str, manifest: DurableRunManifest, store: DurableRunStore,
                      task_fn: Callable[[DurableContext], Awaitable[Any]], *, worker_id: str | None = None,
                      lease_ms: int = DEFAULT_LEASE_MS, default_outcome: RunOutcome | None = None,
                      end_on_failure: bool = False) -> RunDurableResult:
    """Run (or resume) ``task_fn`` under a lease. On success the run ends ``completed``.

    A task function that raises leaves the run open for a later attempt (a step failure after a fix,
    say) unless ``end_on_failure``; a lost lease always leaves it to the worker that holds it now.
    """
    worker_id = worker_id or derive_worker_id()
    start = await store.start_or_resume(run_id, manifest, worker_id, lease_ms)
    lost = asyncio.Event()

    async def renew() -> None:
        while True:
            await asyncio.sleep(lease_ms / 3000)
            try:
                ok, _ = await store.renew_lease(run_id, worker_id, lease_ms)
            except Exception:  # a store hiccup: try again at the next tick; the lease may still expire
                continue
            if not ok:
                ctx.lease_lost()
                return

    ctx = DurableContext(run_id, manifest, store, worker_id, start.completed_steps, lost,
                         begun_before=start.run.step_count)
    renewer = asyncio.create_task(renew())
    try:
        result = await task_fn(ctx)
    except LeaseHeldError:
        raise
    except Exception as exc:
        if end_on_failure:
            with contextlib.suppress(LeaseHeldError):
                await store.end_run(run_id, worker_id, "failed", RunOutcome(pass_=False, notes=str(exc)[:500]))
        raise
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewer
    record = await store.end_run(run_id, worker_id, "completed", default_outcome)
    return RunDurableResult(result, record, ctx.steps, ctx.replayed, ctx.executed)


__all__ = ["DurableContext", "RunDurableResult", "StepRetry", "run_durable"]
