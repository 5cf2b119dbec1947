"""injection_evidence: a fault only counts if it landed while work was in flight.

Each nemesis operation records what it hit (activities running on the
victim, conversations in its cache, bytes a proxy dropped, model requests
refused); a crash point is evidence by construction (the worker killed itself
mid-activity): the effect ledger's ``crash_points`` table names each one that
fired (runs before that table: the supervisor's restart reason). For a kill of a busy
worker the evidence is confirmed after the fact, never taken from the
nemesis's snapshot alone (work it saw may have finished a millisecond before
the SIGKILL): where the effect ledger exists, an execution by the victim that
never finished; without one, the saved event histories: an activity the victim
had started that was still open at the kill instant, one in flight then whose
next attempt followed a timeout, or a workflow task the victim had started
that timed out. What the nemesis saw is kept beside it (``nemesis_saw``).
A kill right after an effect by the external effects service (``kill_worker`` aimed
``after_effect``: the service applied the effect, then the harness killed the
calling worker before the response) is confirmed by the service's own log: the
effect, the fault line naming the killed worker, and that request left unanswered;
it counts as the scenario's ``after_effect`` crash point firing.
A kill aimed at a workflow task or at a continue-as-new (``testbed.faults.nemesis``,
``kill_worker(at=...)``) is checked against the saved event histories where
there are some: the workflow task the frozen victim held never completed (it
timed out or failed), or the run it held continued as new after the kill, or
the freshly continued run it held was already running when it died. A kill
of a busy worker with no ledger also counts as landed when the server's
pending-activity snapshot, taken while the victim was frozen
(``frozen_snapshot``), shows an attempt running on the victim and the history
shows that activity scheduled and not closed at the kill, even when no retry
followed (Temporal writes an attempt's started event only when it closes).
What it cannot see: work a worker runs outside activities and workflow tasks.

A mutation (``harness.faults.MUTATIONS``) proves something only if its broken
code path ran: each one the scenario declared must appear in the effect
ledger's ``mutations`` table, else the verdict is ``unknown`` ("the bug was not
exercised"), never ``pass``; so must each crash point it declared in the
ledger's ``crash_points``.

A run with faults scheduled and none of them landing on work is ``unknown``,
never ``pass``: it proved nothing.

A fault the schedule asked for that did not happen is *not injected*, and shown so (``not_injected``, and in the
faults column ``landed/attempted (n not injected: why)``), never counted as injected: a nemesis operation that
completed ``fail`` (``not_injected`` says why, e.g. a kill before a continue-as-new whose threshold nobody
declared), or a nemesis that raised before recording its operation (a ``nemesis_error`` event). A run with a
fault not injected is ``unknown``: it cannot pass on the strength of a fault that never happened.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from temporalio.api.enums.v1 import EventType

from chaos.checker.run_data import RunData, running_at
from harness.event_history import WORKFLOW_CLOSE, load_saved
from harness.faults import MUTATION_ALIASES
from harness.operations import FAIL as OP_FAIL, INVOKE, OK, Op, pairs
from harness.verdict import PASS, UNKNOWN, CheckResult

FAULT_OPS = {"kill_worker", "pause_worker", "drain_worker", "partition", "degrade_link", "restart_server",
             "model_outage", "effects_outage", "deploy_fix"}
#: kill aims the ledger cannot witness (no activity execution need be running): checked on the event histories
HISTORY_AIMS = ("workflow_task", "continue_as_new")


def _unfinished_executions(data: RunData) -> dict[str, list[dict]]:
    """Ledger executions that never finished, by worker identity: that worker died (or froze) mid-activity."""
    out: dict[str, list[dict]] = {}
    for e in data.ledger_rows("executions"):
        if e["finished_at"] is None:
            out.setdefault(e["worker"], []).append({"workflow_id": e["workflow_id"], "activity": e["tool"],
                                                    "attempt": e["attempt"]})
    return out


def _ts(dt: datetime) -> float:
    return dt.replace(tzinfo=timezone.utc).timestamp() if dt.tzinfo is None else dt.timestamp()


def _runs(data: RunData) -> dict[str, list[dict[str, Any]]]:
    """Each saved conversation's chain of runs, reduced to what the aimed kills need: per run its id, start and
    close (unix time), how it ended, and its workflow tasks (scheduled time, task queue, worker, outcome)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for wid, chain in load_saved(data.dir.event_histories).items():
        runs = []
        for run_id, history in chain:
            run: dict[str, Any] = {"run_id": run_id, "started": None, "closed": None, "ended": None, "tasks": []}
            tasks: dict[int, dict[str, Any]] = {}
            for ev in history.events:
                t, at = ev.event_type, _ts(ev.event_time.ToDatetime())
                if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                    run["started"] = at
                elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                    tasks[ev.event_id] = {"scheduled": at, "outcome": "scheduled", "identity": "", "closed": None,
                                          "queue": ev.workflow_task_scheduled_event_attributes.task_queue.name}
                    run["tasks"].append(tasks[ev.event_id])
                elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                    a = ev.workflow_task_started_event_attributes
                    if a.scheduled_event_id in tasks:
                        tasks[a.scheduled_event_id].update(identity=a.identity, outcome="started")
                elif t in (EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED,
                           EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT):
                    a = (ev.workflow_task_completed_event_attributes
                         if t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
                         else ev.workflow_task_failed_event_attributes
                         if t == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
                         else ev.workflow_task_timed_out_event_attributes)
                    task = tasks.get(a.scheduled_event_id)
                    if task is not None:
                        task["outcome"] = {EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: "completed",
                                           EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED: "failed"}.get(t, "timed_out")
                        task["closed"] = at
                        if t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED and a.identity:
                            task["identity"] = a.identity
                elif t in WORKFLOW_CLOSE:
                    run["ended"], run["closed"] = WORKFLOW_CLOSE[t], at
            runs.append(run)
        out[wid] = runs
    return out


def _parse_time(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return _ts(datetime.fromisoformat(value))
    except ValueError:
        return None


def _history_evidence(at: str, value: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """What the saved event histories say of a kill aimed ``at`` a workflow task or a continue-as-new: for each
    conversation the nemesis named, the server's record that agrees with it (empty: nothing agrees)."""
    out = []
    identity, killed_at = value.get("identity") or "", value.get("killed_at") or 0.0
    for e in value.get("evidence") or []:
        if not isinstance(e, dict) or e.get("workflow_id") not in runs:
            continue
        chain = runs[e["workflow_id"]]
        if at == "workflow_task":
            scheduled = _parse_time((e.get("workflow_task") or {}).get("scheduled"))
            for run in chain:
                for task in run["tasks"]:
                    same_task = scheduled is not None and abs(task["scheduled"] - scheduled) < 0.002
                    victims = (task["identity"] == identity or task["queue"].startswith(f"{identity}-")) and \
                        task["scheduled"] <= killed_at <= (task["closed"] or float("inf"))
                    if (same_task or victims) and task["outcome"] in ("timed_out", "failed", "started"):
                        out.append({"workflow_id": e["workflow_id"], "run_id": run["run_id"],
                                    "workflow_task_never_completed": task["outcome"], "task_queue": task["queue"]})
        elif e.get("continued_as_new") == "before":
            run = next((r for r in chain if r["run_id"] == e.get("run_id")), None)
            if run is not None and run["ended"] == "continued_as_new" and (run["closed"] or 0) >= killed_at:
                out.append({"workflow_id": e["workflow_id"], "run_id": run["run_id"],
                            "continued_as_new_after_the_kill_s": round(run["closed"] - killed_at, 3)})
        elif e.get("continued_as_new") == "after":
            ids = [r["run_id"] for r in chain]
            new, old = e.get("run_id"), e.get("continued_from_run_id")
            if new in ids and ids.index(new) > 0 and ids[ids.index(new) - 1] == old:
                run = chain[ids.index(new)]
                if (run["started"] or float("inf")) <= killed_at <= (run["closed"] or float("inf")):
                    out.append({"workflow_id": e["workflow_id"], "run_id": new, "continued_from_run_id": old,
                                "killed_into_the_new_run_s": round(killed_at - run["started"], 3),
                                "victim_ran_its_workflow_tasks": any(t["identity"] == identity for t in run["tasks"])})
    return out


def _frozen_attempts(data: RunData, value: dict[str, Any]) -> list[dict[str, Any]]:
    """Attempts the server's snapshot taken while the victim was frozen (``frozen_snapshot``) shows running on it
    (state STARTED, its identity the last worker, started before the kill) whose activity the saved history shows
    scheduled before the kill and not closed by then. Temporal writes an attempt's started event only when the
    attempt closes, so an attempt killed mid-call that no retry followed before the run ended (a long
    start-to-close, no heartbeat) leaves no started event: the snapshot is the server's word that it ran there."""
    victim, killed_at = value.get("identity") or "", value.get("killed_at")
    snapshot = value.get("frozen_snapshot")
    rows = snapshot.get("pending_activities") if isinstance(snapshot, dict) else None
    if not victim or not killed_at or not isinstance(rows, list):
        return []
    out = []
    for p in rows:
        if not isinstance(p, dict) or p.get("state") != "STARTED" or p.get("worker") != victim:
            continue
        started = p.get("last_started")
        if isinstance(started, (int, float)) and started > killed_at:
            continue
        for run in data.event_histories.get(str(p.get("workflow_id")), []):
            if p.get("run_id") and run.run_id != p["run_id"]:
                continue
            for a in run.activities:
                scheduled = a.scheduled_at.timestamp() if a.scheduled_at else None
                closed = a.closed_at.timestamp() if a.closed_at else None
                if a.activity_id == str(p.get("activity_id")) and scheduled is not None and scheduled <= killed_at \
                        and (closed is None or closed > killed_at):
                    out.append({"workflow_id": p["workflow_id"], "activity": a.activity_type,
                                "attempt": p.get("attempt"),
                                "history": "running on the frozen victim by the server's snapshot (attempt "
                                           f"{p.get('attempt')}, last worker {victim}); scheduled and not closed at "
                                           "the kill"})
    return out


def _kill_in_history(data: RunData, value: dict[str, Any]) -> list[dict[str, Any]]:
    """What the saved event histories say was in flight when ``value``'s worker was killed: an activity the
    victim had started and that had not closed by the kill instant, one that was in flight then and whose
    next attempt followed a timeout, a workflow task the victim had started that then timed out, or an attempt
    the server's snapshot on the frozen victim shows running there (``_frozen_attempts``)."""
    victim, killed_at = value.get("identity") or "", value.get("killed_at")
    if not killed_at:
        return []
    out: list[dict[str, Any]] = []
    for wid, chain in data.event_histories.items():
        for run in chain:
            for a in run.activities:
                scheduled = a.scheduled_at.timestamp() if a.scheduled_at else None
                closed = a.closed_at.timestamp() if a.closed_at else None
                if scheduled is None or scheduled > killed_at or (closed is not None and closed <= killed_at):
                    continue
                started = a.started_at.timestamp() if a.started_at else None
                if a.worker == victim and started is not None and started <= killed_at:
                    out.append({"workflow_id": wid, "activity": a.activity_type, "attempt": a.attempts,
                                "history": "started by the victim, not closed at the kill"})
                elif a.attempts >= 2 and "timeout" in (a.failure or "").lower():
                    out.append({"workflow_id": wid, "activity": a.activity_type, "attempt": a.attempts,
                                "history": f"in flight at the kill; retried after: {a.failure[:80]}"})
            for t in run.workflow_tasks:
                started = t.started_at.timestamp() if t.started_at else None
                if t.identity == victim and t.outcome == "timed_out" and started is not None and started <= killed_at:
                    out.append({"workflow_id": wid, "workflow_task": t.scheduled_event_id,
                                "history": "a workflow task the victim had started timed out"})
    seen = {(e["workflow_id"], e.get("activity"), e.get("attempt")) for e in out}
    return out + [e for e in _frozen_attempts(data, value)
                  if (e["workflow_id"], e["activity"], e["attempt"]) not in seen]


def _service_kill(data: RunData, value: dict[str, Any]) -> list[dict[str, Any]]:
    """What the effects service's log says of a kill after an effect: the effect applied, the caller it had
    killed (this kill's pid and time), and its request never answered (empty: the log does not confirm it)."""
    log = data.effects_log
    if log is None:
        return []
    # The request that applied the effect must be unanswered; a later retry with the same key is answered from the
    # stored response (replayed) with the same note id, which is the recovery, not the killed request answered.
    answered = {r.get("note_id") for r in log.of("request") if r.get("status") is not None and not r.get("replayed")}
    effects = {e.get("note_id"): e for e in log.of("effect")}
    out = []
    for f in log.of("fault"):
        killed = f.get("killed") if isinstance(f.get("killed"), dict) else {}
        if f.get("outcome") == "killed" and killed.get("pid") == value.get("pid") and \
                killed.get("killed_at") == value.get("killed_at") and f.get("note_id") in effects and \
                f.get("note_id") not in answered:
            e = effects[f["note_id"]]
            out.append({"effect_applied": e.get("identity"), "note_id": e.get("note_id"), "key": e.get("key"),
                        "caller_killed": killed.get("worker"), "response": "never sent"})
    return out


def _mutations(data: RunData) -> tuple[list[str], dict[str, Any], list[str]]:
    """(declared mutations, per declared mutation what the ledger says of it, the ones never exercised)."""
    scenario = data.run.get("scenario") or {}
    # MUTATION_ALIASES: an older run directory may name a mutation by its old name (in its scenario or its ledger)
    declared = sorted({MUTATION_ALIASES.get(m, m) for m in (scenario.get("cluster") or {}).get("mutations") or ()})
    if not declared:
        return [], {}, []
    rows = data.ledger_rows("mutations")
    report: dict[str, Any] = {}
    for m in declared:
        ran = [r for r in rows if MUTATION_ALIASES.get(r["mutation"], r["mutation"]) == m]
        report[m] = {"exercised": len(ran), "workers": sorted({r["worker"] for r in ran}),
                     "first": {k: ran[0][k] for k in ("worker", "workflow_id", "tool", "at")} if ran else None}
    return declared, report, [m for m in declared if not report[m]["exercised"]]


def _short(why: str) -> str:
    """The first clause of a reason, cut at a word within 60 characters, for a table cell."""
    clause = re.split(r"[,;(]", why, maxsplit=1)[0].strip()
    return clause if len(clause) <= 60 else clause[:57].rsplit(" ", 1)[0] + "..."


def _not_injected(inv: Op, done: Op | None, ops: list[Op], claimed: set[int]) -> dict[str, Any] | None:
    """A scheduled fault that did not happen, from its own record, or None: a nemesis operation that completed
    ``fail`` (it certainly did not happen), or a ``nemesis_error`` of a nemesis that raised before recording its
    operation (``op_recorded`` false; in runs before that flag: no recorded operation of its kind, still open or
    not ok, accounts for the error)."""
    value = done.value if done is not None and isinstance(done.value, dict) else {}
    if inv.f in FAULT_OPS and done is not None and done.type == OP_FAIL:
        why = str(value.get("not_injected") or done.error or "its operation failed")
        return {"f": inv.f, "at": round(inv.time, 2), "why": why}
    if inv.f != "nemesis_error" or not isinstance(inv.value, dict):
        return None
    op, recorded = inv.value.get("op"), inv.value.get("op_recorded")
    if recorded is None:  # an older run: an operation of its kind the nemesis began and never ended ok
        done_of = {o.invoke_index: o for o in ops if o.type != INVOKE}
        mine = next((o for o in reversed(ops) if o.index < inv.index and o.process == "nemesis" and o.type == INVOKE
                     and o.f == op and o.index not in claimed
                     and (done_of.get(o.index) is None or done_of[o.index].type != OK)), None)
        if mine is not None:
            claimed.add(mine.index)
        recorded = mine is not None
    if recorded:
        return None
    error = str(inv.value.get("error") or "the nemesis raised")
    return {"f": str(op), "at": round(inv.time, 2), "why": f"the nemesis raised: {error.split(': ', 1)[-1]}"[:300],
            "error": error[:300]}


@dataclass
class _Injected:
    """What the run shows was injected: each fault with whether it landed on in-flight work and the evidence
    (``faults``), the scheduled faults that never happened and why (``not_injected``), the ledger's crash-point
    rows (``crashes``), and whether the run has an effect ledger at all."""

    faults: list[dict[str, Any]] = field(default_factory=list)
    not_injected: list[dict[str, Any]] = field(default_factory=list)
    crashes: list[dict[str, Any]] = field(default_factory=list)
    has_ledger: bool = False


def _injected(data: RunData) -> _Injected:
    """Every fault the run injected, read from the operation log and confirmed by the best record the run has."""
    seen = _Injected(crashes=data.ledger_rows("crash_points"),
                     has_ledger=data.ledger_path is not None and data.ledger_path.exists())
    claimed: set[int] = set()
    unfinished = _unfinished_executions(data)
    runs: dict[str, list[dict[str, Any]]] = {}  # the saved histories, read once if a fault needs them
    for c in seen.crashes:
        seen.faults.append({"f": "crash_point", "at": None, "landed": True,
                            "evidence": [{"point": c["point"], "worker": c["worker"],
                                          "workflow_id": c["workflow_id"], "activity": c["tool"]}]})
    for inv, done in pairs(data.ops):
        missed = _not_injected(inv, done, data.ops, claimed) if inv.process == "nemesis" else None
        if missed is not None:
            seen.not_injected.append({**missed, "short": _short(missed["why"])})
        elif inv.process == "nemesis" and inv.f in FAULT_OPS:
            seen.faults.append(_landing(data, inv, done, seen.has_ledger, unfinished, runs))
        elif (not seen.crashes and inv.process == "supervisor" and inv.f == "restart_worker"
              and inv.value.get("reason") == "crash point"):
            seen.faults.append({"f": "crash_point", "at": round(inv.time, 2), "landed": True,
                                "evidence": [{"worker": inv.value.get("worker"),
                                              "exit_code": inv.value.get("exit_code")}]})
    return seen


def _landing(data: RunData, inv: Op, done: Op | None, has_ledger: bool,
             unfinished: dict[str, list[dict[str, Any]]], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """One nemesis fault: whether it landed on in-flight work, by the most direct evidence the run has of it
    (the effects service's log, the server's event histories, the effect ledger; else what the nemesis saw)."""
    value = done.value if done and isinstance(done.value, dict) else {}
    evidence = value.get("evidence")
    fault: dict[str, Any] = {"f": inv.f, "at": round(inv.time, 2)}
    aim = (inv.value or {}).get("at") if isinstance(inv.value, dict) else None
    if inv.f == "kill_worker" and aim == "after_effect":
        fault["aim"] = aim
        fault["nemesis_saw"] = evidence
        evidence = _service_kill(data, value)
    elif inv.f == "kill_worker" and aim in HISTORY_AIMS:
        fault["aim"] = aim
        if not runs:
            runs.update(_runs(data))
        named = {e.get("workflow_id") for e in evidence or [] if isinstance(e, dict)}
        if named and named <= set(runs):
            # The nemesis saw it on a frozen worker; the server's own record must agree.
            fault["nemesis_saw"] = evidence
            evidence = _history_evidence(aim, value, runs)
    elif inv.f == "kill_worker" and has_ledger and inv.value.get("when") != "idle":
        # What the nemesis saw was milliseconds old; the ledger says what the victim really left unfinished.
        if isinstance(value.get("aim"), dict):
            fault["aim"] = value["aim"].get("activity")
        evidence = [{"unfinished_execution": e} for e in unfinished.get(value.get("identity"), [])]
    elif inv.f == "drain_worker" and has_ledger and value.get("signalled_at") is not None:
        # Landed if the ledger shows the victim running something when the SIGTERM came.
        at = float(value["signalled_at"])
        fault["nemesis_saw"] = evidence
        evidence = [{"in_flight_at_signal": {"workflow_id": e["workflow_id"], "activity": e["tool"],
                                             "attempt": e["attempt"]}}
                    for e in running_at(data.ledger_rows("executions"), at, value.get("identity"))]
    elif inv.f == "kill_worker" and inv.value.get("when") != "idle":
        # No ledger: what the nemesis saw is only a snapshot taken before the kill; the server's histories
        # must confirm that work was in flight on the victim at the kill instant.
        fault["nemesis_saw"] = evidence
        evidence = _kill_in_history(data, value)
        target = value["aim"].get("activity") if isinstance(value.get("aim"), dict) else None
        if target not in (None, "any", "model"):
            # A kill aimed at a tool (or at one activity type) lands only on one: a model call or a workflow task
            # in flight on the victim is not a tool call, and an agent whose tools run in workflow code has none.
            fault["aim"] = target
            evidence = [e for e in evidence if "activity" in e and (
                e["activity"] != data.model_activity if target == "tool" else e["activity"] == target)]
    return {**fault, "landed": bool(evidence), "evidence": evidence}


def _silent_crash_points(data: RunData, seen: _Injected) -> list[str]:
    """The crash points the scenario armed that never fired."""
    points = ((data.run.get("scenario") or {}).get("cluster") or {}).get("crash_at") or []
    fired = {c["point"] for c in seen.crashes} if seen.crashes else set(points) if any(
        f["f"] == "crash_point" for f in seen.faults) else set()  # before crash_points: the supervisor's word, unnamed
    if any(f.get("aim") == "after_effect" and f["landed"] for f in seen.faults):
        fired.add("after_effect")  # the effects service's crash-after-effect (a target with no harness code)
    return [p for p in points if p not in fired]


def check(data: RunData) -> CheckResult:
    """Did the faults happen, and hit work in flight? Unknown (never pass) when a planted mutation never ran, an
    armed crash point never fired, a scheduled fault was not injected, or every fault hit an idle worker."""
    seen = _injected(data)
    faults, not_injected = seen.faults, seen.not_injected
    landed = sum(f["landed"] for f in faults)
    declared, mutations, never = _mutations(data)
    details: dict[str, Any] = {"faults": faults, "injected": len(faults), "landed": landed,
                               "not_injected": not_injected}
    if declared:
        details["mutations"] = mutations
    if never:
        why = ("the run has no effect ledger to record it" if not seen.has_ledger else
               "the ledger records no exercise of it (its mutated path never ran, or the ledger predates the "
               "mutations table)")
        return CheckResult("injection_evidence", UNKNOWN,
                           "; ".join(f"mutation {m} never ran: the bug was not exercised" for m in never)
                           + f" ({why})", details)
    silent = _silent_crash_points(data, seen)
    if silent and faults:  # (no fault at all: "scheduled but none was injected", below)
        return CheckResult("injection_evidence", UNKNOWN,
                           "; ".join(f"crash point {p} never fired: the crash was not exercised" for p in silent),
                           details)
    counts = ", ".join(f"{m} x{mutations[m]['exercised']}" for m in declared)
    exercised = f"; mutation(s) exercised: {counts}" if declared else ""
    if not_injected:
        missed = "; ".join(f"{m['f']} at {m['at']}s: {m['why']}" for m in not_injected[:3])
        return CheckResult("injection_evidence", UNKNOWN,
                           f"{len(not_injected)} of {len(faults) + len(not_injected)} fault(s) not injected ({missed})"
                           f"; {landed} of the {len(faults)} injected landed on in-flight work: the run cannot pass on "
                           "faults that did not happen", details)
    if not faults:
        scenario = data.run.get("scenario") or {}
        scheduled = data.run.get("schedule") or (scenario.get("cluster") or {}).get("crash_at")
        if scheduled and data.target.get("effects") == "none" and not data.run.get("schedule"):
            reason = data.target.get("effects_reason")
            return CheckResult("injection_evidence", UNKNOWN,
                               "not applicable to this agent: its crashes come right after an external effect, and the "
                               "target declares none (effects = \"none\"" + (f": {reason}" if reason else "")
                               + "), so none was injected and the run proved nothing", details)
        if scheduled:
            return CheckResult("injection_evidence", UNKNOWN, "faults were scheduled but none was injected", details)
        return CheckResult("injection_evidence", PASS, f"no faults scheduled (a baseline run){exercised}", details)
    absent = _absent_aims(data, faults)
    if absent:
        details["absent_aims"] = absent
    cannot = "; ".join(f"a kill aimed at {a} cannot apply: {why}" for a, why in absent.items())
    if not landed:
        if cannot:
            return CheckResult("injection_evidence", UNKNOWN, f"not applicable to this agent: {cannot}; none of the "
                               f"{len(faults)} fault(s) hit what it aimed at, so the run proved nothing", details)
        return CheckResult("injection_evidence", UNKNOWN,
                           f"all {len(faults)} fault(s) landed on idle workers: the run proved nothing", details)
    return CheckResult("injection_evidence", PASS,
                       f"{landed} of {len(faults)} fault(s) landed on in-flight work{exercised}"
                       + (f" ({cannot})" if cannot else ""), details)


def _absent_aims(data: RunData, faults: list[dict[str, Any]]) -> dict[str, str]:
    """The aims of kills that hit nothing (a tool, an activity type's name) for which no such activity ran in the
    whole run, by the saved histories: the scenario does not apply to this agent (its tools run in workflow code,
    or it has no activity of that name)."""
    aims = {f["aim"] for f in faults if not f["landed"] and f.get("f") == "kill_worker"
            and isinstance(f.get("aim"), str) and f["aim"] not in ("any", "model", "after_effect", *HISTORY_AIMS)}
    if not aims or not data.event_histories:
        return {}
    ran = {a.activity_type for chain in data.event_histories.values() for run in chain for a in run.activities}
    out = {}
    for aim in sorted(aims):
        if aim == "tool" and not ran - {data.model_activity}:
            out[aim] = (f"no activity but the model's ({data.model_activity}) ran in this run: the agent's tools run "
                        "in workflow code (or it has none)")
        elif aim != "tool" and aim not in ran:
            out[aim] = f"no {aim} activity ran in this run"
    return out
