"""The in-agent faults (harness.faults) act through the recording API, in any process that records through it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.faults import AgentFaults, InjectedBug
from harness.recording import EffectLedger, ExecutionIdentity

ROOT = Path(__file__).resolve().parent.parent
# A stand-in for any agent's activity: it records an execution and applies one effect through the recording API.
ACTIVITY = textwrap.dedent("""
    import sys
    from pathlib import Path
    from harness.recording import EffectLedger, ExecutionIdentity

    ledger_path, attempt, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    ledger = EffectLedger.from_environment(ledger_path)
    ident = ExecutionIdentity("wf-1", "run-1", "7", attempt, f"w-{attempt}")
    execution = ledger.begin_execution(ident, "call_model", model_call=True)
    ledger.end_execution(execution, "ok")
    execution = ledger.begin_execution(ident, "append_note")

    def apply():
        with open(out, "a") as f:
            f.write("note;")
        return {"bytes": 5}

    ledger.apply_once(ident, "append_note", "notes.txt", "d1", apply, lambda: out.read_text().endswith("note;"))
    ledger.end_execution(execution, "ok")
    print("completed")
""")


def attempt(tmp_path: Path, n: int, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", ACTIVITY, str(tmp_path / "ledger.sqlite3"), str(n),
                           str(tmp_path / "notes.txt")], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env})


@pytest.mark.parametrize("point", ["after_effect", "after_model_call"])
def test_a_crash_point_kills_the_first_worker_to_reach_it_and_only_that_one(tmp_path: Path, point: str) -> None:
    first = attempt(tmp_path, 1, DAH_CRASH_AT=point)
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert "completed" not in first.stdout
    second = attempt(tmp_path, 2, DAH_CRASH_AT=point)  # the retry, on a worker built the same way
    assert second.returncode == 0 and "completed" in second.stdout, second.stderr
    with EffectLedger(tmp_path / "ledger.sqlite3", faults=AgentFaults()) as ledger:
        assert [(c["point"], c["worker"]) for c in ledger.crash_points()] == [(point, "w-1")]
        # The effect was applied once, whether the crash came before it or right after it.
        assert ledger.summary().duplicated_effects == 0 and ledger.summary().effects_applied == 1
        kinds = {(e["tool"], e["kind"]) for e in ledger.executions()}
        assert kinds == {("call_model", "model"), ("append_note", "tool")}
    assert (tmp_path / "notes.txt").read_text() == "note;"


def test_the_unkeyed_effects_mutation_applies_on_every_attempt_and_the_ledger_shows_it(tmp_path: Path) -> None:
    for n in (1, 2):
        assert attempt(tmp_path, n, DAH_MUTATIONS="unkeyed_effects").returncode == 0
    with EffectLedger(tmp_path / "ledger.sqlite3", faults=AgentFaults()) as ledger:
        assert ledger.summary().duplicated_effects == 1
    assert (tmp_path / "notes.txt").read_text() == "note;note;"


def test_a_logic_bug_raises_on_every_attempt_and_records_the_failed_execution(tmp_path: Path) -> None:
    with EffectLedger(tmp_path / "ledger.sqlite3", faults=AgentFaults(bugs=frozenset({"calculator"}))) as ledger:
        ident = ExecutionIdentity("wf", "r", "1", 1, "w")
        with pytest.raises(InjectedBug, match="injected logic bug in calculator"):
            ledger.begin_execution(ident, "calculator")
        ledger.end_execution(ledger.begin_execution(ident, "weather"), "ok")  # other tools are fine
        assert [(e["tool"], e["outcome"]) for e in ledger.executions()] == [("calculator", "error"),
                                                                           ("weather", "ok")]


def test_faults_travel_through_the_environment_and_refuse_unknown_names() -> None:
    faults = AgentFaults(frozenset({"after_effect"}), frozenset({"calculator"}), frozenset({"unkeyed_append"}))
    assert faults.mutations == {"unkeyed_effects"}  # the old name is accepted
    assert AgentFaults.from_environment(faults.environment()) == faults
    assert AgentFaults.from_environment({}) == AgentFaults() and not AgentFaults()
    assert faults.without_bugs().bugs == frozenset() and faults.without_bugs().crash_at == faults.crash_at
    with pytest.raises(ValueError, match="crash point after_lunch: unknown; points are after_model_call"):
        AgentFaults(crash_at=frozenset({"after_lunch"}))
    with pytest.raises(ValueError, match="mutation forget_everything: unknown; mutations are unkeyed_effects"):
        AgentFaults(mutations=frozenset({"forget_everything"}))
