"""drain: a worker stopped gracefully (SIGTERM, ``drain_worker``) hands back nothing and re-executes nothing.

For each drained worker, from the run's own records: it exited by itself (exit 0) within the nemesis's
window; every activity attempt the effect ledger shows it running when the signal came finished on it, and
no later attempt of that activity ran anywhere (a drain that cancels work makes the server retry it
elsewhere: a re-execution, and a model call paid twice); no workflow task it had started timed out after the
signal (a task it abandoned). Work it started after the signal (an eager activity its last workflow task
asked for) is allowed if it finished there too, and is counted. A workflow task the server handed it only
after the signal (a poll still open while the SDK shut down) that then timed out was never the worker's to
drain: the SDK dropped it; it is counted and shown (``dropped_after_signal``), not failed.

``not_applicable`` when no worker was drained; ``unknown`` without an effect ledger (nothing says what was
in flight).
"""

from __future__ import annotations

from typing import Any

from chaos.checker.run_data import RunData, run_again, running_at
from harness.operations import pairs
from harness.verdict import FAIL, NOT_APPLICABLE, PASS, UNKNOWN, CheckResult


def check(data: RunData) -> CheckResult:
    drains = [(inv, done) for inv, done in pairs(data.ops) if inv.process == "nemesis" and inv.f == "drain_worker"]
    if not drains:
        return CheckResult("drain", NOT_APPLICABLE, "not applicable: no worker was drained in this run")
    executions = data.ledger_rows("executions")
    if not executions:
        return CheckResult("drain", UNKNOWN, "no effect ledger: nothing says what the drained workers were running",
                           {"drains": len(drains)})
    problems: list[str] = []
    unrecorded: list[str] = []  # drains the nemesis could not carry out or record: nothing seen, nothing claimed
    rows: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    heartbeat_timeouts = 0  # re-executions the server started because a heartbeat was late
    for inv, done in drains:
        v = done.value if done is not None and isinstance(done.value, dict) else None
        if not v or not v.get("identity") or v.get("signalled_at") is None:
            unrecorded.append(f"drain at t={inv.time:.1f}s: the nemesis did not record whom it signalled")
            continue
        identity, at = v["identity"], float(v["signalled_at"])
        if v.get("exited_at") is None:
            problems.append(f"{identity} did not exit within the drain window after SIGTERM (it was killed)")
        elif v.get("exit_code") != 0:
            problems.append(f"{identity} exited with {v.get('exit_code')} after SIGTERM, not 0")
        caught = running_at(executions, at, identity)
        after = [e for e in executions if e["worker"] == identity and e["started_at"] > at]
        for e in caught + after:
            what = f"{e['tool']} attempt {e['attempt']} of {e['workflow_id']}"
            if e["finished_at"] is None:
                problems.append(f"{identity} never finished {what} (in flight at SIGTERM)")
            retried = run_again(executions, e, e["started_at"])
            if retried:
                cause = _retry_cause(data, e)
                problems.append(f"{what}, in flight on {identity} at SIGTERM, ran again (attempt "
                                f"{retried[0]['attempt']} on {retried[0]['worker']}"
                                + (f", after the server's {cause!r}" if cause else "") + "): re-executed")
                if cause and "heartbeat" in cause.lower():
                    heartbeat_timeouts += 1
        timed_out = [(wid, t) for wid, chain in data.event_histories.items() for run in chain
                     for t in run.workflow_tasks if t.identity == identity and t.outcome == "timed_out"
                     and t.closed_at is not None and t.closed_at.timestamp() > at]
        # A task the server handed the worker only after the signal (a poll still open while the SDK shut down)
        # was never the worker's to drain: the SDK dropped it, and it waited out its timeout. Counted and shown.
        late = [{"workflow_id": wid, "started_after_signal_s": round(t.started_at.timestamp() - at, 3),
                 "timed_out_after_signal_s": round(t.closed_at.timestamp() - at, 3)}
                for wid, t in timed_out if t.started_at is not None and t.started_at.timestamp() > at]
        dropped += late
        problems += [f"a workflow task of {wid} started on {identity} timed out after SIGTERM (abandoned)"
                     for wid, t in timed_out if t.started_at is None or t.started_at.timestamp() <= at]
        rows.append({"identity": identity, "in_flight_at_signal": len(caught), "started_after_signal": len(after),
                     "drained_in_s": v.get("drained_in_s"), "exit_code": v.get("exit_code"),
                     "dropped_after_signal": len(late)})
    details = {"drains": rows, "problems": problems, "unrecorded": unrecorded, "dropped_after_signal": dropped}
    if problems:
        hint = (" (the server retried an attempt whose heartbeat came late: a drain that stops heartbeating "
                "does that, and so does a worker short of CPU, e.g. a container on a loaded machine; the worker's "
                "log in logs/ and the --timeouts profile's heartbeat timeout help tell which)"
                ) if heartbeat_timeouts else ""
        return CheckResult("drain", FAIL, "; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)"
                                                                      if len(problems) > 5 else "") + hint, details)
    if unrecorded:
        return CheckResult("drain", UNKNOWN, "; ".join(unrecorded[:3]) + " (see the nemesis_error operations): "
                           "what those workers ran was not checked", details)
    if not any(r["in_flight_at_signal"] for r in rows):
        return CheckResult("drain", UNKNOWN, "no drained worker was running anything when signalled: the drain "
                                             "proved nothing", details)
    n = sum(r["in_flight_at_signal"] for r in rows)
    offsets = ", ".join(f"+{d['started_after_signal_s']}s" for d in dropped)
    note = (f"; {len(dropped)} workflow task(s) the server handed a worker after its SIGTERM ({offsets}) were "
            "dropped by the SDK's shutdown and waited out their timeout (nothing lost or re-executed)"
            ) if dropped else ""
    return CheckResult("drain", PASS, f"{len(rows)} drain(s): the {n} attempt(s) in flight at SIGTERM finished on "
                                      "the drained worker, none re-executed; each worker exited 0" + note, details)


def _retry_cause(data: RunData, e: dict[str, Any]) -> str | None:
    """Why the server started the attempt after ``e``, as the event history says: the failure it recorded for the
    attempt before its last (``activity Heartbeat timeout``, ``activity StartToClose timeout``, an error message),
    when the activity's last attempt is the one right after ``e``; None when the history does not say."""
    for run in data.event_histories.get(e["workflow_id"], []):
        if run.run_id != e["run_id"]:
            continue
        for a in run.activities:
            if a.activity_id == str(e["activity_id"]) and a.attempts == int(e["attempt"]) + 1 and a.failure:
                return a.failure
    return None
