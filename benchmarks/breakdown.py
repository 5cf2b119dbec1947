"""Where a durable turn's time goes, read from the event histories' timestamps.

A conversation turn is one Workflow Update. Its events run from the workflow
task that accepted the Update to ``WorkflowExecutionUpdateCompleted``::

    WorkflowTaskScheduled -> Started -> Completed, UpdateAccepted,
    ActivityTaskScheduled -> Started -> Completed (plan_next_action), ...,
    WorkflowTaskScheduled -> Started -> Completed, UpdateCompleted

For each turn the server-side span is split into workflow-task
schedule-to-start (waiting for a worker to pick the task up) and execution,
activity schedule-to-start and execution (of which the model call's own
latency, read from the ``plan_next_action`` result, is ``model_ms``), and
``other`` (the gaps between events). ``client_rtt`` is what the client saw
beyond the server span: delivering the Update and its result. Local
activities (``AgentConfig.local_model``, ``local_tools``) run inside workflow
tasks: their time is in ``wft_exec``, a local model call's latency is read from
its marker into ``model_ms`` all the same, and ``local_count`` counts them.

The input is Temporal's own history objects (``WorkflowHistory``), so the
same function runs on live histories and on saved ones (``harness.event_history``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

from harness.event_history import ACTIVITY_CLOSE, local_activity

COMPONENTS = ("client_rtt_ms", "wft_sched_to_start_ms", "wft_exec_ms", "act_sched_to_start_ms", "act_exec_ms",
              "other_ms")

_WFT_CLOSED = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: "workflow_task_completed_event_attributes",
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED: "workflow_task_failed_event_attributes",
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT: "workflow_task_timed_out_event_attributes",
}


def _ms(event: HistoryEvent) -> float:
    return event.event_time.seconds * 1000.0 + event.event_time.nanos / 1e6


def _model_latency_ms(event: HistoryEvent) -> float:
    """``PlanOutput.latency_ms`` from a completed plan_next_action's result payload (0 if unreadable)."""
    try:
        payload = event.activity_task_completed_event_attributes.result.payloads[0]
        return float(json.loads(payload.data).get("latency_ms", 0.0))
    except (IndexError, ValueError, AttributeError, TypeError):
        return 0.0


def _local_model_latency_ms(event: HistoryEvent) -> float | None:
    """A local ``plan_next_action``'s ``latency_ms`` from its marker (0 for another local activity or an unreadable
    result); None for a marker that records no local activity."""
    la = local_activity(event)
    if la is None:
        return None
    if la.activity_type != "plan_next_action" or not isinstance(la.result, dict):
        return 0.0
    try:
        return float(la.result.get("latency_ms", 0.0))
    except (TypeError, ValueError):
        return 0.0


def update_spans(events: list[HistoryEvent]) -> dict[str, tuple[int, int]]:
    """Update id -> (index of the turn's first event, index of its UpdateCompleted event)."""
    spans: dict[str, tuple[int, int]] = {}
    accepted: dict[str, int] = {}
    for n, ev in enumerate(events):
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            uid = ev.workflow_execution_update_accepted_event_attributes.accepted_request.meta.update_id
            start = n
            while start > 0 and events[start].event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                start -= 1
            accepted[uid] = start
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED:
            uid = ev.workflow_execution_update_completed_event_attributes.meta.update_id
            if uid in accepted:
                spans[uid] = (accepted[uid], n)
    return spans


def turn_breakdown(events: list[HistoryEvent], start: int, end: int) -> dict[str, Any]:
    """The server-side components of the events ``start..end`` (inclusive), in ms."""
    by_id = {ev.event_id: ev for ev in events}
    out = {"server_ms": _ms(events[end]) - _ms(events[start]), "wft_sched_to_start_ms": 0.0, "wft_exec_ms": 0.0,
           "act_sched_to_start_ms": 0.0, "act_exec_ms": 0.0, "model_ms": 0.0, "wft_count": 0, "act_count": 0,
           "local_count": 0}
    for ev in events[start:end + 1]:
        t = ev.event_type
        if t == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            sched = by_id.get(ev.workflow_task_started_event_attributes.scheduled_event_id)
            if sched is not None:
                out["wft_sched_to_start_ms"] += _ms(ev) - _ms(sched)
        elif t in _WFT_CLOSED:
            attrs = getattr(ev, _WFT_CLOSED[t])
            started = by_id.get(attrs.started_event_id)
            out["wft_count"] += 1
            if started is not None:
                out["wft_exec_ms"] += _ms(ev) - _ms(started)
            elif (sched := by_id.get(attrs.scheduled_event_id)) is not None:
                # Timed out before any worker took it (a dead worker's sticky queue): all of it was waiting.
                out["wft_sched_to_start_ms"] += _ms(ev) - _ms(sched)
        elif t == EventType.EVENT_TYPE_MARKER_RECORDED:
            latency = _local_model_latency_ms(ev)
            if latency is not None:
                out["local_count"] += 1
                out["model_ms"] += latency
        elif t in ACTIVITY_CLOSE:
            attrs = getattr(ev, ev.WhichOneof("attributes"))
            sched, started = by_id.get(attrs.scheduled_event_id), by_id.get(attrs.started_event_id)
            if sched is None:
                continue
            out["act_count"] += 1
            if started is None:  # never started (timed out while scheduled): all of it was waiting
                out["act_sched_to_start_ms"] += _ms(ev) - _ms(sched)
                continue
            out["act_sched_to_start_ms"] += _ms(started) - _ms(sched)
            out["act_exec_ms"] += _ms(ev) - _ms(started)
            if (t == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
                    and sched.activity_task_scheduled_event_attributes.activity_type.name == "plan_next_action"):
                out["model_ms"] += _model_latency_ms(ev)
    parts = out["wft_sched_to_start_ms"] + out["wft_exec_ms"] + out["act_sched_to_start_ms"] + out["act_exec_ms"]
    out["other_ms"] = out["server_ms"] - parts
    return out


def breakdown_by_update(histories: Iterable[WorkflowHistory]) -> dict[str, dict[str, Any]]:
    """Update id -> its turn's breakdown, over every run of a continue-as-new chain."""
    found: dict[str, dict[str, Any]] = {}
    for history in histories:
        events = list(history.events)
        for uid, (start, end) in update_spans(events).items():
            found[uid] = turn_breakdown(events, start, end)
    return found


def with_client(turn: dict[str, Any], client_ms: float) -> dict[str, Any]:
    """Add the client's view: its latency and the part the server span does not explain."""
    return {**{k: round(v, 3) if isinstance(v, float) else v for k, v in turn.items()},
            "client_ms": round(client_ms, 3), "client_rtt_ms": round(client_ms - turn["server_ms"], 3)}
