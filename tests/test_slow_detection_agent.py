"""An agent whose recovery is slow by its own setting, found and named: the OpenAI Agents SDK notes agent
(examples/openai_agents_agent) with its model activity at start-to-close 30 s and no heartbeat timeout
(``chaos-target.no-heartbeat.toml``). With no fault, the lint flags the setting. Under kill_mid_turn, a kill mid
model call waits ~30 s to be noticed: the recovery is decomposed with that in detection, the diagnosis names the
setting, and with a settle too short to wait it out, the reply is reported late, never lost.

Needs the example's own environment (``make example-openai-agents``, which ``make test`` builds)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from chaos.runner import run
from chaos.scenarios import SCENARIOS
from harness.verdict import FAIL, PASS
from testbed.engines.byo.engine import OwnAgentOnTemporal
from testbed.engines.workload import Workload
from testbed.engines.byo.target import load_target

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "openai_agents_agent"
TARGET = EXAMPLE / "chaos-target.no-heartbeat.toml"

pytestmark = pytest.mark.skipif(not (EXAMPLE / ".venv" / ".installed").exists(),
                                reason="the OpenAI Agents SDK example is not installed: make example-openai-agents")


def _engine() -> OwnAgentOnTemporal:
    return OwnAgentOnTemporal(load_target(TARGET), target_file=TARGET)


def _saved(result) -> dict:
    return json.loads((result.run_dir / "verdict.json").read_text())


async def test_the_lint_flags_the_missing_heartbeat_in_a_run_with_no_fault(tmp_path: Path) -> None:
    scenario = replace(SCENARIOS["kill_mid_turn"], name="no_fault", events=(), fault_s=1.0,
                       workload=Workload(conversations=1, messages=2, append_ratio=0.0))
    result = await run(scenario, _engine(), seed=1, out_root=tmp_path)
    lint = _saved(result)["lint"]
    flagged = [f for f in lint if f["rule"] == "no-heartbeat-long-timeout"
               and f["setting"]["activity_type"] == "invoke_model_activity"]
    assert flagged, lint
    assert flagged[0]["setting"]["value_s"] == 30.0 and flagged[0]["evidence"]["heartbeat_s"] is None
    assert "start-to-close 30 s and no heartbeat timeout" in flagged[0]["line"]
    assert "set a heartbeat timeout" not in flagged[0]["fix"].split(", or ")[0]  # never a heartbeat timeout alone
    # the lint informs; it fails nothing (with no fault, injection_evidence cannot pass: the verdict is unknown)
    assert {c.name: c.verdict for c in result.checks}["lost"] == PASS and result.verdict != FAIL, result.checks


async def test_a_kill_mid_call_is_decomposed_diagnosed_and_its_slow_reply_is_late_not_lost(tmp_path: Path) -> None:
    # a settle of 3 s cannot wait out a 30 s start-to-close: the run's late wait does, and says the reply was late
    scenario = replace(SCENARIOS["kill_mid_turn"], settle_s=3.0,
                       workload=Workload(conversations=2, messages=4, append_ratio=0.0))
    result = await run(scenario, _engine(), seed=1, out_root=tmp_path)
    saved = _saved(result)
    checks = {c.name: c for c in result.checks}
    held = [a for p in saved["recovery_paths"] for a in p["activities"] if a["model"]]
    assert held and all(a["detected_by"] == "START_TO_CLOSE" and a["start_to_close_s"] == 30.0 for a in held), held
    assert all(27.0 <= a["detection_s"] <= 31.0 for a in held), held  # ~30 s in detection, minus the call's start
    named = [d for d in saved["diagnoses"] if d["about"] == "recovery" and d["setting"]
             and d["setting"]["name"] == "start_to_close"]
    assert named and "`invoke_model_activity` has start-to-close 30 s and no heartbeat timeout" in named[0]["line"]
    assert checks["lost"].verdict == PASS, checks["lost"]  # nothing lost: answered late
    assert checks["late"].verdict == FAIL and checks["late"].details["late"], checks["late"]
    assert (saved["safety"], saved["liveness"]) == (PASS, FAIL)
    late = [d for d in saved["diagnoses"] if d["about"] == "late"]
    assert late and "start-to-close 30 s" in late[0]["line"], saved["diagnoses"]
    assert saved["summary"]["late"] >= 1 and saved["summary"]["lost"] == 0
