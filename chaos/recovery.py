"""Recovery: how long the faults held the agent up. A measurement, not a check: it decides no verdict (the
``lost`` and ``workflow_tasks`` checkers judge liveness), and ``verdict.json`` carries it beside the verdict
(``recovery``, ``recovery_decomposition``) and in the table's row (``recovery_s``, ``model_rec_s``, ``tool_rec_s``,
``wft_rec_s``). Both read only the saved run, so ``python -m chaos check`` measures them again offline.

The client's view (``recovery``): each conversation's wait for its next *correct* answer after a fault (a refusal
or a wrong reply does not end it).

The server's side (``decompose``): for each fault
that takes work away from a worker (``kill_worker``, ``pause_worker``, ``drain_worker``) or from every worker
(``restart_server``), from the run's own records:

* **activity** (``model_call_s``, ``tool_s``): the attempts the effect ledger shows running on the faulted
  worker at the fault (any worker for a server restart), and for each the next attempt of the same activity:
  the time from the *reference* to that attempt's start. An attempt that finished by itself (the worker
  came back, or a drained worker finished it) needed no retry and is counted in ``finished_in_place``.
* **workflow task** (``workflow_task_s``): every workflow task the histories show timing out after the fault
  (a dead worker's sticky queue, or a task started on it): the time from the reference, or from when the task
  was scheduled if later, to the start of the next workflow task of that run.

For a server restart, also ``first_work_after_s``: how soon after the server was back any worker started
anything. The reference is when the agent *could* have gone on: the fault itself if another worker was alive then;
otherwise the moment a replacement (or the resumed worker) was polling again, or the server was back. Wall
clocks throughout: the ledger, the server's event times and the operation log share this machine's clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from chaos.checker.run_data import RunData, answered, client_sends, run_again, running_at
from harness.operations import FAIL, OK, Op, pairs

WORKER_FAULTS = ("kill_worker", "pause_worker", "drain_worker")
FAULTS = (*WORKER_FAULTS, "restart_server")


def _wall(at: datetime | None) -> float | None:
    return at.timestamp() if at is not None else None


def faults_from_ops(ops: list[Op], workers: int) -> list[dict[str, Any]]:
    """Each fault that landed: ``{op, worker, identity, at, reference, reference_is}`` (wall seconds)."""
    invokes = {o.index: o for o in ops if o.type == "invoke"}
    restarts: dict[str, list[float]] = {}  # worker name -> when a replacement was polling
    for o in ops:
        if o.process == "supervisor" and o.f == "restart_worker" and o.type == OK:
            name = (invokes[o.invoke_index].value or {}).get("worker") if o.invoke_index in invokes else None
            if name:
                restarts.setdefault(name, []).append(o.wall)
    downs: list[tuple[str, float, float]] = []  # (worker name, down from, back at)
    out = []
    for o in ops:
        if o.process != "nemesis" or o.type != OK or o.f not in FAULTS:
            continue
        v = o.value if isinstance(o.value, dict) else {}
        if o.f == "restart_server":
            at = invokes[o.invoke_index].wall if o.invoke_index in invokes else o.wall
            out.append({"op": o.f, "worker": None, "identity": None, "at": at, "reference": o.wall,
                        "reference_is": "server back"})
            continue
        name, identity = v.get("worker"), v.get("identity")
        if o.f == "kill_worker":
            at = float(v.get("killed_at") or o.wall)
            back = next((t for t in sorted(restarts.get(name, [])) if t >= at), None)
        elif o.f == "drain_worker":
            at = float(v.get("signalled_at") or o.wall)
            back = next((t for t in sorted(restarts.get(name, [])) if t >= at), None)
        else:  # pause (older runs did not record when: the op completes as the worker is resumed)
            at = float(v.get("paused_at") or o.wall - float(v.get("pause_s") or 0.0))
            back = float(v.get("resumed_at") or o.wall)
        downs.append((name, at, back if back is not None else float("inf")))
        out.append({"op": o.f, "worker": name, "identity": identity, "at": at, "back": back})
    for f in out:
        if f["op"] == "restart_server":
            continue
        others_down = {n for n, a, b in downs if n != f["worker"] and a <= f["at"] < b}
        if workers - 1 - len(others_down) > 0:
            f["reference"], f["reference_is"] = f["at"], "fault (another worker alive)"
        else:
            f["reference"] = f["back"] if f["back"] is not None else None
            f["reference_is"] = "worker polling again" if f["back"] is not None else "never polling again"
    return out


def activity_waits(fault: dict[str, Any], executions: list[dict[str, Any]], is_model) -> dict[str, Any]:
    """The attempts the fault caught in flight, and how long each activity waited for its next attempt."""
    at, ref = fault["at"], fault["reference"]
    caught = running_at(executions, at, fault["identity"])
    waits: dict[str, list[float]] = {"model_call": [], "tool": []}
    finished = 0
    for e in caught:
        retry = min((x["started_at"] for x in run_again(executions, e, at)), default=None)
        if retry is None:
            finished += e["finished_at"] is not None
            continue
        if ref is not None:
            waits["model_call" if is_model(e) else "tool"].append(max(0.0, retry - ref))
    return {"caught": len(caught), "finished_in_place": finished, "model_call_s": _worst(waits["model_call"]),
            "tool_s": _worst(waits["tool"])}


def server_waits(fault: dict[str, Any], executions: list[dict[str, Any]], is_model) -> dict[str, Any]:
    """A server restart: the activities scheduled before it and started after it, each from the server's return."""
    at, ref = fault["at"], fault["reference"]
    held = [e for e in executions if e.get("scheduled_at") is not None and e["scheduled_at"] < at < e["started_at"]]
    model = [max(0.0, e["started_at"] - ref) for e in held if is_model(e)]
    tool = [max(0.0, e["started_at"] - ref) for e in held if not is_model(e)]
    return {"caught": len(held), "finished_in_place": 0, "model_call_s": _worst(model), "tool_s": _worst(tool)}


def workflow_task_waits(faults: list[dict[str, Any]], tasks: dict[str, list[Any]]) -> list[list[float]]:
    """Per fault, each timed-out workflow task's wait: from the reference (or its scheduling, if later) to the
    start of that run's next workflow task. A timeout belongs to the latest fault before it on the worker that had
    started the task (if one had), else to the latest fault before it. A server restart also holds up the tasks
    scheduled before it and started after it: each from the server's return."""
    waits: list[list[float]] = [[] for _ in faults]
    starts = sorted((f["at"], i) for i, f in enumerate(faults))
    for records in tasks.values():
        for k, t in enumerate(records):
            scheduled, started = _wall(t.scheduled_at), _wall(t.started_at)
            for i, f in enumerate(faults):
                if f["op"] == "restart_server" and scheduled is not None and started is not None \
                        and scheduled < f["at"] < started:
                    waits[i].append(max(0.0, started - f["reference"]))
            closed = _wall(t.closed_at)
            if t.outcome != "timed_out" or closed is None:
                continue
            before = [i for at, i in starts if at <= closed]
            # a task started on the faulted worker is that fault's; one that never started, the latest fault's
            mine = [i for i in before if t.identity and faults[i]["identity"] == t.identity]
            owner = max(mine or before, default=None, key=lambda i: faults[i]["at"])
            if owner is None or faults[owner]["reference"] is None:
                continue
            nxt = next((_wall(r.started_at) for r in records[k + 1:] if r.started_at is not None), None)
            if nxt is None:
                continue
            since = max(faults[owner]["reference"], _wall(t.scheduled_at) or 0.0)
            waits[owner].append(max(0.0, nxt - since))
    return waits


def _worst(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(max(present), 2) if present else None


def decompose(data: RunData) -> dict[str, Any]:
    """Per fault and overall: the worst model-call, tool and workflow-task recovery (seconds; None: nothing of that
    kind was held up, or the run did not record what it takes to tell)."""
    workers = int(((data.run.get("scenario") or {}).get("cluster") or {}).get("workers") or 1)
    faults = faults_from_ops(data.ops, workers)
    if not faults:
        return {"faults": [], "model_call_s": None, "tool_s": None, "workflow_task_s": None}
    executions = data.ledger_rows("executions")
    tasks = {f"{r.workflow_id}/{r.run_id}": r.workflow_tasks for chain in data.event_histories.values() for r in chain}
    wft = workflow_task_waits(faults, tasks)
    rows = []
    for f, w in zip(faults, wft):
        measure = server_waits if f["op"] == "restart_server" else activity_waits
        act = measure(f, executions, data.is_model_call) if executions else \
            {"caught": None, "finished_in_place": None, "model_call_s": None, "tool_s": None}
        if f["op"] == "restart_server" and f["reference"] is not None:
            # how soon the workers took anything at all once the server was back
            starts = [e["started_at"] for e in executions if e["started_at"] >= f["reference"]]
            starts += [w for records in tasks.values() for t in records
                       for w in [_wall(t.started_at)] if w is not None and w >= f["reference"]]
            act = {**act, "first_work_after_s": round(min(starts) - f["reference"], 2) if starts else None}
        rows.append({"op": f["op"], "identity": f["identity"], "reference_is": f["reference_is"],
                     "reference_after_fault_s": round(f["reference"] - f["at"], 2) if f["reference"] else None,
                     **act, "workflow_task_s": _worst(w), "workflow_tasks_held": len(w)})
    return {"faults": rows, "model_call_s": _worst(r["model_call_s"] for r in rows),
            "tool_s": _worst(r["tool_s"] for r in rows), "workflow_task_s": _worst(r["workflow_task_s"] for r in rows),
            "ledger": bool(executions), "histories": bool(tasks)}


# ------------------------------------------------------------------------------------------ the client's view


def recovery(ops: list[Op]) -> dict[str, Any]:
    """Recovery per conversation: for each fault's end, each conversation's wait to its next *correct* answer
    (``answered``: an acknowledged send whose reply matches its expected answer; any other reply, a refusal or a
    wrong answer, does not end the wait).

    ``worst_s``: the worst conversation's longest wait (None: no fault ended, or nothing was answered correctly
    after one); ``by_conversation``: each one's longest wait; ``never``: conversations that sent a message after a
    fault ended and never had one answered correctly again (they did not recover, whatever the others did). A fault
    that was not injected (its operation ``fail``) starts no wait."""
    oks: dict[str, list[float]] = {}
    sent_after: dict[str, float] = {}
    for inv, done in client_sends(ops):
        conv = str((inv.value or {}).get("conversation", inv.process))
        if answered(inv, done):
            oks.setdefault(conv, []).append(done.time)
        sent_after[conv] = max(sent_after.get(conv, 0.0), inv.time)
    ends = [done.time for inv, done in pairs(ops)
            if inv.process == "nemesis" and done is not None and done.type != FAIL and not inv.f.startswith("phase:")]
    by_conv: dict[str, float] = {}
    never: set[str] = set()
    for end in ends:
        for conv in sorted(set(oks) | set(sent_after)):
            nxt = next((t for t in sorted(oks.get(conv, [])) if t >= end), None)
            if nxt is not None:
                by_conv[conv] = max(by_conv.get(conv, 0.0), nxt - end)
            elif sent_after.get(conv, -1.0) >= end or any(
                    i.time < end and (d is None or d.time >= end) for i, d in client_sends(ops)
                    if str((i.value or {}).get("conversation", i.process)) == conv):
                never.add(conv)
    return {"worst_s": round(max(by_conv.values()), 1) if by_conv else None,
            "by_conversation": {c: round(v, 1) for c, v in sorted(by_conv.items())}, "never": sorted(never)}
