"""Micro-benchmarks of the harness's hot pieces (pytest-benchmark).

Not part of ``make test`` (``testpaths = ["tests"]``); run them with::

    python -m pytest benchmarks/micro -q -p no:cacheprovider --benchmark-json=/tmp/micro.json
    python -m pytest benchmarks/micro -q -p no:cacheprovider --benchmark-max-time=0.05 --benchmark-min-rounds=3

What is measured, and why each piece is hot:

- ``payload``: a round trip through Temporal's default payload converter
  (``to_payloads`` then ``from_payloads``) of ``PlanInput`` with a
  conversation of 10 and of 200 OpenAI-format messages, and of the
  ``AgentInput`` that continue-as-new carries with 200 messages. Every agent
  step sends the whole conversation to the model activity, so this cost is
  paid on every step, on both sides of the workflow/activity boundary, and it
  grows with the conversation (the payload's size is recorded in
  ``extra_info``).
- ``ptc``: the programmatic-tool-calling interpreter (``agent.ptc.run_ptc``),
  an AST walker written in Python. It runs inside workflow tasks, so its cost
  is paid again on every replay (a worker restart, a cache eviction, the
  replay checker). Measured: a 200-iteration loop of arithmetic and string
  building, and 20 inner tool calls to a trivial async tool, fanned out with
  ``asyncio.gather`` and awaited one by one.
- ``checkers``: the offline checkers that only read files (``lost``,
  ``stats``, ``effects``, ``injection_evidence``) run on every chaos run's
  saved history; measured on a consistent synthetic run of 50 conversations
  and 10,000 client operations (history lines; ``conftest.build_run_dir``),
  each asserted to say ``pass``. ``temporal_history`` and ``replay`` need
  saved Temporal histories and a replayer, and are not measured here.
- ``history``: ``harness.operations.load`` + ``pairs`` on that 10,000-operation
  ``operations.jsonl``: the first thing every checker does.

Every benchmark asserts its result, so a broken converter, interpreter,
checker or synthetic run fails the benchmark instead of timing garbage.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from temporalio.converter import DataConverter

from agent.contracts import AgentConfig, AgentInput, PlanInput
from agent.ptc import PtcLimits, PtcResult, run_ptc
from harness import operations as hist
from chaos.checker.verdict import run_checkers
from harness.verdict import PASS

CONVERTER = DataConverter.default.payload_converter
TOOLS = ["calculator", "weather", "write_file", "append_file", "read_file", "list_files"]
SYSTEM = ("You are a durable agent. Use the tools for arithmetic, weather and files; files live in your private "
          "workspace and paths are relative to it. When a tool reports an error, repair your call or explain the "
          "failure. Answer concisely.")


# --------------------------------------------------------------------------- payload conversion


def conversation(n_messages: int) -> list[dict[str, Any]]:
    """``n_messages`` OpenAI chat messages: a system prompt, then turns of user / assistant tool call / tool result /
    assistant reply (the last turn cut short if need be)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    turn = 0
    while len(messages) < n_messages:
        a, b = 17 + 31 * turn % 977, 3 + 7 * turn % 89
        call_id = f"call_{turn}_0"
        messages += [
            {"role": "user", "content": f"What is {a} * {b}? Then append the answer to log-{turn % 5}.txt."},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": call_id, "type": "function",
                             "function": {"name": "calculator", "arguments": json.dumps({"expression": f"{a} * {b}"})}}]},
            {"role": "tool", "tool_call_id": call_id, "name": "calculator", "content": str(a * b)},
            {"role": "assistant", "content": f"{a} * {b} = {a * b}; I appended it to log-{turn % 5}.txt."},
        ]
        turn += 1
    return messages[:n_messages]


def round_trip(value: Any, type_: type) -> tuple[Any, int]:
    payloads = CONVERTER.to_payloads([value])
    (out,) = CONVERTER.from_payloads(payloads, [type_])
    return out, payloads[0].ByteSize()


@pytest.mark.benchmark(group="payload")
@pytest.mark.parametrize("n_messages", [10, 200])
def test_payload_plan_input_round_trip(benchmark: Any, n_messages: int) -> None:
    value = PlanInput.of("scripted", conversation(n_messages), list(TOOLS))
    assert len(value.message_list()) == n_messages
    out, size = benchmark(round_trip, value, PlanInput)
    assert out == value
    assert isinstance(out, PlanInput)
    benchmark.extra_info.update(messages=n_messages, payload_bytes=size)


@pytest.mark.benchmark(group="payload")
def test_payload_agent_input_continue_as_new_round_trip(benchmark: Any) -> None:
    value = AgentInput(config=AgentConfig(), messages=conversation(200), turns=50, run_index=3, children_started=2,
                       detached_results={"sub-1": ["ok", "42"]})
    out, size = benchmark(round_trip, value, AgentInput)
    assert out == value
    assert isinstance(out.config, AgentConfig) and isinstance(out.config.ptc, PtcLimits)
    benchmark.extra_info.update(messages=200, payload_bytes=size)


# --------------------------------------------------------------------------- PTC interpreter

LOOP_PROGRAM = textwrap.dedent(
    """
    parts = []
    total = 0
    for i in range(200):
        x = (i * 7 + 3) % 11
        total += x * x - i // 3
        if i % 2 == 0:
            parts.append(f"{i}:{x}")
        else:
            parts.append(str(total))
    text = ",".join(parts)
    (total, len(text), text[:24])
    """
).strip("\n")

GATHER_PROGRAM = textwrap.dedent(
    """
    results = await asyncio.gather(*[fetch(n=i) for i in range(20)])
    total = 0
    for r in results:
        total += r["square"]
    total
    """
).strip("\n")

SEQUENTIAL_PROGRAM = textwrap.dedent(
    """
    total = 0
    for i in range(20):
        r = await fetch(n=i)
        total += r["square"]
    total
    """
).strip("\n")


async def fetch(n: int) -> dict[str, int]:
    return {"n": n, "square": n * n}


def native(code: str) -> Any:
    """What CPython makes of the same program (the interpreter must agree)."""
    *body, last = code.splitlines()
    scope: dict[str, Any] = {}
    exec("\n".join(body), scope)  # noqa: S102 - our own constant program
    return eval(last, scope)  # noqa: S307


@pytest.mark.benchmark(group="ptc")
def test_ptc_loop_arithmetic_and_strings(benchmark: Any, bench_loop: asyncio.AbstractEventLoop) -> None:
    limits = PtcLimits()
    result: PtcResult = benchmark(lambda: bench_loop.run_until_complete(run_ptc(LOOP_PROGRAM, {}, limits=limits)))
    assert result.value == native(LOOP_PROGRAM)
    assert result.tool_calls == 0 and result.operations <= limits.max_operations
    benchmark.extra_info.update(operations=result.operations)


@pytest.mark.benchmark(group="ptc")
@pytest.mark.parametrize("program", ["gather", "sequential"])
def test_ptc_20_tool_calls(benchmark: Any, bench_loop: asyncio.AbstractEventLoop, program: str) -> None:
    code = GATHER_PROGRAM if program == "gather" else SEQUENTIAL_PROGRAM
    tools = {"fetch": fetch}
    result: PtcResult = benchmark(lambda: bench_loop.run_until_complete(run_ptc(code, tools)))
    assert result.value == sum(i * i for i in range(20))
    assert result.tool_calls == 20
    benchmark.extra_info.update(operations=result.operations, tool_calls=result.tool_calls)


# --------------------------------------------------------------------------- checkers and history

FILE_CHECKERS = ["lost", "stats", "effects", "injection_evidence"]


@pytest.mark.benchmark(group="checkers")
@pytest.mark.parametrize("checker", FILE_CHECKERS)
def test_checkers_on_large_history(benchmark: Any, synthetic_run: tuple[Path, dict[str, int]], checker: str) -> None:
    run_dir, sizes = synthetic_run
    # A fresh RunData per round (run_checkers builds one): the files are read and parsed every time, as in a run.
    # (All four together cost about their sum less the shared history load; not measured separately, to keep the
    # quick profile short.)
    results = benchmark(run_checkers, run_dir, [checker])
    assert [r.name for r in results] == [checker], results
    assert all(r.verdict == PASS for r in results), [(r.name, r.verdict, r.summary) for r in results]
    benchmark.extra_info.update(sizes)


@pytest.mark.benchmark(group="history")
def test_history_load_and_pairs(benchmark: Any, synthetic_run: tuple[Path, dict[str, int]]) -> None:
    run_dir, sizes = synthetic_run
    path = run_dir / "operations.jsonl"

    def load_and_pair() -> tuple[list[hist.Op], list[tuple[hist.Op, hist.Op | None]]]:
        ops = hist.load(path)
        return ops, hist.pairs(ops)

    ops, pairs = benchmark(load_and_pair)
    assert len(ops) == sizes["history_lines"]
    assert len(pairs) == len(ops) // 2 and all(done is not None for _, done in pairs)
    benchmark.extra_info.update(ops=len(ops), pairs=len(pairs))
