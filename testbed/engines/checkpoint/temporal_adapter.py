"""The same task function on Temporal: step -> activity, await_event -> signal, now/uuid -> the workflow's own.

Like the seed's adapter onto a workflow engine's steps (``runOnWorkflowStep``),
this runs a substrate task function as a Temporal workflow, with no second
store inside it: Temporal's event history is the checkpoint.

- ``ctx.step(intent, step_call(fn, **kwargs), retry=...)`` runs the generic
  ``durable_step`` activity, which imports ``fn`` and calls it (the step's
  retry policy becomes the activity's); a closure is refused (it cannot
  cross to a worker).
- ``ctx.now()`` / ``ctx.uuid()`` are ``workflow.now()`` / ``workflow.uuid4()``:
  deterministic on replay, recorded nowhere else.
- ``ctx.await_event(key)`` waits for the ``emit_event`` signal with that key;
  ``ctx.emit_event`` and the signal keep the first payload per key.
- Divergence (a task function that changed its steps) is Temporal's
  non-determinism error on replay.

    worker: build_worker(client, settings, ledger, **on_temporal_worker(settings, ledger)) registers
            DurableTaskWorkflow and durable_step (the test bed's reference workers all do).
    client: await client.execute_workflow(DurableTaskWorkflow.run, DurableTaskInput(task="pkg.mod:task", ...))
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from testbed.engines.checkpoint.records import DurableRunManifest
    from testbed.engines.checkpoint.durable_run import StepRetry
    from testbed.engines.checkpoint.steps import (
        StepCall,
        StepInfo,
        reset_current_step,
        resolve,
        configure_worker,
        set_current_step,
        worker_resources,
    )


@dataclass
class DurableTaskInput:
    task: str  # "module:qualname" of ``async def task(ctx) -> JSON``
    run_id: str
    manifest: dict[str, Any] = field(default_factory=dict)  # DurableRunManifest fields
    step_timeout_s: float = 120.0
    heartbeat_s: float | None = 10.0


@dataclass
class StepActivityInput:
    function: str
    kwargs: dict[str, Any]
    run_id: str
    intent: str
    kind: str


class TemporalDurableContext:
    """``DurableContext`` on a Temporal workflow."""

    def __init__(self, wf: DurableTaskWorkflow, inp: DurableTaskInput) -> None:
        manifest = DurableRunManifest(**inp.manifest) if inp.manifest else None
        self.run_id = inp.run_id
        self.project_id = manifest.project_id if manifest else ""
        self.scenario_id = manifest.scenario_id if manifest else None
        self.input = manifest.input if manifest else {}
        self._wf = wf
        self._inp = inp

    async def step(self, intent: str, fn: Any, *, kind: str = "logic", input_fingerprint: Any = None,
                   retry: StepRetry | None = None) -> Any:
        if not isinstance(fn, StepCall):
            raise TypeError(f"step {intent!r}: on Temporal a step's function must be a step_call(...) of a "
                            "module-level function, not a closure (it runs in an activity, on any worker)")
        policy = retry or StepRetry(maximum_attempts=1)
        return await workflow.execute_activity(
            "durable_step",
            StepActivityInput(function=fn.function, kwargs=fn.kwargs, run_id=self.run_id, intent=intent, kind=kind),
            start_to_close_timeout=timedelta(seconds=self._inp.step_timeout_s),
            heartbeat_timeout=timedelta(seconds=self._inp.heartbeat_s) if self._inp.heartbeat_s else None,
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=policy.initial_interval_s),
                backoff_coefficient=policy.backoff_coefficient,
                maximum_interval=timedelta(seconds=policy.maximum_interval_s),
                maximum_attempts=policy.maximum_attempts,
                non_retryable_error_types=list(policy.non_retryable),
            ),
            summary=intent,
        )

    async def now(self) -> Any:
        return workflow.now()

    async def uuid(self) -> str:
        return str(workflow.uuid4())

    async def emit_event(self, key: str, payload: Any) -> bool:
        return self._wf.record_event(key, payload)

    async def await_event(self, key: str, timeout_s: float = 60.0, poll_s: float = 0.05) -> Any:
        try:
            await workflow.wait_condition(lambda: key in self._wf.events, timeout=timedelta(seconds=timeout_s))
        except asyncio.TimeoutError:
            raise ApplicationError(f"run {self.run_id!r}: no event {key!r} within {timeout_s:g} s",
                                   type="AwaitEventTimeoutError", non_retryable=True) from None
        return self._wf.events[key]


@workflow.defn
class DurableTaskWorkflow:
    def __init__(self) -> None:
        self.events: dict[str, Any] = {}

    def record_event(self, key: str, payload: Any) -> bool:
        if key in self.events:
            return False  # first emit wins
        self.events[key] = payload
        return True

    @workflow.signal
    def emit_event(self, key: str, payload: Any) -> None:
        self.record_event(key, payload)

    @workflow.run
    async def run(self, inp: DurableTaskInput) -> Any:
        # The task's module is imported as the worker has it (passed through the sandbox): its module-level
        # imports may touch the environment; what the task *does* stays deterministic (steps do the I/O).
        with workflow.unsafe.imports_passed_through():
            task = resolve(inp.task)
        return await task(TemporalDurableContext(self, inp))


@activity.defn(name="durable_step")
async def durable_step(inp: StepActivityInput) -> Any:
    info = activity.info()
    token = set_current_step(StepInfo(run_id=inp.run_id, step_index=int(info.activity_id), attempt=info.attempt,
                                      worker_id=str(worker_resources().get("identity", "temporal-worker"))))
    beat = asyncio.create_task(_heartbeat())
    try:
        return await resolve(inp.function)(**inp.kwargs)
    finally:
        beat.cancel()
        reset_current_step(token)


async def _heartbeat() -> None:
    while True:
        activity.heartbeat()
        await asyncio.sleep(1.0)


def on_temporal_worker(settings: Any, ledger: Any) -> dict[str, list[Any]]:
    """The checkpoint task's workflow and activity, for ``agent.worker.build_worker``'s ``workflows`` and
    ``activities``, with this process's steps configured as that worker's (``settings``: its ``WorkerSettings``;
    ``ledger``: its effect ledger): the same task functions as the checkpoint engine, on Temporal."""
    configure_worker(ledger=ledger, sandbox_root=settings.sandbox_root, model_base_url=settings.model_base_url,
                     identity=settings.identity)
    return {"workflows": [DurableTaskWorkflow], "activities": [durable_step]}
