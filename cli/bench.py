"""``python -m benchmarks``: what durability costs, measured (see benchmarks/README.md)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import sys
from datetime import datetime, timezone
from typing import Any

from agent.llm import is_scripted
from cli.options import add_connection_arguments, add_durability, add_keep_runs, add_out, prune_runs
from harness.commands import CommandParser, own_out, positive, progress, runnable, runs_root, tool, unknown, whole
from testbed.model_server import add_model_latency
from testbed.engines.temporal.connection import connection_from_args, redact_argv
from benchmarks.conversations import WORKLOADS, BenchError
from benchmarks.options import BENCH_FOLDER, CHECKPOINT_SECTIONS, SECTION_NAMES, Options
from benchmarks.suite import run
from harness.engines import REGISTRY, canonical
from harness.rundir import stop_on_sigterm, stopped_exit_code, stopped_status

EPILOG = """\
sections:
  table2      the paper's Table 2: durable vs plain loop, mock vs model, per workload; and the overhead breakdown
  tuning      per-step overhead before/after tuning: stock vs tuned dev server, eager activities on/off
  overhead    durable overhead per turn, the worker in its own process: dispatched vs local tools / model calls,
              each series interleaved turn by turn with the floor of its shape (N trivial activities);
              --overhead-rounds N --overhead-load K: the ratio's spread over N rounds, idle and beside K CPU-bound
              processes
  length      per-turn latency and history bytes against conversation length, continue-as-new off/on
  throughput  turns/s against concurrent conversations and worker processes
  recovery    what a worker SIGKILL adds to a turn, against the activity heartbeat timeout
  micro       pytest-benchmark micro-benchmarks (payload conversion, PTC interpreter, checkers)
  engines     the same agent on every engine side by side: plain, checkpoint, Temporal, DBOS (SQLite and PostgreSQL),
              Restate; Table 2 per engine and a no-op step's cost against the fsync floor (--engines picks some);
              run only when asked: --only engines
  scale       the harness's own cost at production shape: kill_mid_turn at --scale-conversations (10,30,100) x
              --scale-messages (20), and a continue-as-new size (2 conversations x --scale-chain messages, 230):
              wall time, the harness's CPU per message, peak RSS, time per check, replay per history, run directory
              size, report build time, and how each grows; run only when asked: --only scale (20-40 min)

profiles: the default takes under 10 minutes on 2 cores; --quick (for CI) under 1 minute, skips recovery,
and proves the pipeline works, not the numbers.

examples:
  python -m benchmarks                              # everything; then `make report`
  python -m benchmarks --quick
  python -m benchmarks --only table2 --turns 100 --model-latency normal:800,200
  python -m benchmarks --only overhead --overhead-rounds 3 --overhead-load 2
  OPENAI_API_KEY=... python -m benchmarks --only table2 --model openai/gpt-4o-mini

progress goes to stderr; the results folder to stdout. Also installed as the command dah-bench.

not a section of a run (its own command, a few seconds, no Temporal):
  python -m benchmarks.proxy   what the fault proxy (testbed/faults/network.py) adds to a link: round-trip latency and
                               throughput against a direct connection; goal <= 100 us added at the median
"""


def _load(text: str) -> int:
    value = whole(text)
    if not 0 <= value <= 64:
        raise argparse.ArgumentTypeError(f"{value}: CPU-bound processes are 0 to 64")
    return value


def _sizes(text: str) -> tuple[int, ...]:
    """``--scale-conversations``: a comma-separated list of conversation counts, each 1 to 1000."""
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        sizes = ()
    if not sizes or not all(1 <= n <= 1000 for n in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: conversation counts are whole numbers from 1 to 1000, "
                                         "comma-separated, e.g. 10,30,100")
    return sizes


def _chain(text: str) -> int:
    value = whole(text)
    if not 0 <= value <= 10_000:
        raise argparse.ArgumentTypeError(f"{value}: the continue-as-new size's messages are 0 (none) to 10000")
    return value


def _sections(text: str) -> tuple[str, ...]:
    return _names(text, SECTION_NAMES, "section")


def _names(text: str, known: Any, what: str) -> tuple[str, ...]:
    """A comma-separated list of ``what`` (workload, engine), each one of ``known``; else the error naming them."""
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    bad = [s for s in names if s not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(unknown(what, bad, known))
    return names


def _workloads(text: str) -> tuple[str, ...]:
    return _names(text, WORKLOADS, "workload")


def _engines(text: str) -> tuple[str, ...]:
    from benchmarks.engines_bench import ENGINE_NAMES

    return _names(",".join(canonical(s.strip()) for s in text.split(",")), ENGINE_NAMES, "engine")  # older names too


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(prog=tool("benchmarks"), description=__doc__.split("\n")[0].strip("`"),
                                epilog=runnable(EPILOG), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the CI profile: a few turns of everything but recovery")
    p.add_argument("--only", type=_sections, default=(), metavar="SECTIONS",
                   help=f"comma-separated sections to run ({','.join(SECTION_NAMES)})")
    p.add_argument("--turns", type=positive, help="measured turns per Table 2 series (default 50; quick 5)")
    p.add_argument("--workloads", type=_workloads, help="Table 2 workloads (default reply,tool)")
    p.add_argument("--overhead-rounds", type=positive, metavar="N",
                   help="run the overhead section N times and show each ratio's spread over the rounds (default 1)")
    p.add_argument("--overhead-load", type=_load, metavar="K",
                   help="run every overhead round twice, idle and with K CPU-bound processes beside it (started "
                        "and stopped by the run), and show the ratios side by side (default 0: idle only)")
    p.add_argument("--engines", type=_engines, metavar="ENGINES",
                   help=f"the engines section's engines, comma-separated (default all: {','.join(Options.engines)})")
    p.add_argument("--engines-turns", type=positive, metavar="N",
                   help="measured turns per series of the engines section (default 20; quick 3)")
    p.add_argument("--scale-conversations", type=_sizes, metavar="N,N,...",
                   help="the scale section's sizes: conversations at once in each kill_mid_turn run (default 10,30,100; "
                        "quick 2,4)")
    p.add_argument("--scale-messages", type=positive, metavar="M",
                   help="messages each conversation sends at least, at every scale size (default 20; quick 3)")
    p.add_argument("--scale-chain", type=_chain, metavar="M",
                   help="the scale section's continue-as-new size: 2 conversations of M messages each, continuing as "
                        "new every 1000 events (default 230: a chain of about 5,300 events each; 0: none; quick 0)")
    p.add_argument("--model", default="scripted",
                   help="model for the 'model' mode: 'scripted' (default: the scripted server with --model-latency) "
                        "or a LiteLLM model such as openai/gpt-4o-mini (needs its API key in the environment)")
    add_model_latency(p, default=None, default_text="lognormal:300,0.25; --quick fixed:20",
                      what="the scripted model's response latency in model mode")
    add_durability(p, choices=tuple(r.name for r in REGISTRY if r.table2),
                   help="the durable loop of Table 2: temporal (default) or checkpoint (each step checkpointed in "
                        "SQLite); with checkpoint the default sections are table2, checkpoint and micro")
    p.add_argument("--seed", type=int, default=0, help="seed of the emulated model latencies (default 0)")
    add_out(p, BENCH_FOLDER)
    add_keep_runs(p)
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    add_connection_arguments(p, embedded_default=True)
    return p


def main(argv: list[str] | None = None, private_network: bool = False) -> int:
    """``private_network`` (the command as run from a shell, ``entry``): the benchmark's servers in a network
    namespace of their own (``testbed.isolation``), where it can have one."""
    stop_on_sigterm()  # SIGTERM (kill PID, a CI job's timeout) stops the run as Ctrl-C does; it ends terminated
    from agent.env_options import EnvOptionError, check_environment

    args = build_parser().parse_args(argv)
    try:
        check_environment()
    except EnvOptionError as exc:
        print(f"{tool('benchmarks')}: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    out = runs_root(args.out, BENCH_FOLDER, tool("benchmarks"))
    overrides = {k: v for k, v in {"turns": args.turns, "workloads": args.workloads, "model": args.model,
                                   "model_latency": args.model_latency, "seed": args.seed, "out": out,
                                   "only": args.only, "durability": args.durability, "engines": args.engines,
                                   "engines_turns": args.engines_turns, "overhead_rounds": args.overhead_rounds,
                                   "overhead_load": args.overhead_load, "scale_conversations": args.scale_conversations,
                                   "scale_messages": args.scale_messages, "scale_chain": args.scale_chain}.items()
                 if v is not None}
    if overrides["durability"] == "checkpoint":
        bad = [s for s in args.only if s not in CHECKPOINT_SECTIONS]
        if bad:
            print(f"{tool('benchmarks')}: --durability checkpoint: section(s) {', '.join(bad)} measure Temporal "
                  f"itself; with checkpoint use {', '.join(CHECKPOINT_SECTIONS)}", file=sys.stderr)
            return 2
    try:
        connection = connection_from_args(args)
    except ValueError as exc:
        print(f"{tool('benchmarks')}: {exc}", file=sys.stderr)
        return 2
    if not connection.embedded:
        overrides["connection"] = connection
    options = Options.quick_profile(**overrides) if args.quick else Options(**overrides)
    if not is_scripted(options.model) and not any(k.endswith("_API_KEY") and os.environ.get(k) for k in os.environ):
        print(f"--model {options.model}: no *_API_KEY variable is set; set the provider's key (e.g. OPENAI_API_KEY) "
              "or leave --model at 'scripted'", file=sys.stderr)
        return 2
    try:
        own_out(out, BENCH_FOLDER)  # before anything starts
    except ValueError as exc:  # UnsafeFolder: another user could change it
        print(f"{tool('benchmarks')}: {exc}", file=sys.stderr)
        return 2
    say = progress()
    command = tool("benchmarks") + " " + shlex.join(redact_argv(argv if argv is not None else sys.argv[1:]))
    started = datetime.now(timezone.utc)
    if private_network:
        from testbed import isolation

        why = ("an external cluster is reached over this machine's network" if options.external else
               f"the live model {options.model} is reached over the network" if not is_scripted(options.model)
               else None)
        print(isolation.enter_private_network(why).line(), file=sys.stderr, flush=True)
    try:
        run_dir = asyncio.run(run(options, say, command.strip()))
    except KeyboardInterrupt:
        status = stopped_status()
        print(f"\n{status}: every process was stopped; finished sections are saved in the newest run under "
              f"{options.out / BENCH_FOLDER} (run.json status '{status}'; latest still points at the last complete run)",
              file=sys.stderr)
        return stopped_exit_code()
    except BenchError as exc:
        print(f"benchmark failed: {exc}\nfinished sections are saved in the newest run under "
              f"{options.out / BENCH_FOLDER} (run.json status 'failed')", file=sys.stderr)
        return 1
    prune_runs(options.out, started, args.keep_runs)
    print(f"results: {run_dir}\nreport:  make report   (or: {tool('reports')} --bench {run_dir})")
    return 0


def entry() -> None:
    """The ``dah-bench`` console script (``python -m benchmarks``)."""
    raise SystemExit(main(private_network=True))
