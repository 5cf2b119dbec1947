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
                        "reference_is": "server back", "index": o.index, "snapshot": []})
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
        out.append({"op": o.f, "worker": name, "identity": identity, "at": at, "back": back, "index": o.index,
                    "snapshot": ((v.get("frozen_snapshot") or {}).get("pending_activities") or [])
                    if isinstance(v.get("frozen_snapshot"), dict) else []})
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


def _from_histories(fault: dict[str, Any], held: list[dict[str, Any]]) -> dict[str, Any]:
    """``activity_waits`` for an agent with no effect ledger: the retries its histories show after the fault
    (``held_activities``), each from the reference; what finished in place cannot be told."""
    if not held:
        return {"caught": None, "finished_in_place": None, "model_call_s": None, "tool_s": None}
    ref = fault["reference"]
    waits = [(h["model"], max(0.0, h["retry_at"] - ref)) for h in held if ref is not None]
    return {"caught": len(held), "finished_in_place": None, "model_call_s": _worst(w for m, w in waits if m),
            "tool_s": _worst(w for m, w in waits if not m)}


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
    held = held_activities(data, faults) if not executions else []  # no ledger: the histories' retries
    for i, (f, w) in enumerate(zip(faults, wft)):
        measure = server_waits if f["op"] == "restart_server" else activity_waits
        act = measure(f, executions, data.is_model_call) if executions else _from_histories(
            f, [h for h in held if h["fault"] == i])
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


# ------------------------------------------------------------------------ each fault's path, from the histories

#: an activity's timeout type (what ended the attempt before the last one) -> the setting that decides it
TIMEOUT_SETTINGS = {"HEARTBEAT": "heartbeat_timeout", "START_TO_CLOSE": "start_to_close",
                    "SCHEDULE_TO_CLOSE": "schedule_to_close", "SCHEDULE_TO_START": "schedule_to_start"}


def _owner(faults: list[dict[str, Any]], since: float, until: float, match: Any = None,
           required: bool = False) -> int | None:
    """The fault a held piece of work belongs to: the latest in [since, until) for which ``match`` holds (if none
    does: the latest in it, unless ``required``)."""
    inside = [i for i, f in enumerate(faults) if since <= f["at"] < until and f["op"] != "restart_server"]
    mine = [i for i in inside if match is not None and match(faults[i])]
    return max(mine or ([] if required else inside), default=None, key=lambda i: faults[i]["at"])


def held_activities(data: RunData, faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each activity the histories show retried after a timeout across a fault: the fault (its index in
    ``faults``), the timeout that noticed the dead worker and its setting, the measured detection (the fault to
    the retry's start, less the backoff) and backoff, with the events they rest on. Read from Temporal's event
    histories alone (the final ``ActivityTaskStarted`` keeps the last attempt's start and the failure before it),
    so it needs no effect ledger: any Temporal agent has it."""
    out = []
    for wid, chain in data.event_histories.items():
        for run in chain:
            for a in run.activities:
                if a.attempts < 2 or not a.last_failure_timeout or a.scheduled_at is None or a.started_at is None:
                    continue
                retry = _wall(a.started_at)

                def held_by(f: dict[str, Any], run_id: str = run.run_id, aid: str = a.activity_id) -> bool:
                    return any(p.get("run_id") == run_id and p.get("activity_id") == aid and
                               p.get("worker") == f["identity"] for p in f["snapshot"])
                i = _owner(faults, _wall(a.scheduled_at), retry, held_by)
                if i is None:
                    continue
                backoff = None if a.last_failure_sets_delay else _backoff(a.retry_policy, a.attempts)
                noticed = retry - (backoff or 0.0)
                out.append({
                    "fault": i, "workflow_id": wid, "run_id": run.run_id, "activity_id": a.activity_id,
                    "activity_type": a.activity_type, "model": a.activity_type == data.model_activity,
                    "attempts": a.attempts, "detected_by": a.last_failure_timeout,
                    "setting": TIMEOUT_SETTINGS.get(a.last_failure_timeout, a.last_failure_timeout.lower()),
                    "start_to_close_s": a.start_to_close_s, "heartbeat_s": a.heartbeat_s,
                    "schedule_to_close_s": a.schedule_to_close_s, "retry_policy": a.retry_policy,
                    "detection_s": round(max(0.0, noticed - faults[i]["at"]), 2),
                    "backoff_s": round(backoff, 2) if backoff is not None else None, "retry_at": retry})
    return out


def held_workflow_tasks(data: RunData, faults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each workflow task the histories show timing out after a fault: ``START_TO_CLOSE`` (started on the dead
    worker: the workflow task timeout it was scheduled with) or ``SCHEDULE_TO_START`` (waiting on the dead
    worker's sticky queue: the worker's sticky timeout, which the history does not record, measured from the
    task's scheduling to its timeout); each with the fault, the wait from the fault, and the next task that ran
    (on another worker, which replays the history first: ``replay_s``)."""
    out = []
    for wid, chain in data.event_histories.items():
        for run in chain:
            for k, t in enumerate(run.workflow_tasks):
                if t.outcome != "timed_out" or t.closed_at is None or t.scheduled_at is None:
                    continue
                closed, scheduled, started = _wall(t.closed_at), _wall(t.scheduled_at), _wall(t.started_at)
                # whose it was: the worker that started it, or (never started) the one whose sticky queue held it,
                # the worker that completed the run's task before it
                holder = t.identity if started is not None else next(
                    (r.identity for r in reversed(run.workflow_tasks[:k]) if r.outcome == "completed"), "")
                # (a task that timed out started keeps no identity in some histories: then the kill of a worker
                # while it held the task, between its start and its timeout)
                i = _owner(faults, float("-inf"), closed,
                           lambda f: f["identity"] == holder if holder else
                           started is not None and started <= f["at"] < closed and bool(f["identity"]),
                           required=True)
                if i is None:
                    continue
                nxt = next((r for r in run.workflow_tasks[k + 1:] if r.started_at is not None), None)
                began = max(started if started is not None else scheduled, faults[i]["at"])
                out.append({
                    "fault": i, "workflow_id": wid, "run_id": run.run_id, "scheduled_event_id": t.scheduled_event_id,
                    "timeout_type": t.timeout_type, "sticky": t.sticky,
                    "workflow_task_timeout_s": t.start_to_close_s or run.workflow_task_timeout_s,
                    "timed_out_after_s": round(closed - (started if started is not None else scheduled), 2),
                    "wait_s": round(max(0.0, closed - began), 2),
                    "replay_s": round(_wall(nxt.closed_at) - _wall(nxt.started_at), 2)
                    if nxt is not None and nxt.closed_at is not None else None,
                    "history_events": run.events})
    return out


def fault_paths(data: RunData) -> list[dict[str, Any]]:
    """Per fault that took work away: what it held up on the server and why, part by part (``held_activities``,
    ``held_workflow_tasks``, and ``no_worker_s``: no worker polling until a replacement did), with what could not
    be known. An engine that keeps no Temporal histories says so: only the no-worker part is read (from the
    operations)."""
    workers = int(((data.run.get("scenario") or {}).get("cluster") or {}).get("workers") or 1)
    faults = faults_from_ops(data.ops, workers)
    histories = bool(data.event_histories)
    acts = held_activities(data, faults) if histories else []
    tasks = held_workflow_tasks(data, faults) if histories else []
    backend = (data.run.get("backend") or {}).get("name") or "temporal"
    out = []
    for i, f in enumerate(faults):
        alone = f["reference_is"] not in ("fault (another worker alive)", "server back")
        unknown = [] if histories else [
            f"detection, backoff, sticky wait and replay: {backend} keeps no per-attempt timeouts this harness reads "
            "(no Temporal event histories in the run)"]
        out.append({"fault": f["op"], "index": f["index"], "at": f["at"], "identity": f["identity"],
                    "no_worker_s": round(f["reference"] - f["at"], 2) if alone and f["reference"] else None,
                    "activities": [a for a in acts if a["fault"] == i],
                    "workflow_tasks": [t for t in tasks if t["fault"] == i], "unknown": unknown})
    return out


# ------------------------------------------------------------------------------------------ the client's view


def client_waits(ops: list[Op]) -> list[dict[str, Any]]:
    """For each fault's end, each conversation's wait to its next correct answer: ``{end, conversation, wait_s,
    send, answer}`` (the fault's completion op, and the answered send's invoke and completion; ``wait_s`` None and
    no send: nothing was answered correctly after that end)."""
    oks: dict[str, list[tuple[Op, Op]]] = {}
    convs: set[str] = set()
    for inv, done in client_sends(ops):
        conv = str((inv.value or {}).get("conversation", inv.process))
        convs.add(conv)
        if answered(inv, done):
            oks.setdefault(conv, []).append((inv, done))
    ends = [done for inv, done in pairs(ops)
            if inv.process == "nemesis" and done is not None and done.type != FAIL and not inv.f.startswith("phase:")]
    out = []
    for end in ends:
        for conv in sorted(convs):
            nxt = min((p for p in oks.get(conv, []) if p[1].time >= end.time), default=None, key=lambda p: p[1].time)
            out.append({"end": end, "conversation": conv, "wait_s": nxt[1].time - end.time if nxt else None,
                        "send": nxt[0] if nxt else None, "answer": nxt[1] if nxt else None})
    return out


def recovery(ops: list[Op]) -> dict[str, Any]:
    """Recovery per conversation: for each fault's end, each conversation's wait to its next *correct* answer
    (``answered``: an acknowledged send whose reply matches its expected answer; any other reply, a refusal or a
    wrong answer, does not end the wait).

    ``worst_s``: the worst conversation's longest wait (None: no fault ended, or nothing was answered correctly
    after one); ``by_conversation``: each one's longest wait; ``never``: conversations that sent a message after a
    fault ended and never had one answered correctly again (they did not recover, whatever the others did). A fault
    that was not injected (its operation ``fail``) starts no wait."""
    sent_after: dict[str, float] = {}
    for inv, _ in client_sends(ops):
        conv = str((inv.value or {}).get("conversation", inv.process))
        sent_after[conv] = max(sent_after.get(conv, 0.0), inv.time)
    by_conv: dict[str, float] = {}
    never: set[str] = set()
    for w in client_waits(ops):
        conv, end = w["conversation"], w["end"].time
        if w["wait_s"] is not None:
            by_conv[conv] = max(by_conv.get(conv, 0.0), w["wait_s"])
        elif sent_after.get(conv, -1.0) >= end or any(
                i.time < end and (d is None or d.time >= end) for i, d in client_sends(ops)
                if str((i.value or {}).get("conversation", i.process)) == conv):
            never.add(conv)
    return {"worst_s": round(max(by_conv.values()), 1) if by_conv else None,
            "by_conversation": {c: round(v, 1) for c, v in sorted(by_conv.items())}, "never": sorted(never)}


# ------------------------------------------------------------------------------- one wait, part by part

#: the parts a recovery wait is cut into, in the order a kill's recovery goes through them
PARTS = ("detection_s", "no_worker_s", "backoff_s", "sticky_wait_s", "replay_s", "turn_s", "client_delivery_s",
         "before_send_s")
#: which part an instant counts in when several spans cover it: the first in this order
_PRIORITY = ("client_delivery_s", "before_send_s", "detection_s", "no_worker_s", "sticky_wait_s", "backoff_s",
             "replay_s", "lost_update_s")


def _backoff(policy: tuple[float, float, float] | None, attempt: int) -> float | None:
    """The backoff before ``attempt`` (2 or more) under the retry policy (initial, coefficient, maximum)."""
    if policy is None or attempt < 2:
        return None
    initial, coefficient, maximum = policy
    wait = initial * coefficient ** (attempt - 2)
    return min(wait, maximum) if maximum else wait


def _update(data: RunData, workflow_id: str, send: Op) -> Any:
    """The update record of this send: the driver's id (``msg-<n>``), else the first with its text."""
    value = send.value if isinstance(send.value, dict) else {}
    records = data.updates(workflow_id) or []
    # the reference driver's update ids, and the chat driver's (``<workflow id>-m<n>``)
    by_id = [u for u in records if u.update_id in (f"msg-{value.get('n')}", f"{workflow_id}-m{value.get('n')}")]
    by_text = [u for u in records if u.text == value.get("text")]
    return next(iter(by_id or by_text), None)


def _spans(data: RunData, workflow_id: str, faults: list[dict[str, Any]], executions: list[dict[str, Any]],
           start: float, end: float) -> list[tuple[str, float, float]]:
    """The server-side spans of one workflow that a wait in [start, end] can fall into."""
    spans: list[tuple[str, float, float]] = []
    chain = data.event_histories.get(workflow_id) or []
    policies = {(r.run_id, a.activity_id): a.retry_policy for r in chain for a in r.activities}
    mine = [e for e in executions if e["workflow_id"] == workflow_id]
    for f in faults:
        if f["op"] == "restart_server" or f["at"] > end:
            continue
        if f["reference_is"] != "fault (another worker alive)":  # every worker down until a replacement polled
            spans.append(("no_worker_s", f["at"], f["reference"] if f["reference"] is not None else end))
        for e in running_at(mine, f["at"], f["identity"]):
            retry = min(run_again(mine, e, f["at"]), default=None, key=lambda x: x["started_at"])
            if retry is None or retry["attempt"] < 2:  # finished in place, or a local activity run again by a task
                continue
            wait = _backoff(policies.get((e["run_id"], e["activity_id"])), retry["attempt"])
            noticed = retry["scheduled_at"] - wait if retry.get("scheduled_at") and wait is not None \
                else retry.get("scheduled_at") or retry["started_at"]
            spans += [("detection_s", f["at"], noticed), ("backoff_s", noticed, retry["started_at"])]
    if not mine:  # no effect ledger for this conversation: the retries its history shows
        for h in held_activities(data, faults):
            if h["workflow_id"] == workflow_id and faults[h["fault"]]["at"] <= end:
                noticed = h["retry_at"] - (h["backoff_s"] or 0.0)
                spans += [("detection_s", faults[h["fault"]]["at"], noticed), ("backoff_s", noticed, h["retry_at"])]
    for run in chain:
        for k, t in enumerate(run.workflow_tasks):
            if t.outcome != "timed_out" or t.closed_at is None:
                continue
            closed = _wall(t.closed_at)
            if t.started_at is not None:  # held by a worker that died (or was too slow): its timeout
                held = [f["at"] for f in faults if f["identity"] and f["identity"] == t.identity]
                spans.append(("detection_s", max([_wall(t.started_at), *[a for a in held if a <= closed]]), closed))
            else:  # never started: it waited on a dead worker's sticky queue
                spans.append(("sticky_wait_s", _wall(t.scheduled_at), closed))
            nxt = next((r for r in run.workflow_tasks[k + 1:] if r.started_at is not None), None)
            if nxt is not None and nxt.closed_at is not None:  # the next task, on another worker, replays the history
                spans.append(("replay_s", _wall(nxt.started_at), _wall(nxt.closed_at)))
    return [(label, a, b) for label, a, b in spans if a is not None and b is not None and b > a]


def decompose_wait(data: RunData, wait: dict[str, Any], faults: list[dict[str, Any]],
                   executions: list[dict[str, Any]]) -> dict[str, Any]:
    """One conversation's wait after a fault (``client_waits``), cut into ``PARTS`` that add up to it:

    * ``before_send_s``: the conversation had not sent the message yet (its think time);
    * ``detection_s``: the work sat on a dead worker before the server gave up on it (an activity's heartbeat
      timeout, from the fault to the retry's schedule time less its backoff; a workflow task's timeout);
    * ``no_worker_s``: no worker was alive (the fault took the last one) until a replacement was polling;
    * ``backoff_s``: the retry's backoff, and its wait for a worker to take it;
    * ``sticky_wait_s``: a workflow task waited on a dead worker's sticky queue until its schedule-to-start timeout;
    * ``replay_s``: the workflow task after a timed-out one (on another worker, which replays the history first);
    * ``client_delivery_s``: the client had yet to hear of the reply the server already held (a try waited out,
      a pause before the re-send), or had yet to re-send a message the server lost with a timed-out workflow task;
    * ``turn_s``: the rest: the turn's own work (model calls, tools, workflow tasks) and dispatch.

    Where spans overlap, an instant counts once, in the first of client delivery, before send, detection, no
    worker, sticky wait, backoff, replay. Without the message's update in a saved event history (engines without Temporal
    histories), ``parts`` is None."""
    end_op, send, answer = wait["end"], wait["send"], wait["answer"]
    start, end = end_op.wall, answer.wall
    row: dict[str, Any] = {"fault": end_op.f, "conversation": wait["conversation"],
                           "n": (send.value or {}).get("n") if isinstance(send.value, dict) else None,
                           "wait_s": round(wait["wait_s"], 2), "total_s": round(end - start, 2)}
    update = _update(data, wait["conversation"], send)
    if update is None or update.completed_at is None:
        return {**row, "parts": None, "why": "no event history holds this message's update"}
    spans = [("before_send_s", start, send.wall), ("client_delivery_s", _wall(update.completed_at), end)]
    accepted = _wall(update.accepted_at)
    for o in data.ops:  # the message lost with a workflow task: it waited for the client's re-send
        v = o.value if isinstance(o.value, dict) else {}
        if o.f == "resend_message" and o.type == "invoke" and v.get("conversation") == wait["conversation"] \
                and v.get("n") == row["n"] and accepted is not None and send.wall < o.wall <= accepted:
            spans.append(("lost_update_s", send.wall, o.wall))
    spans += _spans(data, wait["conversation"], faults, executions, start, end)
    cuts = sorted({start, end, *(x for _, a, b in spans for x in (a, b) if start < x < end)})
    parts = dict.fromkeys(PARTS, 0.0)
    for a, b in zip(cuts, cuts[1:]):
        mid = (a + b) / 2
        covering = {label for label, lo, hi in spans if lo <= mid < hi}
        label = next((p for p in _PRIORITY if p in covering), "turn_s")
        parts["client_delivery_s" if label == "lost_update_s" else label] += b - a
    # held: the wait less the time before the message was sent (what the fault, not the workload, cost the user)
    return {**row, "held_s": round(end - start - parts["before_send_s"], 2),
            "parts": {k: round(v, 2) for k, v in parts.items()}}


def causes(path: dict[str, Any] | None, wait: dict[str, Any]) -> dict[str, str]:
    """What set each part of this wait, in words, from the fault's path (``fault_paths``) in the waiting
    conversation (or any, where it has none): part -> the setting and its value."""
    if path is None:
        return {}
    conv = wait["conversation"]
    acts = [a for a in path["activities"] if a["workflow_id"] == conv] or path["activities"]
    tasks = [t for t in path["workflow_tasks"] if t["workflow_id"] == conv] or path["workflow_tasks"]
    out: dict[str, str] = {}
    for a in acts[:1]:
        limit = a["heartbeat_s"] if a["detected_by"] == "HEARTBEAT" else a["start_to_close_s"]
        out["detection_s"] = f"{a['activity_type']}'s {a['setting']} ({limit:g} s)" if limit else a["setting"]
        if a["retry_policy"]:
            out["backoff_s"] = f"{a['activity_type']}'s retry policy (first retry after {a['retry_policy'][0]:g} s)"
    for t in tasks:
        if t["timeout_type"] == "START_TO_CLOSE":
            out.setdefault("detection_s", f"the workflow task timeout ({t['workflow_task_timeout_s'] or 0:g} s)")
        elif t["timeout_type"] == "SCHEDULE_TO_START" and t["sticky"]:
            out["sticky_wait_s"] = f"the worker's sticky schedule-to-start timeout ({t['timed_out_after_s']:.1f} s)"
        if t["replay_s"] is not None:
            out["replay_s"] = f"replaying a history of up to {t['history_events']} events"
    if path["no_worker_s"]:
        out["no_worker_s"] = "the fault took the last worker: until a replacement polled"
    return out


def recovery_parts(data: RunData) -> dict[str, Any]:
    """The run's recovery (``recovery``'s worst wait) and each fault's worst wait, cut into ``PARTS``
    (``decompose_wait``): ``{...the worst wait's row, by_fault: [one row per fault end]}``; ``{}``: no fault ended
    with a correct answer after it."""
    workers = int(((data.run.get("scenario") or {}).get("cluster") or {}).get("workers") or 1)
    faults = faults_from_ops(data.ops, workers)
    executions = data.ledger_rows("executions")
    by_end: dict[int, dict[str, Any]] = {}
    for w in client_waits(data.ops):
        if w["wait_s"] is not None and (w["end"].index not in by_end or w["wait_s"] > by_end[w["end"].index]["wait_s"]):
            by_end[w["end"].index] = w
    paths = {p["index"]: p for p in fault_paths(data)} if by_end else {}
    rows = [{**decompose_wait(data, w, faults, executions), "causes": causes(paths.get(i), w)}
            for i, w in sorted(by_end.items())]
    if not rows:
        return {}
    return {**max(rows, key=lambda r: r["wait_s"]), "by_fault": rows}
