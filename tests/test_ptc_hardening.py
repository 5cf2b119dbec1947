"""The PTC interpreter against an attacker: every costly path is charged before it runs, generated
programs stay within the time and memory budget, and nothing a program does depends on the hash seed.

The hostile corpus (agent/ptc_corpus.py) and the Hypothesis runs execute in fresh processes
(tests/ptc_fuzz.py), so their peak memory is their own and each hash seed is a real process's seed.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.ptc import PtcDisallowed, PtcLimitExceeded, PtcLimits, PtcRuntimeError, render_value, run_ptc
from agent.ptc_corpus import DETERMINISM, HOSTILE

ROOT = Path(__file__).resolve().parent.parent
TIME_BUDGET_S = 1.0  # CPU seconds (tests.ptc_fuzz): on a busy machine wall time is mostly waiting for a CPU
#: a bound on a hung fuzz process only: 3,000 programs run (generated, then replayed twice) take minutes of CPU, and
#: on a runner shared with others several times that in wall time
FUZZ_HANG_S = 900.0
MEMORY_BUDGET_MB = 100.0


def _fuzz(*args: str, seed: str | None = None, timeout: float = FUZZ_HANG_S) -> str:
    env = {**os.environ}
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    proc = subprocess.run([sys.executable, "-m", "tests.ptc_fuzz", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"tests.ptc_fuzz {' '.join(args)} failed:\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_every_hostile_program_ends_as_expected_within_the_budget() -> None:
    rows = json.loads(_fuzz("corpus"))
    assert [r["name"] for r in rows] == [h.name for h in HOSTILE]
    table = "\n".join(f"{r['name']:26} {r['expect']:10} {r['outcome']:10} {r['seconds']:6.3f} s {r['peak_mb']:6.1f} MB"
                      for r in rows)
    print(table)
    wrong = [r["name"] for r in rows if r["outcome"] != r["expect"]]
    assert not wrong, f"unexpected outcomes: {wrong}\n{table}"
    slow = [r["name"] for r in rows if r["seconds"] > TIME_BUDGET_S]
    assert not slow, f"over {TIME_BUDGET_S} s: {slow}\n{table}"
    big = [r["name"] for r in rows if r["peak_mb"] > MEMORY_BUDGET_MB]
    assert not big, f"over {MEMORY_BUDGET_MB} MB: {big}\n{table}"


def test_hostile_programs_do_the_same_under_every_hash_seed() -> None:
    names = {h.name for h in DETERMINISM}
    runs = []
    for seed in ("1", "2", "3", "4"):
        rows = json.loads(_fuzz("corpus", "--names", ",".join(sorted(names)), seed=seed))
        runs.append({r["name"]: r["record"] for r in rows if r["name"] in names})
    assert all(run == runs[0] for run in runs), json.dumps(runs, indent=1)[:3000]
    # the program that branched on str(set) takes one branch, with the set's text sorted
    assert runs[0]["set_str_branch"]["calls"] == [["echo", '"A"']]
    assert runs[0]["set_str_branch"]["result"] == "{'alpha', 'beta', 'delta', 'eps', 'gamma'}"
    assert "0x" not in runs[0]["builtin_str"]["result"]


@pytest.mark.slow
@pytest.mark.timeout(3 * FUZZ_HANG_S)
def test_generated_programs_stay_within_budget_and_do_not_depend_on_the_hash_seed(tmp_path: Path) -> None:
    out = tmp_path / "programs.json"
    report = json.loads(_fuzz("generate", "--examples", "1000", "--out", str(out), seed="0"))
    print(f"Hypothesis: {report['examples']} programs, slowest {report['max_seconds']:.3f} s, "
          f"largest peak {report['max_peak_mb']:.1f} MB ({report['memory_measured']}), outcomes {report['outcomes']}")
    assert report["examples"] == 1000
    assert report["max_seconds"] < TIME_BUDGET_S
    assert report["max_peak_mb"] < MEMORY_BUDGET_MB
    # the grammar reaches the interesting paths: finished programs, refusals at a limit, runtime errors
    assert report["outcomes"].get("ok", 0) > 100 and report["outcomes"].get("limit", 0) > 20
    generated = json.loads(out.read_text())["programs"]
    expected = [{k: v for k, v in p.items() if k not in ("code", "seconds")} for p in generated]
    for seed in ("1", "2"):
        replayed = json.loads(_fuzz("replay", str(out), seed=seed))
        differing = [p["code"] for p, a, b in zip(generated, expected, replayed, strict=True) if a != b]
        assert not differing, f"PYTHONHASHSEED={seed} changed {len(differing)} program(s), e.g.:\n{differing[0]}"


# --------------------------------------------------------------------------- the rules, one by one


def run(code: str, **limits: object) -> object:
    return asyncio.run(run_ptc(code, {"echo": _echo}, limits=PtcLimits(**limits)))


async def _echo(text: object = "") -> str:
    await asyncio.sleep(0)
    return str(text)


def test_round_digits_are_bounded_before_the_builtin_runs() -> None:
    with pytest.raises(PtcLimitExceeded, match="ndigits"):
        run("round(5, -10**8)")
    assert run("round(1234.5678, 2)").value == 1234.57
    assert run("round(5, -1000)").value == 0


def test_builtins_and_sets_render_the_same_in_every_process() -> None:
    assert run("str(range) + ' ' + str(len) + ' ' + str(echo)").value == "<builtin range> <builtin len> <tool echo>"
    assert run("str({'b', 'a', 'c'})").value == "{'a', 'b', 'c'}"
    assert run("f'{ {3, 1, 2} }'").value == "{1, 2, 3}"
    assert run("str({1, 'a'})").value == "{1, 'a'}"  # mixed: by type name, then text
    assert render_value({"k": {"z", "y"}}) == "{'k': {'y', 'z'}}"
    result = run("print({'b', 'a'}, set(), sep=' | ')\n{'q', 'p'}")
    assert result.output == "{'a', 'b'} | set()\n" and render_value(result.value) == "{'p', 'q'}"


def test_print_sep_and_end_must_be_text_and_count_toward_the_output() -> None:
    with pytest.raises(PtcRuntimeError, match="sep must be None or a string"):
        run("print(1, 2, sep=[0])")
    with pytest.raises(PtcLimitExceeded, match="printed output"):
        run("print(1, 2, sep='x' * 30000)")
    assert run("print(1, 2, sep=None, end=None)").output == "1 2\n"


def test_tool_arguments_are_json_and_bounded_before_serialisation() -> None:
    with pytest.raises(PtcDisallowed, match="a set cannot be a tool argument"):
        run("await echo(text={'a'})")
    with pytest.raises(PtcRuntimeError, match="has a int key"):
        run("await echo(text={1: 2})")
    with pytest.raises(PtcLimitExceeded, match="arguments over 1000 characters"):
        run("await echo(text='x' * 2000)", max_tool_argument_chars=1000)
    assert run("await echo(text=[1, (2, 3), {'k': None}])").value == "[1, (2, 3), {'k': None}]"


def test_error_texts_are_bounded_and_quote_no_huge_value() -> None:
    with pytest.raises(PtcRuntimeError) as err:
        run("t = (0,) * 10000\nd = {}\nd[t]")
    assert "KeyError: <a tuple of 10000 elements>" in str(err.value)
    with pytest.raises(PtcRuntimeError) as err:
        run("float('x' * 100000)")
    assert len(str(err.value)) < 400


def test_the_compute_time_backstop_ends_a_program_and_ignores_time_spent_awaiting_tools() -> None:
    with pytest.raises(PtcLimitExceeded, match="time backstop"):
        run("n = 0\nfor i in range(1000):\n    for j in range(9):\n        n = n + 1", max_operations=10**9,
            max_compute_seconds=0.01)

    async def slow(text: object = "") -> str:  # computes in the interpreter's thread: not the program's time
        began = time.thread_time()
        while time.thread_time() - began < 0.3:
            pass
        return "done"

    result = asyncio.run(run_ptc("await slow()\nawait slow()", {"slow": slow}, limits=PtcLimits(max_compute_seconds=0.2)))
    assert result.value == "done"


def test_the_compute_time_backstop_counts_the_programs_cpu_time_not_a_busy_machines_waits() -> None:
    """On a busy machine the interpreter's thread waits for a CPU mid-program: wall time passes that is no work of
    the program's. Here a signal handler holds the thread (a 1 s sleep) in the middle of a program that computes
    for ~0.1 s under a 0.5 s backstop: the program finishes."""
    import signal

    import agent.ptc

    held: list[str] = []

    def hold_the_thread(signum: int, frame: object) -> None:
        at = frame
        while at is not None and at.f_code.co_filename != agent.ptc.__file__:  # type: ignore[attr-defined]
            at = at.f_back  # type: ignore[attr-defined]
        if held:
            return
        if at is None:  # not in the interpreter (yet): again after a little more CPU time
            signal.setitimer(signal.ITIMER_VIRTUAL, 0.005)
            return
        held.append(at.f_code.co_name)  # type: ignore[attr-defined]
        time.sleep(1.0)

    previous = signal.signal(signal.SIGVTALRM, hold_the_thread)
    signal.setitimer(signal.ITIMER_VIRTUAL, 0.005)  # after 5 ms of this process's CPU time
    try:
        result = run("n = 0\nfor i in range(1000):\n    for j in range(20):\n        n = n + 1\nn",
                     max_operations=10**9, max_compute_seconds=0.5)
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)
    assert held, "the program ended before the handler held its thread"
    assert result.value == 20000


def test_cost_is_charged_by_work_so_a_larger_budget_lets_the_same_work_finish() -> None:
    code = "a = list(range(5000))\nb = list(range(5000))\nn = 0\nfor i in range(1000):\n    n = n + (a == b)\nn"
    with pytest.raises(PtcLimitExceeded, match="operation limit of 10000"):
        run(code)  # ~6 operations of comparing per ==, plus the loop's own
    result = run(code, max_operations=100_000)
    assert result.value == 1000 and result.operations > 6 * 1000
