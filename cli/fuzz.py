"""``python -m migration_fuzz``: fan-out agent runs across worker processes; where did each piece run?

    python -m migration_fuzz --iterations 20 --workers 3 --max-n 5
    python -m migration_fuzz --kind ptc-spawns --iterations 10
    python -m migration_fuzz --iterations 20 --chaos      # SIGKILL a random worker in every iteration
    python -m migration_fuzz --durability checkpoint --chaos    # another engine: the writes family

Exit status: 0 when every invariant held, 1 when one was violated, 2 on bad options. Progress goes to stderr,
the results table to stdout. Also installed as the command dah-fuzz.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from datetime import datetime, timezone

from agent.env_options import check_environment
from migration_fuzz.fuzz import FUZZ_FOLDER, KINDS, FuzzOptions, run_fuzz, table
from harness.commands import CommandParser, own_out, progress, runs_root, tool
from cli.options import add_connection_arguments, add_durability, add_keep_runs, add_out, prune_runs
from testbed.model_server import add_model_latency
from testbed.engines.temporal.connection import connection_from_args


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog=tool("migration_fuzz"),
        description="Cross-worker migration fuzzing: W worker processes of an engine share its work; each "
                    "iteration runs an agent run that fans out subagents (child workflows) and file writes in a "
                    "shape drawn from the seed; the engine's records show which worker ran each piece (Temporal's "
                    "event histories: each workflow task and activity; elsewhere the effect ledger: each step). "
                    "Checks that every child completed once and every file was written once.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Families: direct-spawns (N parallel spawn calls), ptc-spawns (one run_ptc gathering N spawns), "
               "ptc-mixed (one run_ptc gathering file writes and N spawns): on an engine with spawn and run_ptc; "
               "writes (N parallel write_file calls): on every engine, drawn by 'all' where the others "
               "are not.\n"
               "Results: <out>/migration_fuzz/<timestamp>/results.json and table.txt (and "
               "<out>/migration_fuzz/latest).",
    )
    add_durability(p, help="the engine whose workers run the iterations (default temporal)")
    p.add_argument("--iterations", type=int, default=10, help="parent runs to fuzz (default 10)")
    p.add_argument("--workers", type=int, default=3, help="the engine's worker processes (default 3)")
    p.add_argument("--max-n", type=int, default=5, help="most children (and file writes) per shape (default 5)")
    p.add_argument("--kind", default="all", choices=["all", *KINDS], help="shape family (default: all, drawn per "
                                                                          "iteration from the seed)")
    p.add_argument("--seed", type=int, default=0, help="iteration i uses seed+i for its shape (default 0)")
    p.add_argument("--chaos", action="store_true",
                   help="SIGKILL a random worker during every iteration (the supervisor restarts it)")
    p.add_argument("--concurrency", type=int, default=1, metavar="N",
                   help="iterations in flight at once (default 1); with --chaos each still schedules its own kill, "
                        "which may land on another iteration's work")
    add_out(p, FUZZ_FOLDER)
    add_keep_runs(p)
    p.add_argument("--iteration-timeout", type=float, default=120.0,
                   help="seconds one parent run may take before it counts as a violation (default 120)")
    add_model_latency(p, default="fixed:20", default_text="fixed:20")
    add_connection_arguments(p, embedded_default=True)
    return p


def main(argv: list[str] | None = None, private_network: bool = False) -> int:
    """``private_network`` (the command as run from a shell, ``entry``): the fuzzer's servers in a network
    namespace of their own (``testbed.isolation``), where it can have one."""
    args = build_parser().parse_args(argv)
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    out = runs_root(args.out, FUZZ_FOLDER, tool("migration_fuzz"))
    try:
        connection = connection_from_args(args)
        opts = FuzzOptions(durability=args.durability, iterations=args.iterations, workers=args.workers, max_n=args.max_n, kind=args.kind,
                           seed=args.seed, chaos=args.chaos, out=out, iteration_timeout_s=args.iteration_timeout,
                           model_latency=args.model_latency, concurrency=args.concurrency,
                           connection=None if connection.embedded else connection)
        opts.validate()
        check_environment()
        own_out(out, FUZZ_FOLDER)  # UnsafeFolder: another user could change it; before anything starts
    except ValueError as exc:  # EnvOptionError is one
        print(f"{tool('migration_fuzz')}: {exc}", file=sys.stderr)
        return 2
    start, started = time.monotonic(), datetime.now(timezone.utc)
    if private_network:
        from testbed import isolation

        why = "an external cluster is reached over this machine's network" if opts.external else None
        print(isolation.enter_private_network(why).line(), file=sys.stderr, flush=True)
    try:
        report = asyncio.run(run_fuzz(opts, progress(start)))
    except KeyboardInterrupt:
        print(f"{tool('migration_fuzz')}: interrupted; every process it started was stopped", file=sys.stderr)
        return 130
    prune_runs(out, started, args.keep_runs)
    print(table(report["families"]))
    verdict = "all invariants held" if report["invariants_held"] else "INVARIANTS VIOLATED"
    print(f"\n{verdict}; {len(report['iterations'])} iteration(s) in {report['wall_seconds']} s: "
          f"{report['iterations_per_minute']} per minute after the cluster was up ({report['startup_seconds']} s), "
          f"{report['iterations_per_minute_overall']} overall (results: {report['run_dir']}/results.json)")
    return 0 if report["invariants_held"] else 1


def entry() -> None:
    """The ``dah-fuzz`` console script (``python -m migration_fuzz``)."""
    from harness.exit import exit_now

    exit_now(main(private_network=True))
