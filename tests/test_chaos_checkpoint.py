"""The chaos harness on the checkpoint engine: the same load, faults and checkers, with Temporal-only
checkers reported as not applicable (never as a pass)."""


from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from chaos.checker.verdict import compose
from harness.commands import tool
from harness.verdict import FAIL, NOT_APPLICABLE, PASS, UNKNOWN, CheckResult
from testbed.engines.workload import Workload
from chaos.generator import NemesisEvent
from testbed.engines.checkpoint.engine import CheckpointEngine
from chaos.runner import check, run
from chaos.scenarios import SCENARIOS
from tests.run_directory import assert_valid


def test_not_applicable_checks_count_neither_way() -> None:
    na = CheckResult("replay", NOT_APPLICABLE, "not applicable: no Temporal histories")
    assert compose([CheckResult("lost", PASS, ""), na]) == PASS
    assert compose([CheckResult("lost", FAIL, ""), na]) == FAIL
    assert compose([na]) == UNKNOWN  # nothing that applies was checked: never a pass


@pytest.mark.slow
async def test_a_worker_kill_on_the_checkpoint_backend_loses_nothing(tmp_path: Path) -> None:
    scenario = replace(SCENARIOS["kill_mid_turn"],
                       events=(NemesisEvent(0.5, "kill_worker", {"when": "busy", "activity": "model", "down_s": 0.5}),),
                       workload=Workload(conversations=2, messages=3), fault_s=2.5)
    result = await run(scenario, CheckpointEngine(), seed=3, out_root=tmp_path)
    verdicts = {c.name: c.verdict for c in result.checks}
    assert verdicts == {"lost": PASS, "effects": PASS, "injection_evidence": PASS, "stats": PASS,
                        "temporal_history": NOT_APPLICABLE, "workflow_tasks": NOT_APPLICABLE,
                        "replay": NOT_APPLICABLE, "drain": NOT_APPLICABLE, "replies": NOT_APPLICABLE,
                        "context": NOT_APPLICABLE, "dbos_steps": NOT_APPLICABLE,
                        "restate_journal": NOT_APPLICABLE, "late": NOT_APPLICABLE}, result.checks
    assert result.verdict == PASS and result.row["faults"] == "1/1" and result.row["lost"] == 0
    # The killed worker's run was resumed elsewhere: its model step began twice, nothing else re-ran.
    db = sqlite3.connect(result.run_dir / "state" / "checkpoint.sqlite3")
    retried = db.execute("SELECT intent, attempts FROM durable_steps WHERE attempts > 1").fetchall()
    db.close()
    assert retried and all(intent == "llm:plan" for intent, _ in retried)
    verdict, checks, _ = check(result.run_dir)  # offline re-check: the same, with the same reasons
    assert verdict == PASS and [c.verdict for c in checks if c.name == "replay"] == [NOT_APPLICABLE]
    assert_valid(result.run_dir)
    assert json.loads((result.run_dir / "run.json").read_text())["reproduce"] == \
        f"{tool('chaos')} rerun {result.run_dir}"  # not a named scenario: rerun from what run.json saved
    # Copied elsewhere (as to another machine) and checked there from the command line: the same verdicts.
    assert_rechecked_identically_elsewhere(result.run_dir, tmp_path / "elsewhere")


def assert_rechecked_identically_elsewhere(run_dir: Path, elsewhere: Path) -> None:
    before = json.loads((run_dir / "verdict.json").read_text())
    copy = elsewhere / run_dir.name
    shutil.copytree(run_dir, copy, symlinks=True)
    out = subprocess.run([sys.executable, "-m", "chaos", "check", str(copy), "--json"], capture_output=True,
                         text=True, timeout=300, cwd=elsewhere)
    after = json.loads(out.stdout)
    assert [(c["name"], c["verdict"], c["summary"]) for c in after["checks"]] == \
        [(c["name"], c["verdict"], c["summary"]) for c in before["checks"]], out.stderr[-2000:]
    assert after["verdict"] == before["verdict"] and out.returncode == (0 if after["verdict"] == PASS else 1)
