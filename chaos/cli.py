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

COLUMNS = [("scenario", 28), ("faults", 7), ("ok", 4), ("fail", 5), ("info", 5), ("lost", 5), ("dup_effects", 12),
           ("recovery_s", 11), ("verdict", 8)]


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


async def _run_many(names: list[str], seed: int, out: Path) -> int:
    from chaos.runner import run

    start = time.monotonic()
    say = _progress(start)
    rows, failed = [], []
    for i, name in enumerate(names, 1):
        say(f"scenario {i}/{len(names)}: {name} (seed {seed})")
        result = await run(SCENARIOS[name], seed=seed, out_root=out, progress=say)
        rows.append(result.row)
        say(f"{name}: {result.verdict.upper()} in {result.wall_s:.0f}s -> {result.run_dir}")
        for c in result.checks:
            if c.verdict != "pass":
                say(f"  {c.name}: {c.verdict}: {c.summary}")
        if result.verdict != "pass":
            failed.append((name, result))
    print()
    print(table(rows))
    print(f"\n{len(names)} scenario(s) in {time.monotonic() - start:.0f}s (seed {seed}); "
          f"{len(names) - len(failed)} passed, {len(failed)} not passed")
    for name, result in failed:
        print(f"  {name}: {result.verdict}; reproduce with: python -m chaos run {name} --seed {seed}; "
              f"artefacts in {result.run_dir}")
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
    p = sub.add_parser("suite", help="the CI suite: every named scenario; exit 1 on any fail or unknown")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("runs"))
    p = sub.add_parser("check", help="re-run the checkers offline on a saved run directory")
    p.add_argument("run_dir", type=Path, help="e.g. runs/kill_mid_turn/latest")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "list":
        for s in SCENARIOS.values():
            print(f"{s.name:<30} {s.description}")
        return 0
    if args.command in ("run", "suite"):
        names = SUITE if args.command == "suite" or args.scenarios == ["all"] else args.scenarios
        unknown = [n for n in names if n not in SCENARIOS]
        if unknown:
            print(f"python -m chaos run: unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}",
                  file=sys.stderr)
            return 2
        try:
            return asyncio.run(_run_many(names, args.seed, args.out))
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
