"""workflow_tasks: from the event histories, the workflow code ran and kept running.

- a workflow task that failed (workflow code raised, non-determinism, a bad
  command) and was never followed by a completed one, in a run that did not
  close, is a failure, named with its error: that conversation is stuck, and
  no other check can say why (its messages look merely unanswered);
- a workflow task failed by the workflow's own code (it raised:
  ``WORKFLOW_WORKER_UNHANDLED_FAILURE``; or it was not deterministic:
  ``NON_DETERMINISTIC_ERROR``) is a failure even if a later task completed;
- other failed and timed-out workflow tasks that were followed by a completed one
  are reported by cause (a worker killed mid-task times its task out; a task
  racing a new message fails with ``UNHANDLED_COMMAND``): expected under
  faults, not failures;
- liveness after the heal: every workflow task pending when the faults healed,
  or scheduled after, completed, within the scenario's ``recovery_within_s``
  of the heal (or of being scheduled, if later). The worst wait is reported;
  a task that never completed is a failure naming its conversation.
A run with no workflow task in its histories is ``unknown``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chaos.checker.run_data import RunData
from harness.operations import pairs
from harness.verdict import FAIL, PASS, UNKNOWN, CheckResult

#: workflow-task failure causes that mean the workflow's own code is broken (it raised, or it is not
#: deterministic): a failure even when a later task completed. Others (a task racing a new event, a reset sticky
#: queue) are expected under faults and only reported.
CODE_FAILURES = ("WORKFLOW_WORKER_UNHANDLED_FAILURE", "NON_DETERMINISTIC_ERROR")
#: default for a scenario that does not say (``ChaosScenario.recovery_within_s``)
RECOVERY_WITHIN_S = 45.0


def _heal_wall(data: RunData) -> float | None:
    for inv, _done in pairs(data.ops):
        if inv.f == "phase:heal":
            return inv.wall
    return None


def _ts(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None


@dataclass
class _Found:
    """What the properties found: problems fail the check; the rest is counted and reported."""

    problems: list[str] = field(default_factory=list)
    tasks: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    timed_out: int = 0
    examples: dict[str, str] = field(default_factory=dict)
    blamed: set[tuple[str, str]] = field(default_factory=set)
    waits: dict[str, float] = field(default_factory=dict)
    stuck: list[str] = field(default_factory=list)
    liveness: int = 0  # how many of the problems are of liveness alone (slow or stuck after the heal)


def check(data: RunData) -> CheckResult:
    """The properties of the module's docstring, run by run."""
    if not data.event_histories:
        return CheckResult("workflow_tasks", UNKNOWN, "no Temporal event histories were saved")
    found = _Found()
    heal = _heal_wall(data)
    limit = float((data.run.get("scenario") or {}).get("recovery_within_s") or RECOVERY_WITHIN_S)
    for wid, chain in data.event_histories.items():
        for run in chain:
            found.tasks += len(run.workflow_tasks)
            _code_never_fails_a_task(wid, run, found)
            _not_stuck_failing(wid, run, found)
            if heal is not None:
                _waits_after_heal(wid, run, heal, found)
    if heal is not None:
        _live_after_heal(found, limit)
    return _result(found, heal, limit)


def _code_never_fails_a_task(wid: str, run: Any, found: _Found) -> None:
    """A workflow task failed by the workflow's own code (``CODE_FAILURES``: it raised, or it was not
    deterministic) is a failure even if a later task completed, once per conversation and cause. Other failed and
    timed-out tasks are counted by cause (expected under faults). Sees only what the history keeps of a failure."""
    for t in run.workflow_tasks:
        if t.outcome == "failed":
            found.failed[t.cause or "?"] += 1
            found.examples.setdefault(t.cause or "?", f"{wid}: {t.failure[:200]}")
            if t.cause in CODE_FAILURES and (wid, t.cause) not in found.blamed:
                found.blamed.add((wid, t.cause))
                found.problems.append(f"{wid}: workflow code failed a workflow task ({t.cause}: {t.failure[:200]})")
        elif t.outcome == "timed_out":
            found.timed_out += 1


def _not_stuck_failing(wid: str, run: Any, found: _Found) -> None:
    """A run still open whose last workflow task failed is stuck, named with its error: no other check can say
    why its messages look merely unanswered."""
    last = run.workflow_tasks[-1] if run.workflow_tasks else None
    if run.status == "running" and last is not None and last.outcome == "failed":
        found.problems.append(f"{wid}: its workflow task keeps failing and never recovered "
                              f"({last.cause}: {last.failure[:200]})")


def _waits_after_heal(wid: str, run: Any, heal: float, found: _Found) -> None:
    """For liveness (``_live_after_heal``): each conversation's longest wait, from the heal (or the task's
    scheduling, if later) to a workflow task's completion, and the open runs whose last task never completed."""
    last = run.workflow_tasks[-1] if run.workflow_tasks else None
    for t in run.workflow_tasks:
        scheduled, closed = _ts(t.scheduled_at), _ts(t.closed_at)
        if scheduled is None or (closed is not None and closed < heal):
            continue
        if t.outcome in ("completed",):
            wait = closed - max(heal, scheduled)
            found.waits[wid] = max(found.waits.get(wid, 0.0), wait)
        elif t is last and run.status == "running":
            found.stuck.append(wid)


def _live_after_heal(found: _Found, limit: float) -> None:
    """Liveness after the heal: every workflow task pending at the heal, or scheduled after, completed, within
    ``limit`` seconds. Needs the run's heal phase; a task the history shows no end of is named."""
    found.liveness += len(found.stuck) + sum(1 for s in found.waits.values() if s > limit)
    for wid in found.stuck:
        found.problems.append(f"{wid}: a workflow task pending after the heal never completed (no worker took it "
                              "up again)")
    slow = {w: s for w, s in found.waits.items() if s > limit}
    for wid, s in sorted(slow.items()):
        found.problems.append(f"{wid}: its workflow task completed {s:.1f}s after the heal (limit {limit:.0f}s)")


def _result(found: _Found, heal: float | None, limit: float) -> CheckResult:
    """The properties' findings as one result: any problem fails it; no workflow task at all is unknown."""
    problems, tasks, failed, timed_out, waits = found.problems, found.tasks, found.failed, found.timed_out, found.waits
    worst = max(waits.values(), default=None)
    details = {"workflow_tasks": tasks, "failed_by_cause": dict(failed), "failed_examples": found.examples,
               "timed_out": timed_out, "heal_wall": heal, "recovery_within_s": limit,
               "worst_wait_after_heal_s": round(worst, 3) if worst is not None else None,
               "wait_after_heal_by_conversation": {w: round(s, 3) for w, s in sorted(waits.items())},
               "problems": problems[:50], "liveness_only": bool(problems) and found.liveness == len(problems)}
    if problems:
        return CheckResult("workflow_tasks", FAIL, f"{len(problems)} problem(s); first: {problems[0]}", details)
    if not tasks:
        return CheckResult("workflow_tasks", UNKNOWN, "the histories hold no workflow task: nothing ran", details)
    recovered = []
    if failed:
        recovered.append(f"{sum(failed.values())} failed ({', '.join(f'{c} x{n}' for c, n in failed.items())})")
    if timed_out:
        recovered.append(f"{timed_out} timed out")
    recovered_text = f"; {' and '.join(recovered)}, each followed by a completed one" if recovered else ""
    live = (f"; after the heal every conversation's workflow tasks completed within {worst:.1f}s "
            f"(limit {limit:.0f}s)") if worst is not None else ("; no workflow task was pending after the heal"
                                                                if heal is not None else "")
    return CheckResult("workflow_tasks", PASS, f"{tasks} workflow tasks, none stuck failing{recovered_text}{live}",
                       details)
