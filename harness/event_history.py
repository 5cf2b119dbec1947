"""Temporal event histories: fetch a workflow's chain of runs, save it, load it back, read it as records.

"History" in this project means only this: what Temporal's server recorded
for one workflow run (what a chaos run's clients and nemeses did is its
operation log, ``harness.operations.OperationLog``). One way to do each thing:

* ``fetch_histories(client, workflow_id)``: every run of a workflow id, first
  to last, walking continue-as-new back from the latest run (raw
  ``WorkflowHistory`` objects, what the replayer and the timing breakdown read);
* ``save_histories(client, workflow_ids, dir)`` / ``save_chain(chain, dir)``:
  ``<dir>/<workflow id>/<nn>-<run id>.json`` in Temporal's own JSON;
* ``load_saved(dir)`` / ``load_saved_records(dir)``: the same back, raw or parsed;
* ``parse_events``: one run as a ``RunRecord`` (activities with their attempts,
  outcome, worker and retry policy; children; workflow-task workers; updates);
* ``fetch_chain`` / ``fetch_tree`` (parsed, live) and ``render`` (the event
  graph the demo prints).

Nothing here knows any particular agent: activity names are data.
"""

from __future__ import annotations

import asyncio
import json
import stat
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory

from harness import run_files
from harness.rundir import expect, parse_json

#: activity close event type -> outcome
ACTIVITY_CLOSE = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "completed",
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: "failed",
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: "timed_out",
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: "canceled",
}
#: workflow run close event type -> how the run ended
WORKFLOW_CLOSE = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED: "completed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED: "failed",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT: "timed_out",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED: "canceled",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED: "terminated",
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW: "continued_as_new",
}


@dataclass
class ActivityRecord:
    activity_id: str
    activity_type: str
    scheduled_event_id: int
    summary: str = ""
    attempts: int = 0  # the attempt number that started last (retries are not separate events)
    outcome: str = "running"
    worker: str = ""
    failure: str = ""
    scheduled_at: datetime | None = None
    started_at: datetime | None = None
    closed_at: datetime | None = None
    # The retry policy it was scheduled with: (initial interval s, backoff coefficient, maximum interval s).
    retry_policy: tuple[float, float, float] | None = None
    # Whether the last failure before the attempt that started last set its own ``next_retry_delay`` (an
    # application failure may, overriding the policy; the history keeps only this last failure).
    last_failure_sets_delay: bool = False
    # What it was scheduled with (seconds; None: not set). The server fills in start-to-close from
    # schedule-to-close when only that is set, so these are the limits the server applied.
    start_to_close_s: float | None = None
    heartbeat_s: float | None = None
    schedule_to_close_s: float | None = None
    schedule_to_start_s: float | None = None
    maximum_attempts: int = 0  # 0: unlimited
    non_retryable: tuple[str, ...] = ()  # error types the retry policy does not retry
    # How the attempt before the last one ended, when a timeout ended it (``START_TO_CLOSE``, ``HEARTBEAT``,
    # ...): the timeout that noticed a dead worker. The history keeps only this last failure.
    last_failure_timeout: str = ""
    last_failure_type: str = ""  # its application error type, when an application failure ended it
    # The application error that closed it (a failed activity), and whether that error said itself that it must
    # not be retried (``ApplicationError(non_retryable=True)``): an error type the agent means to stop on.
    close_failure_type: str = ""
    close_failure_non_retryable: bool = False

    @property
    def duration_ms(self) -> float | None:
        if self.started_at and self.closed_at:
            return (self.closed_at - self.started_at).total_seconds() * 1000.0
        return None


#: the marker the SDK records a local activity's result in (Temporal's sdk-core)
LOCAL_ACTIVITY_MARKER = "core_local_activity"


@dataclass
class LocalActivityRecord:
    """A local activity whose result the history recorded (a ``core_local_activity`` marker). One that ran but
    was never recorded (its worker died or lost the workflow task first) leaves no event: only an execution log
    shows it."""

    activity_id: str
    activity_type: str
    attempt: int
    outcome: str  # completed | failed | cancelled (what the marker carries)
    recorded_at: datetime  # when the history recorded it (the marker event: its workflow task's completion)
    completed_at: datetime | None = None  # when the worker finished it (the marker's own timestamp)
    worker: str = ""  # the worker whose workflow task completion recorded it
    result: object = None  # decoded like ``decode_payload`` (UNREADABLE under a codec)
    failure: str = ""


def local_activity(ev: HistoryEvent, worker: str = "") -> LocalActivityRecord | None:
    """The local activity a ``MarkerRecorded`` event records, or None for any other marker."""
    a = ev.marker_recorded_event_attributes
    if a.marker_name != LOCAL_ACTIVITY_MARKER or "data" not in a.details:
        return None
    try:
        data = json.loads(a.details["data"].payloads[0].data)
    except (IndexError, ValueError, UnicodeDecodeError):
        return None
    done = data.get("complete_time") or {}
    completed = (datetime.fromtimestamp(done.get("seconds", 0) + done.get("nanos", 0) / 1e9, tz=timezone.utc)
                 .replace(tzinfo=None) if done else None)
    result = a.details.get("result")
    failure = a.failure.message if a.HasField("failure") else ""
    outcome = "completed" if not a.HasField("failure") else (
        "cancelled" if a.failure.HasField("canceled_failure_info") else "failed")
    return LocalActivityRecord(str(data.get("activity_id", data.get("seq", ""))), str(data.get("activity_type", "")),
                               int(data.get("attempt") or 1), outcome, ev.event_time.ToDatetime(), completed, worker,
                               decode_payload(result.payloads[0]) if result is not None and result.payloads else None,
                               failure)


_CHILD_CLOSE = {
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED: "completed",
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_FAILED: "failed",
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_CANCELED: "canceled",
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TIMED_OUT: "timed_out",
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TERMINATED: "terminated",
}


@dataclass
class ChildRecord:
    """A child workflow (a subagent) this run started."""

    workflow_id: str
    workflow_type: str
    initiated_event_id: int
    summary: str = ""
    run_id: str = ""
    outcome: str = "initiated"  # -> "running" once started, then how it closed
    #: the worker identity of the workflow task that started it (the parent's placement at that moment)
    initiated_by: str = ""


#: a payload this module cannot read (not ``json/plain``: a codec, protobuf, encryption)
UNREADABLE = "<unreadable payload>"


def decode_payload(payload) -> object:
    """A payload's value if it is plain JSON (the default data converter's), ``None`` for null, else ``UNREADABLE``."""
    encoding = payload.metadata.get("encoding", b"")
    if encoding == b"binary/null":
        return None
    if encoding == b"json/plain":
        try:
            return json.loads(payload.data)
        except ValueError:
            return UNREADABLE
    return UNREADABLE


def message_text(value: object) -> object:
    """The text of a message or reply as an agent passes it: a string, or an object's ``text`` (or ``content``)."""
    if isinstance(value, dict):
        for key in ("text", "content", "message", "reply"):
            if isinstance(value.get(key), str):
                return value[key]
        return UNREADABLE
    return value if isinstance(value, str) else UNREADABLE


@dataclass
class UpdateRecord:
    """An update the workflow accepted (rejected ones leave no event), with its outcome as the server holds it."""

    update_id: str
    name: str
    text: object = UNREADABLE  # the first argument's text (``message_text``)
    outcome: str = "accepted"  # -> "completed" | "failed"
    reply: object = None  # the result's text, when completed
    failure: str = ""
    accepted_at: datetime | None = None
    completed_at: datetime | None = None


@dataclass
class WorkflowTaskRecord:
    """One workflow task attempt the history records (``attempt`` > 1: retries of a failing one)."""

    scheduled_event_id: int
    attempt: int = 1
    identity: str = ""  # the worker that started it
    outcome: str = "scheduled"  # -> "started" | "completed" | "failed" | "timed_out"
    cause: str = ""
    failure: str = ""
    scheduled_at: datetime | None = None
    started_at: datetime | None = None
    closed_at: datetime | None = None
    timeout_type: str = ""  # a timed-out task: ``START_TO_CLOSE`` (its worker held it) or ``SCHEDULE_TO_START``
    sticky: bool = False  # scheduled on a worker's sticky queue (the worker that ran the workflow's last task)
    start_to_close_s: float | None = None  # the workflow task timeout it was scheduled with


@dataclass
class RunRecord:
    workflow_id: str
    run_id: str
    workflow_type: str = ""
    status: str = "running"
    events: int = 0
    history_bytes: int = 0
    activities: list[ActivityRecord] = field(default_factory=list)
    local_activities: list[LocalActivityRecord] = field(default_factory=list)  # those recorded, in order
    updates: int = 0
    signals: int = 0
    next_run_id: str | None = None
    started_at: datetime | None = None
    closed_at: datetime | None = None
    children: list[ChildRecord] = field(default_factory=list)
    #: identity of the worker that completed each workflow task, in order
    workflow_task_workers: list[str] = field(default_factory=list)
    cancel_requested: bool = False
    update_records: list[UpdateRecord] = field(default_factory=list)
    workflow_tasks: list[WorkflowTaskRecord] = field(default_factory=list)
    result: object = None  # the completion's result (decoded as ``decode_payload``), when it completed
    failure: str = ""  # the run's failure message, when it failed
    workflow_task_timeout_s: float | None = None  # what the start event set (the client's ``task_timeout``)
    #: signals received carrying a readable argument with no id (``SIGNAL_ID_KEYS``) to de-duplicate a re-send by
    signals_without_id: int = 0


#: the keys a signal's argument may carry an id in, by which a workflow can tell a re-sent signal from a new one
SIGNAL_ID_KEYS = ("id", "message_id", "messageId", "request_id", "requestId", "idempotency_key", "dedup_id")


def _has_id(value: object) -> bool:
    """Whether a signal's first argument carries an id (``SIGNAL_ID_KEYS``) to de-duplicate it by."""
    return isinstance(value, dict) and any(value.get(k) not in (None, "") for k in SIGNAL_ID_KEYS)


def _summary(event: HistoryEvent) -> str:
    if not event.HasField("user_metadata") or not event.user_metadata.HasField("summary"):
        return ""
    try:
        return str(json.loads(event.user_metadata.summary.data))
    except (ValueError, UnicodeDecodeError):
        return ""


def _enum_name(value: int, prefix: str) -> str:
    from temporalio.api.enums.v1 import WorkflowTaskFailedCause

    try:
        return WorkflowTaskFailedCause.Name(value).removeprefix(prefix)
    except ValueError:
        return str(value)


def _timeout_name(value: int) -> str:
    from temporalio.api.enums.v1 import TimeoutType

    try:
        return TimeoutType.Name(value).removeprefix("TIMEOUT_TYPE_")
    except ValueError:
        return str(value)


def _seconds(duration: Any, present: bool = True) -> float | None:
    """A protobuf Duration in seconds; None when not set (zero is how the server says "none")."""
    value = duration.ToTimedelta().total_seconds() if present else 0.0
    return value or None


def parse_events(workflow_id: str, run_id: str, events: list[HistoryEvent]) -> RunRecord:
    """One run's event history as a ``RunRecord``: each event type is read by one method of ``_EventReader``."""
    reader = _EventReader(RunRecord(workflow_id=workflow_id, run_id=run_id, events=len(events)))
    for ev in events:
        reader.run.history_bytes += ev.ByteSize()
        read = _READERS.get(ev.event_type)
        if read is not None:
            read(reader, ev, ev.event_time.ToDatetime())
    return reader.run


class _EventReader:
    """What ``parse_events`` knows while it reads: the run so far, and the open records by the event id that
    later events name (an activity by its scheduled event, a child by its initiated event, ...)."""

    def __init__(self, run: RunRecord) -> None:
        self.run = run
        self.by_scheduled: dict[int, ActivityRecord] = {}
        self.by_initiated: dict[int, ChildRecord] = {}
        self.by_wft: dict[int, WorkflowTaskRecord] = {}
        self.by_update: dict[str, UpdateRecord] = {}

    @property
    def last_workflow_task_worker(self) -> str:
        return self.run.workflow_task_workers[-1] if self.run.workflow_task_workers else ""

    def workflow_started(self, ev: HistoryEvent, at: datetime) -> None:
        a = ev.workflow_execution_started_event_attributes
        self.run.workflow_type = a.workflow_type.name
        self.run.started_at = at
        self.run.workflow_task_timeout_s = _seconds(a.workflow_task_timeout, a.HasField("workflow_task_timeout"))

    def activity_scheduled(self, ev: HistoryEvent, at: datetime) -> None:
        a = ev.activity_task_scheduled_event_attributes
        rp = a.retry_policy
        rec = ActivityRecord(a.activity_id, a.activity_type.name, ev.event_id, _summary(ev), scheduled_at=at,
                             retry_policy=(rp.initial_interval.ToTimedelta().total_seconds(),
                                           rp.backoff_coefficient or 2.0,
                                           rp.maximum_interval.ToTimedelta().total_seconds()),
                             start_to_close_s=_seconds(a.start_to_close_timeout, a.HasField("start_to_close_timeout")),
                             heartbeat_s=_seconds(a.heartbeat_timeout, a.HasField("heartbeat_timeout")),
                             schedule_to_close_s=_seconds(a.schedule_to_close_timeout,
                                                          a.HasField("schedule_to_close_timeout")),
                             schedule_to_start_s=_seconds(a.schedule_to_start_timeout,
                                                          a.HasField("schedule_to_start_timeout")),
                             maximum_attempts=rp.maximum_attempts, non_retryable=tuple(rp.non_retryable_error_types))
        self.by_scheduled[ev.event_id] = rec
        self.run.activities.append(rec)

    def activity_started(self, ev: HistoryEvent, at: datetime) -> None:
        a = ev.activity_task_started_event_attributes
        rec = self.by_scheduled[a.scheduled_event_id]
        rec.attempts, rec.worker, rec.started_at = a.attempt, a.identity, at
        if a.HasField("last_failure"):
            f = a.last_failure
            rec.failure = f.message
            rec.last_failure_sets_delay = f.HasField("application_failure_info") and \
                f.application_failure_info.HasField("next_retry_delay")
            if f.HasField("timeout_failure_info"):
                rec.last_failure_timeout = _timeout_name(f.timeout_failure_info.timeout_type)
            elif f.HasField("application_failure_info"):
                rec.last_failure_type = f.application_failure_info.type

    def activity_closed(self, ev: HistoryEvent, at: datetime) -> None:
        t = ev.event_type
        attrs = {
            EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: ev.activity_task_completed_event_attributes,
            EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: ev.activity_task_failed_event_attributes,
            EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: ev.activity_task_timed_out_event_attributes,
            EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: ev.activity_task_canceled_event_attributes,
        }[t]
        rec = self.by_scheduled[attrs.scheduled_event_id]
        rec.outcome, rec.closed_at = ACTIVITY_CLOSE[t], at
        if hasattr(attrs, "failure") and attrs.HasField("failure"):
            rec.failure = attrs.failure.message
            if attrs.failure.HasField("application_failure_info"):
                info = attrs.failure.application_failure_info
                rec.close_failure_type, rec.close_failure_non_retryable = info.type, info.non_retryable

    def marker(self, ev: HistoryEvent, at: datetime) -> None:
        la = local_activity(ev, self.last_workflow_task_worker)
        if la is not None:
            self.run.local_activities.append(la)

    def workflow_task_scheduled(self, ev: HistoryEvent, at: datetime) -> None:
        from temporalio.api.enums.v1 import TaskQueueKind

        a = ev.workflow_task_scheduled_event_attributes
        self.run.workflow_tasks.append(WorkflowTaskRecord(
            ev.event_id, a.attempt or 1, scheduled_at=at,
            sticky=a.task_queue.kind == TaskQueueKind.TASK_QUEUE_KIND_STICKY,
            start_to_close_s=_seconds(a.start_to_close_timeout, a.HasField("start_to_close_timeout"))))
        self.by_wft[ev.event_id] = self.run.workflow_tasks[-1]

    def workflow_task_started(self, ev: HistoryEvent, at: datetime) -> None:
        a = ev.workflow_task_started_event_attributes
        wft = self.by_wft.get(a.scheduled_event_id)
        if wft is not None:
            wft.identity, wft.outcome, wft.started_at = a.identity, "started", at

    def workflow_task_closed(self, ev: HistoryEvent, at: datetime) -> None:
        t = ev.event_type
        if t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            a = ev.workflow_task_completed_event_attributes
            self.run.workflow_task_workers.append(a.identity)
            outcome, cause, failure = "completed", "", ""
        elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            a = ev.workflow_task_failed_event_attributes
            outcome, cause = "failed", _enum_name(a.cause, "WORKFLOW_TASK_FAILED_CAUSE_")
            failure = a.failure.message if a.HasField("failure") else ""
        else:
            a = ev.workflow_task_timed_out_event_attributes
            outcome, cause, failure = "timed_out", "", ""
        wft = self.by_wft.get(a.scheduled_event_id)
        if wft is not None:
            wft.outcome, wft.cause, wft.failure, wft.closed_at = outcome, cause, failure, at
            if outcome == "timed_out":
                wft.timeout_type = _timeout_name(a.timeout_type)

    def update_accepted(self, ev: HistoryEvent, at: datetime) -> None:
        a = ev.workflow_execution_update_accepted_event_attributes
        req = a.accepted_request
        args = list(req.input.args.payloads)
        text = message_text(decode_payload(args[0])) if args else UNREADABLE
        rec = UpdateRecord(a.protocol_instance_id or req.meta.update_id, req.input.name, text, accepted_at=at)
        rec.update_id = req.meta.update_id or rec.update_id
        self.by_update[rec.update_id] = rec
        self.run.update_records.append(rec)
        self.run.updates += 1

    def update_completed(self, ev: HistoryEvent, at: datetime) -> None:
        a = ev.workflow_execution_update_completed_event_attributes
        rec = self.by_update.get(a.meta.update_id)
        if rec is None:
            return
        rec.completed_at = at
        if a.outcome.HasField("failure"):
            rec.outcome, rec.failure = "failed", a.outcome.failure.message
        else:
            payloads = list(a.outcome.success.payloads)
            rec.outcome = "completed"
            rec.reply = message_text(decode_payload(payloads[0])) if payloads else None

    def child_initiated(self, ev: HistoryEvent, at: datetime) -> None:
        a = ev.start_child_workflow_execution_initiated_event_attributes
        child = ChildRecord(a.workflow_id, a.workflow_type.name, ev.event_id, _summary(ev),
                            initiated_by=self.last_workflow_task_worker)
        self.by_initiated[ev.event_id] = child
        self.run.children.append(child)

    def child_start_failed(self, ev: HistoryEvent, at: datetime) -> None:
        a = ev.start_child_workflow_execution_failed_event_attributes
        self.by_initiated[a.initiated_event_id].outcome = "start_failed"

    def child_started(self, ev: HistoryEvent, at: datetime) -> None:
        a = ev.child_workflow_execution_started_event_attributes
        child = self.by_initiated[a.initiated_event_id]
        child.run_id, child.outcome = a.workflow_execution.run_id, "running"

    def child_closed(self, ev: HistoryEvent, at: datetime) -> None:
        t = ev.event_type
        attrs = {
            EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED:
                ev.child_workflow_execution_completed_event_attributes,
            EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_FAILED: ev.child_workflow_execution_failed_event_attributes,
            EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_CANCELED:
                ev.child_workflow_execution_canceled_event_attributes,
            EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TIMED_OUT:
                ev.child_workflow_execution_timed_out_event_attributes,
            EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_TERMINATED:
                ev.child_workflow_execution_terminated_event_attributes,
        }[t]
        self.by_initiated[attrs.initiated_event_id].outcome = _CHILD_CLOSE[t]

    def cancel_requested(self, ev: HistoryEvent, at: datetime) -> None:
        self.run.cancel_requested = True

    def signaled(self, ev: HistoryEvent, at: datetime) -> None:
        a = ev.workflow_execution_signaled_event_attributes
        self.run.signals += 1
        value = decode_payload(a.input.payloads[0]) if a.input.payloads else None
        # a message in a signal (a text, an object) with no id; a signal with no argument is a command (end the
        # chat), and an encoded argument cannot be read: neither is counted
        if value not in (None, UNREADABLE) and not _has_id(value):
            self.run.signals_without_id += 1

    def workflow_closed(self, ev: HistoryEvent, at: datetime) -> None:
        t = ev.event_type
        self.run.status, self.run.closed_at = WORKFLOW_CLOSE[t], at
        if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            payloads = list(ev.workflow_execution_completed_event_attributes.result.payloads)
            self.run.result = decode_payload(payloads[0]) if payloads else None
        elif t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            self.run.failure = ev.workflow_execution_failed_event_attributes.failure.message
        if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            self.run.next_run_id = ev.workflow_execution_continued_as_new_event_attributes.new_execution_run_id


#: event type -> the ``_EventReader`` method that reads it (event types not listed carry nothing a checker reads)
_READERS: dict[Any, Any] = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED: _EventReader.workflow_started,
    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: _EventReader.activity_scheduled,
    EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED: _EventReader.activity_started,
    **dict.fromkeys(ACTIVITY_CLOSE, _EventReader.activity_closed),
    EventType.EVENT_TYPE_MARKER_RECORDED: _EventReader.marker,
    EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED: _EventReader.workflow_task_scheduled,
    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED: _EventReader.workflow_task_started,
    **dict.fromkeys((EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED,
                     EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT), _EventReader.workflow_task_closed),
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED: _EventReader.update_accepted,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED: _EventReader.update_completed,
    EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED: _EventReader.child_initiated,
    EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_FAILED: _EventReader.child_start_failed,
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED: _EventReader.child_started,
    **dict.fromkeys(_CHILD_CLOSE, _EventReader.child_closed),
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED: _EventReader.cancel_requested,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED: _EventReader.signaled,
    **dict.fromkeys(WORKFLOW_CLOSE, _EventReader.workflow_closed),
}


async def fetch_histories(client: Client, workflow_id: str) -> list[tuple[str, WorkflowHistory]]:
    """Every run of a workflow id as (run id, history), first to last, walking continue-as-new back from the
    latest run."""
    run_id = (await client.get_workflow_handle(workflow_id).describe()).run_id
    chain: list[tuple[str, WorkflowHistory]] = []
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        chain.append((run_id, history))
        run_id = history.events[0].workflow_execution_started_event_attributes.continued_execution_run_id
    return list(reversed(chain))


def save_chain(chain: list[tuple[str, WorkflowHistory]], out: Path) -> None:
    """``out/<nn>-<run id>.json`` per run, in order (Temporal's JSON: ``WorkflowHistory.from_json`` reads it)."""
    out.mkdir(parents=True, exist_ok=True)
    for n, (run_id, history) in enumerate(chain):
        (out / f"{n:02d}-{run_id}.json").write_text(history.to_json())


async def save_histories(client: Client, workflow_ids: list[str], out: Path) -> list[str]:
    """Save every run of each workflow under ``out/<workflow id>/``; the ids that had none (never started)."""
    missing: list[str] = []

    async def one(wid: str) -> None:
        try:
            chain = await fetch_histories(client, wid)
        except Exception:  # never started (or gone): nothing to save
            missing.append(wid)
            return
        save_chain(chain, out / wid)

    await asyncio.gather(*(one(wid) for wid in workflow_ids))
    return missing


def load_saved(histories_dir: Path) -> dict[str, list[tuple[str, WorkflowHistory]]]:
    """``save_histories``' output back: workflow id -> [(run id, history)], first run first. Read by
    ``harness.run_files``' rules below ``histories_dir``'s parent: a symlink or a file too large is RefusedPath."""
    out: dict[str, list[tuple[str, WorkflowHistory]]] = {}
    root = histories_dir.parent
    try:
        workflows = run_files.entries(root, histories_dir.name)
    except FileNotFoundError:
        return out
    for wid in sorted(name for name, mode in workflows.items() if stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
        files = run_files.entries(root, f"{histories_dir.name}/{wid}")  # a symlink is refused here
        out[wid] = [(name[:-len(".json")].split("-", 1)[1],
                     WorkflowHistory.from_json(wid, _checked_text(root, f"{histories_dir.name}/{wid}/{name}")))
                    for name in sorted(files) if name.endswith(".json")]
    return out


def _checked_text(root: Path, rel: str) -> str:
    """A saved history's text (read by ``harness.run_files``' rules) once ``parse_json`` passed it (the SDK parses
    it again: faster than the deep copy it makes of a parsed one)."""
    data = run_files.read_bytes(root, rel, run_files.JSON_LIMIT)
    expect(parse_json(data, root / rel), "an object", root / rel)
    return data.decode()


def load_saved_records(histories_dir: Path) -> dict[str, list[RunRecord]]:
    """The saved histories, parsed: workflow id -> its chain of ``RunRecord``s."""
    return {wid: [parse_events(wid, rid, list(h.events)) for rid, h in chain]
            for wid, chain in load_saved(histories_dir).items()}


async def fetch_run(client: Client, workflow_id: str, run_id: str | None = None) -> RunRecord:
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    history = await handle.fetch_history()
    if run_id is None:
        desc = await handle.describe()
        run_id = desc.run_id
    return parse_events(workflow_id, run_id, list(history.events))


async def fetch_chain(client: Client, workflow_id: str, first_run_id: str) -> list[RunRecord]:
    """Every run from ``first_run_id`` on, following continue-as-new."""
    runs = [await fetch_run(client, workflow_id, first_run_id)]
    while runs[-1].next_run_id:
        runs.append(await fetch_run(client, workflow_id, runs[-1].next_run_id))
    return runs


async def fetch_tree(client: Client, workflow_id: str, first_run_id: str | None = None
                     ) -> dict[str, list[RunRecord]]:
    """A workflow's chain and, recursively, every child's chain: workflow id -> runs, parents first."""
    if first_run_id is None:
        first_run_id = (await client.get_workflow_handle(workflow_id).describe()).run_id
    tree: dict[str, list[RunRecord]] = {}
    todo = [(workflow_id, first_run_id)]
    while todo:
        wid, rid = todo.pop(0)
        runs = await fetch_chain(client, wid, rid)
        tree[wid] = runs
        todo.extend((c.workflow_id, c.run_id) for r in runs for c in r.children if c.run_id)
    return tree


def activity_shape(runs: list[RunRecord]) -> list[tuple[str, int, str]]:
    """``(activity type, attempts, outcome)`` in scheduling order, across the chain."""
    return [(a.activity_type, a.attempts, a.outcome) for r in runs for a in r.activities]


def render(runs: list[RunRecord]) -> str:
    """The event graph: each run and the activities it scheduled, in order."""
    lines: list[str] = []
    for i, run in enumerate(runs, 1):
        took = ""
        if run.started_at and run.closed_at:
            took = f" in {(run.closed_at - run.started_at).total_seconds() * 1000:.0f} ms"
        lines.append(
            f"workflow {run.workflow_id}  run {i}/{len(runs)} {run.run_id[:8]}  {run.workflow_type}  "
            f"{run.status.upper()}{took}  ({run.events} events, {run.history_bytes} bytes"
            + (f", {run.updates} updates" if run.updates else "") + ")"
        )
        for j, a in enumerate(run.activities):
            branch = "└─" if j == len(run.activities) - 1 else "├─"
            dur = f"{a.duration_ms:6.0f} ms" if a.duration_ms is not None else "       -  "
            retry = f"  attempt {a.attempts}" if a.attempts != 1 else ""
            label = a.summary if a.summary and a.activity_type != "plan_next_action" else a.activity_type
            fail = f"  [{a.failure[:80]}]" if a.failure else ""
            lines.append(f"  {branch} #{a.scheduled_event_id:<4} {label[:60]:<60} {a.outcome:<10}{dur}{retry}{fail}")
        for c in run.children:
            lines.append(f"  ⤷ child #{c.initiated_event_id:<4} {c.workflow_id[-60:]:<60} {c.outcome}")
        if run.next_run_id:
            lines.append("  ⤷ continued as new")
    return "\n".join(lines)
