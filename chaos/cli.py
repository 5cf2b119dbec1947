"""``python -m chaos``: run chaos scenarios, the CI suite, or re-check a saved run.

    python -m chaos list
    python -m chaos run kill_mid_turn [--seed 7] [--durability checkpoint] [--target FILE] [--backend docker --image I]
    python -m chaos suite                     # what `make chaos` runs; exits 1 on any fail, unknown or error
    python -m chaos soak kill_mid_turn --seeds 1-100    # one scenario over many seeds; the verdict distribution
    python -m chaos planted                   # every planted bug must be caught; the table of who caught it
    python -m chaos check runs/kill_mid_turn/latest     # the checkers again, offline, on a saved run (anywhere)
    python -m chaos rerun runs/mutant/20261122T201530Z  # a run again, from the scenario its run.json saved
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from chaos.checker import FAULT_CHECKERS
from chaos.client import DEFAULT_TIMEOUTS, TIMEOUTS
from chaos.scenarios import SCENARIOS, SUITE
from chaos.soak import DEFAULT_SEEDS
from harness.rundir import command_line

COLUMNS = [("scenario", 28), ("faults", 7), ("ok", 4), ("fail", 5), ("info", 5), ("lost", 5), ("dup_effects", 12),
           ("recovery_s", 11), ("model_rec_s", 12), ("tool_rec_s", 11),
           ("wft_rec_s", 10), ("checked", 8), ("verdict", 8)]
#: a scenario under a timeouts profile other than the default is SCENARIO~PROFILE (e.g. kill_idle~defaults)
TIMEOUTS_SEPARATOR = "~"
#: a scenario's twin on the checkpoint backend is SCENARIO@checkpoint (@journal: its old name)
CHECKPOINT_SUFFIX, OLD_SUFFIX = "@checkpoint", "@journal"


def table(rows: list[dict[str, Any]]) -> str:
    header = " ".join(f"{name:<{w}}" for name, w in COLUMNS)
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(" ".join(f"{'-' if r.get(name) is None else r.get(name)!s:<{w}}" for name, w in COLUMNS))
    return "\n".join(lines)


def _progress(start: float):
    def say(message: str) -> None:
        print(f"[{time.monotonic() - start:6.1f}s] {message}", flush=True)
    return say


def _checkpoint_twins() -> list[str]:
    from chaos.backends.checkpoint import CheckpointBackend

    return list(CheckpointBackend().scenarios or ())


async def _run_many(jobs: list[tuple[str, Any, Any]], seed: int, out: Path, parallel: int = 1,
                    ui: bool = False) -> int:
    """``jobs``: (label, scenario, backend); the table at the end; 1 if any did not pass.

    A scenario whose run raises (a worker dying at setup, a port clash, a harness bug) is recorded ``failed`` in
    its own run directory and shows as ``error`` in its row; the others go on. Ctrl-C stops them all."""
    from chaos.soak import PASS, run_captured

    start = time.monotonic()
    say = _progress(start)
    results: dict[str, Any] = {}
    slots = asyncio.Semaphore(max(1, parallel))

    async def one(i: int, label: str, scenario: Any, backend: Any) -> None:
        async with slots:
            say(f"scenario {i}/{len(jobs)}: {label} (seed {seed})")
            result = await run_captured(label, scenario, backend, seed=seed, out_root=out, progress=say, ui=ui)
            results[label] = result
            if result.error:
                say(f"{label}: ERROR after {result.wall_s:.0f}s -> {result.run_dir}")
                for line in result.lines():
                    say(f"  {label} {line}")
                say(f"  {label} reproduce with: {result.reproduce}")
                return
            say(f"{label}: {result.verdict.upper()} in {result.wall_s:.0f}s -> {result.run_dir}")
            for c in result.checks:
                if c.verdict != "pass" and not (c.verdict == "not_applicable" and c.name in FAULT_CHECKERS):
                    say(f"  {label} {c.name}: {c.verdict}: {c.summary}")

    await asyncio.gather(*(one(i, *job) for i, job in enumerate(jobs, 1)))
    labels = [label for label, _, _ in jobs]
    failed = [(n, results[n]) for n in labels if results[n].verdict != PASS]
    print()
    print(table([results[n].row for n in labels]))
    print(f"\n{len(labels)} scenario(s) in {time.monotonic() - start:.0f}s (seed {seed}); "
          f"{len(labels) - len(failed)} passed, {len(failed)} not passed")
    for name, result in failed:
        why = f"error: {result.error_line}" if result.error else result.verdict
        print(f"  {name}: {why}; reproduce with: {result.reproduce}; artefacts in {result.run_dir}")
    return 1 if failed else 0


async def _soak(args: argparse.Namespace, target: Any) -> int:
    from chaos.soak import format_seeds, soak

    [(label, scenario, backend)] = _jobs(args, target)
    reproduce = command_line("python -m chaos soak", {"--seeds": format_seeds(args.seeds), **backend.reproduce()},
                             [label])
    return await soak(label, scenario, backend, args.seeds, args.out, reproduce=reproduce,
                      say=_progress(time.monotonic()), verbose=args.verbose)


def _jobs(args: argparse.Namespace, target: Any) -> list[tuple[str, Any, Any]]:
    """(label, scenario, backend) for every scenario asked for; raises ValueError naming an unknown one."""
    from chaos.backends import make_backend

    twins = _checkpoint_twins()
    checkpoint = getattr(args, "durability", "temporal") in ("checkpoint", "journal")
    if args.command == "soak" and args.scenarios == ["all"]:
        raise ValueError("soak runs one scenario; name it (python -m chaos list)")
    if args.command == "suite":
        names = [*SUITE, *(n + CHECKPOINT_SUFFIX for n in twins)]
    elif args.scenarios == ["all"]:
        names = [n + CHECKPOINT_SUFFIX for n in twins] if checkpoint else list(SUITE)
    else:
        names = [n.removesuffix(OLD_SUFFIX) + CHECKPOINT_SUFFIX if n.endswith(OLD_SUFFIX) else n
                 for n in args.scenarios]
        names = [n + CHECKPOINT_SUFFIX if checkpoint and not n.endswith(CHECKPOINT_SUFFIX) else n for n in names]
    known = [*SCENARIOS, *(n + CHECKPOINT_SUFFIX for n in twins)]
    pinned = {}  # NAME~PROFILE (as a run under another profile names itself): that profile only
    for i, n in enumerate(names):
        base, sep, profile = n.partition(TIMEOUTS_SEPARATOR)
        if sep:
            if profile not in TIMEOUTS:
                raise ValueError(f"{n}: unknown timeouts profile {profile!r}; profiles are {', '.join(TIMEOUTS)}")
            names[i] = base
            pinned[base] = [profile]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(known)}")
    jobs = []
    profiles = getattr(args, "timeouts", [DEFAULT_TIMEOUTS])
    for label in names:
        base = label.removesuffix(CHECKPOINT_SUFFIX)
        checkpoint_twin = label.endswith(CHECKPOINT_SUFFIX)
        backend = make_backend("checkpoint" if checkpoint_twin else "temporal",
                               getattr(args, "backend", "process"), getattr(args, "image", None), target,
                               getattr(args, "target", None))
        for profile in ([DEFAULT_TIMEOUTS] if checkpoint_twin else pinned.get(label, profiles)):  # Temporal only
            if profile == DEFAULT_TIMEOUTS:
                jobs.append((label, SCENARIOS[base], backend))
                continue
            name = f"{base}{TIMEOUTS_SEPARATOR}{profile}"  # its own runs/<name>/, its own row
            jobs.append((name, dataclasses.replace(SCENARIOS[base], name=name, timeouts=profile), backend))
    return jobs


def _rerun(run_dir: Path) -> tuple[Any, Any, int]:
    """(scenario, backend, seed) as a saved run recorded them."""
    from chaos.backends import make_backend
    from chaos.scenarios import scenario_from_dict
    from chaos.target import load_target
    from harness.rundir import RunDir

    record = RunDir(run_dir).read_run()
    if record.get("kind") != "chaos" or "scenario" not in record:
        raise ValueError(f"{run_dir} is not a chaos run directory (no scenario in its run.json)")
    backend = record.get("backend") or {}
    target_file = backend.get("target_file")
    target = load_target(Path(target_file)) if target_file else None
    durability = "checkpoint" if backend.get("name") == "checkpoint" else "temporal"
    return (scenario_from_dict(record["scenario"]),
            make_backend(durability, backend.get("workers") or "process", backend.get("image"), target,
                         Path(target_file) if target_file else None),
            int(record.get("seed", 1)))


def _check_engine(args: argparse.Namespace) -> str | None:
    """For --backend docker: an engine (started here if installed and not running) and an image (the reference
    agent's worker image, built from this checkout if missing, unless --image names one). None, or the problem."""
    if getattr(args, "backend", "process") != "docker":
        return None
    from testbed.dockerd import ensure_engine

    engine = ensure_engine()  # an engine started here is stopped when this command exits
    if not engine.available:
        return f"--backend docker: {engine.reason}; the process backend (the default) needs no engine"
    if not args.image:
        if getattr(args, "target", None):
            return "--backend docker with --target needs --image NAME (an image with your agent's worker installed)"
        from testbed.images import ImageBuildError, worker_image

        try:
            args.image = worker_image()
        except ImageBuildError as exc:
            return f"--backend docker: could not build the worker image: {exc}; or pass --image NAME"
    return None


def _timeouts(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in TIMEOUTS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: profiles are {', '.join(TIMEOUTS)} (comma-separated)")
    return list(dict.fromkeys(names))


def _seeds(text: str) -> list[int]:
    from chaos.soak import parse_seeds

    try:
        return parse_seeds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="the named scenarios")

    def out_and_target(p: argparse.ArgumentParser, parallel: int | None = None) -> None:
        p.add_argument("--out", type=Path, default=Path("runs"), help="where runs are written (default runs/)")
        if parallel is not None:
            p.add_argument("--parallel", type=int, default=parallel,
                           help=f"scenarios run at once, each its own cluster (default {parallel})")
        p.add_argument("--target", type=Path, help="a target TOML file: your own agent (default: the reference "
                                                   "agent; see chaos/target.py)")

    def common(p: argparse.ArgumentParser, parallel: int) -> None:
        p.add_argument("--seed", type=int, default=1, help="seed of the schedule, the load and the model (default 1)")
        out_and_target(p, parallel)

    def backend_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--backend", choices=["process", "docker"], default="process",
                       help="where workers run: local processes (default) or Docker containers (needs an engine)")
        p.add_argument("--image", help="docker backend: an image with the worker installed (default: dah-worker, "
                                       "built from this checkout and this machine's files: python -m testbed.images)")
        p.add_argument("--timeouts", type=_timeouts, default=[DEFAULT_TIMEOUTS], metavar="PROFILE[,PROFILE]",
                       help="how fast the agent notices a dead worker (Temporal backend): "
                            + "; ".join(f"{t.name}: {t.description}" for t in TIMEOUTS.values())
                            + f" (default {DEFAULT_TIMEOUTS}). Two, comma-separated, run every scenario under each, "
                              "side by side in one table (e.g. fast,defaults)")
        p.add_argument("--durability", choices=["temporal", "checkpoint", "journal"], default="temporal",
                       help="the agent's durability backend: temporal (default) or checkpoint (the step-checkpointed "
                            "SQLite substrate; scenarios " + ", ".join(_checkpoint_twins()) + "; journal is its old "
                            "name)")

    p = sub.add_parser("run", help="run named scenarios (or 'all')")
    p.add_argument("scenarios", nargs="+", help=f"names: {', '.join(SCENARIOS)}, or 'all'")
    common(p, 1)
    p.add_argument("--ui", action="store_true", help="start the Temporal Web UI and print its address, to watch")
    backend_options(p)
    p = sub.add_parser("suite", help="the CI suite: every named scenario; exit 1 on any fail, unknown or error")
    common(p, 2)
    p = sub.add_parser("soak", help="one scenario over many seeds, one after another; the verdict distribution; "
                                    "exit 1 unless every seed passed")
    p.add_argument("scenarios", nargs=1, metavar="SCENARIO", help=f"a name: {', '.join(SCENARIOS)}")
    p.add_argument("--seeds", type=_seeds, default=_seeds(DEFAULT_SEEDS),
                   help=f"the seeds: ranges and single seeds, e.g. 1-100 or 1-20,25,30-32 (default {DEFAULT_SEEDS})")
    out_and_target(p)
    backend_options(p)
    p = sub.add_parser("planted", help="the planted-bug catalogue: broken agents that must not pass "
                                       "(python -m chaos planted --help)", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p = sub.add_parser("check", help="re-run the checkers offline on a saved run directory")
    p.add_argument("run_dir", type=Path, help="e.g. runs/kill_mid_turn/latest")
    p.add_argument("--target", type=Path, help="the target file on this machine, when the run came from another "
                                               "(where its interpreter and code are, for the replay checker)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p = sub.add_parser("rerun", help="run a saved run's scenario again (its seed, backend and target)")
    p.add_argument("run_dir", type=Path, help="a chaos run directory, e.g. runs/kill_mid_turn/latest")
    p.add_argument("--out", type=Path, default=Path("runs"), help="where the new run is written (default runs/)")
    return parser


def _terminate_like_ctrl_c() -> None:
    """SIGTERM (``kill PID``, a CI runner's timeout) stops a run as Ctrl-C does: the run directory says
    ``interrupted``, a soak keeps its summary, and every process the run started is stopped. (A background job
    of a non-interactive shell ignores SIGINT, so SIGTERM is how it is stopped.)"""
    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _terminate_like_ctrl_c()
    if argv[:1] == ["planted"]:
        from chaos.planted import main as planted

        return planted(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prog = f"python -m chaos {args.command}"
    if args.command == "list":
        for s in SCENARIOS.values():
            print(f"{s.name:<30} {s.description}")
        for name in _checkpoint_twins():
            print(f"{name + CHECKPOINT_SUFFIX:<30} {SCENARIOS[name].description} (on the checkpoint backend)")
        return 0
    if args.command == "check":
        from chaos.runner import check

        run_dir = args.run_dir.resolve()
        from harness.rundir import RunDir

        if not RunDir(run_dir).operations.exists():
            print(f"{prog}: {args.run_dir} has no operations.jsonl (nor a history.jsonl); give a run directory "
                  "such as runs/<scenario>/latest", file=sys.stderr)
            return 2
        here = None
        if args.target:
            from chaos.target import load_target

            try:
                t = load_target(args.target)
            except ValueError as exc:
                print(f"{prog}: {exc}", file=sys.stderr)
                return 2
            here = {"python": t.python, "cwd": t.cwd, "env": t.env, **t.replay_declarations()}
        verdict, checks, _ = check(run_dir, here)
        if args.json:
            print(json.dumps({"verdict": verdict, "checks": [c.as_dict() for c in checks]}, default=str))
        else:
            for c in checks:
                print(f"{c.name:<20} {c.verdict:<15} {c.summary}")
            print(f"\nverdict: {verdict}")
        return 0 if verdict == "pass" else 1
    try:
        if args.command == "rerun":
            scenario, backend, seed = _rerun(args.run_dir)
            if getattr(backend, "workers", "process") == "docker":
                problem = _check_engine(argparse.Namespace(backend="docker", image=backend.image, target=None))
                if problem:
                    print(f"{prog}: {problem}", file=sys.stderr)
                    return 2
            return asyncio.run(_run_many([(scenario.name + backend.suffix, scenario, backend)], seed, args.out))
        if getattr(args, "parallel", 1) < 1:
            print(f"{prog}: --parallel {args.parallel}: must be 1 or more", file=sys.stderr)
            return 2
        target = None
        if args.target:
            from chaos.target import load_target

            target = load_target(args.target)
        problem = _check_engine(args)
        if problem:
            print(f"{prog}: {problem}", file=sys.stderr)
            return 2
        if args.command == "soak":
            return asyncio.run(_soak(args, target))
        jobs = _jobs(args, target)
        return asyncio.run(_run_many(jobs, args.seed, args.out, args.parallel, getattr(args, "ui", False)))
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\ninterrupted; the cluster was stopped; partial runs are in {args.out} (status interrupted)",
              file=sys.stderr)
        return 130
    finally:
        from testbed.dockerd import stop_started_engines

        stop_started_engines()  # python -m chaos leaves through os._exit, which runs no atexit hooks
