"""restate_journal: on Restate, no ``ctx.run`` action ran again once Restate's journal had completed it.

Restate journals each action's result (a ``Run`` command, then its completion) and, when an invocation is retried
(its endpoint killed, the link reset), replays the journal: a completed action returns its journaled result
instead of running. The Restate chaos backend saves, at the end of a run, when the journal completed each action
(``restate_journal.json``, read through the server's SQL API from ``sys_journal``: the k-th ``Run`` command of an
invocation is the action the effect ledger records as ``activity_id`` k); this check holds those completions
against the ledger's executions of the same actions:

* an execution that started after the journal completed its action, and after another execution of that action
  had already finished, is a completed action run again: what replay must never do.

The journal's timestamps are milliseconds and not exact (a completion was seen stamped 4 ms before the start of the
only execution that produced it), so an execution within ``CLOCK_S`` of the completion is not counted. An
execution interrupted before the journal completed its action, and retries, are allowed. ``not_applicable`` on
other engines' runs (no ``restate_journal.json``); ``unknown`` without an effect ledger.
"""

from __future__ import annotations

import os
from typing import Any

from chaos.checker.run_data import RunData
from harness.rundir import RESTATE_JOURNAL, expect, read_json
from harness.verdict import FAIL, NOT_APPLICABLE, PASS, UNKNOWN, CheckResult

CLOCK_S = 0.05
SHOWN = 10


def re_executed(completions: list[dict[str, Any]], executions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The executions that repeat an action the journal had completed (see the module docstring)."""
    completed = {(c["run_id"], str(c["activity_id"])): c["completed_at"] for c in completions}
    late = []
    for e in executions:
        at = completed.get((e["workflow_id"], str(e["activity_id"])))
        if at is None or e["started_at"] < at + CLOCK_S:
            continue
        if any(o["idempotency_key"] == e["idempotency_key"] and o["id"] != e["id"] and o["finished_at"] is not None
               and o["finished_at"] <= e["started_at"] for o in executions):
            late.append({**{k: e[k] for k in ("workflow_id", "activity_id", "attempt", "tool", "worker", "started_at")},
                         "journal_completed_at": at})
    return late


def check(data: RunData) -> CheckResult:
    path = data.run_dir / RESTATE_JOURNAL
    if not os.path.lexists(path):
        return CheckResult("restate_journal", NOT_APPLICABLE, f"not applicable: no {RESTATE_JOURNAL} (not a run on "
                                                              "Restate)")
    saved = expect(read_json(path), "an object", path)
    if saved.get("error"):
        return CheckResult("restate_journal", UNKNOWN, f"the journal could not be read at the end of the run: "
                                                       f"{saved['error']}")
    executions = [e for e in data.ledger_rows("executions") if e["run_id"] == saved.get("engine_run_id", "restate")]
    if not data.ledger_rows("executions"):
        return CheckResult("restate_journal", UNKNOWN, "no effect ledger: nothing says which actions ran")
    late = re_executed(saved.get("completions") or [], executions)
    details = {"actions_journaled": saved.get("actions_journaled"), "actions_completed": len(saved.get("completions")
                                                                                          or []),
               "executions": len(executions), "re_executed_after_completion": late[:SHOWN]}
    if late:
        first = late[0]
        return CheckResult("restate_journal", FAIL, f"{len(late)} action(s) ran again after the journal completed "
                                                    f"them; first: {first['workflow_id']} action {first['activity_id']}"
                                                    f" ({first['tool']}, attempt {first['attempt']} on "
                                                    f"{first['worker']})", details)
    return CheckResult("restate_journal", PASS, f"{details['actions_completed']} journaled action(s): none ran "
                                                "again after the journal completed it", details)
