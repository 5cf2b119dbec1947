"""What Temporal's workers have in flight, read from the server: the in-flight observer of the nemeses' aimed
faults on this engine (``testbed.faults.nemesis``, through ``NemesisContext.observer``).

* ``running``: the activities started on some worker (each conversation's pending activities);
* ``idle_holders``: which worker holds each open conversation in its cache (it ran its last workflow task);
* ``pending_activities``: the snapshot a kill takes of the server's view, with the frozen worker's evidence;
* the aims only Temporal can observe: ``aim_workflow_task`` (a worker holding a workflow task) and
  ``aim_continue_as_new`` (around a continue-as-new). They act through the nemesis's ``hands``
  (``freeze_then_kill``, ``worker_of``, ``another_up``), so the nemesis stays the one place that signals a worker.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timezone
from typing import Any

from temporalio.api.enums.v1 import EventType, PendingActivityState, PendingWorkflowTaskState

from harness.operations import INVOKE

#: where the evidence of an activity aim came from, on this engine
SOURCE = "temporal_pending_activities"


async def running(ctx: Any) -> list[dict[str, Any]]:
    """Started activities, from Temporal's description of each conversation (its pending activities), every
    conversation described at once: one after another, 30 conversations on a busy server took seconds, and an aim
    acted on what had long finished (issue 44: both kills of 30 x 20 landed on idle workers)."""
    found = []
    workflow_ids = list(ctx.workflow_ids)
    for wid, desc in zip(workflow_ids, await asyncio.gather(*(describe(ctx, wid) for wid in workflow_ids))):
        if desc is None:  # not started yet, or the server is down: nothing observable
            continue
        for p in desc.raw_description.pending_activities:
            if p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
                found.append({"workflow_id": wid, "activity": p.activity_type.name, "attempt": p.attempt,
                              "worker": p.last_worker_identity})
    return found


async def idle_holders(ctx: Any) -> dict[str, str]:
    """Open conversation -> the worker that ran its last workflow task (it holds the conversation in its cache)."""
    held: dict[str, str] = {}
    for wid in ctx.workflow_ids:
        try:
            handle = ctx.client.get_workflow_handle(wid)
            if (await handle.describe()).status.name != "RUNNING":
                continue
            last = None
            async for ev in handle.fetch_history_events():
                if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                    last = ev.workflow_task_completed_event_attributes.identity
            if last:
                held[wid] = last
        except Exception:  # not started yet, or the server is down: nothing observable
            continue
    return held


def epoch(ts: Any) -> float | None:
    """A protobuf Timestamp as unix seconds (None: unset)."""
    return ts.ToDatetime().replace(tzinfo=timezone.utc).timestamp() if ts.seconds or ts.nanos else None


async def pending_activities(ctx: Any, workflow_ids: list[str]) -> dict[str, Any]:
    """The server's pending activities of these conversations now (DescribeWorkflowExecution): per activity its
    workflow and run, activity id and type, state, attempt, last worker identity, scheduled and last started time
    (unix seconds). A conversation the server could not describe is listed in ``not_described``."""
    descs = await asyncio.gather(*(describe(ctx, wid) for wid in workflow_ids))
    found, missing = [], []
    for wid, desc in zip(workflow_ids, descs):
        if desc is None:
            missing.append(wid)
            continue
        for p in desc.raw_description.pending_activities:
            found.append({"workflow_id": wid, "run_id": desc.run_id, "activity_id": p.activity_id,
                          "activity": p.activity_type.name,
                          "state": PendingActivityState.Name(p.state).removeprefix("PENDING_ACTIVITY_STATE_"),
                          "attempt": p.attempt, "worker": p.last_worker_identity,
                          "scheduled": epoch(p.scheduled_time), "last_started": epoch(p.last_started_time)})
    return {"taken_at": time.time(), "pending_activities": found, "not_described": missing}


async def describe(ctx: Any, wid: str, run_id: str | None = None) -> Any:
    try:
        return await ctx.client.get_workflow_handle(wid, run_id=run_id).describe()
    except Exception:  # not started yet, or the server is down: nothing observable
        return None


async def task_workers(ctx: Any, wid: str, run_id: str | None = None) -> tuple[str | None, str | None]:
    """(the worker that completed this run's last workflow task, the one that started its last one): the first
    holds the conversation in its cache (its next workflow task goes to that worker's sticky queue)."""
    completed = started = None
    try:
        async for ev in ctx.client.get_workflow_handle(wid, run_id=run_id).fetch_history_events():
            if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                completed = ev.workflow_task_completed_event_attributes.identity or completed
            elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                started = ev.workflow_task_started_event_attributes.identity or started
    except Exception:
        pass
    return completed, started


def wft(desc: Any) -> dict[str, Any] | None:
    """The pending workflow task of a description, or None."""
    p = desc.raw_description.pending_workflow_task if desc is not None else None
    if p is None or p.state == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_UNSPECIFIED:
        return None
    return {"state": PendingWorkflowTaskState.Name(p.state).removeprefix("PENDING_WORKFLOW_TASK_STATE_"),
            "attempt": p.attempt,
            "scheduled": p.scheduled_time.ToDatetime().isoformat() if p.HasField("scheduled_time") else None,
            "started": p.started_time.ToDatetime().isoformat() if p.HasField("started_time") else None}


async def aim_workflow_task(ctx: Any, hands: Any, down_s: float, wait_s: float, hold_s: float, spare: bool = False
                             ) -> tuple[Any, dict[str, Any]]:
    """Kill a worker while it holds a workflow task. When the client sends a message (an Update), the worker that
    holds the conversation in its cache (it completed its last workflow task: the server sends the next one to its
    sticky queue) is frozen; if Temporal then shows the conversation's workflow task *started* and it stays started,
    unchanged, for ``hold_s`` (a live worker completes one in milliseconds), the frozen worker holds it: kill.
    ``spare``: only while another worker is up."""
    deadline = time.monotonic() + wait_s
    sticky: dict[str, str] = {}
    probes = 0

    async def refresh() -> None:
        while True:
            for wid in ctx.workflow_ids:
                completed, _ = await task_workers(ctx, wid)
                if completed:
                    sticky[wid] = completed
            await asyncio.sleep(0.3)

    refresher = asyncio.create_task(refresh())
    try:
        seen = len(ctx.oplog.ops())
        while time.monotonic() < deadline:
            ops = ctx.oplog.ops()
            sends = [op for op in ops[seen:] if op.type == INVOKE and op.process.startswith("client")
                     and op.f in ("send_message", "resend_message") and isinstance(op.value, dict)]
            seen = len(ops)
            for op in reversed(sends):  # the latest first: its workflow task is the likeliest still in flight
                wid, identity = op.value.get("conversation"), sticky.get(op.value.get("conversation"))
                if not identity or not hands.worker_of(ctx, identity) or (
                        spare and not hands.another_up(ctx, hands.worker_of(ctx, identity))):
                    continue

                async def confirm(wid: str = wid, identity: str = identity, op: Any = op) -> list[dict[str, Any]]:
                    first: dict[str, Any] | None = None
                    t0 = time.monotonic()
                    while time.monotonic() - t0 < hold_s + 0.4:
                        task = wft(await describe(ctx, wid))
                        if task is None or task["state"] != "STARTED":
                            if first is not None:
                                return []  # it was completed: a live worker held it, not the frozen one
                        elif first is None or task["started"] != first["started"]:
                            first, t_first = task, time.monotonic()
                        elif time.monotonic() - t_first >= hold_s:
                            return [{"workflow_id": wid, "workflow_task": task, "worker": identity,
                                     "held_frozen_s": round(time.monotonic() - t_first, 3),
                                     "after": {"op": op.f, "n": op.value.get("n"), "index": op.index}}]
                        await asyncio.sleep(0.03)
                    return []

                probes += 1
                hit = await hands.freeze_then_kill(ctx, identity, down_s, confirm)
                if hit is not None:
                    return hit, {"observed_by": "temporal_pending_workflow_task", "probes": probes}
                break  # the others were sent before: their tasks are done by now
            await asyncio.sleep(0.002)
    finally:
        refresher.cancel()
        await asyncio.gather(refresher, return_exceptions=True)
    return None, {"observed_by": "temporal_pending_workflow_task", "probes": probes}


async def aim_continue_as_new(ctx: Any, hands: Any, phase: str, threshold: int, down_s: float, wait_s: float
                               ) -> tuple[Any, dict[str, Any]]:
    """Kill around a continue-as-new. ``phase`` "before": a conversation's history has reached the continue-as-new
    threshold (``threshold`` events) and it is still the same run, so the turn in flight ends by continuing as new:
    kill the worker holding it. "after": a conversation has a new run id: kill the worker that holds the new run (it
    ran its first workflow task; before that, the one that completed the old run). "any": whichever comes first."""
    deadline = time.monotonic() + wait_s
    runs: dict[str, str] = {}
    probes = 0
    while time.monotonic() < deadline:
        descs = await asyncio.gather(*(describe(ctx, wid) for wid in ctx.workflow_ids))
        for wid, desc in zip(ctx.workflow_ids, descs):
            if desc is None or desc.status is None or desc.status.name != "RUNNING":
                continue
            run_id, length = desc.run_id, desc.raw_description.workflow_execution_info.history_length
            old = runs.setdefault(wid, run_id)
            if run_id != old and phase in ("after", "any"):
                runs[wid] = run_id
                new_holder, new_started = await task_workers(ctx, wid, run_id)
                old_holder, _ = await task_workers(ctx, wid, old)
                identity = new_holder or new_started or old_holder
                basis = ("completed the new run's first workflow task" if new_holder else
                         "started the new run's first workflow task" if new_started else
                         "completed the old run's last workflow task (the continue-as-new)")
                if not identity:
                    continue

                async def confirm(wid: str = wid, run_id: str = run_id, old: str = old, identity: str = identity,
                                  basis: str = basis) -> list[dict[str, Any]]:
                    d = await describe(ctx, wid)
                    if d is None or d.run_id != run_id:
                        return []
                    return [{"workflow_id": wid, "continued_as_new": "after", "continued_from_run_id": old,
                             "run_id": run_id,
                             "history_length": d.raw_description.workflow_execution_info.history_length,
                             "worker": identity, "worker_basis": basis, "workflow_task": wft(d)}]
            elif run_id == old and threshold and length >= threshold and phase in ("before", "any"):
                identity, started = await task_workers(ctx, wid, run_id)
                identity = identity or started
                if not identity:
                    continue

                async def confirm(wid: str = wid, run_id: str = run_id, identity: str = identity
                                  ) -> list[dict[str, Any]]:
                    d = await describe(ctx, wid)
                    n = d.raw_description.workflow_execution_info.history_length if d is not None else 0
                    if d is None or d.run_id != run_id or n < threshold or d.status.name != "RUNNING":
                        return []
                    return [{"workflow_id": wid, "continued_as_new": "before", "run_id": run_id,
                             "history_length": n, "threshold": threshold, "worker": identity,
                             "worker_basis": "completed the run's last workflow task (holds it in its cache)",
                             "workflow_task": wft(d),
                             "activities": [{"activity": a.activity_type.name, "worker": a.last_worker_identity}
                                            for a in d.raw_description.pending_activities
                                            if a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED]}]
            else:
                continue
            if not hands.worker_of(ctx, identity):
                continue
            probes += 1
            hit = await hands.freeze_then_kill(ctx, identity, down_s, confirm)
            if hit is not None:
                return hit, {"observed_by": "temporal_run_ids" if phase != "before" else "temporal_history_length",
                             "probes": probes}
        await asyncio.sleep(0.05)
    return None, {"observed_by": "temporal_run_ids", "probes": probes}


class TemporalInFlight:
    """The observer a nemesis context gets on Temporal (``ReferenceOnTemporal.aiming``)."""

    source = SOURCE
    aims = {"workflow_task": aim_workflow_task, "continue_as_new": aim_continue_as_new}

    async def running(self, ctx: Any) -> list[dict[str, Any]]:
        return await running(ctx)

    async def idle_holders(self, ctx: Any) -> dict[str, str]:
        return await idle_holders(ctx)

    async def retrying(self, ctx: Any, activity: str, min_attempt: int) -> list[dict[str, Any]]:
        """The ``activity`` attempts now retrying at ``min_attempt`` or later (a stuck bug, before its fix)."""
        stuck = []
        for wid, desc in zip(ctx.workflow_ids, await asyncio.gather(*(describe(ctx, w) for w in ctx.workflow_ids))):
            stuck += [{"workflow_id": wid, "activity": p.activity_type.name, "attempt": p.attempt,
                       "last_failure": p.last_failure.message[:120]}
                      for p in (desc.raw_description.pending_activities if desc is not None else ())
                      if p.activity_type.name == activity and p.attempt >= min_attempt]
        return stuck

    async def snapshot(self, ctx: Any) -> dict[str, Any]:
        return await pending_activities(ctx, list(ctx.workflow_ids))

    async def aim(self, at: str, ctx: Any, hands: Any, **options: Any) -> tuple[Any, dict[str, Any]]:
        return await self.aims[at](ctx, hands, **options)
