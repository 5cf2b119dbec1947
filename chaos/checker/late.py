"""late: no reply came after the run's final read would have been taken (liveness, kept apart from ``lost``).

When the load settles with work still pending on the server (an update accepted and not answered, an activity
still running), the runner does not read the conversations at once: it waits for that work, at most a bound
derived from the agent's own settings (``late_bound``: its longest activity timeout that notices a dead worker,
plus the first retry's backoff, plus a margin) or the scenario's ``late_cap_s``, whichever is lower, and records
the wait (the ``late_wait`` operation: what was pending, the bound and why, how long it waited). A reply that
arrived during that wait would have been missing from an immediate read, and read as lost; it was only late.

- **pass**: nothing answered during the wait (nothing was pending, or it never cleared: then ``lost`` judges it,
  a message lost for good being a safety failure);
- **fail**: a reply (an update the server completed) or a piece of the agent's work (an activity that closed)
  came during the wait: each named, with how long after the load settled and after the last fault before it.
  A liveness failure: the agent did answer, too slowly for the run; the ``diagnoses`` say which setting made it
  slow;
- **not applicable**: the run recorded no wait (made before this check, or an engine that cannot say what is
  pending).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from chaos.checker.run_data import RunData
from harness.event_history import RunRecord
from harness.operations import OK, Op, pairs
from harness.verdict import FAIL, NOT_APPLICABLE, PASS, UNKNOWN, CheckResult

#: what the late wait waits beyond the agent's longest timeout and backoff: the retried attempt's own work
LATE_MARGIN_S = 10.0
#: the late wait's bound when the histories show no activity at all (nothing to derive one from)
NO_ACTIVITY_BOUND_S = 30.0
#: the operation the runner records the wait as
LATE_WAIT = "late_wait"


def _wall(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None


def pending_in(latest: list[RunRecord]) -> list[dict[str, Any]]:
    """The work the server still holds open in these (latest) runs: updates accepted and not answered, and
    activities scheduled and not closed, of runs still running."""
    out: list[dict[str, Any]] = []
    for run in latest:
        if run.status != "running":
            continue
        out += [{"workflow_id": run.workflow_id, "update": u.update_id} for u in run.update_records
                if u.outcome == "accepted"]
        out += [{"workflow_id": run.workflow_id, "activity": a.activity_type} for a in run.activities
                if a.outcome == "running"]
    return out


def detecting_timeout(a: Any) -> tuple[str, float | None]:
    """The timeout that notices a dead worker holding this activity: its heartbeat timeout if it has one, else
    its start-to-close, else its schedule-to-close; (name, seconds)."""
    if a.heartbeat_s:
        return "heartbeat timeout", a.heartbeat_s
    if a.start_to_close_s:
        return "start-to-close", a.start_to_close_s
    return "schedule-to-close", a.schedule_to_close_s


def late_bound(runs: list[RunRecord]) -> tuple[float, str]:
    """How long the agent's own settings let a reply take after a dead worker: the longest timeout that notices
    one (``detecting_timeout``), over the activity types these runs scheduled, plus that type's first retry
    backoff, plus ``LATE_MARGIN_S``; (seconds, why in words)."""
    worst: tuple[float, str] | None = None
    for run in runs:
        for a in run.activities:
            name, limit = detecting_timeout(a)
            if limit is None:
                continue
            backoff = a.retry_policy[0] if a.retry_policy else 0.0
            if worst is None or limit + backoff > worst[0]:
                worst = (limit + backoff, f"{a.activity_type}'s {name} {limit:g} s + first retry after {backoff:g} s")
    if worst is None:
        return NO_ACTIVITY_BOUND_S, f"no activity in the histories: {NO_ACTIVITY_BOUND_S:g} s"
    return round(worst[0] + LATE_MARGIN_S, 1), f"{worst[1]} + {LATE_MARGIN_S:g} s margin"


def _late_wait(ops: list[Op]) -> tuple[Op, Op | None] | None:
    return next(((i, d) for i, d in pairs(ops) if i.f == LATE_WAIT), None)


def _faults(ops: list[Op]) -> list[Op]:
    """The faults the nemesis applied, in the order they were recorded."""
    return [o for o in ops if o.process == "nemesis" and o.type == OK and not o.f.startswith("phase:")]


def _last_fault_before(faults: list[Op], wall: float) -> Op | None:
    """The last of ``faults`` recorded at or before ``wall`` (one pass over the faults, not over every operation)."""
    before = [o for o in faults if o.wall <= wall]
    return before[-1] if before else None


def late_replies(data: RunData) -> list[dict[str, Any]] | None:
    """What came during the late wait: each update answered, and (for agents whose replies are not updates)
    each activity that closed, after the wait began and before it ended; None: the run recorded no late wait."""
    wait = _late_wait(data.ops)
    if wait is None:
        return None
    # during the wait: what the final read after it (and the end of each conversation) did is not late
    began, ended = wait[0].wall, wait[1].wall if wait[1] is not None else float("inf")
    out: list[dict[str, Any]] = []
    for wid, chain in data.event_histories.items():
        for run in chain:
            for u in run.update_records:
                done = _wall(u.completed_at)
                if done is not None and began < done <= ended:
                    out.append({"workflow_id": wid, "update": u.update_id, "text": u.text, "at": done,
                                "accepted_at": _wall(u.accepted_at)})
            if not run.update_records:
                for a in run.activities:
                    done = _wall(a.closed_at)
                    if done is not None and began < done <= ended:
                        out.append({"workflow_id": wid, "activity": a.activity_type, "at": done,
                                    "accepted_at": _wall(a.scheduled_at)})
    faults = _faults(data.ops)
    for item in out:
        fault = _last_fault_before(faults, item["at"])  # the latest the reply waited out
        item["after_settle_s"] = round(item["at"] - began, 1)
        item["after_fault_s"] = round(item["at"] - fault.wall, 1) if fault is not None else None
        item["fault"] = fault.f if fault is not None else None
        item["fault_at"] = fault.wall if fault is not None else None
    return sorted(out, key=lambda x: x["at"])


def _describe(item: dict[str, Any]) -> str:
    what = f"the reply to {item['text']!r} (update {item['update']})" if "update" in item else \
        f"activity {item['activity']}"
    fault = f", {item['after_fault_s']:.1f}s after the {item['fault']}" if item["after_fault_s"] is not None else ""
    return f"{item['workflow_id']}: {what} came {item['after_settle_s']:.1f}s after the load settled{fault}"


def check(data: RunData) -> CheckResult:
    """The property of the module's docstring."""
    wait = _late_wait(data.ops)
    if wait is None:
        return CheckResult("late", NOT_APPLICABLE, "not applicable: the run recorded no late wait (made before it "
                                                   "existed, or its engine cannot say what is pending)")
    inv, done = wait
    waited = done.value if done is not None and isinstance(done.value, dict) else {}
    details: dict[str, Any] = {"late_wait": {**(inv.value or {}), **waited}}
    if not data.event_histories:
        return CheckResult("late", UNKNOWN, "no event histories were saved: when each reply came cannot be read",
                           details)
    late = late_replies(data) or []
    details["late"] = [{k: v for k, v in x.items() if k != "text"} | {"text": str(x.get("text"))[:200]}
                       for x in late[:50]]
    pending = int((inv.value or {}).get("pending") or 0)
    if late:
        return CheckResult("late", FAIL, f"{len(late)} late: {_describe(late[0])} (a liveness failure: answered, "
                                         "not lost)", details)
    if not pending:
        return CheckResult("late", PASS, "nothing was pending when the load settled: no reply came late", details)
    return CheckResult("late", PASS, f"{pending} item(s) pending when the load settled; none was answered in the "
                                     f"{waited.get('waited_s', '?')}s wait (lost judges them)", details)
