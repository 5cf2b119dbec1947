"""temporal_history: from the Temporal event histories (and the ledger's execution log):

- a completed activity is never executed again: no execution of the attempt
  that completed it (or a later one) starts after the history recorded it
  completed (the model call made before a crash is reused from history, not
  repeated), and no activity has more executions than the attempts its
  history records;
- a local activity (a ``core_local_activity`` marker) is never executed after
  the history recorded it; one that finished on a worker that died (or lost
  its workflow task) before recording it runs again, which is its contract
  (at-least-once until recorded): counted, not failed. A model call counts as
  completed before a kill only once recorded;
- a *stale* attempt is not that: an earlier attempt (one the server had
  already timed out and retried) that a paused or partitioned worker starts
  late is Temporal's at-least-once activity execution. It wastes a call but
  replays nothing; it is counted and timed (``stale_attempts``,
  ``stale_seconds``), not failed; one that asked the server first and
  skipped the work (outcome ``stale_skipped``) is counted apart;
- retries were spaced by the retry policy, on the server's clock: for an
  activity that took n attempts, its last attempt started at least the sum
  of the first n-1 backoff intervals after it was scheduled (both times are
  the history's; the policy is read from the ActivityTaskScheduled event), and
  consecutive attempts were *scheduled* (``executions.scheduled_at``, from the
  activity's info) at least one backoff apart. Worker-side start times are
  not used: a paused worker starts late;
- retries hidden inside one attempt (an HTTP client's own retries) are
  invisible to both: the model server's request count, which the run saves,
  is held against the model-call executions and the difference reported,
  only where the ledger marks which executions are model calls
  (``harness.recording``'s ``model_call=True``). Without that mark (no
  ledger, or one whose executions are all tools) the number of model calls
  is not known, and the result says it cannot tell, never a figure.

Without an execution log (a target with no ledger) the first two properties
cannot be checked and the result says so; it never claims them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chaos.checker.run_data import RunData
from harness.verdict import FAIL, PASS, UNKNOWN, CheckResult
from harness.operations import pairs

TOLERANCE_S = 0.05
#: an execution that found its attempt stale and did not do the work (agent.activities.STALE_SKIPPED)
STALE_SKIPPED = "stale_skipped"


def backoff(initial_s: float, coefficient: float, maximum_s: float, k: int) -> float:
    """The wait before attempt k + 1."""
    return min(initial_s * coefficient ** (k - 1), maximum_s) if maximum_s > 0 else initial_s * coefficient ** (k - 1)


@dataclass
class _Findings:
    """What the properties found, as the result reports it: problems fail the check, ``not_checked`` says what
    could not be looked at, ``stale`` attempts are counted (at-least-once), never failed."""

    problems: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)
    stale: list[dict[str, Any]] = field(default_factory=list)
    own_delays: list[str] = field(default_factory=list)
    activities: int = 0
    retried: int = 0
    reused_checked: int = 0
    local: int = 0
    local_repeated: int = 0


def check(data: RunData) -> CheckResult:
    """The five properties of the module's docstring, on every activity of every saved history."""
    if not data.event_histories:
        return CheckResult("temporal_history", UNKNOWN, "no Temporal event histories were saved")
    found = _Findings()
    rows = data.ledger_rows("executions")
    executions: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in rows:
        executions.setdefault((e["run_id"], e["activity_id"]), []).append(e)
    has_log = bool(rows)
    if not has_log:
        found.not_checked.append("re-execution after completion (no execution log: the target declares no effect "
                                 "ledger, or nothing recorded an execution)")
    if has_log and not any(e.get("scheduled_at") is not None for e in rows):
        found.not_checked.append("per-attempt retry spacing (the ledger has no schedule times: recorded before "
                                 "version 4)")
    # The reference agent's activities never choose their own retry delay; another agent's may (the history keeps
    # only each activity's last failure): a retry sooner than the policy is then not a violation anyone can see.
    reference = not data.target.get("source")
    completed_model_calls: dict[tuple[str, str], float] = {}
    for wid, chain in data.event_histories.items():
        for run in chain:
            for a in run.activities:
                found.activities += 1
                key = (run.run_id, a.activity_id)
                execs = sorted(executions.get(key, []), key=lambda e: e["started_at"])
                closed = a.closed_at.timestamp() if a.outcome == "completed" and a.closed_at is not None else None
                if closed is not None:
                    if a.activity_type == data.model_activity:
                        completed_model_calls[key] = closed
                    found.reused_checked += bool(execs)
                _not_executed_after_completion(data, wid, a, execs, closed, found)
                _retries_spaced_by_policy(wid, a, execs, reference, found)
    recorded_model_calls = _local_not_executed_after_recording(data, executions, found)
    kills = [(done.value or {}).get("killed_at", done.wall) for inv, done in pairs(data.ops)
             if inv.f == "kill_worker" and done is not None]
    before_kill, again_after_kill = _model_calls_not_repeated_after_kills(
        data, executions, completed_model_calls, recorded_model_calls, kills) if kills and has_log else (0, 0)
    if again_after_kill:
        found.problems.append(f"{again_after_kill} model call(s) completed before a kill were executed again after it")
    if found.own_delays:
        found.not_checked.append(f"retry spacing of {len(found.own_delays)} activit"
                                 f"{'y' if len(found.own_delays) == 1 else 'ies'} retried sooner than the policy, "
                                 "where an application failure may have set its own next_retry_delay (first: "
                                 f"{found.own_delays[0]})")
    hidden = _hidden_retries(data, rows)
    if hidden.get("requests") is None:
        found.not_checked.append("retries inside an attempt (the run saved no model-server request count)")
    elif hidden.get("inside_attempts") is None:
        found.not_checked.append("retries inside an attempt (cannot tell: the effect ledger marks no execution as a "
                                 "model call, model_call=True in harness.recording, so the model calls made are not "
                                 "known)")
    return _result(found, has_log, kills, before_kill, again_after_kill, hidden)


def _not_executed_after_completion(data: RunData, wid: str, a: Any, execs: list[dict[str, Any]],
                                   closed: float | None, found: _Findings) -> None:
    """Property 1: a completed activity is never executed again. An execution of the attempt that completed it (or
    a later one) starting after the history recorded it completed is a replay bug, and so is an execution with an
    attempt number the history never reached. An *earlier* attempt starting after the server moved on (scheduled
    its successor, or completed it) is stale: at-least-once execution by a paused or cut-off worker, counted in
    ``found.stale``, not failed. Cannot check without an execution log (``execs`` empty): it then finds nothing,
    and ``check`` says so."""
    # when the server scheduled each attempt (its clock): an attempt starting after its successor was scheduled,
    # or after the activity completed, started stale
    sched = {e["attempt"]: e["scheduled_at"] for e in execs if e.get("scheduled_at") is not None}
    for e in execs:
        k = e["attempt"]
        moved_on = min([t for t in (sched.get(k + 1), closed) if t is not None], default=None)
        if k < a.attempts and moved_on is not None and e["started_at"] > moved_on + TOLERANCE_S:
            found.stale.append({"workflow_id": wid, "activity": a.activity_type, "activity_id": a.activity_id,
                                "attempt": k, "final_attempt": a.attempts, "worker": e["worker"],
                                "late_s": round(e["started_at"] - moved_on, 3),
                                "seconds": round((e["finished_at"] or e["started_at"]) - e["started_at"], 3),
                                "model_call": data.is_model_call(e), "skipped": e.get("outcome") == STALE_SKIPPED})
        elif closed is not None and k >= a.attempts and e["started_at"] > closed + TOLERANCE_S:
            found.problems.append(f"{wid} {a.activity_type} #{a.activity_id}: executed again after it completed "
                                  f"(attempt {k} by {e['worker']}, {e['started_at'] - closed:.2f}s after; it "
                                  f"completed on attempt {a.attempts})")
    if execs and max(e["attempt"] for e in execs) > max(a.attempts, 1):
        found.problems.append(f"{wid} {a.activity_type} #{a.activity_id}: an execution with attempt "
                              f"{max(e['attempt'] for e in execs)} but the history records {a.attempts}")


def _retries_spaced_by_policy(wid: str, a: Any, execs: list[dict[str, Any]], reference: bool,
                              found: _Findings) -> None:
    """Property 4: retries were spaced by the retry policy, on the server's clock. An activity that took n attempts
    started its last one at least the sum of the first n-1 backoffs after it was scheduled (the history's times,
    the policy from its ActivityTaskScheduled event), and consecutive attempts were *scheduled* at least one backoff
    apart (the ledger's ``scheduled_at``). Cannot tell a violation from an activity that set its own
    ``next_retry_delay`` (``_own_delay``: counted in ``found.own_delays``, not failed), and does not use worker-side
    start times (a paused worker starts late)."""
    if not (a.attempts >= 2 and a.retry_policy and a.scheduled_at and a.started_at):
        return
    found.retried += 1
    initial, coef, maximum = a.retry_policy
    floor = sum(backoff(initial, coef, maximum, k) for k in range(1, a.attempts))
    waited = (a.started_at - a.scheduled_at).total_seconds()
    own = _own_delay(a, reference)
    if waited + TOLERANCE_S < floor and own:
        found.own_delays.append(f"{wid} {a.activity_type} #{a.activity_id} (attempt {a.attempts} after "
                                f"{waited:.2f}s, the policy's floor {floor:.2f}s: {own})")
    elif waited + TOLERANCE_S < floor:
        found.problems.append(f"{wid} {a.activity_type} #{a.activity_id}: attempt {a.attempts} started "
                              f"{waited:.2f}s after scheduling; the backoff policy needs >= {floor:.2f}s")
    scheduled = {e["attempt"]: e["scheduled_at"] for e in execs if e.get("scheduled_at") is not None}
    for k in sorted(scheduled):
        if k + 1 in scheduled and not own:
            gap = scheduled[k + 1] - scheduled[k]
            if gap + TOLERANCE_S < backoff(initial, coef, maximum, k):
                found.problems.append(f"{wid} {a.activity_type} #{a.activity_id}: attempts {k} and {k + 1} "
                                      f"scheduled {gap:.2f}s apart by the server; the backoff is "
                                      f"{backoff(initial, coef, maximum, k):.2f}s")


def _local_not_executed_after_recording(data: RunData, executions: dict[tuple[str, str], list[dict[str, Any]]],
                                        found: _Findings) -> dict[tuple[str, str], float]:
    """Property 2: a local activity is never executed after the history recorded it (its marker, written when its
    workflow task completes, so "completed" means recorded). Running again in a workflow task its worker took
    after the recording is a replay bug; running again on a task taken before it (a paused or cut-off worker) is
    at-least-once, counted in ``found.stale``; one that finished but was never recorded (its worker died, or lost
    the task, first) runs again by contract, counted in ``found.local_repeated``. Cannot check without an
    execution log. Returns the completed local model calls with when they were recorded (property 3)."""
    recorded_model_calls: dict[tuple[str, str], float] = {}  # local model calls: run again only as a replay bug
    for wid, chain in data.event_histories.items():
        for run in chain:
            for la in run.local_activities:
                found.local += 1
                key = (run.run_id, la.activity_id)
                execs = executions.get(key, [])
                recorded = la.recorded_at.timestamp()
                if la.activity_type == data.model_activity and la.outcome == "completed":
                    recorded_model_calls[key] = recorded
                found.local_repeated += max(0, sum(1 for e in execs if e.get("outcome") == "ok"
                                                   and e["started_at"] <= recorded + TOLERANCE_S) - 1)
                for e in execs:
                    if e["started_at"] <= recorded + TOLERANCE_S:
                        continue
                    if _took_task_after(run, e["worker"], recorded, e["started_at"]):
                        found.problems.append(f"{wid} {la.activity_type} (local activity) #{la.activity_id}: "
                                              f"executed again after the history recorded it (by {e['worker']}, "
                                              f"{e['started_at'] - recorded:.2f}s after, in a workflow task it "
                                              "took after the recording)")
                    else:  # a worker still on a task it took before the recording (paused, cut off): at-least-once
                        found.stale.append({"workflow_id": wid, "activity": la.activity_type,
                                            "activity_id": la.activity_id, "attempt": e["attempt"],
                                            "final_attempt": la.attempt, "worker": e["worker"],
                                            "late_s": round(e["started_at"] - recorded, 3),
                                            "seconds": round((e["finished_at"] or e["started_at"]) - e["started_at"],
                                                             3),
                                            "model_call": data.is_model_call(e), "skipped": False, "local": True})
    return recorded_model_calls


def _model_calls_not_repeated_after_kills(data: RunData, executions: dict[tuple[str, str], list[dict[str, Any]]],
                                          completed: dict[tuple[str, str], float],
                                          recorded: dict[tuple[str, str], float],
                                          kills: list[float]) -> tuple[int, int]:
    """Property 3, the reference's claim: a model call completed before a worker was killed is not made again
    after the kill (it is reused from history). Each completed call counted once, whatever the number of kills:
    (calls completed before a kill, of them executed again after it). Needs an execution log and a kill. A local
    model call run after its recording is property 2's (a local activity's attempt numbers restart with each
    workflow task, so they cannot tell a replay from a stale run: the tasks do)."""
    before_kill = again_after_kill = 0
    for key, closed in completed.items():
        killed_after = [k for k in kills if k > closed]
        if not killed_after:
            continue
        before_kill += 1
        first_kill = min(killed_after)
        again_after_kill += sum(1 for e in executions.get(key, []) if e["started_at"] > first_kill
                                and e["attempt"] >= _completing_attempt(data, key))
    before_kill += sum(1 for closed in recorded.values() if any(k > closed for k in kills))
    return before_kill, again_after_kill


def _result(found: _Findings, has_log: bool, kills: list[float], before_kill: int, again_after_kill: int,
            hidden: dict[str, Any]) -> CheckResult:
    """The properties' findings as one result: any problem fails it; no activity at all is unknown."""
    skipped = [z for z in found.stale if z["skipped"]]
    stale = [z for z in found.stale if not z["skipped"]]
    stale_model = [z for z in stale if z["model_call"]]
    activities, local, retried, own_delays = found.activities, found.local, found.retried, found.own_delays
    details = {"activities": activities, "retried_activities": retried, "own_retry_delays": own_delays[:10],
               "completed_activities_with_executions": found.reused_checked, "kills": len(kills),
               "local_activities": local, "local_repeated_before_recorded": found.local_repeated if has_log else None,
               "execution_log": has_log,
               "model_calls_completed_before_kills": before_kill if has_log else None,
               "model_calls_re_executed_after_kills": again_after_kill if has_log else None,
               "stale_attempts": len(stale), "stale_model_calls": len(stale_model),
               "stale_seconds": round(sum(z["seconds"] for z in stale), 3), "stale_examples": stale[:10],
               "stale_attempts_skipped": len(skipped),
               "model_requests": hidden, "not_checked": found.not_checked, "problems": found.problems[:50]}
    problems = found.problems
    if problems:
        return CheckResult("temporal_history", FAIL, f"{len(problems)} problem(s); first: {problems[0]}", details)
    if not activities and not local:
        return CheckResult("temporal_history", UNKNOWN, "the histories hold no activity: nothing to check", details)
    parts = [f"{activities} activities" + (": none executed after completing" if has_log else ""),
             f"{retried - len(own_delays)} retried activit{'y' if retried - len(own_delays) == 1 else 'ies'} "
             "spaced by the backoff policy "
             "(server clock)"]
    if local:
        parts.insert(1, f"{local} local activities recorded" + (
            f": none executed after recording; {found.local_repeated} finished again because the first finish was "
            "never recorded (a local activity is at-least-once until its workflow task completes)" if has_log else ""))
    if kills and has_log:
        parts.append(f"{before_kill} model call(s) completed before {len(kills)} kill(s), none executed again")
    if stale:
        parts.append(f"{len(stale)} stale attempt(s) started late by a paused or cut-off worker "
                     f"({len(stale_model)} model call(s), {details['stale_seconds']:.1f}s wasted; at-least-once, "
                     "not a replay)")
    if skipped:
        parts.append(f"{len(skipped)} stale attempt(s) found themselves stale and skipped the call")
    if hidden.get("inside_attempts"):
        parts.append(f"{hidden['inside_attempts']} model request(s) were retries inside an attempt, "
                     "invisible to Temporal's retry policy")
    if found.not_checked:
        parts.append("not checked: " + "; ".join(found.not_checked))
    return CheckResult("temporal_history", PASS, "; ".join(parts), details)


def _took_task_after(run: Any, worker: str, recorded: float, started: float) -> bool:
    """Whether ``worker`` started a workflow task of ``run`` after a local activity was recorded and before it ran
    it again: the history then showed it the result, so running it was a replay bug. A worker whose latest task
    started before the recording ran it on a task it took earlier (it was paused or cut off): at-least-once."""
    return any(w.identity == worker and w.started_at is not None
               and recorded - TOLERANCE_S < w.started_at.timestamp() <= started + TOLERANCE_S
               for w in run.workflow_tasks)


def _completing_attempt(data: RunData, key: tuple[str, str]) -> int:
    for chain in data.event_histories.values():
        for run in chain:
            if run.run_id == key[0]:
                for a in run.activities:
                    if a.activity_id == key[1]:
                        return a.attempts
    return 0


def _hidden_retries(data: RunData, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Model requests the model server saw against the model calls made: more requests than calls means retries
    inside an attempt (a client library's own), which Temporal's retry policy never saw. Only where the ledger
    marks model calls (``inside_attempts`` None otherwise: a ledger with no model call marked, or no ledger, does
    not say how many calls were made, and a framework's model activity may make several requests per attempt)."""
    stats = data.run.get("model_server") or {}
    requests = stats.get("requests")
    calls = sum(1 for e in rows if data.is_model_call(e)) if rows else None
    attempts = sum(a.attempts for chain in data.event_histories.values() for run in chain for a in run.activities
                   if a.activity_type == data.model_activity)
    known = requests is not None and bool(calls)
    return {"requests": requests, "model_call_executions": calls, "model_attempts_in_histories": attempts,
            "model_calls_marked": bool(calls),
            "inside_attempts": max(0, requests - calls) if known else None}


def _own_delay(a: Any, reference: bool) -> str:
    """Why an activity's retries may be spaced by the activity itself rather than its retry policy (an
    ``ApplicationError`` with ``next_retry_delay``, which the server honours; e.g. the OpenAI Agents SDK's model
    activity passes a 429's Retry-After), or "" where the policy alone decides."""
    if a.last_failure_sets_delay:
        return "its last failure set next_retry_delay"
    if not reference and a.attempts > 2:  # (with 2 attempts, the one failure is the last, seen above)
        return ("an earlier failure may have set next_retry_delay (the agent is not the harness's, and the history "
                "keeps only the last failure)")
    return ""

