"""What the task planner costs the scripted model: its latency per request beside today's routes, in one run.

    .venv/bin/python -m benchmarks.model_planner [--requests 400] [--json PATH]

One scripted model server (no added latency, recording tasks as a chaos run does), one keep-alive HTTP client, and
three kinds of request sent in turn, round-robin, so the machine's noise falls on each alike:

- ``convention``: "What is 6 * 7?" with a calculator declared: today's route (the model calls the calculator);
- ``task step``: a task's first step with three tools declared, one taking nested objects with enums and arrays
  (the planner draws that call's arguments from the schema: a cache miss, each request a new token);
- ``task final``: a task's answer after its steps (the plan's calls already in the conversation).

It prints the p50 and p90 of each, in milliseconds, and each task kind's p50 over the convention's. A benchmark,
not a test: it reports figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness.model_record import make_token

NESTED = {"type": "object", "required": ["request"], "$defs": {
    "Traveller": {"type": "object", "required": ["name", "kind"], "properties": {
        "name": {"type": "string"}, "kind": {"enum": ["adult", "child", "infant"]},
        "ages": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 120}}}}},
    "properties": {"request": {"type": "object", "required": ["travellers", "nights"], "properties": {
        "travellers": {"type": "array", "items": {"$ref": "#/$defs/Traveller"}, "minItems": 1},
        "nights": {"type": "integer", "minimum": 1, "maximum": 30}}}}}
TOOLS = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in (
    ("calculator", {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}),
    ("plan_trip", NESTED),
    ("lookup", {"type": "object", "properties": {"q": {"type": "string"}, "limit": {"type": "integer"}}}))]


def bodies(i: int) -> dict[str, dict[str, Any]]:
    """The three requests of round ``i`` (a new token each round: no plan is cached across rounds)."""
    token = make_token("bench0", 0, i)
    user = {"role": "user", "content": f"Please take care of request {token}."}
    steps = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{i}_{k}", "type": "function", "function": {"name": "lookup", "arguments": "{\"q\": \"x\"}"}}]}
        for k in range(3)]
    done = [m for k, s in enumerate(steps) for m in (s, {"role": "tool", "tool_call_id": f"call_{i}_{k}",
                                                         "content": "ok"})]
    return {"convention": {"model": "gpt-4o", "messages": [{"role": "user", "content": "What is 6 * 7?"}],
                           "tools": TOOLS[:1]},
            "task step": {"model": "gpt-4o", "messages": [user], "tools": TOOLS},
            "task final": {"model": "gpt-4o", "messages": [user, *done], "tools": TOOLS}}


def measure(requests: int) -> dict[str, Any]:
    import httpx

    from testbed.model_server import ScriptedModelServer
    from testbed.scripted_routes import respond
    from testbed.task_planner import warm

    warm()
    samples: dict[str, list[float]] = {k: [] for k in bodies(0)}
    with tempfile.TemporaryDirectory() as tmp, ScriptedModelServer(respond, record=Path(tmp) / "record.jsonl") as s:
        with httpx.Client(base_url=s.url, timeout=30) as client:
            for i in range(requests + 20):
                for kind, body in bodies(i).items():
                    started = time.perf_counter()
                    client.post("/chat/completions", json=body).raise_for_status()
                    if i >= 20:  # the first rounds warm the connection and the imports
                        samples[kind].append((time.perf_counter() - started) * 1000)
    out: dict[str, Any] = {"requests_each": requests}
    for kind, ms in samples.items():
        ms.sort()
        out[kind] = {"p50_ms": round(statistics.median(ms), 3), "p90_ms": round(ms[int(len(ms) * 0.9)], 3)}
    base = out["convention"]["p50_ms"]
    out["ratio_p50"] = {k: round(out[k]["p50_ms"] / base, 2) for k in ("task step", "task final")}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.model_planner", description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=400, help="requests of each kind (default 400)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    figures = measure(args.requests)
    for kind in ("convention", "task step", "task final"):
        f = figures[kind]
        ratio = figures["ratio_p50"].get(kind)
        print(f"{kind:12} p50 {f['p50_ms']:7.2f} ms  p90 {f['p90_ms']:7.2f} ms"
              + (f"  {ratio:.2f}x the convention's p50" if ratio else ""))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
