"""effects: from the effect ledger (``harness.recording``), duplicated executions and
duplicated effects, counted separately per logical effect (one activity's idempotency key).
Model calls are executions, not effects: the ledger says which executions were model calls.

Executions may repeat (activities are at-least-once): reported, not a
failure. A logical effect applied more than once is a failure. An effect
left pending (an attempt died mid-apply and nothing finished it) is unknown.
"""

from __future__ import annotations

from collections import Counter

from chaos.checker.run_data import RunData
from harness.verdict import FAIL, PASS, UNKNOWN, CheckResult


def check(data: RunData) -> CheckResult:
    if data.ledger_path is None:
        return CheckResult("effects", UNKNOWN, "the target declares no effect ledger: effects cannot be counted")
    if not data.ledger_path.exists():
        return CheckResult("effects", UNKNOWN, f"no effect ledger at {data.ledger_path}")
    executions = [e for e in data.ledger_rows("executions") if not data.is_model_call(e)]
    applications = data.ledger_rows("applications")
    effects = data.ledger_rows("effects")
    exec_per_key = Counter(e["idempotency_key"] for e in executions)
    applied_per_key = Counter(a["idempotency_key"] for a in applications)
    duplicated = {k: n for k, n in applied_per_key.items() if n > 1}
    pending = [e["idempotency_key"] for e in effects if e["state"] == "pending"]
    details = {
        "tool_executions": len(executions),
        "logical_effects_executed_more_than_once": sum(1 for n in exec_per_key.values() if n > 1),
        "logical_effects_applied": len(applied_per_key),
        "duplicated_effects": len(duplicated),
        "duplicated_examples": dict(list(duplicated.items())[:10]),
        "pending_effects": pending[:10],
    }
    if duplicated:
        key, n = next(iter(duplicated.items()))
        return CheckResult("effects", FAIL, f"{len(duplicated)} logical effect(s) applied more than once "
                                            f"(e.g. {key} applied {n} times)", details)
    if pending:
        return CheckResult("effects", UNKNOWN, f"{len(pending)} effect(s) left pending: applied or not, nobody knows",
                           details)
    return CheckResult("effects", PASS, f"{len(applied_per_key)} effects applied once each "
                                        f"({details['logical_effects_executed_more_than_once']} re-executed, "
                                        "deduplicated by idempotency key)", details)
