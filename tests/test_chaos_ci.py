"""Chaos in CI (chaos/ci.py, the suite's and soak's --shard/--summary/--junit, ``python -m chaos summary``).

The bookkeeping is tested with ``chaos.runner.run`` replaced by a fake that writes a run directory as a real run
does (``run.json`` and ``verdict.json``) with the verdict the test asks for; the real runs' side (a SIGTERMed
suite shard on a real cluster) is in ``test_a_sigtermed_suite_shard_...`` below.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chaos import ci, runner, suite
from cli import chaos as cli
from chaos.runner import RunFailed, RunResult
from harness.rundir import RunDir
from chaos.checker.verdict import compose
from harness.verdict import CheckResult
from tests.conftest import temporal_server_pids
from tests.run_directory import problems

ROOT = Path(__file__).resolve().parent.parent
LOST = "1 acknowledged message(s) lost: conv-0 #2"


def _fake_run(plan: dict[tuple[str, int], str]):
    """``chaos.runner.run`` writing a run directory per (scenario, seed): ``pass`` (default), ``fail``,
    ``unknown`` or ``error`` (recorded ``failed``), as the real runner leaves it."""

    async def fake(scenario: Any, backend: Any, *, seed: int, out_root: Path, progress: Any = None,
                   ui: bool = False, on_run_dir: Any = lambda p: None, cluster: Any = None) -> RunResult:
        name = scenario.name + backend.suffix
        what = plan.get((name, seed), "pass")
        run = RunDir.create(Path(out_root) / name)
        on_run_dir(run.path)
        reproduce = f"python -m chaos run {name} --seed {seed}"
        run.begin("chaos", name, seed=seed, reproduce=reproduce)
        if what == "error":
            run.finish("failed", 2.0, "WorkerStartError: worker w1-1 exited with 3")
            raise RunFailed(name, seed, run.path, reproduce, "WorkerStartError: worker w1-1 exited with 3", 2.0)
        checks = [CheckResult("lost", "fail" if what == "fail" else "pass", LOST if what == "fail" else "none lost"),
                  CheckResult("injection_evidence", "unknown" if what == "unknown" else "pass",
                              "no fault landed" if what == "unknown" else "1/1 landed")]
        run.write_json("verdict.json", {"verdict": compose(checks), "checks": [c.as_dict() for c in checks]})
        run.finish("complete", 3.0)
        return RunResult(name, run.path, compose(checks), checks, seed, 3.0, {"scenario": name, "verdict": what},
                         reproduce)

    return fake


def _cases(junit: Path) -> dict[str, ET.Element]:
    root = ET.parse(junit).getroot()
    return {case.get("name"): case for case in root.iter("testcase")}


@given(st.lists(st.tuples(st.sampled_from(["kill_idle", "hotfix", "mixed@checkpoint"]), st.integers(0, 500)),
                unique=True, max_size=60), st.integers(1, 12))
def test_shards_split_the_runs_deterministically_each_in_exactly_one(items: list[tuple[str, int]], n: int) -> None:
    shards = [ci.shard(items, k, n) for k in range(1, n + 1)]
    assert sorted(i for s in shards for i in s) == sorted(items)  # every run in exactly one shard
    assert [ci.shard(list(items), k, n) for k in range(1, n + 1)] == shards  # the same split every time
    assert max(map(len, shards)) - min(map(len, shards)) <= 1  # balanced
    for s in shards:
        assert s == [i for i in items if i in s]  # each shard keeps the suite's order


def test_a_bad_shard_is_refused_naming_it() -> None:
    assert ci.parse_shard(" 2/4 ") == (2, 4)
    for bad in ("0/4", "5/4", "2", "a/b", "1/0", "-1/4"):
        with pytest.raises(ValueError, match="--shard"):
            ci.parse_shard(bad)


def test_the_suite_shard_writes_junit_and_a_summary_with_a_testcase_per_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    everything = [(label, seed) for seed in (1, 2) for label, _, _ in suite.jobs(cli.build_parser().parse_args(
        ["suite"]), None)]
    mine = ci.shard(everything, 2, 5)
    plan = {mine[0]: "fail", mine[1]: "unknown", mine[2]: "error"}
    monkeypatch.setattr(runner, "run", _fake_run(plan))
    junit = tmp_path / "ci" / "junit.xml"
    rc = cli.main(["suite", "--seeds", "1-2", "--shard", "2/5", "--out", str(tmp_path / "runs"), "--junit", str(junit)])
    out, err = capsys.readouterr()  # progress (the shard's share) on stderr; the table and verdicts on stdout
    assert rc == 1
    assert f"shard 2/5: {len(mine)} of the suite's {len(everything)} run(s)" in err
    assert f"{mine[0][0]} (seed {mine[0][1]}): fail; reproduce with: python -m chaos run {mine[0][0]}" in out

    cases = _cases(junit)
    assert set(cases) == {f"{label} seed {seed}" for label, seed in mine}
    root = ET.parse(junit).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("skipped")) == (
        str(len(mine)), "2", "1", "0")
    failure = cases[f"{mine[0][0]} seed {mine[0][1]}"].find("failure")
    assert failure.get("type") == "fail" and LOST in failure.get("message")
    assert f"reproduce: python -m chaos run {mine[0][0]} --seed {mine[0][1]}" in failure.text
    unknown = cases[f"{mine[1][0]} seed {mine[1][1]}"].find("failure")
    assert unknown.get("type") == "unknown" and "injection_evidence: unknown: no fault landed" in unknown.get("message")
    assert "WorkerStartError" in cases[f"{mine[2][0]} seed {mine[2][1]}"].find("error").get("message")
    assert cases[f"{mine[3][0]} seed {mine[3][1]}"].find("failure") is None

    summary = json.loads((tmp_path / "runs" / ci.SUITE_SUMMARY).read_text())  # the default path
    assert (summary["kind"], summary["status"], summary["shard"]) == ("chaos-summary", "complete", "2/5")
    assert summary["totals"] == {"pass": len(mine) - 3, "fail": 1, "unknown": 1, "error": 1, "incomplete": 0, "skipped": 0}
    rows = {(r["scenario"], r["seed"]): r for r in summary["runs"]}
    assert set(rows) == set(mine) and summary["all_items"] == [list(i) for i in everything]
    row = rows[mine[0]]
    assert row["verdict"] == "fail" and row["checkers"] == {"lost": "fail", "injection_evidence": "pass"}
    assert (tmp_path / "runs" / row["run_dir"] / "run.json").exists()  # relative to the summary's directory
    assert isinstance(row["wall_s"], float) and rows[mine[2]]["status"] == "failed"


def test_summary_merges_two_ci_jobs_and_names_what_is_missing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runner, "run", _fake_run({("kill_idle", 3): "fail"}))
    for k in (1, 2):  # two CI jobs, each its own machine's runs/, downloaded side by side
        assert cli.main(["soak", "kill_idle", "--seeds", "1-5", "--shard", f"{k}/3", "--out",
                         str(tmp_path / f"job{k}" / "runs")]) == 0
    capsys.readouterr()
    merged_json, merged_xml = tmp_path / "all.json", tmp_path / "all.xml"
    rc = cli.main(["summary", str(tmp_path / "job1"), str(tmp_path / "job2"), "--summary", str(merged_json),
                   "--junit", str(merged_xml)])
    out = capsys.readouterr().out
    assert rc == 1
    # shard 1/3: seeds 1, 4; shard 2/3: seeds 2, 5; shard 3/3 (seed 3) never reported: missing, by name
    assert "shard 3/3: no summary among the inputs; its runs are missing" in out
    assert "incomplete: 1 run(s) did not finish: kill_idle seed 3 (missing)" in out
    doc = json.loads(merged_json.read_text())
    assert [(r["seed"], r["verdict"], r["status"]) for r in doc["runs"]] == [
        (1, "pass", "complete"), (2, "pass", "complete"), (3, "unknown", "missing"), (4, "pass", "complete"),
        (5, "pass", "complete")]
    assert doc["totals"] == {"pass": 4, "fail": 0, "unknown": 0, "error": 0, "incomplete": 1, "skipped": 0}
    assert (merged_json.parent / doc["runs"][0]["run_dir"] / "run.json").exists()
    assert _cases(merged_xml)["kill_idle seed 3"].find("failure").get("type") == "missing"

    # The third job's artefacts arrive: its failing seed is in the table, and the exit status still says so.
    assert cli.main(["soak", "kill_idle", "--seeds", "1-5", "--shard", "3/3", "--out",
                     str(tmp_path / "job3" / "runs")]) == 1
    capsys.readouterr()
    assert cli.main(["summary", str(tmp_path), "--summary", str(merged_json), "--junit", str(merged_xml)]) == 1
    out = capsys.readouterr().out
    assert "kill_idle seed 3: fail: lost: fail: " + LOST in out and "did not finish" not in out
    assert json.loads(merged_json.read_text())["totals"]["fail"] == 1


def test_summary_of_passing_runs_exits_0_and_refuses_a_missing_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runner, "run", _fake_run({}))
    assert cli.main(["run", "kill_idle", "hotfix", "--out", str(tmp_path / "runs")]) == 0  # no summary: run dirs
    out = tmp_path / "s.json"
    assert cli.main(["summary", str(tmp_path / "runs"), "--summary", str(out), "--junit", str(tmp_path / "j.xml")]) == 0
    assert [r["scenario"] for r in json.loads(out.read_text())["runs"]] == ["hotfix", "kill_idle"]
    assert cli.main(["summary", str(tmp_path / "nowhere")]) == 2
    assert "not a directory" in capsys.readouterr().err


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in (path.read_text() if path.exists() else ""):
        assert proc.poll() is None, path.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{text!r} never appeared: {path.read_text()[-3000:]}"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_sigtermed_suite_shard_ends_terminated_and_says_so_everywhere(tmp_path: Path) -> None:
    """A real run (the suite's first scenario, the only one in shard 1/100) SIGTERMed in its fault phase."""
    before = temporal_server_pids()
    log = tmp_path / "suite.log"
    with log.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "chaos", "suite", "--shard", "1/100", "--out",
                                 str(tmp_path / "runs")], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    try:
        _wait_for(log, ": faults (t=", proc, 180)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert proc.returncode == 143, text[-3000:]
    assert "terminated; the cluster was stopped" in text
    [run_dir] = [p for p in (tmp_path / "runs").glob("*/2*") if p.is_dir()]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "terminated" and record["stopped_during"] in ("faults", "heal", "settle")
    assert problems(run_dir) == []
    assert temporal_server_pids() <= before, "a temporal server was left running"

    check = subprocess.run([sys.executable, "-m", "chaos", "check", str(run_dir)], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert check.returncode == 1
    assert f"was terminated during {record['stopped_during']}" in check.stdout and "verdict: unknown" in check.stdout
    assert "crashed" not in check.stdout

    summary = json.loads((tmp_path / "runs" / ci.SUITE_SUMMARY).read_text())
    assert summary["status"] == "terminated"
    [row] = summary["runs"]
    assert (row["status"], row["verdict"]) == ("terminated", "unknown")
    assert row["error"] == f"terminated during {record['stopped_during']}: never checked"
    [case] = _cases(tmp_path / "runs" / ci.SUITE_JUNIT).values()
    assert case.find("failure").get("type") == "terminated"

    from reports.build import build

    build(tmp_path / "runs", tmp_path / "report")
    assert f"unknown (terminated during {record['stopped_during']}: the run was never checked)" in (
        tmp_path / "report" / "report.md").read_text()


def test_the_ci_example_shards_the_suite_and_merges_every_shard() -> None:
    import yaml

    workflow = yaml.safe_load((ROOT / "examples" / "ci" / "github-actions.yml").read_text())
    shards = workflow["jobs"]["shard"]["strategy"]["matrix"]["shard"]
    steps = " ".join(str(step.get("run", "")) for step in workflow["jobs"]["shard"]["steps"])
    assert f"--shard ${{{{ matrix.shard }}}}/{len(shards)}" in steps and "make chaos CHAOS_ARGS=" in steps
    parsed = cli.build_parser().parse_args(["suite", "--shard", f"{shards[-1]}/{len(shards)}", "--seeds", "1-3"])
    assert parsed.shard == (len(shards), len(shards))
    summary = workflow["jobs"]["summary"]
    assert summary["needs"] == "shard" and summary["if"] == "always()"
    assert "python -m chaos summary shards/*" in " ".join(str(s.get("run", "")) for s in summary["steps"])


def test_an_interrupted_suite_says_what_ran_and_skips_what_never_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_chaos_soak import _fake_run as interrupting_run

    second = suite.SUITE[1]
    monkeypatch.setattr(runner, "run", interrupting_run({second: "interrupt"}, []))
    assert cli.main(["suite", "--out", str(tmp_path), "--parallel", "1"]) == 130
    summary = json.loads((tmp_path / ci.SUITE_SUMMARY).read_text())
    assert summary["status"] == "interrupted" and summary["all_passed"] is False
    statuses = [r["status"] for r in summary["runs"]]
    assert statuses[0] == "complete" and set(statuses[1:]) == {"not_run"}
    assert summary["totals"]["incomplete"] == len(statuses) - 1
    root = ET.parse(tmp_path / ci.SUITE_JUNIT).getroot()
    assert (root.get("skipped"), root.get("failures")) == (str(len(statuses) - 1), "0")
    assert _cases(tmp_path / ci.SUITE_JUNIT)[f"{second} seed 1"].find("skipped") is not None


def test_check_on_a_run_killed_outright_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = RunDir.create(tmp_path / "kill_idle")  # as a SIGKILLed run leaves it: running, no final read
    run.begin("chaos", "kill_idle", seed=1, reproduce="python -m chaos run kill_idle --seed 1")
    run.operations.write_text("")
    assert cli.main(["check", str(run.path)]) == 1
    out = capsys.readouterr().out
    assert "says running: it is still running, or was killed outright" in out and "verdict: unknown" in out
    assert cli.main(["check", str(run.path), "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == {"verdict": "unknown", "status": "running", "checks": [],
                                                   "note": out.split(";")[0]}
    [row] = ci.merge([tmp_path]).rows
    assert (row["status"], row["verdict"]) == ("running", "unknown") and ci.incomplete(row)
