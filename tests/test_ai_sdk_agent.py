"""The TypeScript agent (examples/ai_sdk_agent) end to end on the real stack: a Node worker answers chat updates
through the AI SDK's OpenAI provider (Responses API) on the scripted model, continues as new, and its target file's
``replay_command`` (``dah-replay``, plugins/temporal-replay) passes the saved histories, then fails them once the
workflow code changes an activity input.
Then the same agent as a chaos run driven by its target file alone (``chaos-target.toml``: no harness code), whose
verdict must be pass, its notes seen by the effects service and its histories replayed by its ``replay_command``.

Needs its node_modules (``make example-ai-sdk``); skipped, saying so, without them."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from testbed.engines.byo.engine import OwnAgentOnTemporal
from testbed.engines.workload import Workload
from chaos.runner import run
from chaos.scenarios import SCENARIOS
from testbed.engines.byo.target import load_target
from harness.event_history import save_histories
from testbed.processes import spawn, stop
from testbed.stack import Stack

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ai_sdk_agent"

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or not (EXAMPLE / "node_modules" / "@temporalio" / "worker").is_dir(),
    reason="the TypeScript agent is not installed: make example-ai-sdk",
)


#: the replayer the target file names, as the harness runs it (``{history}``: one workflow's folder of runs)
REPLAY_COMMAND = ["npx", "--no-install", "dah-replay", "--workflows", "./workflows.js", "--plugins",
                  "./temporal-plugins.js", "{history}"]


def replay(cwd: Path, histories: Path) -> subprocess.CompletedProcess:
    argv = [str(histories) if part == "{history}" else part for part in REPLAY_COMMAND]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


@pytest.mark.slow
async def test_chat_continue_as_new_and_strict_replay(stack: Stack, tmp_path: Path) -> None:
    task_queue = f"ai-sdk-{uuid.uuid4().hex[:8]}"
    ends = stack.endpoints
    log = (tmp_path / "worker.log").open("w")
    worker = spawn(["node", "worker.js", "--address", ends.address, "--namespace", ends.namespace,
                    "--task-queue", task_queue, "--identity", "ts-1", "--model-url", ends.model_url,
                    "--effects-url", "http://127.0.0.1:9"],  # arithmetic only: the notes service is never called
                   cwd=EXAMPLE, stdout=log, stderr=subprocess.STDOUT)
    workflow_id = f"ts-chat-{uuid.uuid4().hex[:8]}"
    try:
        handle = await stack.client.start_workflow("ChatWorkflow", {"maxTurns": 2}, id=workflow_id,
                                                   task_queue=task_queue)
        replies = []
        for a, b in [(6, 7), (12, 3), (5, 5)]:  # the third turn goes to the run continued as new
            replies.append(await asyncio.wait_for(handle.execute_update("send", f"What is {a} * {b}?"), 180))
        assert replies == ["6 * 7 = 42", "12 * 3 = 36", "5 * 5 = 25"]
        conversation = await handle.query("messages")
        assert [m["role"] for m in conversation] == ["user", "assistant"] * 3
        assert conversation[-1] == {"role": "assistant", "content": "5 * 5 = 25"}
        assert (await handle.describe()).run_id != handle.first_execution_run_id  # it continued as new
        assert await save_histories(stack.client, [workflow_id], tmp_path / "histories") == []
    finally:
        stop(worker)
        log.close()
        try:
            await stack.client.get_workflow_handle(workflow_id).terminate("test over")
        except Exception:  # never started, or already closed
            pass
    histories = tmp_path / "histories" / workflow_id
    assert len(list(histories.glob("*.json"))) == 2

    assert list(load_target(EXAMPLE / "chaos-target.toml").replay_command) == REPLAY_COMMAND
    ok = replay(EXAMPLE, histories)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"replayed 2 run(s) of {workflow_id} on @temporalio/worker 1.24.0: deterministic")
    assert "inputs of" in ok.stdout and "compared with the history" in ok.stdout

    # The same commands with another model input: the SDK's own replay accepts it, the strict comparison does not.
    changed = tmp_path / "changed"
    changed.mkdir()
    for f in EXAMPLE.glob("*.js"):
        shutil.copy(f, changed / f.name)
    (changed / "node_modules").symlink_to(EXAMPLE / "node_modules")
    source = (changed / "workflows.js").read_text()
    assert "You are a helpful assistant." in source
    (changed / "workflows.js").write_text(source.replace("You are a helpful assistant.", "You are terse."))
    bad = replay(changed, histories)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    line = bad.stderr.strip()
    assert "\n" not in line
    assert "activity invokeModel (id 1, event" in line and "different input on replay at $" in line
    assert "You are a helpful assistant." in line and "You are terse." in line  # shown where they part


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_chaos_run_from_its_target_file_alone_passes(tmp_path: Path) -> None:
    """model_outage on the TypeScript agent (a smaller load, so it stays near a minute): every message answered,
    every acknowledged note applied once by the effects service, its histories replayed by ``dah-replay``."""
    path = EXAMPLE / "chaos-target.toml"
    target = load_target(path)
    scenario = replace(SCENARIOS["model_outage"], workload=Workload(conversations=2, messages=3, append_ratio=0.5))
    result = await run(scenario, OwnAgentOnTemporal(target, target_file=path), seed=1, out_root=tmp_path)
    by = {c.name: c for c in result.checks}
    print("ai-sdk-agent model_outage: " + "; ".join(f"{c.name} {c.verdict}" for c in result.checks))
    report = json.dumps([c.as_dict() for c in result.checks], indent=1, default=str)[:4000]
    assert result.verdict == "pass", f"run dir {result.run_dir}:\n{report}"
    assert by["lost"].details["acknowledged"] >= 4, by["lost"].details
    assert by["effects"].details["logical_effects_applied"] >= 1, by["effects"].details
    assert "inputs compared by the command" in by["replay"].summary, by["replay"].summary
    assert any(f["f"] == "model_outage" and f["landed"] for f in by["injection_evidence"].details["faults"])
    recorded = json.loads((result.run_dir / "run.json").read_text())["target"]
    assert recorded["replay_command"] == REPLAY_COMMAND and recorded["workflow"] is None


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_its_planted_bug_an_effect_sent_without_its_key_fails_effects(tmp_path: Path) -> None:
    """The same agent with its planted bug (``--bug no-idempotency-key``, from its bug target file: the note is
    posted with no Idempotency-Key): under crash_after_effect the service applies the note, the worker is killed
    before the answer, the retry applies it again, and ``effects`` fails, naming the note, by its content."""
    path = EXAMPLE / "chaos-target.bug-no-idempotency-key.toml"
    target = load_target(path)
    scenario = replace(SCENARIOS["crash_after_effect"],
                       workload=Workload(conversations=2, messages=3, append_ratio=1.0))
    result = await run(scenario, OwnAgentOnTemporal(target, target_file=path), seed=1, out_root=tmp_path)
    by = {c.name: c for c in result.checks}
    print("ai-sdk-agent (no key) crash_after_effect: " + "; ".join(f"{c.name} {c.verdict}" for c in result.checks))
    assert result.verdict == "fail" and by["effects"].verdict == "fail", by["effects"].summary
    assert "applied 2 times" in by["effects"].summary and "sent no Idempotency-Key" in by["effects"].summary
