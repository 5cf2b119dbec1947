"""The PTC interpreter: language subset, tool calls and gather, sandbox refusals,
limits and determinism. Pure asyncio, no Temporal: the interpreter is plain
workflow-safe code, so its contract is checked directly."""

from __future__ import annotations

import asyncio
import textwrap
from typing import Any

import pytest

from agent.ptc import (
    PtcDisallowed,
    PtcError,
    PtcLimitExceeded,
    PtcLimits,
    PtcResult,
    PtcRuntimeError,
    PtcSyntaxError,
    PtcToolError,
    run_ptc,
)


def prog(code: str) -> str:
    return textwrap.dedent(code).strip("\n")


class FakeTools:
    """Async tools that record the order they were invoked in; ``delays`` per argument."""

    def __init__(self, delays: dict[int, float] | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.delays = delays or {}

    def mapping(self) -> dict[str, Any]:
        return {"fetch": self.fetch, "echo": self.echo}

    async def fetch(self, n: int) -> dict[str, Any]:
        self.calls.append(("fetch", n))
        await asyncio.sleep(self.delays.get(n, 0))
        return {"n": n, "square": n * n}

    async def echo(self, text: str = "") -> str:
        self.calls.append(("echo", text))
        return text


# --------------------------------------------------------------------------- language


async def test_arithmetic_and_last_expression_is_the_result() -> None:
    result = await run_ptc("a = 7\nb = a * 3 - 1\n(b // 4, b % 4, b / 4, 2 ** 10, -a, a > 3 and b < 100)", {})
    assert result.value == (5, 0, 5.0, 1024, -7, True)
    assert result.output == ""
    assert result.tool_calls == 0
    assert result.operations > 0


async def test_result_is_none_when_last_statement_is_not_an_expression() -> None:
    assert (await run_ptc("x = 1", {})).value is None
    assert (await run_ptc("", {})).value is None


async def test_loops_comprehensions_fstrings_and_methods() -> None:
    code = prog(
        """
        words = "alpha beta gamma delta".split()
        lengths = {w: len(w) for w in words if w != "beta"}
        evens = [i * j for i in range(4) for j in range(3) if (i * j) % 2 == 0]
        total = 0
        i = 0
        while True:
            i += 1
            if i % 2:
                continue
            total += i
            if i >= 10:
                break
        first, *rest = sorted(words, reverse=True)
        acc = []
        for k, v in lengths.items():
            acc.append(f"{k.upper()}={v:03d}")
        print(", ".join(acc), end="!")
        label = "big" if total > 20 else "small"
        (lengths, evens, total, first, rest, label, f"{3.14159:.2f}|{'x'!r}|{total:>5}", acc[1:], words[-1][::-1])
        """
    )
    result = await run_ptc(code, {})
    assert result.value == (
        {"alpha": 5, "gamma": 5, "delta": 5},
        [0, 0, 0, 0, 2, 0, 2, 4, 0, 6],
        30,
        "gamma",
        ["delta", "beta", "alpha"],
        "big",
        "3.14|'x'|   30",
        ["GAMMA=005", "DELTA=005"],
        "atled",
    )
    assert result.output == "ALPHA=005, GAMMA=005, DELTA=005!"


async def test_comprehension_variables_do_not_leak() -> None:
    code = "x = 'outer'\nys = [x for x in range(3)]\nx"
    assert (await run_ptc(code, {})).value == "outer"


async def test_runtime_errors_are_reported_with_their_line() -> None:
    with pytest.raises(PtcRuntimeError) as err:
        await run_ptc("d = {'a': 1}\nx = 1\ny = d['b']", {})
    assert err.value.line == 3 and err.value.kind == "runtime"
    assert str(err.value).startswith("line 3: KeyError")
    with pytest.raises(PtcRuntimeError, match="ZeroDivisionError"):
        await run_ptc("1 / 0", {})


# --------------------------------------------------------------------------- tools


async def test_awaited_tool_call() -> None:
    tools = FakeTools()
    result = await run_ptc("r = await fetch(n=4)\nr['square'] + 1", tools.mapping())
    assert result.value == 17
    assert result.tool_calls == 1
    assert tools.calls == [("fetch", 4)]


async def test_gather_fans_out_concurrently_with_results_in_argument_order() -> None:
    started: list[int] = []
    all_started = asyncio.Event()

    async def fetch(n: int) -> int:
        started.append(n)
        if len(started) == 3:
            all_started.set()
        # Each call waits for all three to have started: only a concurrent gather gets past this.
        await asyncio.wait_for(all_started.wait(), timeout=2)
        await asyncio.sleep(0.01 * (3 - n))  # finish in reverse order
        return n * 10

    code = "await asyncio.gather(*[fetch(n=i) for i in range(3)])"
    result = await run_ptc(code, {"fetch": fetch})
    assert result.value == [0, 10, 20]
    assert started == [0, 1, 2]
    assert result.tool_calls == 3


async def test_gather_of_a_list_of_pending_calls_and_mixed_tools() -> None:
    tools = FakeTools()
    code = prog(
        """
        calls = [fetch(n=1), echo(text="hi")]
        a, b = await asyncio.gather(*calls)
        [a['square'], b]
        """
    )
    assert (await run_ptc(code, tools.mapping())).value == [1, "hi"]


async def test_first_failure_in_gather_cancels_in_flight_siblings() -> None:
    release = asyncio.Event()
    observed: list[str] = []

    async def wait_forever(n: int) -> int:
        try:
            await release.wait()
        except asyncio.CancelledError:
            observed.append(f"cancelled {n}")
            raise
        return n

    async def boom() -> None:
        await asyncio.sleep(0)
        raise ValueError("disk full")

    code = prog(
        """
        x = 1
        await asyncio.gather(wait(n=1), boom(), wait(n=2))
        """
    )
    with pytest.raises(PtcToolError) as err:
        await asyncio.wait_for(run_ptc(code, {"wait": wait_forever, "boom": boom}), timeout=2)
    assert err.value.tool == "boom"
    assert err.value.tool_message == "disk full"
    assert err.value.line == 2 and err.value.kind == "tool"
    assert str(err.value) == "line 2: tool boom failed: disk full"
    # Siblings were cancelled and their cancellation completed before the error surfaced.
    assert observed == ["cancelled 1", "cancelled 2"]


async def test_outer_cancellation_propagates_into_inner_tool_tasks() -> None:
    inner_started = asyncio.Event()
    observed: list[str] = []

    async def slow(n: int) -> int:
        inner_started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            observed.append(f"cancelled {n}")
            raise
        return n

    for code in ("await asyncio.gather(slow(n=1), slow(n=2))", "await slow(n=3)"):
        inner_started.clear()
        task = asyncio.create_task(run_ptc(code, {"slow": slow}))
        await asyncio.wait_for(inner_started.wait(), timeout=2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert observed == ["cancelled 1", "cancelled 2", "cancelled 3"]


async def test_tool_failure_on_plain_await() -> None:
    async def broken(path: str) -> str:
        raise RuntimeError(f"no such file: {path}")

    with pytest.raises(PtcToolError, match=r"^line 2: tool read failed: no such file: a.txt$") as err:
        await run_ptc("p = 'a.txt'\nawait read(path=p)", {"read": broken})
    assert err.value.tool == "read"


@pytest.mark.parametrize(
    ("code", "line", "needle"),
    [
        ("r = fetch(n=1)\nr['square']", 2, "never awaited"),
        ("r = fetch(n=1)\nr + 1", 2, "never awaited"),
        ("fetch(n=1)", 1, "never awaited"),  # result is a pending call
        ("x = 1\nfetch(n=1)\nx", 2, "never awaited"),  # started nowhere, silently dropped otherwise
        ("await 3", 1, "cannot await"),
        ("c = fetch(n=1)\nawait c\nawait c", 3, "already awaited"),
        ("await asyncio.gather(1, 2)", 1, "un-awaited tool calls"),
        ("await asyncio.sleep(1)", 1, "only asyncio.gather"),
    ],
)
async def test_misused_tool_calls_are_refused(code: str, line: int, needle: str) -> None:
    with pytest.raises(PtcDisallowed) as err:
        await run_ptc(code, FakeTools().mapping())
    assert err.value.line == line
    assert needle in str(err.value)


# --------------------------------------------------------------------------- sandbox


@pytest.mark.parametrize(
    ("code", "line", "needle"),
    [
        ("x = 1\nimport os", 2, "imports are not allowed"),
        ("from os import path", 1, "imports are not allowed"),
        ("x = 1\ny = ().__class__", 2, "dunder"),
        ("x = {}\nx.__dict__", 2, "dunder"),
        ("x = 'a'\nx._private", 2, "private"),
        ("__builtins__", 1, "dunder"),
        ("f = lambda: 1", 1, "lambda"),
        ("def f():\n    return 1", 1, "defining functions"),
        ("async def f():\n    return 1", 1, "defining functions"),
        ("class A:\n    pass", 1, "defining classes"),
        ("x = 1\ntry:\n    x = 2\nexcept Exception:\n    pass", 2, "try/except"),
        ("with x:\n    pass", 1, "'with'"),
        ("global x", 1, "'global'"),
        ("x = 1\ndel x", 2, "'del'"),
        ("x = 1\n\nopen('/etc/passwd')", 3, "builtin 'open'"),
        ("eval('1')", 1, "builtin 'eval'"),
        ("exec('x = 1')", 1, "builtin 'exec'"),
        ("getattr(1, 'real')", 1, "builtin 'getattr'"),
        ("r = await fetch(n=1)\nr.keys()\nr.n", 3, "dict.n is not available; allowed: clear"),
        ("r = await echo(text='a')\nr.format()", 2, "str.format is not available"),
        ("yolo(1)", 1, "name 'yolo' is not defined; available tools: echo, fetch"),
        ("x = 1\n'%s' % x", 2, "f-string"),
        ("x = (y := 3)", 1, "':='"),
        ("list(i for i in range(3))", 1, "generator expressions"),
        ("x = 1\nx is 1", 2, "use =="),
        ("a = [[0] * 9000] * 9000\nsum(a, [])", 2, "sum() adds numbers only"),
    ],
)
async def test_disallowed_constructs_are_refused_with_their_line(code: str, line: int, needle: str) -> None:
    tools = FakeTools()
    with pytest.raises(PtcDisallowed) as err:
        await run_ptc(code, tools.mapping())
    assert err.value.kind == "disallowed"
    assert err.value.line == line, str(err.value)
    assert needle in str(err.value)
    assert str(err.value).startswith(f"line {line}: ")


async def test_attribute_access_on_a_tool_result_object_is_refused() -> None:
    class Secret:
        token = "s3cr3t"

    async def get() -> Secret:
        return Secret()

    with pytest.raises(PtcDisallowed, match=r"^line 2: attribute 'token' of Secret is not accessible"):
        await run_ptc("s = await get()\ns.token", {"get": get})


async def test_syntax_error_reports_its_line() -> None:
    with pytest.raises(PtcSyntaxError) as err:
        await run_ptc("x = 1\ny = (2 +\n", {})
    assert err.value.kind == "syntax"
    assert err.value.line is not None and err.value.line >= 2
    assert "syntax error" in str(err.value)


# --------------------------------------------------------------------------- limits


async def test_infinite_loop_hits_the_iteration_limit() -> None:
    with pytest.raises(PtcLimitExceeded) as err:
        await run_ptc("x = 0\nwhile True:\n    pass", {})
    assert err.value.kind == "limit" and err.value.line == 2
    assert "1000 iterations" in str(err.value)


async def test_operation_limit() -> None:
    code = prog(
        """
        t = 0
        for i in range(900):
            t = t + i * 2 + i * 3 + i * 4
        """
    )
    with pytest.raises(PtcLimitExceeded, match="operation limit"):
        await run_ptc(code, {})
    # The same program fits a larger budget.
    result = await run_ptc(code + "\nt", {}, limits=PtcLimits(max_operations=100_000))
    assert result.value == sum(i * 9 for i in range(900))


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        ("for i in range(900):\n    print('x' * 100)", "printed output"),
        ("'x' * 10 ** 9", "repeating a str"),
        ("'x' * 30000", "result of 30000 characters"),
        ("[0] * 10 ** 8", "repeating a list"),
        ("list(range(10 ** 12))", "exceeds the limit"),
        ("[i for i in range(5000)]", "1000 iterations"),
        ("[[0] * 9000 for i in range(900)]", "operation limit"),
        ("s = 'ab'\ns.replace('a', 'x' * 999999)", "str.replace"),
        ("f'{1:>999999999}'", "format width"),
        ("a = [0] * 9000\nb = [a] * 9000\nprint(b)", "printed output"),
        ("s = 'x' * 900000\nprint(*[s] * 9000)", "printed output"),
        ("s = 'x' * 900000\n','.join([s] * 9000)", "str.join"),
        ("s = 'x' * 900000\nf'{s}{s}'", "f-string longer"),
        ("a = [0] * 9000\nb = [a] * 9000\nb", "too large to turn into text"),
        ("a = [0] * 9000\nb = {'k': [a] * 9000}\nf'{b}'", "too large to turn into text"),
    ],
)
async def test_output_and_size_limits(code: str, needle: str) -> None:
    with pytest.raises(PtcLimitExceeded) as err:
        await run_ptc(code, {})
    assert needle in str(err.value)


@pytest.mark.parametrize("code", ["2 ** 10 ** 10", "9 ** 99999", "x = 10 ** 999\nx * x * x", "(-7) ** 5000"])
async def test_power_bombs_are_refused(code: str) -> None:
    with pytest.raises(PtcLimitExceeded, match="digits"):
        await run_ptc(code, {})


async def test_deeply_nested_expression_is_a_limit_not_a_crash() -> None:
    with pytest.raises(PtcLimitExceeded):
        await run_ptc("x = " + "(" * 150 + "1" + ")" * 150 + "\n" + "-" * 500 + "1", {})


async def test_all_errors_share_the_base_class() -> None:
    for code in ("import os", "while True:\n    pass", "x = (", "1/0"):
        with pytest.raises(PtcError):
            await run_ptc(code, {})


# --------------------------------------------------------------------------- determinism


async def test_same_program_and_tool_results_give_identical_runs_whatever_the_completion_order() -> None:
    code = prog(
        """
        firsts = await asyncio.gather(*[fetch(n=i) for i in range(4)])
        labels = []
        for r in firsts:
            if r['square'] % 2 == 0:
                labels.append(await echo(text=f"even {r['n']}"))
        more = await asyncio.gather(echo(text="a"), fetch(n=9), echo(text="b"))
        print(len(labels), labels)
        {"firsts": firsts, "labels": labels, "more": more, "seen": sorted({r['n'] for r in firsts})}
        """
    )
    runs: list[tuple[PtcResult, list]] = []
    for delays in ({0: 0.03, 1: 0.0, 2: 0.02, 3: 0.01, 9: 0.0}, {0: 0.0, 1: 0.03, 2: 0.0, 3: 0.02, 9: 0.01}):
        tools = FakeTools(delays)
        result = await run_ptc(code, tools.mapping())
        runs.append((result, tools.calls))
    (first, first_calls), (second, second_calls) = runs
    assert first == second
    assert first_calls == second_calls
    assert first_calls == [
        ("fetch", 0), ("fetch", 1), ("fetch", 2), ("fetch", 3),
        ("echo", "even 0"), ("echo", "even 2"),
        ("echo", "a"), ("fetch", 9), ("echo", "b"),
    ]  # fmt: skip
    assert first.tool_calls == 9
    assert first.output == "2 ['even 0', 'even 2']\n"
