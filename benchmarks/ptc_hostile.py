"""Measure the hostile ``run_ptc`` corpus: time, memory and outcome of every program.

    python -m benchmarks.ptc_hostile                   # the interpreter in this checkout
    python -m benchmarks.ptc_hostile --module OLD.py   # another copy (e.g. from `git show REV:agent/ptc.py`)
    python -m benchmarks.ptc_hostile --only shared_eq,round_huge_ndigits --timeout 30

Each program runs in its own subprocess (so a runaway one is killed at
``--timeout`` and cannot take the machine's memory: its address space is
capped at ``--memory-cap-mb``), and the table shows wall time, the peak
resident memory the program added, and the outcome: ``ok``, the kind of
``PtcError`` it raised, ``killed`` (timeout) or ``crash`` (the process died, e.g.
out of memory). Programs in the determinism set also run under several hash
seeds; the last column says whether every seed made the same tool calls,
printed the same text and returned the same result.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from agent.ptc_corpus import DETERMINISM, HOSTILE
from harness.commands import CommandParser, tool

_CHILD = r"""
import asyncio, importlib.util, json, resource, sys, time
spec = importlib.util.spec_from_file_location("ptc_under_test", sys.argv[1])
ptc = importlib.util.module_from_spec(spec); sys.modules["ptc_under_test"] = ptc; spec.loader.exec_module(ptc)
code = sys.stdin.read()
calls = []
async def echo(text=""):
    calls.append(["echo", text]); return text
async def write_file(path="", content=""):
    calls.append(["write_file", path, json.dumps({"path": path, "content": content}, sort_keys=True)[:200]])
    return "ok"
render = getattr(ptc, "render_value", repr)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
try:
    result = asyncio.run(ptc.run_ptc(code, {"echo": echo, "write_file": write_file}))
    outcome, detail = "ok", render(result.value)[:300] + " | printed " + repr(result.output[:100])
except ptc.PtcError as e:
    outcome, detail = e.kind, str(e)[:300]
except BaseException as e:
    outcome, detail = "unclassified", f"{type(e).__name__}: {str(e)[:200]}"
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"outcome": outcome, "detail": detail, "seconds": seconds, "mb": (peak - base) / 1024,
                  "calls": calls}))
"""


def run_one(module: Path, code: str, *, timeout: float, memory_cap_mb: int, hash_seed: str = "0") -> dict:
    def cap() -> None:
        import resource

        limit = memory_cap_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(module)], input=code, capture_output=True,
                              text=True, timeout=timeout, env=env, preexec_fn=cap)
    except subprocess.TimeoutExpired:
        return {"outcome": "killed", "detail": f"still running after {timeout:g} s", "seconds": timeout, "mb": None}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"outcome": "crash", "detail": tail[:200], "seconds": time.perf_counter() - start, "mb": None}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog=tool("benchmarks.ptc_hostile"), description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--module", type=Path, default=Path(__file__).resolve().parent.parent / "agent" / "ptc.py",
                        help="the interpreter's source file to measure (default: agent/ptc.py of this checkout)")
    parser.add_argument("--only", default="", help="comma-separated corpus names (default: all)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds before a program is killed (default 30)")
    parser.add_argument("--memory-cap-mb", type=int, default=4096,
                        help="address-space cap of each program's process (default 4096)")
    parser.add_argument("--seeds", default="1,2,3,4,5,6", help="hash seeds of the determinism check")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    args = parser.parse_args(argv)
    if not args.module.is_file():
        parser.error(f"--module {args.module}: no such file")
    wanted = {n for n in args.only.split(",") if n}
    unknown = wanted - {h.name for h in HOSTILE}
    if unknown:
        parser.error(f"--only: unknown program(s) {', '.join(sorted(unknown))}; known: {', '.join(h.name for h in HOSTILE)}")
    programs = [h for h in HOSTILE if not wanted or h.name in wanted]
    seeds = [s for s in args.seeds.split(",") if s]
    rows = []
    print(f"{'program':26} {'expect':10} {'outcome':12} {'seconds':>8} {'+MB':>7}  same across seeds", flush=True)
    for h in programs:
        row = run_one(args.module, h.code, timeout=args.timeout, memory_cap_mb=args.memory_cap_mb)
        same = ""
        if h in DETERMINISM:
            seen = {json.dumps([r.get("outcome"), r.get("detail"), r.get("calls")])
                    for r in (run_one(args.module, h.code, timeout=args.timeout, memory_cap_mb=args.memory_cap_mb,
                                      hash_seed=s) for s in seeds)}
            same = "yes" if len(seen) == 1 else f"NO ({len(seen)} different outcomes over {len(seeds)} seeds)"
        row.update(name=h.name, expect=h.expect, same_across_seeds=same)
        rows.append(row)
        mb = "-" if row.get("mb") is None else f"{row['mb']:.1f}"
        print(f"{h.name:26} {h.expect:10} {row['outcome']:12} {row['seconds']:8.2f} {mb:>7}  {same}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    worst = max(rows, key=lambda r: r["seconds"]) if rows else None
    if worst:
        print(f"slowest: {worst['name']} {worst['seconds']:.2f} s; "
              f"unexpected outcomes: {sum(r['outcome'] != r['expect'] for r in rows)} of {len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
