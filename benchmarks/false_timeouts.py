"""What short timeouts cost on a loaded machine: false timeouts with no fault injected.

    python -m benchmarks.false_timeouts                      # fast vs defaults, 4 CPU hogs, 30 s of load each
    python -m benchmarks.false_timeouts --hogs 0 --duration 20

For each timeouts profile (``testbed.engines.workload.TIMEOUTS``) it runs the chaos workload on the reference agent (two
workers, three conversations, tools and appends) with **no fault** while ``--hogs`` processes spin on the CPU
at the workers' priority, and counts what only a timeout can cause when nothing was killed: activity attempts
after the first (a heartbeat or start-to-close timeout that fired on a live worker: the model call or tool is
paid again) and workflow tasks that timed out (a replay elsewhere). Both profiles run in this one invocation,
one after the other, under the same load. The run directories stay under ``--out`` for a closer look.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.load import cpu_hogs
from harness.commands import RUNS, CommandParser, own_out, progress, runs_root, tool
from testbed.engines.workload import TIMEOUTS, Workload
from harness.private import own_subfolder


def count(run_dir: Path) -> dict[str, Any]:
    """What the run's ledger and histories say timed out, though nothing was killed."""
    from chaos.checker.run_data import RunData

    data = RunData(run_dir)
    executions = data.ledger_rows("executions")
    retries = [e for e in executions if e["attempt"] > 1]
    tasks = [t for chain in data.event_histories.values() for r in chain for t in r.workflow_tasks]
    sends = [o for o in data.ops if o.f == "send_message" and o.type in ("ok", "fail", "info")]
    return {"activity_attempts": len(executions), "retried_attempts": len(retries),
            "retried_model_calls": sum(data.is_model_call(e) for e in retries),
            "workflow_tasks": len(tasks), "workflow_tasks_timed_out": sum(t.outcome == "timed_out" for t in tasks),
            "messages_ok": sum(o.type == "ok" for o in sends), "messages_not_ok": sum(o.type != "ok" for o in sends)}


async def run_beside_hogs(scenario: Any, hogs: int, seed: int, out: Path, engine: Any = None) -> Any:
    """One chaos run of the reference agent (on ``engine``, default ``ReferenceOnTemporal()``) while ``hogs``
    processes spin on the CPU (started here, killed by pid)."""
    from testbed.engines.temporal.engine import ReferenceOnTemporal
    from chaos.runner import run

    with cpu_hogs(hogs):  # started here, killed by pid (and by the kernel with us)
        return await run(scenario, engine or ReferenceOnTemporal(), seed=seed, out_root=out)


async def one(profile: str, hogs: int, duration_s: float, seed: int, out: Path) -> dict[str, Any]:
    from chaos.scenarios import ChaosScenario

    scenario = ChaosScenario(f"loaded_{profile}", f"no fault; {hogs} CPU hogs; timeouts {profile}",
                             workload=Workload(conversations=3, think_s=0.2, append_ratio=0.4, flaky_ratio=0.0),
                             fault_s=duration_s, timeouts=profile)
    result = await run_beside_hogs(scenario, hogs, seed, out)
    return {"profile": profile, "hogs": hogs, "verdict": result.verdict, **count(result.run_dir),
            "run_dir": str(result.run_dir)}


def main(argv: list[str] | None = None) -> int:
    p = CommandParser(prog=tool("benchmarks.false_timeouts"), description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timeouts", default="fast,defaults", help="profiles, comma-separated (default fast,defaults)")
    p.add_argument("--hogs", type=int, default=4, help="CPU-spinning processes during each run (default 4)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load per profile (default 30)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=RUNS, metavar="DIR",
                   help=f"the runs root: this command writes into DIR/false_timeouts/<scenario>/ (default {RUNS}/)")
    args = p.parse_args(argv)
    profiles = [n.strip() for n in args.timeouts.split(",") if n.strip()]
    bad = [n for n in profiles if n not in TIMEOUTS]
    if bad or not profiles or args.hogs < 0 or args.duration <= 0:
        print(f"{p.prog}: --timeouts: profiles are {', '.join(TIMEOUTS)}; --hogs >= 0; --duration > 0",
              file=sys.stderr)
        return 2
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    rows = []
    try:  # UnsafeFolder: another user could change --out, or false_timeouts/ is a symlink
        out = own_subfolder(own_out(runs_root(args.out, "false_timeouts", p.prog)), "false_timeouts")
    except ValueError as exc:
        print(f"{p.prog}: {exc}", file=sys.stderr)
        return 2
    say = progress()
    for profile in profiles:
        say(f"{profile}: {args.duration:g} s of load, {args.hogs} CPU hog(s) on {os.cpu_count()} CPU(s) ...")
        row = asyncio.run(one(profile, args.hogs, args.duration, args.seed, out))
        say(f"{profile}: done -> {row['run_dir']}")
        rows.append(row)
    cols = ["profile", "hogs", "messages_ok", "messages_not_ok", "activity_attempts", "retried_attempts",
            "retried_model_calls", "workflow_tasks", "workflow_tasks_timed_out", "verdict"]
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
