"""Diagnoses: why a recovery was slow and why a check failed, each in one plain line with the setting to change.

    run directory -> fault_paths (chaos.recovery) + the checks -> diagnose -> verified -> verdict.json

Computed from the run directory alone, so ``dah-chaos check`` on a copy gives the same text. A diagnosis claims
only what its ``evidence`` shows: each names the saved values it rests on (an activity's scheduled start-to-close,
the timeout that ended an attempt, a workflow task's timeout type, the fault's operation), and ``verified`` drops
any whose evidence the run directory does not hold (a test fails if one is ever dropped).

Each is ``{about, line, cause, fix, setting, measured_s, evidence}``: ``about`` is ``recovery`` (a part of a
recovery at least ``SLOW_S`` long) or the name of the failing check; ``line`` is cause and fix in one sentence;
``fix`` is None where the run shows no cause to fix.

The fix fits the evidence. A history cannot show whether an activity's code heartbeats, so an activity with no
heartbeat timeout is never told to set one alone (that would time out its live calls): it is told to shorten its
start-to-close toward its real latency, or to heartbeat while it runs and set a heartbeat timeout.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from chaos.checker.late import late_replies
from chaos.checker.run_data import RunData
from chaos.recovery import fault_paths
from harness.verdict import FAIL, CheckResult

#: a part of a recovery at least this long (seconds) is diagnosed; shorter ones are what recovery costs anyway
SLOW_S = 5.0


def _kind(item: dict[str, Any]) -> str:
    return "model" if item.get("model") else "tool"


def _slowest(data: RunData, activity_type: str) -> float | None:
    """The slowest completed attempt of an activity type in the run's histories (seconds): its real latency."""
    times = [a.duration_ms / 1000 for chain in data.event_histories.values() for run in chain for a in run.activities
             if a.activity_type == activity_type and a.outcome == "completed" and a.duration_ms is not None]
    return max(times) if times else None


def _activity_evidence(item: dict[str, Any], *fields: str) -> list[dict[str, Any]]:
    where = {"workflow_id": item["workflow_id"], "run_id": item["run_id"], "activity_id": item["activity_id"]}
    return [{"kind": "activity", **where, "field": f, "value": item[f]} for f in fields]


def _fault_evidence(path: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "operation", "index": path["index"], "f": path["fault"]}


def _detection(data: RunData, path: dict[str, Any], item: dict[str, Any], t0: float) -> dict[str, Any]:
    """A dead worker's attempt noticed late: by its heartbeat timeout, or by its start-to-close for want of one."""
    kind, name, waited = _kind(item), item["activity_type"], item["detection_s"]
    at = f"the {path['fault']} at t={path['at'] - t0:.1f}s"
    if item["detected_by"] == "HEARTBEAT":
        cause = f"the {kind} activity `{name}` has heartbeat timeout {item['heartbeat_s']:g} s: {at} waited " \
                f"{waited:.1f} s for it to notice the dead worker"
        fix = "shorten the heartbeat timeout, keeping it a few times the interval the activity heartbeats at"
        setting, fields = ("heartbeat_timeout", item["heartbeat_s"]), ("detected_by", "heartbeat_s")
    elif item["detected_by"] == "START_TO_CLOSE" and not item["heartbeat_s"]:
        cause = f"the {kind} activity `{name}` has start-to-close {item['start_to_close_s']:g} s and no heartbeat " \
                f"timeout: {at} waited {waited:.1f} s for it to time out"
        slowest = _slowest(data, name)
        real = f" (its slowest completed attempt here took {slowest:.1f} s)" if slowest is not None else ""
        fix = f"shorten start-to-close toward the {kind} call's real latency{real}, or heartbeat while the call " \
              "runs and set a heartbeat timeout"
        setting, fields = ("start_to_close", item["start_to_close_s"]), ("detected_by", "start_to_close_s",
                                                                        "heartbeat_s")
    elif item["detected_by"] == "START_TO_CLOSE":
        cause = f"the {kind} activity `{name}` timed out by its start-to-close {item['start_to_close_s']:g} s " \
                f"before its heartbeat timeout {item['heartbeat_s']:g} s noticed the dead worker: {at} waited " \
                f"{waited:.1f} s"
        fix = "heartbeat while the call runs (its heartbeat timeout never fired), or shorten start-to-close"
        setting, fields = ("start_to_close", item["start_to_close_s"]), ("detected_by", "start_to_close_s",
                                                                        "heartbeat_s")
    else:
        cause = f"the {kind} activity `{name}` was retried after its {item['setting']} timeout: {at} waited " \
                f"{waited:.1f} s for it"
        fix = f"shorten its {item['setting']} timeout"
        setting, fields = (item["setting"], None), ("detected_by",)
    return {"cause": cause, "fix": fix, "setting": {"name": setting[0], "value_s": setting[1],
                                                    "activity_type": name},
            "measured_s": waited, "evidence": [_fault_evidence(path), *_activity_evidence(item, *fields)]}


def _backoff(path: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    initial, coefficient, maximum = item["retry_policy"]
    cause = f"the retry of the {_kind(item)} activity `{item['activity_type']}` (attempt {item['attempts']}) " \
            f"waited {item['backoff_s']:.1f} s of backoff (retry policy: first retry after {initial:g} s, " \
            f"x{coefficient:g}, at most {maximum:g} s)"
    return {"cause": cause, "fix": "lower the retry policy's initial interval for this activity",
            "setting": {"name": "initial_interval", "value_s": initial, "activity_type": item["activity_type"]},
            "measured_s": item["backoff_s"],
            "evidence": [_fault_evidence(path), *_activity_evidence(item, "retry_policy", "attempts")]}


def _task_evidence(task: dict[str, Any], *fields: str) -> list[dict[str, Any]]:
    where = {"workflow_id": task["workflow_id"], "run_id": task["run_id"],
             "scheduled_event_id": task["scheduled_event_id"]}
    return [{"kind": "workflow_task", **where, "field": f, "value": task[f]} for f in fields]


def _workflow_task(path: dict[str, Any], task: dict[str, Any], t0: float) -> dict[str, Any] | None:
    at = f"the {path['fault']} at t={path['at'] - t0:.1f}s"
    if task["timeout_type"] == "START_TO_CLOSE":
        value = task["workflow_task_timeout_s"]
        cause = f"a workflow task of {task['workflow_id']} started on the dead worker waited {task['wait_s']:.1f} s " \
                f"after {at} for the workflow task timeout ({value:g} s) before another worker could take it"
        fix = "lower the workflow task timeout (the workflow's task timeout, set when it starts; Temporal's " \
              "default is 10 s), keeping it above the longest workflow task the agent runs"
        return {"cause": cause, "fix": fix, "setting": {"name": "workflow_task_timeout", "value_s": value},
                "measured_s": task["wait_s"], "evidence": [_fault_evidence(path), *_task_evidence(
                    task, "timeout_type", "workflow_task_timeout_s")]}
    if task["timeout_type"] == "SCHEDULE_TO_START" and task["sticky"]:
        cause = f"a workflow task of {task['workflow_id']} waited {task['wait_s']:.1f} s after {at} on the dead " \
                f"worker's sticky queue, until its schedule-to-start timeout ({task['timed_out_after_s']:.1f} s " \
                "after it was scheduled), before any worker could take it"
        fix = "lower the worker's sticky queue schedule-to-start timeout (sticky_queue_schedule_to_start_timeout, " \
              "stickyQueueScheduleToStartTimeout in TypeScript; the SDKs' default is 10 s)"
        return {"cause": cause, "fix": fix, "setting": {"name": "sticky_queue_schedule_to_start_timeout",
                                                        "value_s": task["timed_out_after_s"]},
                "measured_s": task["wait_s"], "evidence": [_fault_evidence(path), *_task_evidence(
                    task, "timeout_type", "sticky", "timed_out_after_s")]}
    return None


def _replay(path: dict[str, Any], task: dict[str, Any]) -> dict[str, Any]:
    cause = f"the next worker took {task['replay_s']:.1f} s to replay {task['workflow_id']}'s history (up to " \
            f"{task['history_events']} events) after the {path['fault']}"
    return {"cause": cause, "fix": "continue as new sooner, to keep each run's history short",
            "setting": {"name": "history_events", "value_s": None}, "measured_s": task["replay_s"],
            "evidence": [_fault_evidence(path), *_task_evidence(task, "replay_s")]}


def _no_worker(path: dict[str, Any], t0: float) -> dict[str, Any]:
    cause = f"no worker was polling for {path['no_worker_s']:.1f} s after the {path['fault']} at " \
            f"{path['at'] - t0:.1f}s (it took the last one)"
    return {"cause": cause, "fix": "run more than one worker, or restart a dead one sooner",
            "setting": {"name": "workers", "value_s": None}, "measured_s": path["no_worker_s"],
            "evidence": [_fault_evidence(path), {"kind": "no_worker", "index": path["index"],
                                                 "value": path["no_worker_s"]}]}


def _grouped(items: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """A fault's held activities, one group per activity type and timeout that noticed them (one kill may hold
    several conversations' calls)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for item in items:
        groups.setdefault((item["activity_type"], item["detected_by"]), []).append(item)
    return list(groups.values())


def _counted(d: dict[str, Any] | None, same: list[dict[str, Any]], part: str, what: str = "calls"
             ) -> dict[str, Any] | None:
    """A diagnosis made from the worst of several alike: how many it stands for, and each one's time."""
    if d is None or len(same) == 1:
        return d if d is None else {**d, "count": 1}
    times = ", ".join(f"{x[part]:.1f}" for x in sorted(same, key=lambda x: -(x[part] or 0)))
    more = [e for x in same if x is not same[0] for e in (
        _task_evidence(x, "timeout_type") if "timeout_type" in x else _activity_evidence(x, "detected_by"))]
    return {**d, "cause": f"{d['cause']} ({len(same)} {what} held alike: {times} s)", "count": len(same),
            "evidence": d["evidence"] + more}


def recovery_diagnoses(data: RunData, paths: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
    """One diagnosis per slow part (``SLOW_S`` or longer) of each fault's path."""
    out: list[dict[str, Any]] = []
    for path in paths:
        parts: list[dict[str, Any] | None] = []
        if (path["no_worker_s"] or 0) >= SLOW_S:
            parts.append(_no_worker(path, t0))
        for same in _grouped(path["activities"]):
            worst = max(same, key=lambda x: x["detection_s"])
            if worst["detection_s"] >= SLOW_S:
                parts.append(_counted(_detection(data, path, worst, t0), same, "detection_s"))
            worst = max(same, key=lambda x: x["backoff_s"] or 0)
            if (worst["backoff_s"] or 0) >= SLOW_S:
                parts.append(_counted(_backoff(path, worst), same, "backoff_s"))
        for kind in ("START_TO_CLOSE", "SCHEDULE_TO_START"):
            same = [t for t in path["workflow_tasks"] if t["timeout_type"] == kind]
            worst = max(same, key=lambda t: t["wait_s"], default=None)
            if worst is not None and worst["wait_s"] >= SLOW_S:
                parts.append(_counted(_workflow_task(path, worst, t0), same, "wait_s", "workflow tasks"))
        for task in path["workflow_tasks"]:
            if (task["replay_s"] or 0) >= SLOW_S:
                parts.append(_replay(path, task))
        out += [{"about": "recovery", **p} for p in parts if p is not None]
    return out


def _fault_op(d: dict[str, Any]) -> int:
    return next((e["index"] for e in d["evidence"] if e.get("kind") == "operation"), -1)


def _explain(diagnoses: list[dict[str, Any]], workflow_id: str, before: int | None = None) -> dict[str, Any] | None:
    """The slow recovery diagnosed in this conversation, if one was: the one of the latest fault (before the
    operation ``before``, if given), the longest of its parts."""
    mine = [d for d in diagnoses if any(e.get("workflow_id") == workflow_id for e in d["evidence"])
            and (before is None or _fault_op(d) < before)]
    return max(mine, key=lambda d: (_fault_op(d), d["measured_s"] or 0.0), default=None)


def _late(data: RunData, check: CheckResult, slow: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for item in late_replies(data) or []:
        what = f"the reply to {str(item['text'])!r}" if "update" in item else f"activity {item['activity']}"
        why = _explain(slow, item["workflow_id"], next((o.index for o in data.ops if o.wall > item["at"]), None))
        if why is not None:  # the fault that held it, not merely the last one before its message
            fault_op = next(o for o in data.ops if o.index == _fault_op(why))
            item = {**item, "fault": fault_op.f, "after_fault_s": round(item["at"] - fault_op.wall, 1)}
        fault = f", {item['after_fault_s']:.1f} s after the {item['fault']}" if item["after_fault_s"] is not None \
            else ""
        came = f"{what} ({item['workflow_id']}) came {item['after_settle_s']:.1f} s after the load settled{fault}"
        evidence = [{"kind": "late", "workflow_id": item["workflow_id"], "at": item["at"]}]
        if why is None:
            out.append({"about": "late", "cause": f"{came}; nothing in its history (no retried activity, no timed-out "
                                                  "workflow task) explains the wait", "fix": None, "setting": None,
                        "measured_s": item["after_fault_s"], "evidence": evidence})
        else:
            out.append({"about": "late", "cause": f"{came}: {why['cause']}", "fix": why["fix"],
                        "setting": why["setting"], "measured_s": item["after_fault_s"],
                        "evidence": evidence + why["evidence"]})
    return out


def _slow_after_heal(check: CheckResult, slow: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A liveness failure of ``workflow_tasks`` or ``lost`` (still waiting long after the heal), explained by the
    slow recovery diagnosed in that conversation where there is one."""
    out = []
    for problem in check.details.get("problems") or []:
        wid = str(problem).split(":")[0].split(" #")[0]
        why = _explain(slow, wid)
        if why is not None:
            out.append({"about": check.name, "cause": f"{problem}: {why['cause']}", "fix": why["fix"],
                        "setting": why["setting"], "measured_s": why["measured_s"], "evidence": why["evidence"]})
    return out


#: the fix a failing check implies by what it checks, whatever the agent (None: the check names what it saw)
CHECK_FIXES = {
    "effects": "make the effect idempotent across retries: send an idempotency key stable across attempts of one "
               "call (workflow id, run id and activity id) and have the service apply each key once",
    "replay": "the workflow code does not replay its own history: keep it deterministic, and put a changed step "
              "behind a version check (patched / getVersion) so runs already in flight replay the old path",
    "drain": "on SIGTERM, stop polling and let the tasks the worker holds finish before it exits (a graceful "
             "shutdown with a drain timeout), rather than cancelling them",
    "workflow_tasks": "fix the workflow code's error named here; a change that is not deterministic needs a version "
                      "check (patched / getVersion) for the runs already in flight",
    "temporal_history": None,
    "lost": None,
}


def check_diagnoses(data: RunData, checks: Iterable[CheckResult], slow: list[dict[str, Any]]
                    ) -> list[dict[str, Any]]:
    """One diagnosis per failing check (``late``: one per late reply), with the slow recovery that explains it
    where the run shows one, else what the check saw and the fix its property implies."""
    out: list[dict[str, Any]] = []
    for c in checks:
        if c.verdict != FAIL:
            continue
        if c.name == "late":
            out += _late(data, c, slow)
            continue
        if c.details.get("liveness_only") and (explained := _slow_after_heal(c, slow)):
            out += explained
            continue
        out.append({"about": c.name, "cause": c.summary, "fix": CHECK_FIXES.get(c.name), "setting": None,
                    "measured_s": None, "evidence": [{"kind": "check", "name": c.name}]})
    return out


def _line(d: dict[str, Any]) -> str:
    fix = f". Fix: {d['fix']}" if d.get("fix") else ""
    return f"{d['about']}: {d['cause']}{fix}"


def diagnose(data: RunData, checks: Iterable[CheckResult], paths: list[dict[str, Any]] | None = None
             ) -> list[dict[str, Any]]:
    """Every diagnosis of the run: each slow part of a recovery, then each failing check; verified, each with its
    ``line``. ``paths``: the run's ``fault_paths``, if the caller has them."""
    paths = fault_paths(data) if paths is None else paths
    t0 = next((o.wall - o.time for o in data.ops), 0.0)  # times in lines are the run's own (since it began)
    slow = recovery_diagnoses(data, paths, t0)
    found = slow + check_diagnoses(data, list(checks), slow)
    return [{**d, "line": _line(d)} for d in verified(data, found, paths)]


# ------------------------------------------------------------------------------- the evidence, read again


def _activity(data: RunData, e: dict[str, Any]) -> Any:
    for run in data.event_histories.get(e["workflow_id"]) or []:
        if run.run_id == e["run_id"]:
            return next((a for a in run.activities if a.activity_id == e["activity_id"]), None)
    return None


def _task_value(data: RunData, e: dict[str, Any]) -> Any:
    """The saved value of a workflow task's field this evidence names, read again from its run's history (a
    measured one, in seconds, rounded as ``held_workflow_tasks`` rounds it); ``_MISSING`` if there is no such task."""
    for run in data.event_histories.get(e["workflow_id"]) or []:
        if run.run_id != e["run_id"]:
            continue
        for k, t in enumerate(run.workflow_tasks):
            if t.scheduled_event_id != e["scheduled_event_id"]:
                continue
            start = t.started_at or t.scheduled_at
            nxt = next((r for r in run.workflow_tasks[k + 1:] if r.started_at is not None), None)
            return {"timeout_type": t.timeout_type, "sticky": t.sticky,
                    "workflow_task_timeout_s": t.start_to_close_s or run.workflow_task_timeout_s,
                    "timed_out_after_s": round((t.closed_at - start).total_seconds(), 2)
                    if t.closed_at and start else None,
                    "replay_s": round((nxt.closed_at - nxt.started_at).total_seconds(), 2)
                    if nxt is not None and nxt.closed_at is not None else None}.get(e["field"], _MISSING)
    return _MISSING


_MISSING = object()


def holds(data: RunData, e: dict[str, Any], paths: list[dict[str, Any]] | None = None) -> bool:
    """Whether the run directory shows this piece of evidence: the saved value it names, read again."""
    kind = e.get("kind")
    if kind == "operation":
        return any(o.index == e["index"] and o.f == e["f"] for o in data.ops)
    if kind == "check":
        return True  # the check's own result, written beside the diagnosis
    if kind == "late":
        return any(x["workflow_id"] == e["workflow_id"] and x["at"] == e["at"] for x in late_replies(data) or [])
    if kind == "activity":
        a = _activity(data, e)
        if a is None:
            return False
        value = {"detected_by": a.last_failure_timeout, "retry_policy": list(a.retry_policy or ()),
                 "attempts": a.attempts}.get(e["field"], getattr(a, e["field"], None))
        return value == (list(e["value"]) if isinstance(e["value"], tuple) else e["value"])
    if kind == "workflow_task":
        value = _task_value(data, e)
        return value is not _MISSING and value == e["value"]
    if kind == "no_worker":
        return any(p["index"] == e["index"] and p["no_worker_s"] == e["value"] for p in paths or fault_paths(data))
    return False


def verified(data: RunData, diagnoses: list[dict[str, Any]], paths: list[dict[str, Any]] | None = None
             ) -> list[dict[str, Any]]:
    """The diagnoses whose every piece of evidence the run directory holds (``holds``)."""
    paths = fault_paths(data) if paths is None else paths
    return [d for d in diagnoses if d["evidence"] and all(holds(data, e, paths) for e in d["evidence"])]
