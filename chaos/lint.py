"""A durability lint that needs no fault: the risky settings a run's saved event histories show, each with its
evidence and its fix (``dah-chaos lint RUN_DIR``, and ``lint`` in every run's ``verdict.json``).

    run directory -> event histories -> RULES -> findings

It informs and fails nothing unless asked (``--lint-fails``). Like the diagnoses, it claims only what the
histories show: a history cannot show whether an activity's code heartbeats, so an activity without a
heartbeat timeout is never told to set one alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from chaos.checker.run_data import RunData
from harness.event_history import RunRecord

#: an activity without a heartbeat timeout is flagged when its start-to-close (or schedule-to-close) is above this
LONG_TIMEOUT_S = 10.0
#: a workflow task timeout below this many times the longest workflow task seen is flagged
TASK_TIMEOUT_MARGIN = 2.0
#: Temporal's history limits: the server suggests continue-as-new at, and fails a run at (events, bytes)
SUGGEST_EVENTS, SUGGEST_BYTES = 10_240, 10 * 1024 * 1024
LIMIT_EVENTS, LIMIT_BYTES = 51_200, 50 * 1024 * 1024
#: a run past this share of the suggested size without continuing as new is flagged
GROWTH_SHARE = 0.5

Histories = dict[str, list[RunRecord]]


def _runs(h: Histories) -> list[RunRecord]:
    return [run for chain in h.values() for run in chain]


def _where(run: RunRecord) -> dict[str, str]:
    return {"workflow_id": run.workflow_id, "run_id": run.run_id}


def no_heartbeat_long_timeout(h: Histories, model_activity: str | None) -> list[dict[str, Any]]:
    """Activity types scheduled with no heartbeat timeout and a start-to-close (else schedule-to-close) above
    ``LONG_TIMEOUT_S``: a worker that dies mid call is noticed only when that runs out."""
    seen: dict[str, dict[str, Any]] = {}
    for run in _runs(h):
        for a in run.activities:
            limit = a.start_to_close_s or a.schedule_to_close_s
            if a.heartbeat_s or not limit or limit <= LONG_TIMEOUT_S:
                continue
            f = seen.setdefault(a.activity_type, {"limit": limit, "name": "start-to-close" if a.start_to_close_s
                                                  else "schedule-to-close", "count": 0, **_where(run),
                                                  "activity_id": a.activity_id})
            f["count"] += 1
            f["limit"] = max(f["limit"], limit)
    out = []
    for name, f in sorted(seen.items()):
        kind = "model" if name == model_activity else "tool"
        took = [x.duration_ms / 1000 for run in _runs(h) for x in run.activities
                if x.activity_type == name and x.outcome == "completed" and x.duration_ms is not None]
        real = f" (its slowest completed attempt here took {max(took):.1f} s)" if took else ""
        fix = (f"shorten {f['name']} toward the activity's real latency{real}, or heartbeat while it runs and set a "
               "heartbeat timeout")
        line = (f"the {kind} activity `{name}` has {f['name']} {f['limit']:g} s and no heartbeat timeout: a worker "
                f"that dies mid call is noticed only after {f['limit']:g} s ({f['count']} call(s))")
        out.append({"rule": "no-heartbeat-long-timeout", "line": f"{line}. Fix: {fix}", "fix": fix,
                    "setting": {"name": f["name"].replace("-", "_"), "value_s": f["limit"], "activity_type": name},
                    "evidence": {"activity_type": name, "workflow_id": f["workflow_id"], "run_id": f["run_id"],
                                 "activity_id": f["activity_id"], "heartbeat_s": None, f["name"]: f["limit"],
                                 "count": f["count"]}})
    return out


def unbounded_retry_nonretryable(h: Histories, model_activity: str | None) -> list[dict[str, Any]]:
    """An activity retried without limit whose failures are of an error type the agent itself marks
    non-retryable elsewhere (another activity's retry policy lists it): retried forever what it means to stop."""
    marked = {t for run in _runs(h) for a in run.activities for t in a.non_retryable}
    out: dict[str, dict[str, Any]] = {}
    for run in _runs(h):
        for a in run.activities:
            if a.maximum_attempts or not a.last_failure_type or a.last_failure_type not in marked \
                    or a.last_failure_type in a.non_retryable or a.attempts < 2:
                continue
            fix = f"list {a.last_failure_type} in `{a.activity_type}`'s non-retryable error types too, or bound " \
                  "its attempts"
            out.setdefault(a.activity_type, {
                "rule": "unbounded-retry-nonretryable", "fix": fix, "setting": None,
                "line": f"`{a.activity_type}` retries without limit on {a.last_failure_type}, an error this agent "
                        f"marks non-retryable elsewhere ({a.attempts} attempts seen). Fix: {fix}",
                "evidence": {**_where(run), "activity_id": a.activity_id, "attempts": a.attempts,
                             "error_type": a.last_failure_type, "maximum_attempts": 0}})
    return list(out.values())


def workflow_task_timeout_near_replay(h: Histories, model_activity: str | None) -> list[dict[str, Any]]:
    """A workflow task timeout less than ``TASK_TIMEOUT_MARGIN`` times the longest workflow task the histories
    show: a replay of a longer history could time out, and be tried again, and again."""
    worst: tuple[float, float, RunRecord] | None = None
    for run in _runs(h):
        for t in run.workflow_tasks:
            timeout = t.start_to_close_s or run.workflow_task_timeout_s
            if t.outcome != "completed" or not timeout or t.started_at is None or t.closed_at is None:
                continue
            took = (t.closed_at - t.started_at).total_seconds()
            if took * TASK_TIMEOUT_MARGIN > timeout and (worst is None or took / timeout > worst[0] / worst[1]):
                worst = (took, timeout, run)
    if worst is None:
        return []
    took, timeout, run = worst
    fix = "raise the workflow task timeout, or continue as new sooner so a replay stays short"
    return [{"rule": "workflow-task-timeout-near-replay", "fix": fix,
             "setting": {"name": "workflow_task_timeout", "value_s": timeout},
             "line": f"a workflow task of {run.workflow_id} took {took:.2f} s against a workflow task timeout of "
                     f"{timeout:g} s: a longer replay could time out and be retried over and over. Fix: {fix}",
             "evidence": {**_where(run), "longest_task_s": round(took, 3), "workflow_task_timeout_s": timeout}}]


def history_growth(h: Histories, model_activity: str | None) -> list[dict[str, Any]]:
    """A run whose history passed ``GROWTH_SHARE`` of the size at which the server suggests continuing as new
    (10,240 events or 10 MiB) without doing so: it grows toward the limits at which the server fails it
    (51,200 events, 50 MiB)."""
    out = []
    for wid, chain in sorted(h.items()):
        big = [r for r in chain if r.next_run_id is None and (r.events > GROWTH_SHARE * SUGGEST_EVENTS or
                                                             r.history_bytes > GROWTH_SHARE * SUGGEST_BYTES)]
        for run in big:
            fix = "continue as new when the server suggests it (or every N turns), carrying the conversation"
            out.append({"rule": "history-growth-no-continue-as-new", "fix": fix, "setting": None,
                        "line": f"{wid}'s run has {run.events} events ({run.history_bytes / 1e6:.1f} MB) and never "
                                f"continued as new: the server fails a run at {LIMIT_EVENTS} events or 50 MiB. "
                                f"Fix: {fix}",
                        "evidence": {**_where(run), "events": run.events, "history_bytes": run.history_bytes,
                                     "longest_chain_run_events": max(r.events for r in chain)}})
    return out


def signals_without_id(h: Histories, model_activity: str | None) -> list[dict[str, Any]]:
    """Signals whose argument carries no id: a re-sent signal cannot be told from a new one."""
    runs = [r for r in _runs(h) if r.signals_without_id]
    if not runs:
        return []
    n = sum(r.signals_without_id for r in runs)
    fix = "carry a message id in each signal and drop one already seen (across continue-as-new), or send " \
          "messages as Updates with an update id"
    return [{"rule": "signals-without-id", "fix": fix, "setting": None,
             "line": f"{n} signal(s) in {len(runs)} run(s) carry no id: a client that re-sends one after a timeout "
                     f"makes the agent take it twice. Fix: {fix}",
             "evidence": {**_where(runs[0]), "signals_without_id": n}}]


RULES: dict[str, Callable[[Histories, str | None], list[dict[str, Any]]]] = {
    "no-heartbeat-long-timeout": no_heartbeat_long_timeout,
    "unbounded-retry-nonretryable": unbounded_retry_nonretryable,
    "workflow-task-timeout-near-replay": workflow_task_timeout_near_replay,
    "history-growth-no-continue-as-new": history_growth,
    "signals-without-id": signals_without_id,
}
#: what ``lint`` says of a run it could not look at
NO_HISTORIES = "no Temporal event histories in this run: nothing to lint"


def lint(data: RunData) -> tuple[list[dict[str, Any]], str | None]:
    """(findings, why it could not look: None when it did). No finding and no reason: nothing risky seen."""
    if not data.event_histories:
        return [], NO_HISTORIES
    found = [f for rule in RULES.values() for f in rule(data.event_histories, data.model_activity)]
    return sorted(found, key=lambda f: f["rule"]), None
