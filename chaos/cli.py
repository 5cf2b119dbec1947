"""``python -m chaos``: run chaos scenarios, the CI suite, or re-check a saved run.

    python -m chaos list
    python -m chaos run kill_mid_turn [--seed 7]
    python -m chaos suite                     # what `make chaos` runs; exits 1 on any fail or unknown
    python -m chaos check runs/kill_mid_turn/latest
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from chaos.scenarios import SCENARIOS, SUITE

CHECKPOINT_SCENARIOS = ("kill_mid_turn", "model_outage")  # chaos.checkpoint.CHECKPOINT_SCENARIOS (imported lazily there)

COLUMNS = [("scenario", 28), ("faults", 7), ("ok", 4), ("fail", 5), ("info", 5), ("lost", 5), ("dup_effects", 12),
           ("recovery_s", 11), ("verdict", 8)]


CHECKPOINT_SUFFIX = "@checkpoint"  # a scenario's twin on the checkpoint backend (chaos/checkpoint.py)
OLD_SUFFIX = "@journal"  # its name before the backend was called checkpoint


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


async def _run_many(names: list[str], seed: int, out: Path, parallel: int = 1, target: Any = None,
                    ui: bool = False, backend: str = "process", image: str | None = None) -> int:
    from chaos.runner import run
    from chaos.target import REFERENCE

    target = target or REFERENCE
    start = time.monotonic()
    say = _progress(start)
    results: dict[str, Any] = {}
    slots = asyncio.Semaphore(max(1, parallel))

    async def one(i: int, name: str) -> None:
        async with slots:
            say(f"scenario {i}/{len(names)}: {name} (seed {seed})")
            if name.endswith(CHECKPOINT_SUFFIX):
                from chaos.checkpoint import run_checkpoint

                result = await run_checkpoint(SCENARIOS[name.removesuffix(CHECKPOINT_SUFFIX)], seed=seed, out_root=out,
                                           progress=say)
            else:
                result = await run(SCENARIOS[name], seed=seed, out_root=out, progress=say, target=target, ui=ui,
                                   backend=backend, image=image)
            results[name] = result
            say(f"{name}: {result.verdict.upper()} in {result.wall_s:.0f}s -> {result.run_dir}")
            for c in result.checks:
                if c.verdict != "pass":
                    say(f"  {name} {c.name}: {c.verdict}: {c.summary}")

    await asyncio.gather(*(one(i, n) for i, n in enumerate(names, 1)))
    rows = [results[n].row for n in names]
    failed = [(n, results[n]) for n in names if results[n].verdict != "pass"]
    print()
    print(table(rows))
    print(f"\n{len(names)} scenario(s) in {time.monotonic() - start:.0f}s (seed {seed}); "
          f"{len(names) - len(failed)} passed, {len(failed)} not passed")
    for name, result in failed:
        print(f"  {name}: {result.verdict}; reproduce with: {result.reproduce}; artefacts in {result.run_dir}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="the named scenarios")
    p = sub.add_parser("run", help="run named scenarios (or 'all')")
    p.add_argument("scenarios", nargs="+", help=f"names: {', '.join(SCENARIOS)}, or 'all'")
    p.add_argument("--seed", type=int, default=1, help="seed of the schedule, the load and the model (default 1)")
    p.add_argument("--out", type=Path, default=Path("runs"), help="where runs are written (default runs/)")
    p.add_argument("--parallel", type=int, default=1, help="scenarios run at once, each its own cluster (default 1)")
    p.add_argument("--ui", action="store_true", help="start the Temporal Web UI and print its address, to watch")
    p.add_argument("--target", type=Path, help="a target TOML file: your own agent (default: the reference agent)")
    p.add_argument("--backend", choices=["process", "docker"], default="process",
                   help="where workers run: local processes (default) or Docker containers (needs an engine)")
    p.add_argument("--image", help="docker backend: an image with the worker installed")
    p.add_argument("--durability", choices=["temporal", "checkpoint", "journal"], default="temporal",
                   help="the agent's durability backend: temporal (default) or checkpoint (the step-checkpointed "
                        f"SQLite substrate; scenarios {', '.join(CHECKPOINT_SCENARIOS)}; journal is its old name)")
    p = sub.add_parser("suite", help="the CI suite: every named scenario; exit 1 on any fail or unknown")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("runs"))
    p.add_argument("--parallel", type=int, default=2,
                   help="scenarios run at once (default 2: each cluster mostly waits on its faults)")
    p.add_argument("--target", type=Path, help="a target TOML file: your own agent (default: the reference agent)")
    p = sub.add_parser("check", help="re-run the checkers offline on a saved run directory")
    p.add_argument("run_dir", type=Path, help="e.g. runs/kill_mid_turn/latest")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "list":
        for s in SCENARIOS.values():
            print(f"{s.name:<30} {s.description}")
        for name in CHECKPOINT_SCENARIOS:
            print(f"{name + CHECKPOINT_SUFFIX:<30} {SCENARIOS[name].description} (on the checkpoint backend)")
        return 0
    if args.command in ("run", "suite"):
        checkpoint = getattr(args, "durability", "temporal") in ("checkpoint", "journal")
        if args.command == "suite":
            names = [*SUITE, *(n + CHECKPOINT_SUFFIX for n in CHECKPOINT_SCENARIOS)]
        elif args.scenarios == ["all"]:
            names = [n + CHECKPOINT_SUFFIX for n in CHECKPOINT_SCENARIOS] if checkpoint else list(SUITE)
        else:
            names = [n.removesuffix(OLD_SUFFIX) + CHECKPOINT_SUFFIX if n.endswith(OLD_SUFFIX) else n for n in args.scenarios]
            names = [n + CHECKPOINT_SUFFIX if checkpoint and not n.endswith(CHECKPOINT_SUFFIX) else n for n in names]
        known = [*SCENARIOS, *(n + CHECKPOINT_SUFFIX for n in CHECKPOINT_SCENARIOS)]
        unknown = [n for n in names if n not in known]
        if unknown:
            print(f"python -m chaos run: unknown scenario(s) {', '.join(unknown)}; known: {', '.join(known)}",
                  file=sys.stderr)
            return 2
        try:
            if args.parallel < 1:
                print(f"--parallel {args.parallel}: must be 1 or more", file=sys.stderr)
                return 2
            target = None
            if args.target:
                from chaos.target import load_target

                try:
                    target = load_target(args.target)
                except ValueError as exc:
                    print(f"python -m chaos {args.command}: --target: {exc}", file=sys.stderr)
                    return 2
            backend, image = getattr(args, "backend", "process"), getattr(args, "image", None)
            if backend == "docker":
                from agent.envs.docker_engine import docker_engine_available

                ok, reason = docker_engine_available()
                if not ok:
                    print(f"python -m chaos {args.command}: --backend docker: {reason}; "
                          "the process backend (the default) needs no engine", file=sys.stderr)
                    return 2
                if not image:
                    print(f"python -m chaos {args.command}: --backend docker needs --image NAME (an image with the "
                          "worker installed)", file=sys.stderr)
                    return 2
            return asyncio.run(_run_many(names, args.seed, args.out, args.parallel, target, getattr(args, "ui", False),
                                         backend, image))
        except KeyboardInterrupt:
            print("\ninterrupted; the cluster was stopped; partial runs are in " + str(args.out), file=sys.stderr)
            return 130
    if args.command == "check":
        from chaos.runner import recheck

        run_dir = args.run_dir.resolve()
        if not (run_dir / "history.jsonl").exists():
            print(f"python -m chaos check: {args.run_dir} has no history.jsonl; give a run directory such as "
                  "runs/<scenario>/latest", file=sys.stderr)
            return 2
        verdict, checks, row = recheck(run_dir)
        if args.json:
            print(json.dumps({"verdict": verdict, "checks": [c.as_dict() for c in checks]}, default=str))
        else:
            for c in checks:
                print(f"{c.name:<20} {c.verdict:<8} {c.summary}")
            print(f"\nverdict: {verdict}")
        return 0 if verdict == "pass" else 1
    return 2
