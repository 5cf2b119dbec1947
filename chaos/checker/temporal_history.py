"""temporal_history: from the Temporal event histories (and the ledger's execution log):

- a completed activity is never executed again: no physical execution of an
  activity starts after the history recorded it completed (the model call
  made before a crash is reused from history, not repeated), and no activity
  has more executions than the attempts its history records;
- retries were spaced by the retry policy: for an activity that took n
  attempts, its last attempt started at least the sum of the first n-1
  backoff intervals after it was scheduled (the policy is read from the
  ActivityTaskScheduled event), and consecutive recorded attempts are at least
  one backoff apart.
"""

from __future__ import annotations

from typing import Any

from chaos.checker.run_data import RunData
from harness.verdict import FAIL, PASS, UNKNOWN, CheckResult
from harness.operations import pairs

TOLERANCE_S = 0.05


def backoff(initial_s: float, coefficient: float, maximum_s: float, k: int) -> float:
    """The wait before attempt k + 1."""
    return min(initial_s * coefficient ** (k - 1), maximum_s) if maximum_s > 0 else initial_s * coefficient ** (k - 1)


def check(data: RunData) -> CheckResult:
    if not data.event_histories:
        return CheckResult("temporal_history", UNKNOWN, "no Temporal event histories were saved")
    problems: list[str] = []
    executions: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in data.ledger_rows("executions"):
        executions.setdefault((e["run_id"], e["activity_id"]), []).append(e)
    activities = retried = reused_checked = 0
    for wid, chain in data.event_histories.items():
        for run in chain:
            for a in run.activities:
                activities += 1
                key = (run.run_id, a.activity_id)
                execs = sorted(executions.get(key, []), key=lambda e: e["started_at"])
                if a.outcome == "completed" and a.closed_at is not None:
                    closed = a.closed_at.timestamp()
                    late = [e for e in execs if e["started_at"] > closed + TOLERANCE_S]
                    reused_checked += bool(execs)
                    if late:
                        problems.append(f"{wid} {a.activity_type} #{a.activity_id}: executed again after it completed "
                                        f"(attempts {[e['attempt'] for e in late]} by {[e['worker'] for e in late]})")
                if execs and max(e["attempt"] for e in execs) > max(a.attempts, 1):
                    problems.append(f"{wid} {a.activity_type} #{a.activity_id}: an execution with attempt "
                                    f"{max(e['attempt'] for e in execs)} but the history records {a.attempts}")
                if a.attempts >= 2 and a.retry_policy and a.scheduled_at and a.started_at:
                    retried += 1
                    initial, coef, maximum = a.retry_policy
                    floor = sum(backoff(initial, coef, maximum, k) for k in range(1, a.attempts))
                    waited = (a.started_at - a.scheduled_at).total_seconds()
                    if waited + TOLERANCE_S < floor:
                        problems.append(f"{wid} {a.activity_type} #{a.activity_id}: attempt {a.attempts} started "
                                        f"{waited:.2f}s after scheduling; the backoff policy needs >= {floor:.2f}s")
                    by_attempt = {e["attempt"]: e["started_at"] for e in execs}
                    for k in sorted(by_attempt):
                        if k + 1 in by_attempt:
                            gap = by_attempt[k + 1] - by_attempt[k]
                            if gap + TOLERANCE_S < backoff(initial, coef, maximum, k):
                                problems.append(f"{wid} {a.activity_type} #{a.activity_id}: attempts {k} and {k + 1} "
                                                f"{gap:.2f}s apart; backoff is {backoff(initial, coef, maximum, k):.2f}s")
    # The reference's claim, per kill: model calls completed before the worker died are not made again.
    model_activity = data.model_activity
    kills = [((done.value or {}).get("killed_at", done.wall), (done.value or {}).get("identity"))
             for inv, done in pairs(data.ops) if inv.f == "kill_worker" and done is not None]
    before_kill = again_after_kill = 0
    for kill_wall, _victim in kills:
        for wid, chain in data.event_histories.items():
            for run in chain:
                for a in run.activities:
                    if a.activity_type == model_activity and a.outcome == "completed" and a.closed_at \
                            and a.closed_at.timestamp() < kill_wall:
                        before_kill += 1
                        execs = executions.get((run.run_id, a.activity_id), [])
                        again_after_kill += sum(1 for e in execs if e["started_at"] > kill_wall)
    if again_after_kill:
        problems.append(f"{again_after_kill} model call(s) completed before a kill were executed again after it")
    details = {"activities": activities, "retried_activities": retried,
               "completed_activities_with_executions": reused_checked, "kills": len(kills),
               "model_calls_completed_before_kills": before_kill,
               "model_calls_re_executed_after_kills": again_after_kill, "problems": problems[:50]}
    if problems:
        return CheckResult("temporal_history", FAIL, f"{len(problems)} problem(s); first: {problems[0]}", details)
    kill_note = (f"; {before_kill} model call(s) completed before {len(kills)} kill(s), none executed again"
                 if kills else "")
    return CheckResult("temporal_history", PASS,
                       f"{activities} activities: none executed after completing; {retried} retried "
                       f"activit{'y' if retried == 1 else 'ies'} spaced by the backoff policy{kill_note}", details)
