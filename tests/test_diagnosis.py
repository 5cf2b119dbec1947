"""Diagnoses name the setting that made a recovery slow, with its time, and claim nothing their evidence does not
show: one run of the reference agent under the ``distinct`` timeouts profile (heartbeat 10 s, first retry after
6 s, sticky 7 s, workflow task 8 s) with three kills, each aimed to exercise one of them; each setting is then
checked by a test of its own, and a fast run shows no slow-recovery diagnosis at all."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from chaos.checker.run_data import RunData
from chaos.diagnosis import check_diagnoses, diagnose, holds, recovery_diagnoses, verified
from chaos.generator import NemesisEvent as E
from chaos.recovery import fault_paths
from chaos.runner import run
from chaos.scenarios import SCENARIOS, ChaosScenario, ClusterSpec
from harness.verdict import FAIL, CheckResult
from testbed.engines.workload import TIMEOUTS, Workload
from testbed.engines.temporal.engine import ReferenceOnTemporal

PLANTED = TIMEOUTS["distinct"]
SCENARIO = ChaosScenario(
    "planted_settings", "a model call killed mid-call, a worker killed while it holds idle conversations, a worker "
                        "killed holding a workflow task",
    (E(0.5, "kill_worker", {"when": "busy", "activity": "model", "down_s": 1.0, "spare": True}),
     E(22.0, "kill_worker", {"when": "idle", "down_s": 1.0}),
     E(34.0, "kill_worker", {"at": "workflow_task", "down_s": 1.0, "spare": True})),
    cluster=ClusterSpec(model_latency="fixed:150"), workload=Workload(think_s=2.0, messages=12, append_ratio=0.0),
    fault_s=50.0, timeouts="distinct")


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    result = asyncio.run(run(SCENARIO, ReferenceOnTemporal(), seed=1, out_root=tmp_path_factory.mktemp("runs")))
    saved = json.loads((result.run_dir / "verdict.json").read_text())
    return {"result": result, "diagnoses": saved["diagnoses"], "data": RunData(result.run_dir)}


def _named(planted: dict[str, Any], setting: str) -> list[dict[str, Any]]:
    found = [d for d in planted["diagnoses"] if d["about"] == "recovery" and (d["setting"] or {}).get("name") == setting]
    assert found, f"no diagnosis names {setting}; run {planted['result'].run_dir}: " + \
        "\n".join(d["line"] for d in planted["diagnoses"])
    return found


def _within(value: float | None, planted_s: float, share: float = 0.2) -> bool:
    return value is not None and abs(value - planted_s) <= share * planted_s


@pytest.mark.slow
def test_a_long_heartbeat_timeout_is_named_with_its_time(planted: dict[str, Any]) -> None:
    d = _named(planted, "heartbeat_timeout")[0]
    assert d["setting"]["value_s"] == PLANTED.heartbeat_s and d["setting"]["activity_type"] == "plan_next_action"
    assert _within(d["measured_s"], PLANTED.heartbeat_s), d["line"]
    assert "heartbeat timeout 10 s" in d["line"] and "shorten the heartbeat timeout" in d["line"]


def test_a_long_first_retry_interval_is_named_with_its_time(planted: dict[str, Any]) -> None:
    d = _named(planted, "initial_interval")[0]
    assert d["setting"]["value_s"] == PLANTED.initial_interval_s
    assert _within(d["measured_s"], PLANTED.initial_interval_s), d["line"]
    # the measured total from the kill to the retry is the heartbeat's and the backoff's, each within 20 %
    path = next(p for p in fault_paths(planted["data"]) if p["activities"])
    held = path["activities"][0]
    assert _within(held["retry_at"] - path["at"], PLANTED.heartbeat_s + PLANTED.initial_interval_s), held


def test_a_long_sticky_timeout_is_named_with_its_time(planted: dict[str, Any]) -> None:
    d = _named(planted, "sticky_queue_schedule_to_start_timeout")[0]
    assert _within(d["setting"]["value_s"], PLANTED.sticky_timeout_s), d["line"]
    assert _within(d["measured_s"], PLANTED.sticky_timeout_s, 0.3), d["line"]
    assert "sticky queue" in d["line"]


def test_a_long_workflow_task_timeout_is_named_with_its_time(planted: dict[str, Any]) -> None:
    d = _named(planted, "workflow_task_timeout")[0]
    assert d["setting"]["value_s"] == PLANTED.workflow_task_timeout_s
    assert _within(d["measured_s"], PLANTED.workflow_task_timeout_s), d["line"]


def test_every_diagnosis_of_the_planted_run_rests_on_evidence_its_directory_holds(planted: dict[str, Any]) -> None:
    data = planted["data"]
    paths = fault_paths(data)
    t0 = data.ops[0].wall - data.ops[0].time
    made = recovery_diagnoses(data, paths, t0)
    made += check_diagnoses(data, planted["result"].checks, made)
    assert made and verified(data, made) == made  # none dropped: each claims only what the run shows
    assert [d["line"] for d in diagnose(data, planted["result"].checks)] == \
        [d["line"] for d in planted["diagnoses"]]  # from the run directory alone: the same words again


def test_a_diagnosis_whose_evidence_the_run_does_not_show_is_dropped(planted: dict[str, Any]) -> None:
    data = planted["data"]
    real = next(d for d in planted["diagnoses"] if d["setting"] and d["setting"]["name"] == "heartbeat_timeout")
    lying = [{**e, "value": 99.0} if e.get("field") == "heartbeat_s" else e for e in real["evidence"]]
    assert any(not holds(data, e) for e in lying)
    assert verified(data, [{**real, "evidence": lying}]) == []
    # a failing check with nothing in the run to explain it names what it saw, and claims no setting
    plain = check_diagnoses(data, [CheckResult("replay", FAIL, "chat-1: does not replay")], [])
    assert plain[0]["setting"] is None and "deterministic" in plain[0]["fix"]


async def test_under_fast_timeouts_no_recovery_is_diagnosed_slow(tmp_path: Path) -> None:
    result = await run(SCENARIOS["kill_mid_turn"], ReferenceOnTemporal(), seed=2, out_root=tmp_path)
    saved = json.loads((result.run_dir / "verdict.json").read_text())
    assert result.verdict == "pass", result.checks
    assert [d["line"] for d in saved["diagnoses"]] == []
    assert saved["safety"] == saved["liveness"] == "pass"
