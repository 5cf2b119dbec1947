"""A durability lint that needs no fault: the risky settings a run's saved event histories show, each with its
evidence and its fix (``dah-chaos lint RUN_DIR``, and ``lint`` in every run's ``verdict.json``).

    run directory -> event histories -> the five rules below -> findings (one per rule and activity type)

It informs and fails nothing unless asked (``--lint-fails``). Like the diagnoses, it claims only what the
histories show: a history cannot show whether an activity's code heartbeats, so an activity without a
heartbeat timeout is never told to set one alone. Each threshold is a keyword argument of ``lint``.
"""

from __future__ import annotations

from typing import Any

from chaos.checker.run_data import RunData
from harness.event_history import ActivityRecord, RunRecord

#: an activity without a heartbeat timeout is flagged when its start-to-close (or schedule-to-close) is above this
LONG_TIMEOUT_S = 10.0
#: a workflow task timeout below this many times the longest workflow task seen is flagged
TASK_TIMEOUT_MARGIN = 2.0
#: Temporal's history limits: the server suggests continue-as-new at (``limit.historyCount.suggestContinueAsNew``,
#: ``limit.historySize.suggestContinueAsNew``) and fails a run at (``limit.historyCount.error``,
#: ``limit.historySize.error``), in events and bytes
SUGGEST_EVENTS, SUGGEST_BYTES = 10_240, 10 * 1024 * 1024
LIMIT_EVENTS, LIMIT_BYTES = 51_200, 50 * 1024 * 1024
#: a run past this share of the suggested size without continuing as new is flagged
GROWTH_SHARE = 0.5
#: what ``lint`` says of a run it could not look at
NO_HISTORIES = "no Temporal event histories in this run: nothing to lint"
#: every rule's id (a finding's ``rule``) and what it flags, at the default thresholds
RULES = {
    "no-heartbeat-long-timeout": f"an activity with no heartbeat timeout and a start-to-close above "
                                 f"{LONG_TIMEOUT_S:g} s",
    "unbounded-retry-nonretryable": "an activity retried without limit on an error the agent marks "
                                    "non-retryable elsewhere",
    "workflow-task-timeout-near-replay": f"a workflow task timeout under {TASK_TIMEOUT_MARGIN:g}x the longest "
                                         "workflow task",
    "history-growth-no-continue-as-new": f"a run past {GROWTH_SHARE:.0%} of the size at which the server "
                                         "suggests continuing as new, without doing so",
    "signals-without-id": "signals carrying a message with no id, which a re-send cannot be told apart by",
}

Histories = dict[str, list[RunRecord]]


def _runs(h: Histories) -> list[RunRecord]:
    return [run for chain in h.values() for run in chain]


def _where(run: RunRecord) -> dict[str, str]:
    return {"workflow_id": run.workflow_id, "run_id": run.run_id}


def _finding(rule: str, seen: str, fix: str, evidence: dict[str, Any],
             setting: dict[str, Any] | None = None) -> dict[str, Any]:
    """One finding: ``line`` is what was seen and the fix, in one line; ``evidence['count']`` its occurrences."""
    return {"rule": rule, "line": f"{seen}. Fix: {fix}", "evidence": evidence, "setting": setting, "fix": fix}


def _limit(a: ActivityRecord) -> tuple[str, float | None]:
    """The timeout that notices a dead worker mid attempt when no heartbeat timeout is set, and its name."""
    if a.start_to_close_s:
        return "start-to-close", a.start_to_close_s
    return "schedule-to-close", a.schedule_to_close_s


def no_heartbeat_long_timeout(h: Histories, model_activity: str | None, *,
                              long_timeout_s: float = LONG_TIMEOUT_S) -> list[dict[str, Any]]:
    """Reads each scheduled activity's heartbeat, start-to-close and schedule-to-close timeouts, and how long
    its completed attempts took. Risky: with no heartbeat timeout and a limit above ``long_timeout_s``, a worker
    that dies mid call is noticed only when that limit runs out. Activities with neither limit set are left out
    (nothing to measure)."""
    worst: dict[str, tuple[float, ActivityRecord, RunRecord]] = {}
    count: dict[str, int] = {}
    for run in _runs(h):
        for a in run.activities:
            limit = _limit(a)[1]
            if a.heartbeat_s or not limit or limit <= long_timeout_s:
                continue
            count[a.activity_type] = count.get(a.activity_type, 0) + 1
            if a.activity_type not in worst or limit > worst[a.activity_type][0]:
                worst[a.activity_type] = (limit, a, run)
    out = []
    for activity_type, (limit, a, run) in sorted(worst.items()):
        name = _limit(a)[0]
        kind = ("model activity" if activity_type == model_activity else
                "tool activity" if model_activity else "activity")
        took = [x.duration_ms / 1000 for r in _runs(h) for x in r.activities
                if x.activity_type == activity_type and x.outcome == "completed" and x.duration_ms is not None]
        real = (f"its slowest completed attempt here took {max(took):.1f} s" if took else
                "no attempt of it completed here, so that latency is not known")
        fix = (f"shorten {name} toward the activity's real latency ({real}), or heartbeat while it runs and set a "
               "heartbeat timeout")
        unset = ", no start-to-close" if name == "schedule-to-close" else ""
        seen = (f"the {kind} `{activity_type}` has {name} {limit:g} s{unset} and no heartbeat timeout: a worker "
                f"that dies mid call is noticed only after {limit:g} s ({count[activity_type]} call(s))")
        out.append(_finding(
            "no-heartbeat-long-timeout", seen, fix,
            {"activity_type": activity_type, **_where(run), "activity_id": a.activity_id, "heartbeat_s": None,
             "start_to_close_s": a.start_to_close_s, "schedule_to_close_s": a.schedule_to_close_s,
             "slowest_completed_s": round(max(took), 3) if took else None, "count": count[activity_type]},
            {"name": name.replace("-", "_"), "value_s": limit, "activity_type": activity_type}))
    return out


def _marked_non_retryable(h: Histories) -> dict[str, str]:
    """Error type -> where this agent marks it non-retryable: a retry policy that lists it, or a failure that
    said so itself (``ApplicationError(non_retryable=True)``)."""
    marked: dict[str, str] = {}
    for a in (a for run in _runs(h) for a in run.activities):
        for t in a.non_retryable:
            marked.setdefault(t, f"the retry policy of `{a.activity_type}` lists it")
        if a.close_failure_type and a.close_failure_non_retryable:
            marked.setdefault(a.close_failure_type, f"`{a.activity_type}` raised it as non-retryable")
    return marked


def unbounded_retry_nonretryable(h: Histories) -> list[dict[str, Any]]:
    """Reads each activity's maximum attempts, its attempts and the application error type of the failure before
    its last attempt, and every error type the agent marks non-retryable (any retry policy's list, any failure
    raised non-retryable). Risky: an activity retried without limit on an error the agent itself means to stop
    on is retried until something else gives up. Nothing is guessed: an error type nothing marks is left out."""
    marked = _marked_non_retryable(h)
    worst: dict[str, tuple[ActivityRecord, RunRecord]] = {}
    count: dict[str, int] = {}
    for run in _runs(h):
        for a in run.activities:
            if a.maximum_attempts or a.attempts < 2 or a.last_failure_type not in marked \
                    or a.last_failure_type in a.non_retryable:
                continue
            count[a.activity_type] = count.get(a.activity_type, 0) + 1
            if a.activity_type not in worst or a.attempts > worst[a.activity_type][0].attempts:
                worst[a.activity_type] = (a, run)
    out = []
    for name, (a, run) in sorted(worst.items()):
        error = a.last_failure_type
        fix = f"list {error} in `{name}`'s non-retryable error types too, or bound its attempts"
        seen = (f"`{name}` retries without limit on {error}, an error this agent marks non-retryable elsewhere "
                f"({marked[error]}): up to {a.attempts} attempts seen, in {count[name]} call(s)")
        out.append(_finding("unbounded-retry-nonretryable", seen, fix,
                            {"activity_type": name, **_where(run), "activity_id": a.activity_id,
                             "attempts": a.attempts, "error_type": error, "maximum_attempts": 0,
                             "marked_by": marked[error], "count": count[name]}))
    return out


def workflow_task_timeout_near_replay(h: Histories, *,
                                      margin: float = TASK_TIMEOUT_MARGIN) -> list[dict[str, Any]]:
    """Reads each completed workflow task's start and close and the workflow task timeout it ran under. Risky:
    a timeout less than ``margin`` times the longest task means a replay of a longer history (a new worker's
    first task, after a crash) could time out, be tried again from the start, and time out again. Runs that
    recorded local activities are left out: their tasks' lengths include the local activities, and the SDK
    completes such a task at 80% of its timeout on purpose."""
    near: list[tuple[float, float, RunRecord, int]] = []
    for run in _runs(h):
        if run.local_activities:
            continue
        for i, t in enumerate(run.workflow_tasks):
            timeout = t.start_to_close_s or run.workflow_task_timeout_s
            if t.outcome != "completed" or not timeout or t.started_at is None or t.closed_at is None:
                continue
            took = (t.closed_at - t.started_at).total_seconds()
            if took * margin > timeout:
                near.append((took, timeout, run, i))
    if not near:
        return []
    took, timeout, run, i = max(near, key=lambda n: n[0] / n[1])
    task = run.workflow_tasks[i]
    replay = i > 0 and run.workflow_tasks[i - 1].outcome == "timed_out" and not task.sticky
    fix = "raise the workflow task timeout, or continue as new sooner so a replay stays short"
    seen = (f"a workflow task of {run.workflow_id} took {took:.2f} s against a workflow task timeout of "
            f"{timeout:g} s{' (a replay after a timed-out task)' if replay else ''}, and {len(near)} task(s) took "
            f"over {1 / margin:.0%} of theirs: a longer replay could time out and be retried over and over")
    return [_finding("workflow-task-timeout-near-replay", seen, fix,
                     {**_where(run), "scheduled_event_id": task.scheduled_event_id, "attempt": task.attempt,
                      "sticky": task.sticky, "after_timeout": replay, "longest_task_s": round(took, 3),
                      "workflow_task_timeout_s": timeout, "count": len(near)},
                     {"name": "workflow_task_timeout", "value_s": timeout})]


def history_growth_no_continue_as_new(h: Histories, *, share: float = GROWTH_SHARE,
                                      suggest_events: int = SUGGEST_EVENTS,
                                      suggest_bytes: int = SUGGEST_BYTES) -> list[dict[str, Any]]:
    """Reads each run's event count, size, and whether it continued as new. Risky: a run past ``share`` of the
    size at which the server suggests continuing as new (``suggest_events`` events or ``suggest_bytes``)
    without doing so grows toward the limits at which the server fails it (51,200 events, 50 MiB); the
    evidence names the longest run of its chain."""
    big = [(run, chain) for chain in h.values() for run in chain if run.next_run_id is None and
           (run.events > share * suggest_events or run.history_bytes > share * suggest_bytes)]
    if not big:
        return []
    run, chain = max(big, key=lambda b: (b[0].events, b[0].history_bytes))
    fix = "continue as new when the server suggests it (or every N turns), carrying the conversation"
    seen = (f"{run.workflow_id}'s run has {run.events} events ({run.history_bytes / 2**20:.1f} MiB) and never "
            f"continued as new, with {len(big)} run(s) past {share:g} of the size at which the server suggests "
            f"it ({suggest_events} events or {suggest_bytes / 2**20:g} MiB): the server fails a run at "
            f"{LIMIT_EVENTS} events or {LIMIT_BYTES / 2**20:g} MiB")
    return [_finding("history-growth-no-continue-as-new", seen, fix,
                     {**_where(run), "events": run.events, "history_bytes": run.history_bytes,
                      "chain_runs": len(chain), "longest_chain_run_events": max(r.events for r in chain),
                      "count": len(big)})]


def signals_without_id(h: Histories) -> list[dict[str, Any]]:
    """Reads each run's signals that carry a message with no id (``RunRecord.signals_without_id``). Risky: a
    client that re-sends one after a timeout cannot be told from a new message, so the agent takes it twice."""
    runs = [r for r in _runs(h) if r.signals_without_id]
    if not runs:
        return []
    n = sum(r.signals_without_id for r in runs)
    fix = "carry a message id in each signal and drop one already seen (across continue-as-new), or send " \
          "messages as Updates with an update id"
    seen = (f"{n} signal(s) in {len(runs)} run(s) carry no id: a client that re-sends one after a timeout makes "
            "the agent take it twice")
    return [_finding("signals-without-id", seen, fix,
                     {**_where(runs[0]), "signals_without_id": n, "runs": len(runs), "count": n})]


def lint(data: RunData, *, long_timeout_s: float = LONG_TIMEOUT_S, task_timeout_margin: float = TASK_TIMEOUT_MARGIN,
         growth_share: float = GROWTH_SHARE, suggest_events: int = SUGGEST_EVENTS,
         suggest_bytes: int = SUGGEST_BYTES) -> tuple[list[dict[str, Any]], str | None]:
    """(findings sorted by rule, why it could not look: ``NO_HISTORIES``, or None when it did). No finding and
    None: nothing risky seen. Reads only the run directory's saved event histories and run.json's target."""
    h = data.event_histories
    if not h:
        return [], NO_HISTORIES
    found = [*no_heartbeat_long_timeout(h, data.model_activity, long_timeout_s=long_timeout_s),
             *unbounded_retry_nonretryable(h),
             *workflow_task_timeout_near_replay(h, margin=task_timeout_margin),
             *history_growth_no_continue_as_new(h, share=growth_share, suggest_events=suggest_events,
                                                suggest_bytes=suggest_bytes),
             *signals_without_id(h)]
    return sorted(found, key=lambda f: f["rule"]), None
