"""A run's verdict, decided here and nowhere else: which checks apply, how they compose, the table's row and
``verdict.json``.

    plan (which checks run) -> run_checkers -> compose -> table_row -> verdict.json

* **Which checks apply** (``plan``): every check in ``chaos.checker.CHECKERS`` unless
  - the run cannot have what it reads: ``not_applicable``, with its reason. The backend says so in ``run.json``
    (Temporal event histories on the checkpoint engine); a fault's own check on a run without that fault
    (``FAULT_CHECKERS``); an engine's own records on a run on another engine (``ENGINE_CHECKERS``);
  - the target opted out of it (its ``checkers`` list leaves it out): ``unknown`` ("not checked"), never left
    out, so a run cannot pass on a property nobody checked.
* **A check that cannot finish** (a crash, a malformed or refused file) is ``unknown``, never ``pass``.
* **Composition** (``compose``): the run's verdict is the worst of the checks that apply (fail > unknown >
  pass, ``harness.verdict.worst``); a run with no applicable check is ``unknown``. A saved verdict re-read later
  is never better than its checks (``saved_verdict``).
* **The row** (``table_row``): the scenario table's line for the run, every tool that shows one builds it here.
* **verdict.json** (``check``): written only here; its fields are RUN_DIRECTORY.md's.

Reads only the run directory, so a saved run re-checks to the same verdict anywhere (``python -m chaos check``).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.checker import ALL_CHECKERS, CHECKERS
from chaos.checker.late import LATE_WAIT
from chaos.checker.run_data import ReplayTarget, RunData, client_sends
from chaos.fault_timeline import fault_timeline
from chaos.diagnosis import diagnose
from chaos.lint import lint
from chaos.recovery import decompose, fault_paths, recovery, recovery_parts
from harness.engines import HOME, canonical, own_checks
from harness.model_record import TOKEN
from harness.operations import INFO, Op
from harness.run_files import RefusedPath
from harness.rundir import SCHEMA, VERDICT_JSON, RunDir, RunDirError
from harness.verdict import FAIL, NOT_APPLICABLE, PASS, UNKNOWN, CheckResult, worst

#: checks of one fault's promise: not applicable to a run without that fault, whatever a target declares
FAULT_CHECKERS = {"drain": "drain_worker"}
#: checks of one engine's own records: not applicable to a run on another backend (run.json's backend name)
ENGINE_CHECKERS = own_checks()
#: checks of tasks (messages carrying a token, judged by the model's record): not applicable to a run that sent none
TASK_CHECKERS = ("replies", "context")
NO_TASKS = "the run sent no task messages (its messages follow the scripted model's conventions, which lost judges)"
NO_LATE_WAIT = "the run recorded no late wait (made before it existed, or its engine cannot say what is pending)"
#: the scenario table's columns, in order: what ``table_row`` fills
ROW_FIELDS = ("scenario", "faults", "ok", "fail", "info", "lost", "late", "dup_effects", "recovery_s", "model_rec_s",
              "tool_rec_s", "wft_rec_s", "checked", "verdict")

#: what ``check`` needs to let ``replay`` run the agent's code: the target it may run, given what the run
#: declares (``chaos.replay_target.replay_target``); None: nothing, and replay is unknown
ReplayWith = Callable[[dict[str, Any]], ReplayTarget | str | None]


# ----------------------------------------------------------------------------------------- which checks apply


@dataclass
class Plan:
    """Which checks a run gets: ``run`` (in ``CHECKERS``' order), ``opted_out`` (the target left them out:
    unknown) and ``not_applicable`` (check -> why the run cannot have what it reads)."""

    run: list[str]
    opted_out: list[str]
    not_applicable: dict[str, str] = field(default_factory=dict)


def plan(record: dict[str, Any], ops: list[Op]) -> Plan:
    """The checks that apply to the run ``record`` (its ``run.json``) with these operations."""
    declared = list((record.get("target") or {}).get("checkers") or ALL_CHECKERS)
    if "lost" in declared and "late" not in declared:
        declared.append("late")  # the liveness half of what lost judged before they were split: declared with it
    not_applicable = dict((record.get("backend") or {}).get("not_applicable") or {})
    if not_applicable.keys() & {"temporal_history", "replay"}:
        not_applicable.setdefault("workflow_tasks", not_applicable.get("temporal_history") or
                                  not_applicable.get("replay"))
    faults_run = {op.f for op in ops if op.process == "nemesis"}
    for checker, fault in FAULT_CHECKERS.items():
        if fault not in faults_run:
            not_applicable.setdefault(checker, f"no {fault} in this run")
    if not any(op.f == "send_message" and isinstance(op.value, dict) and TOKEN.search(str(op.value.get("text")))
               for op in ops):
        for checker in TASK_CHECKERS:
            not_applicable.setdefault(checker, NO_TASKS)
    if not any(op.f == LATE_WAIT for op in ops):
        not_applicable.setdefault("late", NO_LATE_WAIT)
    backend_name = canonical((record.get("backend") or {}).get("name") or HOME)
    for checker, engines in ENGINE_CHECKERS.items():
        if backend_name not in engines:
            not_applicable.setdefault(checker, f"reads {' or '.join(engines)}'s own records; this run is on "
                                               f"{backend_name}")
    return Plan(run=[c for c in ALL_CHECKERS if c in declared and c not in not_applicable],
                opted_out=[c for c in ALL_CHECKERS if c not in declared and c not in not_applicable],
                not_applicable=not_applicable)


def worth_showing(c: CheckResult) -> bool:
    """Whether a check's result says something about the run worth a line of progress: not a pass, and not a
    fault's or an engine's own check that did not apply (a run without that fault, or on another engine)."""
    return c.verdict != PASS and not (c.verdict == NOT_APPLICABLE and (
        c.name in FAULT_CHECKERS or c.name in ENGINE_CHECKERS or c.name in TASK_CHECKERS or c.name == "late"))


# ---------------------------------------------------------------------------------------------- the checks


def run_checkers(run_dir: Path | RunData, only: list[str] | None = None,
                 replay_target: ReplayTarget | str | None = None,
                 timings: dict[str, float] | None = None) -> list[CheckResult]:
    """The checks ``only`` names (default: all) on the saved run (its directory, or its ``RunData`` already read:
    its histories are parsed once for every check and measurement); ``replay_target``: what ``replay`` may run
    (``chaos.replay_target.replay_target``; None: nothing, and replay is unknown). A check that cannot finish is
    ``unknown``, with why: a crashed checker knows nothing, so it never reads as a pass. ``timings``: filled with
    each check's wall seconds (what the scale benchmark reads; it changes no verdict)."""
    data = run_dir if isinstance(run_dir, RunData) else RunData(run_dir)
    data.replay_target = replay_target
    results = []
    for name, checker in CHECKERS.items():
        if only and name not in only:
            continue
        started = time.perf_counter()
        try:
            result = checker(data)
        except RefusedPath as exc:  # a file the run names that is not read (outside, a symlink, too large)
            result = CheckResult(name, UNKNOWN, str(exc))
        except RunDirError as exc:  # a malformed file: which one and where says all there is to say
            result = CheckResult(name, UNKNOWN, f"malformed run directory: {exc}")
        except Exception as exc:  # a crashed checker knows nothing: unknown, never pass
            result = CheckResult(name, UNKNOWN, f"checker crashed: {type(exc).__name__}: {exc}",
                                 {"traceback": traceback.format_exc()[-3000:]})
        results.append(result)
        if timings is not None:
            timings[name] = round(time.perf_counter() - started, 4)
    return results


def compose(results: Iterable[CheckResult]) -> str:
    """The run's verdict: the worst of the checks that apply; none that apply is unknown."""
    return worst(r.verdict for r in results)


#: checks of liveness (the agent answered, but too slowly): kept apart from safety (nothing lost, doubled or wrong)
LIVENESS_CHECKS = ("late",)


def property_verdicts(checks: list[CheckResult]) -> dict[str, str]:
    """The run's verdict on safety and on liveness apart, so a run can gate on either: ``late`` is liveness;
    a check that failed on liveness alone (``details["liveness_only"]``: a workflow task or a message still
    waiting long after the heal) fails liveness and passes safety; every other check is safety. Either is
    ``not_applicable`` when no check of it applies."""
    safety: list[str] = []
    liveness: list[str] = []
    for c in checks:
        if c.name in LIVENESS_CHECKS:
            liveness.append(c.verdict)
        elif c.verdict == FAIL and c.details.get("liveness_only"):
            liveness.append(FAIL)
            safety.append(PASS)
        else:
            safety.append(c.verdict)
    return {name: worst(vs) if any(v != NOT_APPLICABLE for v in vs) else NOT_APPLICABLE
            for name, vs in (("safety", safety), ("liveness", liveness))}


def saved_verdict(checks: list[CheckResult], recorded: Any) -> str:
    """The verdict of a saved ``verdict.json``: the worst of its checks and its recorded ``verdict``, so a
    hand-edited or stale record never reads better than its checks."""
    return worst([compose(checks), *([recorded] if isinstance(recorded, str) else [])])


# ------------------------------------------------------------------------------------------------- the row


def counts(ops: list[Op]) -> dict[str, int]:
    """ok / fail / info among the client's sends; one never completed counts as info (it may have happened)."""
    out = {"ok": 0, "fail": 0, "info": 0}
    for _, done in client_sends(ops):
        out[done.type if done else INFO] += 1
    return out


def table_row(name: str, ops: list[Op] | None, checks: list[CheckResult], decomposition: dict[str, Any] | None = None,
        *, verdict: str | None = None, faults_scheduled: int | None = None) -> dict[str, Any]:
    """One row of the scenario table (``ROW_FIELDS``): faults landed/attempted (with ``(n not injected: why)`` for
    scheduled faults that did not happen: never ``1/1`` for a fault that was not injected), client ops, lost,
    duplicated effects, recovery (``chaos.recovery``: the client's, and the server's ``decomposition``), how many
    checks could see their property, verdict (default: ``compose(checks)``).

    A figure a check did not produce is ``"?"``, never 0; a ``lost`` check that failed on something other than a
    lost message (a wrong answer, a doubled one) shows it (``0+2 bad``), so a failed check never reads as 0.
    ``ops`` None: a run that ended in an error, with nothing to count: every figure ``"?"``.
    ``faults_scheduled``: the faults the run attempted, where no ``injection_evidence`` check says (``?/N``)."""
    if ops is None:
        return {"scenario": name, **dict.fromkeys(ROW_FIELDS[1:-1], "?"), "verdict": verdict}
    by = {c.name: c for c in checks}
    faults = by["injection_evidence"].details if "injection_evidence" in by else {}
    lost: Any = "?"
    if "lost" in by and by["lost"].verdict in (PASS, FAIL):
        lost = by["lost"].details.get("lost", "?")
        bad = len(by["lost"].details.get("problems") or []) - (lost if isinstance(lost, int) else 0)
        if by["lost"].verdict == FAIL and bad > 0:
            lost = f"{lost}+{bad} bad"
    late: Any = len(by["late"].details.get("late") or []) if "late" in by and by["late"].verdict in (PASS, FAIL) \
        else ("-" if "late" in by and by["late"].verdict == NOT_APPLICABLE else "?")
    dup: Any = by["effects"].details.get("duplicated_effects", "?") if "effects" in by and \
        by["effects"].verdict in (PASS, FAIL) else "?"
    if "effects" in by and by["effects"].verdict == NOT_APPLICABLE and by["effects"].summary.startswith("declared:"):
        dup = "declared"  # the target declared its agent has no external effects (effects = "none")
    rec = recovery(ops)
    worst_s: Any = rec["worst_s"]
    if rec["never"]:
        worst_s = f"never ({len(rec['never'])})"
    missed = faults.get("not_injected") or []
    injected = faults.get("injected", faults_scheduled if faults_scheduled is not None else "?")
    attempted = injected + len(missed) if isinstance(injected, int) else injected
    server = decomposition or {}
    return {
        "scenario": name,
        "faults": f"{faults.get('landed', '?')}/{attempted}" + (
            f" ({len(missed)} not injected: {missed[0].get('short') or missed[0].get('why', '?')})" if missed else ""),
        **counts(ops),
        "lost": lost,
        "late": late,
        "dup_effects": dup,
        "recovery_s": worst_s,
        "model_rec_s": server.get("model_call_s"),
        "tool_rec_s": server.get("tool_s"),
        "wft_rec_s": server.get("workflow_task_s"),
        "checked": f"{sum(c.verdict in (PASS, FAIL) for c in checks)}/{len(checks)}",
        "verdict": compose(checks) if verdict is None else verdict,
    }


# ------------------------------------------------------------------------------------------- verdict.json


def check(path: Path, replay_with: ReplayWith = lambda declared: None) -> tuple[str, list[CheckResult],
                                                                                 dict[str, Any]]:
    """Run the checks that apply (``plan``) on the run's saved files and write ``verdict.json``; (verdict, checks,
    row). Everything is recomputed with today's checkers, so the same on a fresh run, on a run re-checked later and
    on a run directory copied to another machine. ``replay_with``: what ``replay`` may run, given the target the
    run declares (asked only when replay applies); nothing the run directory names is executed here."""
    started = time.perf_counter()
    run_dir = RunDir(path)
    record = run_dir.read_run()
    data = RunData(path)  # what the checks and the measurements read: each file read, and parsed, once
    ops = data.ops
    chosen = plan(record, ops)
    replay = replay_with(data.target) if "replay" in chosen.run else None
    timings: dict[str, float] = {}
    checks = run_checkers(data, chosen.run, replay, timings)
    measured: dict[str, float] = {}
    checks += [CheckResult(c, UNKNOWN, "not checked: the target's 'checkers' leaves it out, so this property is "
                                       "unverified") for c in chosen.opted_out]
    checks += [CheckResult(c, NOT_APPLICABLE, f"not applicable: {why}") for c, why in chosen.not_applicable.items()]
    verdict = compose(checks)
    mark = time.perf_counter()
    try:
        decomposed = decompose(data)
    except Exception as exc:  # a measurement, not a check: a run it cannot read still gets its verdict
        decomposed = {"error": f"{type(exc).__name__}: {exc}", "model_call_s": None, "tool_s": None,
                      "workflow_task_s": None}
    mark = _lap(measured, "recovery_decomposition", mark)
    try:
        parts = recovery_parts(data)
    except Exception as exc:  # a measurement too
        parts = {"error": f"{type(exc).__name__}: {exc}"}
    mark = _lap(measured, "recovery", mark)
    try:
        paths = fault_paths(data)
        diagnoses = diagnose(data, checks, paths)
    except Exception as exc:  # words about the run, not a check: a run they cannot read still gets its verdict
        paths, diagnoses = [], [{"about": "diagnosis", "line": f"diagnosis: could not be made: "
                                 f"{type(exc).__name__}: {exc}", "cause": str(exc), "fix": None, "setting": None,
                                 "measured_s": None, "evidence": []}]
    mark = _lap(measured, "diagnosis", mark)
    try:
        findings, unlinted = lint(data)
    except Exception as exc:  # advice, not a check
        findings, unlinted = [], f"the lint could not read the run: {type(exc).__name__}: {exc}"
    _lap(measured, "lint", mark)
    summary = table_row(record.get("name") or run_dir.path.parent.name, ops, checks, decomposed, verdict=verdict)
    run_dir.write_json(VERDICT_JSON, {
        "schema": SCHEMA, "verdict": verdict, **property_verdicts(checks), "checks": [c.as_dict() for c in checks],
        "checked": [c.name for c in checks if c.verdict in (PASS, FAIL)],
        "not_checked": {c.name: c.summary for c in checks if c.verdict in (UNKNOWN, NOT_APPLICABLE)},
        "checkers_not_run": chosen.opted_out + list(chosen.not_applicable),
        "recovery": recovery(ops),
        "recovery_decomposition": decomposed,
        "recovery_parts": parts,
        "recovery_paths": paths,
        "diagnoses": diagnoses,
        "lint": findings,
        **({"lint_unavailable": unlinted} if unlinted else {}),
        "fault_timeline": fault_timeline(record, ops),
        "summary": summary,
        "timings_s": {"checks": timings, "measurements": measured,
                      "total": round(time.perf_counter() - started, 4)}})
    return verdict, checks, summary


def _lap(into: dict[str, float], name: str, since: float) -> float:
    """Record the seconds since ``since`` as ``into[name]``; now, for the next lap."""
    now = time.perf_counter()
    into[name] = round(now - since, 4)
    return now
