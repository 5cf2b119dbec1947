"""injection_evidence: a fault only counts if it landed while work was in flight.

Each nemesis operation records what it hit (activities running on the
victim, conversations in its cache, bytes a proxy dropped, model requests
refused); a crash point is evidence by construction (the worker killed itself
mid-activity): the effect ledger's ``crash_points`` table names each one that
fired (runs before that table: the supervisor's restart reason). For a kill of a busy
worker, where the effect ledger exists, the proof is stronger than what the
nemesis saw a moment before: an execution by the victim that never finished. A run with faults
scheduled and none of them landing on work is ``unknown``, never ``pass``:
it proved nothing.
"""

from __future__ import annotations

from chaos.checker.run_data import RunData
from harness.verdict import PASS, UNKNOWN, CheckResult
from harness.operations import pairs

FAULT_OPS = {"kill_worker", "pause_worker", "partition", "degrade_link", "restart_server", "model_outage", "deploy_fix"}


def _unfinished_executions(data: RunData) -> dict[str, list[dict]]:
    """Ledger executions that never finished, by worker identity: that worker died (or froze) mid-activity."""
    out: dict[str, list[dict]] = {}
    for e in data.ledger_rows("executions"):
        if e["finished_at"] is None:
            out.setdefault(e["worker"], []).append({"workflow_id": e["workflow_id"], "activity": e["tool"],
                                                    "attempt": e["attempt"]})
    return out


def check(data: RunData) -> CheckResult:
    faults = []
    unfinished = _unfinished_executions(data)
    has_ledger = data.ledger_path is not None and data.ledger_path.exists()
    crashes = data.ledger_rows("crash_points")
    for c in crashes:
        faults.append({"f": "crash_point", "at": None, "landed": True,
                       "evidence": [{"point": c["point"], "worker": c["worker"], "workflow_id": c["workflow_id"],
                                     "activity": c["tool"]}]})
    for inv, done in pairs(data.ops):
        if inv.process == "nemesis" and inv.f in FAULT_OPS:
            value = done.value if done and isinstance(done.value, dict) else {}
            evidence = value.get("evidence")
            if inv.f == "kill_worker" and has_ledger and inv.value.get("when") != "idle":
                # What the nemesis saw was milliseconds old; the ledger says what the victim really left unfinished.
                evidence = [{"unfinished_execution": e} for e in unfinished.get(value.get("identity"), [])]
            faults.append({"f": inv.f, "at": round(inv.time, 2), "landed": bool(evidence), "evidence": evidence})
        elif (not crashes and inv.process == "supervisor" and inv.f == "restart_worker"
              and inv.value.get("reason") == "crash point"):
            faults.append({"f": "crash_point", "at": round(inv.time, 2), "landed": True,
                           "evidence": [{"worker": inv.value.get("worker"), "exit_code": inv.value.get("exit_code")}]})
    landed = sum(f["landed"] for f in faults)
    details = {"faults": faults, "injected": len(faults), "landed": landed}
    if not faults:
        scenario = data.run.get("scenario") or {}
        scheduled = data.run.get("schedule") or (scenario.get("cluster") or {}).get("crash_at")
        if scheduled:
            return CheckResult("injection_evidence", UNKNOWN, "faults were scheduled but none was injected", details)
        return CheckResult("injection_evidence", PASS, "no faults scheduled (a baseline run)", details)
    if not landed:
        return CheckResult("injection_evidence", UNKNOWN,
                           f"all {len(faults)} fault(s) landed on idle workers: the run proved nothing", details)
    return CheckResult("injection_evidence", PASS, f"{landed} of {len(faults)} fault(s) landed on in-flight work", details)
