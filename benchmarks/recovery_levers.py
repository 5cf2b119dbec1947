"""What each recovery lever buys after a worker kill, and what it costs in false timeouts on a loaded machine.

    python -m benchmarks.recovery_levers                              # every lever, the four kill scenarios, seeds 1-3
    python -m benchmarks.recovery_levers --levers main,fast --seeds 1-20 --hogs 0
    python -m benchmarks.recovery_levers --scenarios kill_mid_turn --seeds 1-5 --hogs 2
    python -m benchmarks.recovery_levers --levers workflow_task,nocache,latency500 --scenarios kill_mid_turn
    python -m benchmarks.recovery_levers --soaks runs/soak-kill_mid_turn/latest --label fast   # measure a soak

The levers are steps from the settings chaos ran with before they were tuned (``main``: heartbeat 1.5 s held back
up to 0.5 s, retry after 0.1 s, workflow task 1.5 s, sticky 1 s, a 4 s first try and a 0.5 s pause before a
re-send) to the ``fast`` timeouts profile of ``testbed.engines.workload.TIMEOUTS``, one lever at a time, each step
keeping the ones before it (``_STEPS``), then variants of ``fast`` that change one thing each and are measured,
not taken (``_VARIANTS``: ``nocache``, the workers' workflow cache off, so no sticky queue; ``latency500``, the
model answering in 500 ms, as ``kill_mid_turn``'s did before issue 31). For each step, each scenario runs once per
seed while ``--hogs`` processes spin on the CPU beside it (started here and killed by pid), and the step's row says:

* recovery: the p50 and p95 over its runs of the run's recovery (``verdict.json``'s ``recovery.worst_s``: the worst
  conversation's wait from a fault's end to its next correct answer), of the same wait less the time before the
  message was sent (``held``: a conversation thinking is the workload, not the fault), and the mean of each of its
  parts (``recovery_parts``: detection, no worker, backoff, sticky wait, replay, turn, client delivery, before send);
* false timeouts (``false_timeouts``), counted from the run directory: activity attempts retried though the worker
  running the attempt before was never faulted (a heartbeat or start-to-close timeout on a live worker: the model
  call or tool paid twice), workflow tasks that timed out on a worker never faulted (``workflow_task``) or on the
  sticky queue of one (``sticky``; both a replay elsewhere), and re-sends of a message during whose tries no fault
  began (``resend``: one more RPC each).

Everything is written to ``<out>/recovery_levers/<stamp>/levers.json``; the run directories stay under it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.false_timeouts import run_beside_hogs
from chaos.recovery import PARTS
from harness.percentiles import percentile
from harness.commands import RUNS, CommandParser, own_out, progress, runs_root, tool
from harness.private import own_subfolder
from harness.rundir import write_json
from testbed.engines.workload import TIMEOUTS, Timeouts

KILL_SCENARIOS = ("kill_mid_turn", "kill_idle", "kill_mid_tool", "kill_workflow_task")

#: (name, what the step changes, the timeouts profile, the client: Workload's try_timeout_s and resend_at_once);
#: each step keeps the ones before it, and the last is the ``fast`` profile as it ships
_MAIN = Timeouts("main", "before tuning", workflow_task_timeout_s=1.5, sticky_timeout_s=1.0, heartbeat_s=1.5,
                 heartbeat_throttle_s=0.5, initial_interval_s=0.1, maximum_interval_s=4.0, start_to_close_s=10.0)
_STEPS: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("main", "heartbeat 1.5 s (held back <= 0.5 s), retry 0.1 s, workflow task 1.5 s, sticky 1 s; first try 4 s, "
             "0.5 s pause before a re-send", {}, {"try_timeout_s": 4.0, "resend_at_once": False}),
    ("client", "+ a try that times out is re-sent at once; first try 2 s", {},
     {"try_timeout_s": 2.0, "resend_at_once": True}),
    ("sticky", "+ sticky 0.3 s", {"sticky_timeout_s": 0.3}, {}),
    ("heartbeat", "+ heartbeat 0.8 s, sent every 0.2 s (held back <= 0.2 s)",
     {"heartbeat_s": 0.8, "heartbeat_throttle_s": 0.2}, {}),
    ("workflow_task", "+ workflow task 1 s (fast until issue 31's second round)", {"workflow_task_timeout_s": 1.0}, {}),
    ("sticky_short", "+ sticky 0.1 s", {"sticky_timeout_s": 0.1}, {}),
    ("heartbeat_short", "+ heartbeat 0.4 s, sent every 0.1 s (held back <= 0.1 s) (= fast)",
     {"heartbeat_s": 0.4, "heartbeat_throttle_s": 0.1}, {}),
    ("retry", "+ first retry after 0.05 s", {"initial_interval_s": 0.05}, {}),
]
#: the step that is the ``fast`` profile as it ships (the steps after it go beyond it)
FAST_STEP = "heartbeat_short"


#: variants of ``fast`` (the ``FAST_STEP`` step), one change each, measured but not taken: (name, what it
#: changes, the scenario's cluster changes, the worker's extra arguments)
_VARIANTS: list[tuple[str, str, dict[str, Any], tuple[str, ...]]] = [
    ("nocache", "fast, with the workers' workflow cache off (max_cached_workflows 0: no sticky queue, every "
                "workflow task replays the history)", {}, ("--max-cached-workflows", "0")),
    ("latency500", "fast, with the model answering in 500 ms (kill_mid_turn's latency before issue 31)",
     {"model_latency": "fixed:500"}, ()),
]
#: variants of ``fast`` that change its timeouts: (name, what it changes, the timeouts' changes)
_TIMEOUT_VARIANTS: list[tuple[str, str, dict[str, Any]]] = [
    ("heartbeat05", "fast, with a 0.5 s heartbeat timeout (still sent every 0.1 s): 0.1 s more slack",
     {"heartbeat_s": 0.5}),
]

Lever = tuple[str, str, Timeouts, dict[str, Any], dict[str, Any], tuple[str, ...]]


def levers() -> list[Lever]:
    """The cumulative steps, then the variants of ``fast``: (name, what it changes, its timeouts, its client
    settings, its cluster changes, the worker's extra arguments)."""
    out: list[Lever] = []
    timeouts, client = _MAIN, {}
    for name, what, t, c in _STEPS:
        timeouts = dataclasses.replace(timeouts, name=f"lever-{name}", description=what, **t)
        client = {**client, **c}
        out.append((name, what, timeouts, dict(client), {}, ()))
    fast = next(lv for lv in out if lv[0] == FAST_STEP)
    for name, what, cluster, args in _VARIANTS:
        out.append((name, what, dataclasses.replace(fast[2], name=f"lever-{name}", description=what), fast[3],
                    cluster, args))
    for name, what, t in _TIMEOUT_VARIANTS:
        out.append((name, what, dataclasses.replace(fast[2], name=f"lever-{name}", description=what, **t), fast[3],
                    {}, ()))
    return out


def _faults(data: Any) -> list[tuple[str, float]]:
    """(worker identity, when) of every kill, pause or drain that landed."""
    from chaos.recovery import WORKER_FAULTS, faults_from_ops

    return [(f["identity"], f["at"]) for f in faults_from_ops(data.ops, 2) if f["op"] in WORKER_FAULTS]


def _faulted(faults: list[tuple[str, float]], identity: str, until: float) -> bool:
    return any(who == identity and at <= until for who, at in faults) if identity else False


def false_timeouts(run_dir: Path) -> dict[str, int]:
    """What timed out though no fault touched it, from the saved run (see the module docstring)."""
    from chaos.checker.run_data import RunData, client_sends

    data = RunData(run_dir)
    faults = _faults(data)
    executions = data.ledger_rows("executions")
    by_attempt = {(e["workflow_id"], e["run_id"], e["activity_id"], e["attempt"]): e for e in executions}
    activity = 0
    for e in executions:
        prev = by_attempt.get((e["workflow_id"], e["run_id"], e["activity_id"], e["attempt"] - 1))
        if prev is None:
            continue
        gave_up_at = e.get("scheduled_at") or e["started_at"]
        still_running = prev["finished_at"] is None or prev["finished_at"] >= gave_up_at
        if still_running and not _faulted(faults, prev["worker"], gave_up_at):
            activity += 1
    wft = sticky = 0
    for chain in data.event_histories.values():
        for run in chain:
            last_worker = ""
            for t in run.workflow_tasks:
                if t.outcome == "timed_out" and t.closed_at is not None:
                    # started: the worker that held it; never started: the sticky queue of the last one that worked
                    who = t.identity or last_worker
                    if not _faulted(faults, who, t.closed_at.timestamp()):
                        wft += bool(t.identity)
                        sticky += not t.identity
                if t.outcome == "completed":
                    last_worker = t.identity
    fault_times = [at for _, at in faults]
    resends = 0
    for o in data.ops:
        if o.f != "resend_message" or o.type != "invoke":
            continue
        v = o.value if isinstance(o.value, dict) else {}
        sent = next((i.wall for i, _ in client_sends(data.ops) if (i.value or {}).get("conversation")
                     == v.get("conversation") and (i.value or {}).get("n") == v.get("n")), None)
        if sent is not None and not any(sent - 0.5 <= at <= o.wall for at in fault_times):
            resends += 1
    return {"activity": activity, "workflow_task": wft, "sticky": sticky, "resend": resends}


def _pct(values: list[float], q: float) -> float | None:
    return round(percentile(values, q * 100), 2) if values else None


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p95 of the runs' recovery, the mean of each part, and the false timeouts summed."""
    rec = [r["recovery_s"] for r in rows if r.get("recovery_s") is not None]
    parts = {p: round(statistics.fmean(v), 2) if (v := [r["parts"][p] for r in rows if (r.get("parts") or {})
                                                        .get(p) is not None]) else None for p in PARTS}
    false = {k: sum(r["false_timeouts"][k] for r in rows if r.get("false_timeouts")) for k in
             ("activity", "workflow_task", "sticky", "resend")}
    held = [r["held_s"] for r in rows if r.get("held_s") is not None]
    return {"runs": len(rows), "measured": len(rec), "p50_s": _pct(rec, 0.5), "p95_s": _pct(rec, 0.95),
            "max_s": max(rec) if rec else None, "held_p50_s": _pct(held, 0.5), "held_p95_s": _pct(held, 0.95), "not_pass": sum(r["verdict"] != "pass" for r in rows),
            "parts_mean_s": parts, "false_timeouts": false}


async def one(scenario_name: str, lever: Lever, seed: int, hogs: int, out: Path) -> dict[str, Any]:
    from chaos.scenarios import SCENARIOS
    from testbed.engines.temporal.engine import ReferenceOnTemporal

    name, _, timeouts, client, cluster, worker_args = lever
    TIMEOUTS[timeouts.name] = timeouts  # this process's runs only: the workers get its sticky and throttle values
    base = SCENARIOS[scenario_name]
    scenario = dataclasses.replace(base, name=f"{scenario_name}~{name}", timeouts=timeouts.name,
                                   workload=dataclasses.replace(base.workload, **client),
                                   cluster=dataclasses.replace(base.cluster, **cluster))

    engine = ReferenceOnTemporal()
    if worker_args:  # this engine's workers only: the reference worker's template and these arguments after it
        engine.worker_command = lambda s: (*ReferenceOnTemporal.worker_command(engine, s), *worker_args)
    result = await run_beside_hogs(scenario, hogs, seed, out, engine)
    return measured(result.run_dir, scenario_name, name, seed, result.verdict)


def measured(run_dir: Path, scenario: str, lever: str, seed: int, verdict: str) -> dict[str, Any]:
    """A run's row, computed from its directory alone (the recovery and its parts as ``chaos check`` computes them)."""
    from chaos.checker.run_data import RunData
    from chaos.recovery import recovery, recovery_parts

    data = RunData(run_dir)
    return {"scenario": scenario, "lever": lever, "seed": seed, "verdict": verdict,
            "recovery_s": recovery(data.ops)["worst_s"], "held_s": (parts := recovery_parts(data)).get("held_s"),
            "parts": parts.get("parts"),
            "false_timeouts": false_timeouts(run_dir), "run_dir": str(run_dir)}


def soak_summary(soak_dirs: list[Path], label: str) -> dict[str, Any]:
    """``python -m chaos soak``'s runs (each directory's soak.json), measured as the levers are: one row per soak."""
    doc: dict[str, Any] = {"runs": [], "summary": {}}
    for soak in soak_dirs:
        record = json.loads((soak / "soak.json").read_text())
        rows = [measured(Path(r["run_dir"]), record["scenario"], label, r["seed"], r["verdict"])
                for r in record["runs"] if r.get("run_dir") and Path(r["run_dir"]).is_dir()]
        doc["runs"] += rows
        doc["summary"][f"{record['scenario']}~{label}"] = summarise(rows)
    return doc


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv: list[str] | None = None) -> int:
    p = CommandParser(prog=tool("benchmarks.recovery_levers"), description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    names = [n for n, *_ in _STEPS] + [n for n, *_ in _VARIANTS] + [n for n, *_ in _TIMEOUT_VARIANTS]
    p.add_argument("--levers", default=",".join(n for n, *_ in _STEPS),
                   help=f"steps and variants of fast, comma-separated: {','.join(names)} (default: the steps)")
    p.add_argument("--scenarios", default=",".join(KILL_SCENARIOS), help="kill scenarios, comma-separated")
    p.add_argument("--seeds", default="1-3", help="seeds, e.g. 1-3 or 1,4,7 (default 1-3)")
    p.add_argument("--hogs", type=int, default=2, help="CPU-spinning processes beside each run (default 2)")
    p.add_argument("--soaks", type=Path, nargs="+", metavar="SOAK_DIR",
                   help="run nothing: measure these soaks' runs (" + tool("chaos") + " soak's directories) the same way")
    p.add_argument("--label", default="soak", help="--soaks: the lever name their rows get (default soak)")
    p.add_argument("--out", type=Path, default=RUNS, metavar="DIR",
                   help=f"the runs root: this command writes into DIR/recovery_levers/ (default {RUNS}/)")
    args = p.parse_args(argv)
    if args.soaks:
        doc = soak_summary(args.soaks, args.label)
        print(table(doc))
        return 0
    chosen = [lv for lv in levers() if lv[0] in args.levers.split(",")]
    scenarios = [s for s in args.scenarios.split(",") if s]
    if not chosen or not scenarios or args.hogs < 0:
        print(f"{p.prog}: --levers from {', '.join(names)}; --scenarios; --hogs >= 0", file=sys.stderr)
        return 2
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:  # UnsafeFolder: another user could change --out, or a folder under it is a symlink
        out = own_subfolder(own_out(runs_root(args.out, "recovery_levers", p.prog)),
                            "recovery_levers/" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    except ValueError as exc:
        print(f"{p.prog}: {exc}", file=sys.stderr)
        return 2
    say = progress()
    rows: list[dict[str, Any]] = []
    doc: dict[str, Any] = {"hogs": args.hogs, "cpus": os.cpu_count(), "seeds": _seeds(args.seeds),
                           "levers": [{"name": n, "changes": w, "timeouts": dataclasses.asdict(t), "client": c,
                                       "cluster": cl, "worker_args": list(a)} for n, w, t, c, cl, a in chosen],
                           "runs": rows, "summary": {}}
    for seed in _seeds(args.seeds):  # seeds outermost: every lever sees the machine in the same state, in turn
        for scenario in scenarios:
            for lever in chosen:
                row = asyncio.run(one(scenario, lever, seed, args.hogs, out))
                rows.append(row)
                say(f"{scenario} seed {seed} {lever[0]}: {row['verdict']}, recovery {row['recovery_s']} s, "
                    f"false timeouts {row['false_timeouts']}")
                doc["summary"] = {f"{s}~{lv[0]}": summarise([r for r in rows if r["scenario"] == s
                                                             and r["lever"] == lv[0]])
                                  for s in scenarios for lv in chosen}
                write_json(out / "levers.json", doc)
    print(table(doc))
    print(f"\n{out / 'levers.json'}")
    return 0


def table(doc: dict[str, Any]) -> str:
    """The summary as a Markdown table: one row per scenario and lever."""
    cols = ["scenario~lever", "runs", "not_pass", "p50_s", "p95_s", "max_s", "held_p50_s", "held_p95_s",
            *(p.removesuffix("_s") for p in PARTS),
            "false: activity", "wft", "sticky", "resend"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for key, s in doc["summary"].items():
        cells = [key, s["runs"], s["not_pass"], s["p50_s"], s["p95_s"], s["max_s"], s["held_p50_s"], s["held_p95_s"],
                 *(s["parts_mean_s"][p] for p in PARTS), *s["false_timeouts"].values()]
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
