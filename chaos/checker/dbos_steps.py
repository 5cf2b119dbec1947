"""dbos_steps: on DBOS, no step ran again once DBOS had recorded it (the step-log twin of ``replay``).

DBOS records each completed step's output (its system database's ``operation_outputs``) and, on recovery, runs
the workflow function again from the start, returning the recorded output for every step it finds there instead
of running it. The DBOS chaos backend saves, at the end of a run, every run's status and recorded steps
(``dbos_steps.json``, read from the system database through DBOS's client); this check holds them against the
effect ledger's executions of the same steps (a step is its workflow id and DBOS function id, the ledger's
``activity_id``):

* no execution of a step began after DBOS had recorded its output: a completed step run again (a model call paid
  twice, a tool re-run) is what recovery must never do;
* every step DBOS recorded as completed was executed and finished before DBOS recorded it (a recorded output that
  no execution produced came from nowhere);
* in a workflow that succeeded, every executed step is one DBOS recorded: a step run and then forgotten means the
  recovered workflow took another path than the first run (non-determinism).

Retries, and an execution interrupted by a kill before DBOS recorded the step, are allowed (the step is then run
again, as on any engine). ``not_applicable`` on other engines' runs (no ``dbos_steps.json``); ``unknown`` without
an effect ledger.
"""

from __future__ import annotations

import os
from typing import Any

from chaos.checker.run_data import RunData
from harness.rundir import DBOS_STEPS, expect, read_json
from harness.verdict import FAIL, NOT_APPLICABLE, PASS, UNKNOWN, CheckResult

#: DBOS's step timestamps are milliseconds (and its clock is the ledger's: one machine)
SLACK_S = 0.002
SHOWN = 10


def _recorded_at(step: dict[str, Any]) -> float | None:
    at = step.get("completed_at_epoch_ms")
    return at / 1000.0 if at is not None else None


def check(data: RunData) -> CheckResult:
    path = data.run_dir / DBOS_STEPS
    if not os.path.lexists(path):
        return CheckResult("dbos_steps", NOT_APPLICABLE, f"not applicable: no {DBOS_STEPS} (not a run on DBOS)")
    saved = expect(read_json(path), "an object", path)
    executions = [e for e in data.ledger_rows("executions") if e["run_id"] == saved.get("engine_run_id", "dbos")]
    if not data.ledger_rows("executions"):
        return CheckResult("dbos_steps", UNKNOWN, "no effect ledger: nothing says which steps ran")
    by_step: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in executions:
        by_step.setdefault((e["workflow_id"], str(e["activity_id"])), []).append(e)
    rerun, unproduced, forgotten = [], [], []
    steps = 0
    for wf in saved.get("workflows", []):
        wid = wf["workflow_id"]
        recorded = {str(s["function_id"]): s for s in wf.get("steps", [])}
        steps += len(recorded)
        for fid, step in recorded.items():
            at = _recorded_at(step)
            ran = by_step.get((wid, fid), [])
            if at is None:
                continue
            after = [e for e in ran if e["started_at"] > at + SLACK_S]
            if after:
                rerun.append(f"{wid} step {fid} ({step['function_name']}) recorded at {at:.3f}, run again "
                             f"{len(after)}x (attempt {after[0]['attempt']} on {after[0]['worker']})")
            if not any(e["finished_at"] is not None and e["finished_at"] <= at + SLACK_S for e in ran):
                unproduced.append(f"{wid} step {fid} ({step['function_name']}): recorded, never executed to an end")
        if wf.get("status") == "SUCCESS":
            extra = sorted({fid for (w, fid) in by_step if w == wid} - set(recorded), key=int)
            if extra:
                forgotten.append(f"{wid}: step(s) {', '.join(extra)} executed, not in the completed workflow's log")
    details = {"workflows": len(saved.get("workflows", [])), "recorded_steps": steps, "executions": len(executions),
               "run_again_after_recorded": rerun[:SHOWN], "recorded_without_execution": unproduced[:SHOWN],
               "executed_not_recorded": forgotten[:SHOWN]}
    problems = len(rerun) + len(unproduced) + len(forgotten)
    if problems:
        first = (rerun or unproduced or forgotten)[0]
        return CheckResult("dbos_steps", FAIL, f"{problems} step(s) disagree with DBOS's step log; first: {first}",
                           details)
    return CheckResult("dbos_steps", PASS, f"{steps} recorded step(s) of {details['workflows']} run(s): each executed "
                                           f"before it was recorded, none run again after", details)
