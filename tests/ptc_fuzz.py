"""Generated ``run_ptc`` programs (Hypothesis): within the time and memory budget, and hash-seed free.

    python -m tests.ptc_fuzz generate --examples 2000 --out programs.json   # run them, report the budget
    PYTHONHASHSEED=3 python -m tests.ptc_fuzz replay programs.json          # what each does, as JSON
    python -m tests.ptc_fuzz corpus                                          # the hostile corpus, measured

``generate`` draws programs from a grammar built to hit the interpreter's
costly paths: shared structure (``[x] * 10000`` nested), big numbers and
``round`` digits, sets of strings rendered and branched on, sorting,
hashing, ``print`` with ``sep``/``end``, f-strings, string methods and tool
calls whose arguments come from all of that. It runs each program once,
records the largest time (CPU time, as the interpreter's backstop counts: a
busy machine's waits are not the program's) and the largest peak memory
(tracemalloc) of one program, and writes every program with what it did (tool calls, printed text, result or
error) to ``--out``. ``replay`` runs a saved list again and prints the same
record, so running it under other ``PYTHONHASHSEED`` values and comparing is
the determinism check. A fresh process each time: its peak memory is then the
programs' own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.ptc import PtcError, render_value, run_ptc

NAMES = ["a", "b", "c", "d", "s", "big", "tup", "many", "words"]
WORDS = ["alpha", "beta", "gamma", "delta", "eps", "x", ""]


def _lit() -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers(-3, 12).map(str),
        st.sampled_from(["10**300", "-10**200", "2**64", "0.5", "1e300", "None", "True", "False"]),
        st.sampled_from(WORDS).map(repr),
        st.sampled_from(["('x' * 1000)", "('ab ' * 3000)", "('\\u00e9\\n' * 50)"]),
    )


def _expr(depth: int = 2) -> st.SearchStrategy[str]:
    atom = st.one_of(_lit(), st.sampled_from(NAMES))
    if depth == 0:
        return atom
    sub = _expr(depth - 1)
    n = st.sampled_from(["0", "1", "3", "100", "1000", "10000"])
    k = st.sampled_from(["-10**7", "-400", "-5", "0", "2", "10**6"])
    return st.one_of(
        atom,
        st.tuples(sub, sub).map(lambda t: f"[{t[0]}, {t[1]}]"),
        st.tuples(sub, sub).map(lambda t: f"({t[0]}, {t[1]})"),
        st.lists(st.sampled_from(WORDS).map(repr), min_size=1, max_size=5).map(lambda w: "{" + ", ".join(w) + "}"),
        st.tuples(sub, sub).map(lambda t: f"{{{t[0]}: {t[1]}}}"),
        st.tuples(sub, n).map(lambda t: f"[{t[0]}] * {t[1]}"),
        st.tuples(sub, n).map(lambda t: f"({t[0]},) * {t[1]}"),
        n.map(lambda v: f"list(range({v}))"),
        st.tuples(sub, st.sampled_from(["+", "*", "==", "<", "!=", "in", "not in", "//", "%", "**"]), sub).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(["str", "len", "sorted", "min", "max", "set", "list", "tuple", "sum", "any",
                                   "abs", "int", "float", "bool", "enumerate"]), sub).map(lambda t: f"{t[0]}({t[1]})"),
        st.tuples(sub, k).map(lambda t: f"round({t[0]}, {t[1]})"),
        st.tuples(sub, sub).map(lambda t: f"dict(zip({t[0]}, {t[1]}))"),
        st.tuples(sub, sub).map(lambda t: f"({t[0]}).count({t[1]})"),
        st.tuples(sub, sub).map(lambda t: f"({t[0]}).index({t[1]})"),
        st.tuples(sub, st.sampled_from(["upper()", "split()", "strip()", "replace('a', 'bb')", "find('x')",
                                        "splitlines()", "keys()", "items()", "copy()"])).map(
            lambda t: f"({t[0]}).{t[1]}"),
        sub.map(lambda e: f"' '.join({e})"),
        st.tuples(st.sampled_from(NAMES), st.sampled_from(["", ":>20", ":,", ":.3", "!r", "!a"])).map(
            lambda t: f'f"<{{{t[0]}{t[1]}}}>"'),
        st.tuples(sub, sub).map(lambda t: f"({t[0]})[{t[1]}]"),
        sub.map(lambda e: f"({e})[1:3]"),
        sub.map(lambda e: f"str({e})[2:4]"),
    )


def _stmt() -> st.SearchStrategy[str]:
    e = _expr()
    name = st.sampled_from(NAMES)
    return st.one_of(
        st.tuples(name, e).map(lambda t: f"{t[0]} = {t[1]}"),
        st.tuples(name, e).map(lambda t: f"{t[0]} = [{t[1]}] * 10000"),
        st.tuples(name, name).map(lambda t: f"{t[0]} = [{t[1]}] * 10000"),
        st.tuples(name, e).map(lambda t: f"{t[0]}.append({t[1]})"),
        st.tuples(name, e, e).map(lambda t: f"{t[0]}[{t[1]}] = {t[2]}"),
        e.map(lambda x: f"if str({x})[2:3] == 'a':\n    await echo(text='A')\nelse:\n    await echo(text='B')"),
        e.map(lambda x: f"await echo(text=str({x})[:50])"),
        e.map(lambda x: f"await write_file(path='f', content={x})"),
        st.tuples(e, e, e).map(lambda t: f"print({t[0]}, {t[1]}, sep={t[2]})"),
        st.tuples(e, e).map(lambda t: f"print({t[0]}, end={t[1]})"),
        st.tuples(name, e, e).map(lambda t: f"for i in {t[1]}:\n    {t[0]} = {t[2]}"),
        st.tuples(name, e).map(lambda t: f"for i in range(200):\n    {t[0]} = [{t[0]}, {t[1]}]"),
        e.map(lambda x: f"x = {x}"),
    )


def programs() -> st.SearchStrategy[str]:
    preamble = ("a = [0] * 10\nb = 'alpha'\nc = {'k': 1}\nd = (1, 2)\ns = {'beta', 'gamma'}\n"
                "big = [[0] * 10000] * 10000\ntup = ((0,) * 10000,) * 10000\nmany = list(range(10000))\n"
                "words = ['alpha', 'beta'] * 5000\n")
    return st.lists(_stmt(), min_size=1, max_size=8).map(lambda body: preamble + "\n".join(body) + "\ns")


async def run_one(code: str) -> dict[str, Any]:
    """What a program did: its tool calls, printed text, and result or error (kind and text)."""
    calls: list[list[str]] = []

    async def echo(text: Any = "") -> str:
        calls.append(["echo", json.dumps(text, sort_keys=True)])
        return str(text)

    async def write_file(path: Any = "", content: Any = "") -> str:
        calls.append(["write_file", json.dumps({"path": path, "content": content}, sort_keys=True)[:300]])
        return "ok"

    try:
        result = await run_ptc(code, {"echo": echo, "write_file": write_file})
        outcome = {"result": render_value(result.value), "printed": result.output}
    except PtcError as e:
        outcome = {"error": e.kind, "text": str(e)}
    return {"calls": calls, **outcome}


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


#: a program that ran at least this long is run again under tracemalloc for its peak memory (allocating
#: tens of MB takes longer than this; measuring every program would triple the run)
MEASURE_MEMORY_AFTER_S = 0.005


def _traced_peak_mb(code: str) -> float:
    import tracemalloc

    tracemalloc.start()
    try:
        asyncio.run(run_one(code))
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def generate(examples: int, seed: int | None, memory_all: bool = False) -> dict[str, Any]:
    records: list[dict[str, Any]] = []
    start_peak = _peak_mb()
    slowest = [0.0, ""]
    biggest = [0.0, ""]

    @settings(max_examples=examples, deadline=None, database=None, derandomize=seed is None,
              suppress_health_check=list(HealthCheck))
    @given(programs())
    def check(code: str) -> None:
        begin = time.thread_time()
        record = asyncio.run(run_one(code))
        seconds = time.thread_time() - begin
        if seconds > slowest[0]:
            slowest[:] = [seconds, code]
        peak = _traced_peak_mb(code) if memory_all or seconds >= MEASURE_MEMORY_AFTER_S else None
        if peak is not None and peak > biggest[0]:
            biggest[:] = [peak, code]
        records.append({"code": code, "seconds": seconds, **record})

    if seed is not None:
        from hypothesis import seed as hypothesis_seed

        check = hypothesis_seed(seed)(check)
    check()
    kinds: dict[str, int] = {}
    for r in records:
        key = r.get("error", "ok")
        kinds[key] = kinds.get(key, 0) + 1
    return {"examples": len(records), "max_seconds": slowest[0], "slowest_program": slowest[1],
            "max_peak_mb": biggest[0], "biggest_program": biggest[1],
            "memory_measured": "every program" if memory_all else f"programs that ran >= {MEASURE_MEMORY_AFTER_S} s",
            "process_peak_growth_mb": _peak_mb() - start_peak, "outcomes": kinds, "programs": records}


def replay(codes: list[str]) -> list[dict[str, Any]]:
    return [asyncio.run(run_one(code)) for code in codes]


def corpus(names: set[str] | None = None) -> list[dict[str, Any]]:
    """Every hostile program of ``agent.ptc_corpus``: its CPU time, then (a second run) its peak traced memory."""
    import tracemalloc

    from agent.ptc_corpus import HOSTILE

    rows = []
    for hostile in HOSTILE:
        if names and hostile.name not in names:
            continue
        begin = time.thread_time()
        record = asyncio.run(run_one(hostile.code))
        seconds = time.thread_time() - begin
        tracemalloc.start()
        asyncio.run(run_one(hostile.code))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        rows.append({"name": hostile.name, "expect": hostile.expect, "outcome": record.get("error", "ok"),
                     "seconds": seconds, "peak_mb": peak / 2**20, "record": record})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.ptc_fuzz", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="draw programs, run them, report time and memory")
    gen.add_argument("--examples", type=int, default=500, help="how many programs (default 500)")
    gen.add_argument("--seed", type=int, help="Hypothesis seed (default: derandomized, the same programs each time)")
    gen.add_argument("--out", type=Path, required=True, help="where to write the programs and what they did (JSON)")
    gen.add_argument("--memory-all", action="store_true",
                     help=f"measure every program's peak memory (default: those that ran >= {MEASURE_MEMORY_AFTER_S} s)")
    rep = sub.add_parser("replay", help="run saved programs again; print what each did (JSON)")
    rep.add_argument("file", type=Path, help="a file written by generate")
    cor = sub.add_parser("corpus", help="run the hostile corpus (agent/ptc_corpus.py): time, memory, outcome (JSON)")
    cor.add_argument("--names", default="", help="comma-separated program names (default: all)")
    args = parser.parse_args(argv)
    if args.command == "corpus":
        print(json.dumps(corpus({n for n in args.names.split(",") if n})))
        return 0
    if args.command == "generate":
        if args.examples < 1:
            parser.error(f"--examples must be at least 1, got {args.examples}")
        report = generate(args.examples, args.seed, args.memory_all)
        args.out.write_text(json.dumps(report))
        print(json.dumps({k: v for k, v in report.items() if k not in ("programs", "slowest_program", "biggest_program")}))
        return 0
    if not args.file.is_file():
        parser.error(f"{args.file}: no such file")
    codes = [p["code"] for p in json.loads(args.file.read_text())["programs"]]
    print(json.dumps(replay(codes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
