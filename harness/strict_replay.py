"""Strict replay: what the replayed workflow schedules, input by input, against what the history recorded.

Temporal's ``Replayer`` checks the *sequence* of commands a workflow issues against its history (an activity of
another type, or one missing, fails it) but not their *inputs*: workflow code that puts an unseeded
``random.Random()`` nonce or a wall-clock time into an activity argument replays "cleanly" and then, on a real
worker, re-runs that activity with other arguments than the ones recorded. This module closes that gap:

* ``InputRecorder`` is a worker interceptor for the ``Replayer``. Its workflow outbound interceptor sees every
  ``start_activity``, ``start_local_activity`` and ``start_child_workflow`` call and converts the arguments with
  the workflow's own payload converter (the one the worker converts them with, in the serialisation context the
  worker gives that call), then hands them out of the workflow (sandboxed or not) through an extern function.
  It changes nothing the workflow does: it only passes each call on and records it.
* ``compare`` pairs those calls with the history's ``ActivityTaskScheduled`` and
  ``StartChildWorkflowExecutionInitiated`` events (by activity id / child workflow id) and compares the type and,
  payload by payload, the input. The history's payloads are decoded with the data converter's payload codec
  first (in the same context), so a codec whose output differs on every call (encryption with a random nonce)
  is still compared by what it encoded. JSON payloads (``json/plain``, ``json/protobuf``) are equal when their
  parsed values are (a converter's key order is no difference); any other payload is equal when its bytes are.
  Metadata must be equal in both cases.

What is not compared, and said: local activities (their ``core_local_activity`` markers record the result, not
the input), signals to other workflows, payloads kept in external storage (the history holds references), and a
history event a replayed call cannot be paired with (no comparison: unknown, never pass). A call the replay made
after the history's last event (the workflow's next step, never recorded) has nothing to be compared with.

Standard library and temporalio only: this runs in the target's own interpreter (``harness.replayer``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import temporalio.converter
import temporalio.workflow
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.worker import (
    Interceptor,
    StartActivityInput,
    StartChildWorkflowInput,
    StartLocalActivityInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

#: the extern function the in-workflow interceptor reports each call through
EXTERN = "durable_agent_harness.strict_replay.record"
ACTIVITY, LOCAL_ACTIVITY, CHILD_WORKFLOW = "activity", "local activity", "child workflow"
#: encodings whose data is JSON: compared by parsed value
JSON_ENCODINGS = (b"json/plain", b"json/protobuf")
#: how many characters of each value a mismatch shows (around the first difference)
SHOWN = 160
#: how many mismatches / unknowns a result lists in full (the counts are always exact)
LISTED = 20


@dataclass
class ScheduledCall:
    """One call the replayed workflow made, with its arguments as the worker converts them (before any codec)."""

    kind: str  # ACTIVITY | LOCAL_ACTIVITY | CHILD_WORKFLOW
    name: str  # the activity type / child workflow type
    key: str | None  # the activity id (None when the SDK does not expose it: paired in order) / child workflow id
    payloads: list[bytes] | None  # each argument's ``Payload``, serialised; None if converting raised
    context: Any = None  # the ``temporalio.converter.SerializationContext`` the worker converts it in, if any
    error: str = ""  # why ``payloads`` is None


class InputRecorder(Interceptor):
    """A ``Replayer`` interceptor that records every activity, local activity and child workflow the replayed
    workflow starts (``take``: replay one history at a time). Put it first in the interceptor list: the first is
    the innermost outbound interceptor, the one that sees the arguments exactly as they are scheduled."""

    def __init__(self) -> None:
        self.calls: list[ScheduledCall] = []

    def workflow_interceptor_class(self, input: WorkflowInterceptorClassInput) -> type[WorkflowInboundInterceptor]:
        input.unsafe_extern_functions[EXTERN] = self.calls.append
        return _RecordingInbound

    def take(self) -> list[ScheduledCall]:
        """The calls recorded since the last ``take``, in the order the workflow made them."""
        calls, self.calls[:] = list(self.calls), []
        return calls


class _RecordingInbound(WorkflowInboundInterceptor):
    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        self.next.init(_RecordingOutbound(outbound))


class _RecordingOutbound(WorkflowOutboundInterceptor):
    """Passes every call on unchanged; records what it scheduled (runs inside the workflow, sandboxed or not)."""

    def start_activity(self, input: StartActivityInput) -> temporalio.workflow.ActivityHandle[Any]:
        handle = self.next.start_activity(input)
        info = temporalio.workflow.info()
        _report(ACTIVITY, input.activity, _activity_id(input, handle), input.args,
                _activity_context(info, input.activity, input.activity_id, input.task_queue or info.task_queue,
                                  False))
        return handle

    def start_local_activity(self, input: StartLocalActivityInput) -> temporalio.workflow.ActivityHandle[Any]:
        handle = self.next.start_local_activity(input)
        info = temporalio.workflow.info()
        _report(LOCAL_ACTIVITY, input.activity, _activity_id(input, handle), input.args,
                _activity_context(info, input.activity, input.activity_id, info.task_queue, True))
        return handle

    async def start_child_workflow(self, input: StartChildWorkflowInput) -> Any:
        # Recorded before the start is awaited (that waits for the child to start); the command is built from the
        # same arguments. A call whose start raises is never in the history: it stays unpaired (not compared).
        info = temporalio.workflow.info()
        context = _construct(getattr(temporalio.converter, "WorkflowSerializationContext", None),
                             namespace=info.namespace, workflow_id=input.id)
        _report(CHILD_WORKFLOW, input.workflow, input.id, input.args, context)
        return await self.next.start_child_workflow(input)


def _activity_id(input: StartActivityInput | StartLocalActivityInput, handle: Any) -> str | None:
    """The activity id the worker puts in the command: the one given, else its sequence number (not public API:
    None if this SDK does not have it, and the calls are then paired with the history's events in order)."""
    if input.activity_id:
        return input.activity_id
    seq = getattr(handle, "_seq", None)
    return str(seq) if isinstance(seq, int) else None


def _construct(cls: Any, **kwargs: Any) -> Any:
    """``cls(**kwargs)``, or None if this temporalio has no such class or it takes other fields."""
    try:
        return cls(**kwargs) if cls is not None else None
    except TypeError:
        return None


def _activity_context(info: Any, activity_type: str, activity_id: str | None, task_queue: str,
                      is_local: bool) -> Any:
    """The ``ActivitySerializationContext`` the worker converts this call's arguments in (as it builds it)."""
    return _construct(getattr(temporalio.converter, "ActivitySerializationContext", None),
                      namespace=info.namespace, workflow_id=info.workflow_id, workflow_type=info.workflow_type,
                      activity_type=activity_type, activity_id=activity_id, activity_task_queue=task_queue,
                      is_local=is_local)


def _with_context(obj: Any, context: Any) -> Any:
    with_context = getattr(temporalio.converter, "WithSerializationContext", None)
    if context is not None and with_context is not None and isinstance(obj, with_context):
        return obj.with_context(context)
    return obj


def _report(kind: str, name: str, key: str | None, args: Sequence[Any], context: Any) -> None:
    try:
        converter = _with_context(temporalio.workflow.payload_converter(), context)
        payloads: list[bytes] | None = [p.SerializeToString() for p in converter.to_payloads(args)] if args else []
        error = ""
    except Exception as exc:  # the worker raised the same while scheduling it; never fail the workflow here
        payloads, error = None, f"converting its arguments raised {type(exc).__name__}: {exc}"[:300]
    record = temporalio.workflow.extern_functions().get(EXTERN)
    if record is not None:
        record(ScheduledCall(kind, name, key, payloads, context, error))


@dataclass
class _HistoryCall:
    """An activity scheduled / child workflow initiated in the history."""

    kind: str
    event_id: int
    key: str
    name: str
    payloads: list[Payload]
    paired: bool = False


def history_calls(events: Iterable[Any]) -> list[_HistoryCall]:
    """The history's scheduled activities and initiated child workflows, in event order."""
    calls = []
    for ev in events:
        if ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = ev.activity_task_scheduled_event_attributes
            calls.append(_HistoryCall(ACTIVITY, ev.event_id, a.activity_id, a.activity_type.name,
                                      list(a.input.payloads)))
        elif ev.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            a = ev.start_child_workflow_execution_initiated_event_attributes
            calls.append(_HistoryCall(CHILD_WORKFLOW, ev.event_id, a.workflow_id, a.workflow_type.name,
                                      list(a.input.payloads)))
    return calls


@dataclass
class Comparison:
    """What strict replay found in one or more runs (``merge`` adds runs up)."""

    compared: int = 0  # calls whose type and input were compared
    equal: int = 0
    mismatches: list[dict[str, Any]] = field(default_factory=list)
    mismatch_count: int = 0
    unknown: list[dict[str, Any]] = field(default_factory=list)  # history calls that could not be compared
    unknown_count: int = 0
    local_activities: int = 0  # local activities the replay started: input not compared (not in the history)
    after_history: int = 0  # calls the replay made past the history's end: nothing to compare with

    def merge(self, other: Comparison) -> None:
        self.compared += other.compared
        self.equal += other.equal
        self.mismatch_count += other.mismatch_count
        self.unknown_count += other.unknown_count
        self.mismatches += other.mismatches[:max(0, LISTED - len(self.mismatches))]
        self.unknown += other.unknown[:max(0, LISTED - len(self.unknown))]
        self.local_activities += other.local_activities
        self.after_history += other.after_history

    def as_dict(self) -> dict[str, Any]:
        return {"compared": self.compared, "equal": self.equal, "mismatch_count": self.mismatch_count,
                "mismatches": self.mismatches, "unknown_count": self.unknown_count, "unknown": self.unknown,
                "local_activities_not_compared": self.local_activities,
                "calls_after_history_end": self.after_history}


async def compare(workflow_id: str, run_id: str, events: Sequence[Any], calls: list[ScheduledCall],
                  data_converter: temporalio.converter.DataConverter, ignore: Iterable[str] = ()) -> Comparison:
    """Each replayed call against the history event it scheduled: type, then input payload by payload. ``ignore``:
    JSON paths (``$.messages[*].timestamp``: ``.key``, ``[*]`` for any list item) left out of every JSON input,
    for values a framework computes afresh on every replay (declared by the target, listed in the result)."""
    ignore = frozenset(ignore)
    out = Comparison(local_activities=sum(1 for c in calls if c.kind == LOCAL_ACTIVITY))
    recorded = history_calls(events)
    external = getattr(data_converter, "external_storage", None)
    for call in calls:
        if call.kind == LOCAL_ACTIVITY:
            continue
        event = _pair(recorded, call)
        if event is None:
            out.after_history += 1
            continue
        where = {"workflow_id": workflow_id, "run_id": run_id, "event_id": event.event_id, "kind": call.kind,
                 "name": event.name}
        if call.name != event.name:
            out.mismatch_count += 1
            out.mismatches.append({**where, "field": "type", "replayed": _printable(call.name),
                                   "history": _printable(event.name)})
            continue
        if external is not None:
            reason = "the data converter keeps payloads in external storage; the history holds references"
        elif call.payloads is None:
            reason = call.error
        else:
            reason = ""
        found = None
        if not reason:
            try:
                history = await _decoded(event.payloads, data_converter.payload_codec, call.context)
            except Exception as exc:  # a codec that cannot read its own history: no comparison
                reason = f"the payload codec could not decode the history's input: {type(exc).__name__}: {exc}"
            else:
                found = _difference([_parsed(b) for b in call.payloads or []], history, ignore)
        if reason:
            out.unknown_count += 1
            out.unknown.append({**where, "reason": _printable(reason)[:300]})
            continue
        out.compared += 1
        if found is None:
            out.equal += 1
        else:
            out.mismatch_count += 1
            out.mismatches.append({**where, "field": "input", **found})
    for event in recorded:
        if not event.paired:  # the replay made no call for it: its input was not compared (never a pass)
            out.unknown_count += 1
            out.unknown.append({"workflow_id": workflow_id, "run_id": run_id, "event_id": event.event_id,
                                "kind": event.kind, "name": _printable(event.name),
                                "reason": "no replayed call was paired with it"})
    del out.mismatches[LISTED:], out.unknown[LISTED:]
    return out


def _pair(recorded: list[_HistoryCall], call: ScheduledCall) -> _HistoryCall | None:
    """The first unpaired history event of the call's kind with its key (without a key: the next one in order)."""
    for event in recorded:
        if not event.paired and event.kind == call.kind and (call.key is None or event.key == call.key):
            event.paired = True
            return event
    return None


def _parsed(data: bytes) -> Payload:
    p = Payload()
    p.ParseFromString(data)
    return p


async def _decoded(payloads: list[Payload], codec: Any, context: Any) -> list[Payload]:
    if codec is None or not payloads:
        return payloads
    return list(await _with_context(codec, context).decode(payloads))


def _difference(replayed: list[Payload], history: list[Payload], ignore: frozenset[str] = frozenset()
                ) -> dict[str, Any] | None:
    """None if the two inputs are equal, else which argument differs, where (a JSON path, for JSON) and both
    values (bounded, printable)."""
    if len(replayed) != len(history):
        return {"argument": None, "path": None, "replayed": f"{len(replayed)} argument(s)",
                "history": f"{len(history)} argument(s)"}
    for n, (mine, theirs) in enumerate(zip(replayed, history)):
        if not payloads_equal(mine, theirs, ignore):
            x, y = _json(mine, ignore), _json(theirs, ignore)
            if x is _NOT_JSON or y is _NOT_JSON or dict(mine.metadata) != dict(theirs.metadata):
                a, b, path = _text(mine), _text(theirs), None
            else:
                a, b = (json.dumps(v, sort_keys=True, ensure_ascii=False) for v in (x, y))
                path = _first_path(x, y)
            return {"argument": n, "path": path, "replayed": _window(a, b), "history": _window(b, a)}
    return None


#: what an ignored JSON value is replaced with before comparing
IGNORED = "<ignored>"
_NOT_JSON = object()


def _json(p: Payload, ignore: frozenset[str] = frozenset()) -> Any:
    """A JSON payload's parsed value with the ``ignore`` paths masked, or ``_NOT_JSON``."""
    if p.metadata.get("encoding") not in JSON_ENCODINGS:
        return _NOT_JSON
    try:
        return _masked(json.loads(p.data), ignore) if ignore else json.loads(p.data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return _NOT_JSON


def _masked(value: Any, ignore: frozenset[str], path: str = "$") -> Any:
    if path in ignore:
        return IGNORED
    if isinstance(value, dict):
        return {k: _masked(v, ignore, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, ignore, f"{path}[*]") for v in value]
    return value


def _first_path(x: Any, y: Any, path: str = "$") -> str:
    """The JSON path of the first place (keys in sorted order) where ``x`` and ``y`` differ."""
    if isinstance(x, dict) and isinstance(y, dict):
        for k in sorted(set(x) | set(y)):
            if k not in x or k not in y or not _same_json(x[k], y[k]):
                return _first_path(x.get(k), y.get(k), f"{path}.{k}") if k in x and k in y else f"{path}.{k}"
    if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        for i, j in zip(x, y):
            if not _same_json(i, j):
                return _first_path(i, j, f"{path}[*]")
    return path


def payloads_equal(a: Payload, b: Payload, ignore: frozenset[str] = frozenset()) -> bool:
    """Equal metadata and, for JSON encodings, equal parsed values (key order and spacing are no difference; the
    ``ignore`` paths left out); otherwise equal bytes."""
    if dict(a.metadata) != dict(b.metadata):
        return False
    if a.data == b.data:
        return True
    x, y = _json(a, ignore), _json(b, ignore)
    return x is not _NOT_JSON and y is not _NOT_JSON and _same_json(x, y)


def _same_json(x: Any, y: Any) -> bool:
    """Parsed JSON values equal: 1 equals 1.0, NaN equals NaN (identical input is never a difference), a bool
    equals only a bool."""
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same_json(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same_json(i, j) for i, j in zip(x, y))
    if isinstance(x, bool) or isinstance(y, bool):
        return x is y
    if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
    return type(x) is type(y) and x == y


def _text(p: Payload) -> str:
    """A payload as text to show: JSON canonicalised (sorted keys), other data as its encoding and hex."""
    encoding = p.metadata.get("encoding", b"").decode("utf-8", "replace")
    if p.metadata.get("encoding") in JSON_ENCODINGS:
        try:
            return json.dumps(json.loads(p.data), sort_keys=True, ensure_ascii=False)
        except (ValueError, UnicodeDecodeError):
            pass
    others = {k: v.decode("utf-8", "replace") for k, v in p.metadata.items() if k != "encoding"}
    return f"<{encoding or 'no encoding'}{' ' + json.dumps(others, sort_keys=True) if others else ''}, " \
           f"{len(p.data)} bytes> {p.data[:SHOWN].hex()}"


def _window(text: str, other: str) -> str:
    """``text`` around its first difference from ``other``, at most ``SHOWN`` characters, printable."""
    at = next((i for i, (x, y) in enumerate(zip(text, other)) if x != y), min(len(text), len(other)))
    start = max(0, at - SHOWN // 4)
    shown = text[start:start + SHOWN]
    return ("…" if start else "") + _printable(shown) + ("…" if start + SHOWN < len(text) else "")


def _printable(text: str) -> str:
    """Control and other unprintable characters escaped (values come from run data and model output)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def describe(mismatch: dict[str, Any]) -> str:
    """One line naming the call, its event and both values."""
    arg, path = mismatch.get("argument"), mismatch.get("path")
    what = "type" if mismatch["field"] == "type" else ("input" if arg is None else f"input argument {arg}")
    what += f" at {path}" if path else ""
    return (f"{mismatch['kind']} {mismatch['name']!r} (event {mismatch['event_id']} of {mismatch['workflow_id']}) "
            f"{what} differs on replay: replayed {mismatch['replayed']} vs history {mismatch['history']}")

