"""Bring your own agent: the harness tests an agent it shares no code with, through a target file.

The example (examples/third_party_agent) talks Signals + a Query and calls the
model with plain httpx; the run below kills its workers mid model call on a
real Temporal dev server and checks the verdict the harness reaches.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from chaos.client import Workload
from chaos.backends.byo import OwnAgentOnTemporal
from chaos.runner import run
from chaos.scenarios import SCENARIOS
from chaos.target import load_target
from tests.run_directory import assert_valid

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "third_party_agent" / "chaos-target.toml"
CHECKS = ["lost", "temporal_history", "replay", "injection_evidence", "stats"]

WORKER = 'worker = ["{python}", "-m", "x.worker", "--address", "{address}", "--task-queue", "{task_queue}"]\n'
GOOD = WORKER + 'name = "x"\ndriver = "x.driver:make_driver"\nworkflow = "x.app:Flow"\n'


def test_example_target_loads() -> None:
    t = load_target(EXAMPLE)
    assert t.name == "calc-agent" and t.ready_line == "AGENT-WORKER-UP" and t.ledger is None
    assert list(t.checkers) == CHECKS
    assert Path(t.cwd) == EXAMPLE.parent.parent.parent  # the repo root, so examples.* imports
    cmd = t.worker_command(address="127.0.0.1:1", task_queue="q", identity="w1-1", model_url="http://m/v1",
                           namespace="default")
    assert cmd[1:3] == ["-m", "examples.third_party_agent.worker"] and "127.0.0.1:1" in cmd and "w1-1" in cmd


@pytest.mark.parametrize("text, field", [
    (GOOD.replace(WORKER, ""), "'worker'"),  # missing
    (GOOD + 'checkers = ["lost", "effectz"]\n', "effectz"),
    (GOOD + 'colour = "blue"\n', "colour"),
    (GOOD.replace('"--address", "{address}", ', ""), "{address}"),
], ids=["missing-worker", "unknown-checker", "unknown-field", "worker-without-address"])
def test_bad_target_files_are_refused_naming_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "target.toml"
    path.write_text(text)
    with pytest.raises(ValueError) as exc:
        load_target(path)
    assert field in str(exc.value) and str(path) in str(exc.value)


def test_good_target_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "target.toml"
    path.write_text(GOOD)
    t = load_target(path)
    assert t.checkers == tuple(["lost", "temporal_history", "effects", "replay", "injection_evidence", "stats"])


@pytest.mark.slow
async def test_kill_mid_turn_against_third_party_agent(tmp_path: Path) -> None:
    # The stock scenario aims its kills at "the model activity": the target file says CalcAgent's is call_model.
    scenario = replace(SCENARIOS["kill_mid_turn"], workload=Workload(conversations=2, messages=3))
    result = await run(scenario, OwnAgentOnTemporal(load_target(EXAMPLE)), seed=2, out_root=tmp_path)
    by = {c.name: c for c in result.checks}
    report = json.dumps([c.as_dict() for c in result.checks], indent=1, default=str)[:4000]
    assert result.verdict == "pass", f"run dir {result.run_dir}:\n{report}"
    assert sorted(by) == sorted(CHECKS)
    assert_valid(result.run_dir)
    verdict = json.loads((result.run_dir / "verdict.json").read_text())
    assert verdict["checkers_not_run"] == ["effects"]
    assert by["lost"].verdict == "pass" and by["lost"].details["acknowledged"] > 0
    assert by["injection_evidence"].verdict == "pass" and by["injection_evidence"].details["landed"] >= 1
    assert by["replay"].verdict == "pass" and by["replay"].details["replayed"] >= 2
    # The worker the harness ran was ours (its ready line, its activity), not the reference agent's.
    assert "AGENT-WORKER-UP" in (result.run_dir / "logs" / "w1-1.log").read_text()
    # At least one kill took down the very process running a model call (not a restarted successor).
    kills = [json.loads(line) for line in (result.run_dir / "operations.jsonl").read_text().splitlines()]
    kills = [op["value"] for op in kills if op["f"] == "kill_worker" and op["type"] == "ok"]
    assert all(e["activity"] == "call_model" for k in kills for e in k["evidence"])
    assert any(k["identity"] in {e["worker"] for e in k["evidence"]} for k in kills), kills
