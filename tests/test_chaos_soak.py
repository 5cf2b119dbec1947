"""``python -m chaos soak`` and the suite's per-run error capture (chaos/soak.py, cli/chaos.py, chaos/runner.run).

The loops' bookkeeping is tested with ``chaos.runner.run`` replaced by a fake that passes, fails, raises or is
interrupted per seed (the real runs are exercised by the other chaos tests); the runner's own error path is
tested for real, with a backend whose cluster cannot start (no Temporal server is started here).
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import pytest

from chaos import runner, suite
from cli import chaos as cli
from testbed.engines.temporal.engine import ReferenceOnTemporal
from chaos.runner import RunFailed, RunResult
from chaos.scenarios import SCENARIOS
from chaos.runner import run_captured
from chaos.seeds import format_seeds, parse_seeds
from harness.rundir import RUNNER_ERROR, RunDir
from harness.commands import tool
from harness.verdict import CheckResult
from tests.run_directory import problems as all_problems

LOST = "1 acknowledged message(s) lost: conv-0 #2"
#: as a worker that dies at setup says it: the error, then its log's last lines
WORKER_DIED = ("WorkerStartError: worker w1-1 exited with 3 before printing 'READY' (log logs/w1-1.log):\n"
               "boom: no config\n")


def test_seeds_are_ranges_and_single_seeds_in_order_each_once() -> None:
    assert parse_seeds("1-100") == list(range(1, 101))
    assert parse_seeds("1-20,25,30-32") == [*range(1, 21), 25, 30, 31, 32]
    assert parse_seeds(" 7 ") == [7]
    assert parse_seeds("3-5,1,4-6") == [3, 4, 5, 1, 6]
    assert format_seeds(parse_seeds("1-20,25,30-32")) == "1-20,25,30-32"
    assert format_seeds([3, 4, 5, 1, 6]) == "3-5,1,6"
    for bad in ("", "1-", "a", "5-3", "1,,2", "-1", "1-2-3", "1.5"):
        with pytest.raises(ValueError, match="seeds"):
            parse_seeds(bad)


def problems(path: Path) -> list[str]:
    """The run directory's departures from the schema, except inside run.json's ``scenario`` (the whole scenario
    definition, held to the schema by the end-to-end chaos tests; not what these tests are about)."""
    return [p for p in all_problems(path) if "run.json: scenario:" not in p]


def _fake_run(plan: dict[Any, str], calls: list[tuple[str, int]]):
    """A stand-in for ``chaos.runner.run``: per seed (or scenario name), ``pass``, ``fail``, ``unknown``,
    ``error`` (a recorded RunFailed), ``crash`` (an exception before any run directory) or ``interrupt``."""

    async def fake(scenario: Any, backend: Any, *, seed: int, out_root: Path, progress: Any = None,
                   ui: bool = False, on_run_dir: Any = None, cluster: Any = None) -> RunResult:
        name = scenario.name + backend.suffix
        calls.append((name, seed))
        what = plan.get(seed, plan.get(name, "pass"))
        reproduce = f"python -m chaos run {name} --seed {seed}"
        if what == "crash":
            raise OSError("No space left on device")
        if what == "interrupt":  # Ctrl-C, as it really arrives: asyncio.run's handler cancels the main task
            signal.raise_signal(signal.SIGINT)
            await asyncio.sleep(30)
        path = RunDir.create(Path(out_root) / name).path
        if what == "error":
            raise RunFailed(name, seed, path, reproduce, WORKER_DIED, 2.0)
        checks = [CheckResult("lost", "fail" if what == "fail" else "pass", LOST if what == "fail" else "none lost"),
                  CheckResult("injection_evidence", "unknown" if what == "unknown" else "pass",
                              "no fault landed on in-flight work" if what == "unknown" else "1/1 landed"),
                  CheckResult("replay", "not_applicable", "not applicable: no histories")]
        row = {"scenario": name, "faults": "1/1", "ok": 4, "fail": 0, "info": 0, "lost": 1 if what == "fail" else 0,
               "dup_effects": 0, "recovery_s": 1.5, "verdict": what}
        return RunResult(name, path, what, checks, seed, 3.0, row, reproduce)

    return fake


def _soak_dir(out: Path, name: str = "kill_idle") -> Path:
    [path] = [p for p in (out / f"soak-{name}").iterdir() if not p.is_symlink()]
    return path


def test_a_soak_counts_every_seed_and_lists_each_that_did_not_pass(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(runner, "run", _fake_run({2: "fail", 3: "error", 5: "unknown", 6: "crash"}, calls))
    rc = cli.main(["soak", "kill_idle", "--seeds", "1-5,6", "--out", str(tmp_path), "--parallel", "1"])
    out, err = capsys.readouterr()
    assert rc == 1
    assert calls == [("kill_idle", s) for s in range(1, 7)]  # one after another; an error does not stop it
    # progress on stderr, the summary on stdout
    assert "seed 2/6 (seed 2): FAIL" in err and "[1 pass, 1 fail, 0 unknown, 0 error]" in err
    assert "seed 3/6 (seed 3): ERROR" in err and "[1 pass, 1 fail, 0 unknown, 1 error]" in err
    assert "seed 2/6" not in out
    summary = out[out.index("soak kill_idle: 6 of 6 seed(s)"):]
    for line in ("pass         2   33.3", "fail         1   16.7", "unknown      1   16.7", "error        2   33.3"):
        assert line in summary
    assert "4 seed(s) not passed:" in summary
    assert f"seed 2: fail\n    lost: fail: {LOST}\n    reproduce: python -m chaos run kill_idle --seed 2" in summary
    assert "seed 3: error\n    error: WorkerStartError: worker w1-1 exited with 3 before printing 'READY' (log " \
           "logs/w1-1.log):\n      | boom: no config\n    reproduce: python -m chaos run kill_idle --seed 3" in summary
    assert "seed 5: unknown\n    injection_evidence: unknown: no fault landed" in summary
    assert f"seed 6: error\n    error: OSError: No space left on device\n    reproduce: {tool('chaos')} run " \
           "kill_idle --seed 6\n    run dir:   (none" in summary

    soak_dir = _soak_dir(tmp_path)
    assert (tmp_path / "soak-kill_idle" / "latest").resolve() == soak_dir
    assert problems(soak_dir) == []  # run.json and soak.json keep harness/run_directory.schema.json
    record = json.loads((soak_dir / "run.json").read_text())
    assert (record["kind"], record["name"], record["status"], record["seeds"]) == ("soak", "kill_idle", "complete",
                                                                                   [1, 2, 3, 4, 5, 6])
    assert record["reproduce"] == f"{tool('chaos')} soak kill_idle --seeds 1-6"
    soak = json.loads((soak_dir / "soak.json").read_text())
    assert soak["distribution"] == {"pass": 2, "fail": 1, "unknown": 1, "error": 2}
    assert soak["percent"]["pass"] == 33.3 and soak["done"] == 6 and soak["all_passed"] is False
    rows = {r["seed"]: r for r in soak["runs"]}
    assert rows[2]["checks"] == {"lost": "fail", "injection_evidence": "pass", "replay": "not_applicable"}
    assert rows[2]["non_pass"] == [{"check": "lost", "verdict": "fail", "summary": LOST}]
    assert rows[2]["reproduce"] == "python -m chaos run kill_idle --seed 2" and Path(rows[2]["run_dir"]).is_dir()
    assert rows[3]["verdict"] == "error" and rows[3]["error"] == WORKER_DIED and rows[3]["run_dir"]
    assert rows[6]["run_dir"] is None and rows[1]["non_pass"] == [] and rows[1]["error"] is None


def test_a_soak_where_every_seed_passed_exits_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runner, "run", _fake_run({}, []))
    assert cli.main(["soak", "kill_mid_turn@checkpoint", "--seeds", "4,9", "--out", str(tmp_path)]) == 0
    assert "every seed passed (2/2)" in capsys.readouterr().out
    soak = json.loads((_soak_dir(tmp_path, "kill_mid_turn@checkpoint") / "soak.json").read_text())
    assert soak["all_passed"] is True and soak["distribution"]["pass"] == 2


def test_an_interrupted_soak_keeps_the_seeds_it_finished(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(runner, "run", _fake_run({1: "fail", 3: "interrupt"}, calls))
    assert cli.main(["soak", "kill_idle", "--seeds", "1-10", "--out", str(tmp_path), "--parallel", "1"]) == 130
    assert [s for _, s in calls] == [1, 2, 3]  # Ctrl-C stops the soak
    assert "(interrupted during seed 3)" in capsys.readouterr().out
    soak_dir = _soak_dir(tmp_path)
    assert json.loads((soak_dir / "run.json").read_text())["status"] == "interrupted"
    assert not (tmp_path / "soak-kill_idle" / "latest").exists()
    soak = json.loads((soak_dir / "soak.json").read_text())
    assert (soak["status"], soak["done"], soak["interrupted_seeds"]) == ("interrupted", 2, [3])
    assert soak["distribution"] == {"pass": 1, "fail": 1, "unknown": 0, "error": 0}
    assert problems(soak_dir) == []

    # ... and the report shows it: the distribution and the seed that did not pass
    from reports.build import build

    build(tmp_path, tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "### Soak: kill_idle" in report and "interrupted during seed 3" in report
    assert "| pass | 1 | 50.0 |" in report.replace("  ", " ")
    assert "python -m chaos run kill_idle --seed 1" in report and LOST in report
    assert "Soak of kill_idle" in (tmp_path / "report" / "report.html").read_text()


def _timed_run(seconds: dict[int, float], calls: list[tuple[str, int]], at_once: list[int]):
    """``_fake_run``'s passing runs, each taking ``seconds[seed]`` (default 0.05 s); ``at_once``: how many were
    running as each one started. Seed 0 is Ctrl-C once the others have started."""
    running: set[int] = set()
    passing = _fake_run({}, [])

    async def fake(scenario: Any, backend: Any, *, seed: int, **kwargs: Any) -> RunResult:
        calls.append((scenario.name, seed))
        running.add(seed)
        at_once.append(len(running))
        try:
            if seed == 0:
                await asyncio.sleep(0.2)
                signal.raise_signal(signal.SIGINT)
            await asyncio.sleep(seconds.get(seed, 0.05))
            return await passing(scenario, backend, seed=seed, **kwargs)
        finally:
            running.discard(seed)

    return fake


def test_a_soak_runs_seeds_side_by_side_and_keeps_its_records_in_seed_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[str, int]] = []
    at_once: list[int] = []
    # seed 1 is slow: seeds 2-4 finish before it, in the other lane
    monkeypatch.setattr(runner, "run", _timed_run({1: 0.6}, calls, at_once))
    assert cli.main(["soak", "kill_idle", "--seeds", "1-4", "--out", str(tmp_path), "--parallel", "2"]) == 0
    out, err = capsys.readouterr()
    assert [s for _, s in calls] == [1, 2, 3, 4]  # started in their order
    assert max(at_once) == 2 and at_once[:2] == [1, 2]  # two at once, never more
    assert "kill_idle: 4 seed(s), 2 at a time" in err
    assert err.index("(seed 4): PASS") < err.index("(seed 1): PASS")  # progress as they end
    soak_dir = _soak_dir(tmp_path)
    soak = json.loads((soak_dir / "soak.json").read_text())
    assert [r["seed"] for r in soak["runs"]] == [1, 2, 3, 4] and soak["all_passed"] is True
    assert json.loads((soak_dir / "run.json").read_text())["parallel"] == 2
    summary = json.loads((soak_dir / "summary.json").read_text())
    assert [(r["seed"], r["verdict"], r["status"]) for r in summary["runs"]] == [
        (s, "pass", "complete") for s in (1, 2, 3, 4)]
    assert problems(soak_dir) == []


def test_ctrl_c_stops_every_seed_under_way_and_none_starts_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(runner, "run", _timed_run({5: 30.0}, calls, []))
    # seed 5 is long; seed 0 (Ctrl-C) starts after 7 and 8 ended in its lane, while 5 is under way in the other
    assert cli.main(["soak", "kill_idle", "--seeds", "5,7,8,0,9,10", "--out", str(tmp_path), "--parallel",
                     "2"]) == 130
    assert [s for _, s in calls] == [5, 7, 8, 0]  # 9 and 10 never started
    assert "(interrupted during seeds 5, 0)" in capsys.readouterr().out
    soak_dir = _soak_dir(tmp_path)
    soak = json.loads((soak_dir / "soak.json").read_text())
    assert (soak["status"], soak["done"], soak["interrupted_seeds"]) == ("interrupted", 2, [5, 0])
    assert [r["seed"] for r in soak["runs"]] == [7, 8]
    summary = {r["seed"]: r["status"] for r in json.loads((soak_dir / "summary.json").read_text())["runs"]}
    assert summary == {5: "not_run", 7: "complete", 8: "complete", 0: "not_run", 9: "not_run", 10: "not_run"}  # the
    # fake runs never made a run directory; a real one stopped reads as its run.json says (test_chaos_ci)
    assert json.loads((soak_dir / "run.json").read_text())["stopped_during"] == "seeds 5, 0"
    assert problems(soak_dir) == []


def test_the_suite_records_an_error_and_goes_on_to_the_next_scenario(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(runner, "run", _fake_run({"model_outage": "error", "pause_worker": "crash"}, calls))
    jobs = [(n, SCENARIOS[n], ReferenceOnTemporal()) for n in ("kill_idle", "model_outage", "pause_worker", "hotfix")]
    assert asyncio.run(suite.run_many([(*job, 1) for job in jobs], tmp_path, parallel=2)) == 1
    out, err = capsys.readouterr()  # progress on stderr, the table and the verdicts on stdout
    assert sorted(n for n, _ in calls) == ["hotfix", "kill_idle", "model_outage", "pause_worker"]
    table = out[out.index("scenario "):]
    assert [line.split() for line in table.splitlines() if line.startswith("model_outage")] == [
        ["model_outage", *["?"] * 12, "error"]]
    assert [line.split()[-1] for line in table.splitlines() if line.startswith(("kill_idle", "hotfix"))] == [
        "pass", "pass"]
    assert "4 scenario(s)" in out and "2 passed, 2 not passed" in out
    assert "model_outage error: WorkerStartError: worker w1-1 exited with 3" in err and "model_outage   | boom" in err
    assert "scenario 1/4" in err and "scenario 1/4" not in out
    assert "model_outage: error: WorkerStartError: worker w1-1 exited with 3 before printing 'READY' (log " \
           "logs/w1-1.log): (...); reproduce with: python -m chaos run model_outage --seed 1; artefacts in " \
           f"{tmp_path.resolve() / 'model_outage'}" in out
    assert f"pause_worker: error: OSError: No space left on device; reproduce with: {tool('chaos')} run " \
           "pause_worker --seed 1" in out


def test_ctrl_c_still_stops_the_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []
    second = SCENARIOS[suite.SUITE[1]].name
    monkeypatch.setattr(runner, "run", _fake_run({second: "interrupt"}, calls))
    assert cli.main(["suite", "--out", str(tmp_path), "--parallel", "1"]) == 130
    assert len(calls) == 2


class _NoCluster(ReferenceOnTemporal):
    def stack_spec(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("port 7233 already in use")


async def test_a_run_that_raises_is_recorded_failed_with_its_error_and_reproduce_command(tmp_path: Path) -> None:
    with pytest.raises(RunFailed) as caught:
        await runner.run(SCENARIOS["kill_idle"], _NoCluster(), seed=3, out_root=tmp_path)
    exc = caught.value
    assert exc.error == "RuntimeError: port 7233 already in use" and exc.reproduce == f"{tool('chaos')} run " \
                                                                                      "kill_idle --seed 3"
    record = json.loads((exc.run_dir / "run.json").read_text())
    assert (record["status"], record["error"], record["reproduce"]) == ("failed", exc.error, exc.reproduce)
    assert "port 7233 already in use" in (exc.run_dir / "logs" / RUNNER_ERROR).read_text()
    assert problems(exc.run_dir) == []
    assert not (tmp_path / "kill_idle" / "latest").exists()

    outcome = await run_captured("kill_idle", SCENARIOS["kill_idle"], _NoCluster(), seed=4, out_root=tmp_path)
    assert (outcome.verdict, outcome.error, outcome.reproduce) == (
        "error", "RuntimeError: port 7233 already in use", f"{tool('chaos')} run kill_idle --seed 4")
    assert outcome.row == {"scenario": "kill_idle", **dict.fromkeys(
        ("faults", "ok", "fail", "info", "lost", "late", "dup_effects", "recovery_s", "model_rec_s", "tool_rec_s", "wft_rec_s",
         "checked"), "?"), "verdict": "error"}


def test_sigterm_stops_a_chaos_command_as_ctrl_c_does(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import time

    from harness import rundir

    monkeypatch.setattr(rundir, "_stopping", {})  # this process's record of the stop, put back afterwards
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        assert rundir.stopped_status() == "interrupted" and rundir.stopped_exit_code() == 130
        rundir.stop_on_sigterm()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs at the next bytecode boundary
        assert rundir.stopped_status() == "terminated" and rundir.stopped_exit_code() == 143
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
