"""The calculator tool is bounded like the PTC interpreter (agent.numeric_limits) and runs off the event loop.

Issue 28, case 6: ``round(7, -999999999)`` passed the calculator's length and ``**`` checks and computed 10**999999999
on the worker's event loop (no answer in 75 s). Every operation is now checked before it runs, and refusals are the
model-visible validation error.
"""

from __future__ import annotations

import asyncio
import gc
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import numeric_limits, tools
from agent.errors import ToolValidationError
from agent.ptc import PtcLimitExceeded, run_ptc
from agent.tools import TOOLS, ToolContext, evaluate_arithmetic, run_tool
from tests.events import HANG_S
from tests.test_tools import ctx  # noqa: F401  (the fixture: a workspace and an effect ledger)

ROOT = Path(__file__).resolve().parent.parent
#: far above what any bounded expression takes (well under 1 ms), far below the unbounded ones (minutes)
QUICK_SECONDS = 0.25


def timed(expression: str) -> tuple[float, str | ToolValidationError]:
    """The CPU seconds ``expression`` took (this thread's: other processes on a busy machine do not count), with
    the garbage collector held off (a full collection of the test process's heap once took 0.47 s of this thread
    inside a 0.2 ms expression, and did not reproduce); an unbounded operation is slow on every try, so a slow
    first try is timed once more and the faster counts."""
    best = math.inf
    for _ in range(2):
        gc.disable()
        start = time.thread_time()
        try:
            out: str | ToolValidationError = evaluate_arithmetic(expression)
        except ToolValidationError as exc:
            out = exc
        finally:
            seconds = time.thread_time() - start
            gc.enable()
        best = min(best, seconds)
        if best < QUICK_SECONDS:
            break
    return best, out


def test_the_reported_round_is_refused_at_once_as_a_validation_error(ctx: ToolContext) -> None:
    start = time.perf_counter()
    with pytest.raises(ToolValidationError, match=r"ndigits beyond \+-1000") as refused:
        asyncio.run(run_tool(TOOLS["calculator"], {"expression": "round(7, -999999999)"}, ctx))
    assert time.perf_counter() - start < 30  # refused, not evaluated (minutes), on however busy a machine
    assert str(refused.value).startswith("calculator: 'round(7, -999999999)': ")


def test_the_calculator_and_the_ptc_interpreter_refuse_with_the_same_limit() -> None:
    shared = numeric_limits.round_problem(-999999999)
    assert shared is not None
    with pytest.raises(ToolValidationError, match=re.escape(shared)):
        evaluate_arithmetic("round(7, -999999999)")
    with pytest.raises(PtcLimitExceeded, match=re.escape(shared)):
        asyncio.run(run_ptc("round(7, -999999999)", {}))


@pytest.mark.parametrize("expression", [
    "round(7, -999999999)", "round(-7, -10000)", "round(7.5, -999999999)", "round(7, 999999999999)",
    "round(7, ndigits=-999999999)", "round(*(7, -999999999))",
    "1 << 999999999", "9 >> 999999999", "~9", "2 ** 999999999", "pow(2, 999999999)",
    "'a' * 999999999", "'a'.ljust(999999999)", "'%999999999d' % 1", "f'{1:999999999}'", "(1).to_bytes(999999999)",
    "'9' * 4000 + 1", "[9] * 999999999", "(9,) * 999999999", "{9: 9}[9]", "1 if 9 else 2", "9 == 9", "9 in 9",
    "*".join(["0x" + "f" * 15] * 12), "*".join(["9" * 20] * 9) + "*" + "9" * 19, "round(" + "9" * 180 + ", -1000)",
    "max(" + "9" * 190 + ", 1)", "-" * 199 + "9", "(" * 99 + "9" + ")" * 99, "(" * 150 + "9" + ")" * 50,
    "1e308 * 1e308", "round(1e308 * 10)", "1e308 // 1e-308", "1e308 % 1e-308", "9" * 199 + "/ 3",
    "__import__('os')", "abs", "round(7)(1)", "True + 1", "1j * 1j", "x = 1", "1; 2", "",
])
def test_hostile_expressions_end_quickly_with_a_number_or_a_validation_error(expression: str) -> None:
    seconds, out = timed(expression)
    assert seconds < QUICK_SECONDS, f"{expression!r} took {seconds:.3f} s"
    if isinstance(out, str):
        float(out)  # an answer is a number


def test_evaluation_leaves_the_event_loop_free(ctx: ToolContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """While one calculation runs (made slow here by a blocking sleep in front of the real one), the loop that
    awaits it keeps running other tasks: a worker's heartbeats among them."""
    slow_seconds = 0.3

    def slow_evaluate(expression: str) -> str:
        time.sleep(slow_seconds)  # stands for compute that holds its thread
        return evaluate_arithmetic(expression)

    monkeypatch.setattr(tools, "evaluate_arithmetic", slow_evaluate)

    async def main() -> tuple[str, int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticking = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        try:
            answer = await run_tool(TOOLS["calculator"], {"expression": "6 * 7"}, ctx)
        finally:
            ticking.cancel()
        return answer, ticks

    answer, ticks = asyncio.run(main())
    assert answer == "42"
    assert ticks >= slow_seconds / 0.01 / 3, f"the event loop ticked only {ticks} times in {slow_seconds} s"


# -- a property: every short expression of the calculator's grammar ends quickly, in little memory

_OPERATORS = ["+", "-", "*", "/", "//", "%"]


def _number() -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers(-10**6, 10**6).map(str),
        st.integers(1, 190).map(lambda n: "9" * n),  # big literals, for products and rounding
        st.integers(1, 95).map(lambda n: "0x" + "f" * n),
        st.floats(allow_nan=False, allow_infinity=False).map(repr),
        st.sampled_from(["pi", "e", "1e308", "5e-324"]),
    )


def _expression() -> st.SearchStrategy[str]:
    def extend(sub: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        digits = st.one_of(st.integers(-1200, 1200), st.integers(-10**12, 10**12)).map(str)
        return st.one_of(
            st.tuples(sub, st.sampled_from(_OPERATORS), sub).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
            st.tuples(st.sampled_from(["-", "+"]), sub).map(lambda t: f"{t[0]}({t[1]})"),
            sub.map(lambda x: f"({x})"),
            sub.map(lambda x: f"abs({x})"),
            sub.map(lambda x: f"round({x})"),
            st.tuples(sub, st.one_of(digits, sub)).map(lambda t: f"round({t[0]}, {t[1]})"),
            st.tuples(st.sampled_from(["min", "max"]), st.lists(sub, min_size=1, max_size=4))
            .map(lambda t: f"{t[0]}({', '.join(t[1])})"),
            st.lists(sub, min_size=2, max_size=12).map(" * ".join),  # long products of big numbers
        )

    return st.recursive(_number(), extend, max_leaves=30).filter(lambda x: len(x) <= tools.MAX_EXPRESSION_CHARS)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(_expression())
def test_any_short_expression_of_the_grammar_ends_quickly(expression: str) -> None:
    seconds, _ = timed(expression)
    assert seconds < QUICK_SECONDS, f"{expression!r} took {seconds:.3f} s"


#: the memory property, in a child of its own: tracemalloc started or stopped while another thread allocates can
#: crash CPython 3.11 (the test process has image-building threads), and a fresh interpreter has none
MEMORY_PROPERTY = """
import tracemalloc
from hypothesis import HealthCheck, given, settings
from tests.test_calculator_limits import _expression, timed

peaks = []

@settings(max_examples=400, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(_expression())
def holds(expression):
    tracemalloc.start()
    try:
        timed(expression)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    peaks.append(peak)
    assert peak < 1 << 20, f"{expression!r} allocated {peak} bytes at its peak"

holds()
print(f"examples {len(peaks)}; largest peak {max(peaks)} bytes")
"""


def test_any_short_expression_of_the_grammar_needs_little_memory() -> None:
    out = subprocess.run([sys.executable, "-c", MEMORY_PROPERTY], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert re.search(r"^examples \d+; largest peak \d+ bytes$", out.stdout, re.M), out.stdout


def test_dah_run_answers_the_reported_prompt_within_seconds(tmp_path: Path) -> None:
    """The issue's reproduction, end to end: the scripted model passes the expression to the calculator as written."""
    # a hang bound: evaluating the round would take far longer; start-up on a busy machine takes what it takes
    out = subprocess.run([sys.executable, "-m", "testbed", "run", "compute round(7, -999999999) exactly",
                          "--state-dir", str(tmp_path)], capture_output=True, text=True, timeout=HANG_S, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"^answer: .*ERROR \(validation_error\): calculator: .*ndigits beyond \+-1000", out.stdout, re.M)
