"""When each scheduled fault really happened: a measurement of a saved run, not a check.

``run.json``'s ``schedule`` says when the seed meant each fault to start (``at_s`` into the fault phase); the
operation log says when the nemesis began it (its operation's invoke), when it ended (the completion) and, for a
kill, when the process died (``killed_at``). Read together they show whether the faults came on time and whether
the ones the schedule overlaps overlapped:

    op, at_s (scheduled), started_s, ended_s, late_s (started - scheduled), landed_s (when it took effect)

all in seconds since the fault phase began. A fault whose start came more than ``TOLERANCE_S`` after its time is
``late``; a kill aimed at in-flight work, a pause, a drain and a server restart begin aiming on time and land when
their target shows (``aimed``: the lateness is the start of aiming, ``landed_s`` the blow); a partition, a slow link
and a model outage take effect at once (``landed_s``: when the proxy or the model server had it). A scheduled fault with no operation of its kind left is
``started_s`` null: it never began (``injection_evidence`` says why). Operations are matched to the schedule in
order, per kind.
"""

from __future__ import annotations

from typing import Any

from harness.operations import INVOKE, Op

#: how late a fault may start and still be on time (seconds)
TOLERANCE_S = 0.1
#: faults that wait for their target by design (besides kills aimed at in-flight work): their lateness is the
#: start of aiming, ``landed_s`` when they struck
AIMED = ("pause_worker", "drain_worker", "restart_server")
#: where a completion says when the fault took effect (wall clock), in the order looked for
LANDED = ("killed_at", "paused_at", "signalled_at", "applied_at")


def _faults_began(ops: list[Op]) -> float | None:
    return next((op.time for op in ops if op.f == "phase:faults" and op.type == INVOKE), None)


def fault_timeline(record: dict[str, Any], ops: list[Op]) -> dict[str, Any]:
    """The schedule against what happened (see the module's docstring); ``faults`` empty when nothing was
    scheduled, ``error`` when the log has no fault phase to count from."""
    schedule = [e for e in record.get("schedule") or [] if isinstance(e, dict) and "op" in e]
    if not schedule:
        return {"faults": [], "late": 0, "tolerance_s": TOLERANCE_S}
    t0 = _faults_began(ops)
    if t0 is None:
        return {"faults": [], "late": 0, "tolerance_s": TOLERANCE_S,
                "error": "the operation log has no fault phase to count from"}
    done = {op.invoke_index: op for op in ops if op.type != INVOKE and op.invoke_index is not None}
    unmatched = [op for op in ops if op.process == "nemesis" and op.type == INVOKE and op.time >= t0]
    rows = []
    for event in schedule:
        at_s = float(event.get("at_s") or 0.0)
        inv = next((op for op in unmatched if op.f == event["op"]), None)
        row: dict[str, Any] = {"op": event["op"], "at_s": round(at_s, 3), "started_s": None, "ended_s": None,
                               "late_s": None, "late": None}
        if inv is not None:
            unmatched.remove(inv)
            end = done.get(inv.index)
            started = inv.time - t0
            row.update(started_s=round(started, 3), late_s=round(started - at_s, 3),
                       late=started - at_s > TOLERANCE_S,
                       ended_s=round(end.time - t0, 3) if end is not None else None)
            args = event.get("args") if isinstance(event.get("args"), dict) else {}
            if event["op"] in AIMED or (event["op"] == "kill_worker"
                                        and (args.get("when", "busy") != "idle" or args.get("at"))):
                row["aimed"] = True
            value = end.value if end is not None and isinstance(end.value, dict) else {}
            landed = next((value[k] for k in LANDED if isinstance(value.get(k), (int, float))), None)
            if landed is not None:
                row["landed_s"] = round(landed - (inv.wall - inv.time) - t0, 3)
        rows.append(row)
    return {"faults": rows, "late": sum(1 for r in rows if r["late"]), "tolerance_s": TOLERANCE_S}


def lines(timeline: dict[str, Any]) -> list[str]:
    """The timeline as a table for people (``python -m chaos check``)."""
    if not timeline.get("faults"):
        return []
    out = [f"{'fault':<16} {'scheduled':>9} {'started':>8} {'ended':>8} {'late':>7}  (s into the fault phase)"]
    for r in timeline["faults"]:
        def cell(v: Any) -> str:
            return "-" if v is None else f"{v:.2f}"

        note = " never began" if r["started_s"] is None else (
            f" aimed; struck at {r['landed_s']:.2f}" if r.get("aimed") and r.get("landed_s") is not None else "")
        out.append(f"{str(r['op'])[:16]:<16} {cell(r['at_s']):>9} {cell(r['started_s']):>8} {cell(r['ended_s']):>8} "
                   f"{cell(r['late_s']):>7}{' LATE' if r['late'] else ''}{note}")
    return out
