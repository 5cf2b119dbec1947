"""Bring your own agent: the harness tests an agent it shares no code with, through a target file, in the agent's
own Python.

The example (examples/third_party_agent) talks Signals + a Query, calls the model with plain httpx, and records
its model calls and its one side effect (appending to a notebook file) through the harness's public recording
API. Here it runs in a virtual environment of its own that has only its own requirements (temporalio, httpx; no
LiteLLM, no harness dependencies): its workers, its driver and the replay of its histories all run there.
"""

from __future__ import annotations

import json
import subprocess
import venv
from dataclasses import replace
from pathlib import Path

import pytest

from testbed.engines.byo.engine import OwnAgentOnTemporal
from testbed.engines.workload import Workload
from chaos.generator import NemesisEvent
from chaos.runner import run
from chaos.scenarios import SCENARIOS, ClusterSpec
from testbed.engines.byo.target import load_target
from tests.run_directory import assert_valid
from tests.test_chaos_checkpoint import assert_rechecked_identically_elsewhere

EXAMPLE_DIR = Path(__file__).resolve().parent.parent / "examples" / "third_party_agent"
EXAMPLE = EXAMPLE_DIR / "chaos-target.toml"
ALL = ["lost", "late", "replies", "context", "temporal_history", "workflow_tasks", "effects", "replay", "injection_evidence",
       "stats", "drain", "dbos_steps", "restate_journal"]

WORKER = 'worker = ["{python}", "-m", "x.worker", "--address", "{address}", "--task-queue", "{task_queue}"]\n'
GOOD = WORKER + 'name = "x"\ndriver = "x.driver:make_driver"\nworkflow = "x.app:Flow"\n'


def test_example_target_loads() -> None:
    t = load_target(EXAMPLE)
    assert t.name == "calc-agent" and t.ready_line == "AGENT-WORKER-UP" and t.ledger == "ledger.sqlite3"
    assert t.workspace == "notes/{workflow_id}" and list(t.checkers) == ALL
    assert Path(t.cwd) == EXAMPLE_DIR and t.python is None  # its own directory; the harness's Python by default
    cmd = t.worker_command(address="127.0.0.1:1", task_queue="q", identity="w1-1", model_url="http://m/v1",
                           namespace="default", state_dir="/s", ledger="/s/ledger.sqlite3")
    assert cmd[1:3] == ["-m", "calc_agent.worker"] and "127.0.0.1:1" in cmd and "/s/ledger.sqlite3" in cmd


@pytest.mark.parametrize("text, field", [
    (GOOD.replace(WORKER, ""), "'worker'"),  # missing
    (GOOD + 'checkers = ["lost", "effectz"]\n', "effectz"),
    (GOOD + 'checkers = "lost"\n', "'checkers' must be a non-empty list"),
    (GOOD + 'colour = "blue"\n', "colour"),
    (GOOD + 'env = "FOO=1"\n', "'env' must be a table"),
    (GOOD + 'ready_line = ["x"]\n', "'ready_line' must be a non-empty string"),
    (GOOD.replace('name = "x"', "name = 5"), "'name' must be a non-empty string"),
    (GOOD + 'python = "./no/such/python"\n', "'python'"),
    (GOOD.replace('"--address", "{address}", ', ""), "{address}"),
], ids=["missing-worker", "unknown-checker", "checkers-not-a-list", "unknown-field", "env-not-a-table",
        "ready-line-not-a-string", "name-not-a-string", "python-missing", "worker-without-address"])
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
    assert t.checkers == tuple(ALL) and t.cwd == str(tmp_path.resolve())


@pytest.fixture(scope="session")
def own_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment with the example's requirements only (from the package index, like a user's)."""
    env = tmp_path_factory.mktemp("calc-agent-venv") / "venv"
    venv.EnvBuilder(with_pip=True).create(env)
    python = env / "bin" / "python"
    out = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r",
                          str(EXAMPLE_DIR / "requirements.txt")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return python


@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_a_third_party_agent_in_its_own_python_keeps_its_promises_under_kills_and_crashes(
        tmp_path: Path, own_python: Path) -> None:
    # Its own interpreter cannot import the harness's dependencies: only what it declared, plus `harness`.
    probe = subprocess.run([str(own_python), "-c", "import litellm"], capture_output=True, text=True)
    assert probe.returncode != 0
    target = replace(load_target(EXAMPLE), python=str(own_python))
    # SIGKILLs aimed at workers in the middle of a model call, and workers that SIGKILL themselves right after
    # an effect (the crash point acts inside the agent's own recording calls).
    scenario = replace(SCENARIOS["kill_mid_turn"], name="byo_kills_and_crashes",
                       cluster=ClusterSpec(model_latency="fixed:300", crash_at=("after_effect",)),
                       events=(NemesisEvent(0.5, "kill_worker", {"when": "busy", "activity": "model", "down_s": 0.5}),),
                       workload=Workload(conversations=2, messages=4, append_ratio=0.6), fault_s=3.0)
    result = await run(scenario, OwnAgentOnTemporal(target, target_file=EXAMPLE), seed=2, out_root=tmp_path)
    by = {c.name: c for c in result.checks}
    report = json.dumps([c.as_dict() for c in result.checks], indent=1, default=str)[:4000]
    assert result.verdict == "pass", f"run dir {result.run_dir}:\n{report}"
    assert sorted(by) == sorted(ALL)
    assert_valid(result.run_dir)
    # A real effects verdict: effects were applied (through the recording API), each once, though the worker
    # that applied the first one died before reporting it, and the retry ran on another process.
    effects = by["effects"].details
    assert effects["logical_effects_applied"] >= 2 and effects["duplicated_effects"] == 0, effects
    assert effects["logical_effects_executed_more_than_once"] >= 1, effects
    assert by["lost"].details["acknowledged"] > 0
    landed = by["injection_evidence"].details["faults"]
    assert any(f["f"] == "crash_point" and f["landed"] for f in landed), landed
    assert any(f["f"] == "kill_worker" and f["landed"] for f in landed), landed
    assert by["replay"].details["replayed"] >= 2  # replayed in the agent's own Python
    # The processes the harness ran were the agent's own, in its own interpreter.
    assert "AGENT-WORKER-UP" in (result.run_dir / "logs" / "w1-1.log").read_text()
    record = json.loads((result.run_dir / "run.json").read_text())
    assert record["target"]["python"] == str(own_python) and record["backend"]["name"] == "target"
    kills = [json.loads(line) for line in (result.run_dir / "operations.jsonl").read_text().splitlines()]
    kills = [op["value"] for op in kills if op["f"] == "kill_worker" and op["type"] == "ok"]
    assert all(e["activity"] == "call_model" for k in kills for e in k["evidence"])
    assert_rechecked_identically_elsewhere(result.run_dir, tmp_path / "elsewhere")


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_planted_bug_in_the_third_party_agent_fails_its_effects_and_lost_checks(
        tmp_path: Path, own_python: Path) -> None:
    # The same agent, built to ignore its idempotency keys (the unkeyed_effects mutation, acting inside its own
    # recording calls): the retry after a crash right after an append appends again. The checkers must say so.
    target = replace(load_target(EXAMPLE), python=str(own_python))
    scenario = replace(SCENARIOS["crash_after_effect"], name="byo_unkeyed_effects",
                       cluster=ClusterSpec(crash_at=("after_effect",), mutations=("unkeyed_effects",)),
                       workload=Workload(conversations=2, messages=3, append_ratio=1.0), fault_s=2.0)
    result = await run(scenario, OwnAgentOnTemporal(target, target_file=EXAMPLE), seed=3, out_root=tmp_path)
    by = {c.name: c for c in result.checks}
    assert by["effects"].verdict == "fail" and by["effects"].details["duplicated_effects"] >= 1, by["effects"]
    assert by["lost"].verdict == "fail" and "each processed append once" in by["lost"].summary, by["lost"]
    assert result.verdict == "fail"
