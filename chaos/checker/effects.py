"""effects: every logical effect applied at most once, read from what recorded the effects.

Two witnesses; the target says which it has (``effects = "service"``: the service's; otherwise the ledger's):

* the external effects service's log (``effects_service.jsonl``, ``testbed.effects_service``), seen from outside
  the agent, in any language: a duplicate is the same effect *identity* (kind + content, the planned unique text)
  applied more than once, whatever the keys, so an agent that sends a fresh key on every attempt fails. Keyless
  requests are reported (each one was applied: nothing could de-duplicate a retry of it). An effect whose request
  got no response (the caller was killed right after it: crash-after-effect) is fine if it was applied once.
* the effect ledger (``harness.recording``): duplicated executions and duplicated effects, counted separately per
  logical effect (one activity's idempotency key). Model calls are executions, not effects: the ledger says which
  executions were model calls. Executions may repeat (activities are at-least-once): reported, not a failure. A
  logical effect applied more than once is a failure; one left pending (an attempt died mid-apply and nothing
  finished it) is unknown.

A target that declares its agent has no external effects (``effects = "none"``, ``effects_reason``) gets
``not_applicable`` with ``declared: <reason>``; one that declares neither a ledger nor the service is ``unknown``:
nothing could count them. The service's log is read only for a target that declares ``effects = "service"``
(the reference agent never calls it: a request there came from something else, and never changes a verdict).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from chaos.checker.run_data import EffectsLog, RunData
from harness.verdict import FAIL, NOT_APPLICABLE, PASS, UNKNOWN, CheckResult

#: the route the service applies notes on (testbed.effects_service)
NOTES_PATH = "/v1/notes"


def check(data: RunData) -> CheckResult:
    declared = data.target.get("effects")
    if declared == "none":
        reason = data.target.get("effects_reason") or "the target declares its agent has no external effects"
        return CheckResult("effects", NOT_APPLICABLE, f"declared: {reason}")
    if declared == "service":
        return _service(data.effects_log)
    result = _ledger(data)
    # Only a target that declares it calls the effects service: its log is read for no one else (a request there
    # came from something other than the agent under test).
    log = data.effects_log if result.verdict == UNKNOWN else None
    seen = len(log.of("effect")) if log is not None else 0
    if seen:
        return CheckResult("effects", UNKNOWN, f"{result.summary}; the run's effects service applied {seen} "
                                               "effect(s), but the target does not declare effects = \"service\", "
                                               "so its log is not read: declare it if the agent's tools call "
                                               "{effects_url}", {**result.details, "undeclared_service_effects": seen})
    return result


def _service(log: EffectsLog | None) -> CheckResult:
    if log is None:
        return CheckResult("effects", UNKNOWN, "the target declares its effects go to the effects service, but the "
                                               "run has no effects_service.jsonl")
    effects = log.of("effect")
    per_identity = Counter(e.get("identity") or f"{e.get('kind')}:{e.get('text')}" for e in effects)
    duplicated = {i: n for i, n in per_identity.items() if n > 1}
    keys: dict[str, list[Any]] = {}
    for e in effects:
        keys.setdefault(e.get("identity") or f"{e.get('kind')}:{e.get('text')}", []).append(e.get("key"))
    notes = [r for r in log.of("request") if r.get("method") == "POST" and r.get("path", "").split("?")[0]
             .rstrip("/") == NOTES_PATH]
    keyless = [r for r in notes if r.get("key") is None and r.get("status") == 200]
    unanswered = [r for r in notes if r.get("status") is None and r.get("note_id")]
    crashes = [f for f in log.of("fault") if f.get("outcome") == "killed"]
    details: dict[str, Any] = {
        "witness": "effects service",
        "effects_applied": len(effects),
        "logical_effects_applied": len(per_identity),
        "duplicated_effects": len(duplicated),
        "duplicated_examples": {i: {"applied": n, "keys": keys[i][:5]} for i, n in list(duplicated.items())[:10]},
        "requests": len(notes),
        "replayed": sum(1 for r in notes if r.get("replayed")),
        "keyless_requests": len(keyless),
        "unanswered_effects": len(unanswered),
        "callers_killed_after_effect": len(crashes),
        "torn_last_line": log.torn_last_line,
    }
    keyless_text = f"; {len(keyless)} request(s) sent no Idempotency-Key" if keyless else ""
    if duplicated:
        ident, n = next(iter(duplicated.items()))
        shown = ", ".join("none" if k is None else repr(k[:60]) for k in keys[ident][:3])
        return CheckResult("effects", FAIL, f"{len(duplicated)} effect(s) applied more than once by the effects "
                                            f"service (e.g. {ident[:80]!r} applied {n} times, keys {shown})"
                                            f"{keyless_text}", details)
    torn = " (the log's last line was cut by a kill and not read)" if log.torn_last_line else ""
    unanswered_text = (f"; {len(unanswered)} applied with no response (the caller was killed after the effect), "
                       "each applied once") if unanswered else ""
    return CheckResult("effects", PASS, f"{len(per_identity)} effect(s) applied once each by the effects service "
                                        f"({details['replayed']} retried request(s) replayed by key{keyless_text}"
                                        f"{unanswered_text}){torn}", details)


def _ledger(data: RunData) -> CheckResult:
    if data.ledger_path is None:
        return CheckResult("effects", UNKNOWN, "the target declares no effect ledger and its run's effects service "
                                               "saw no effect: effects cannot be counted")
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
