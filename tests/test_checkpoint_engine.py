"""The checkpoint engine across processes (real SIGKILL), and the same agent task on it and on Temporal."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

from agent.contracts import AgentConfig
from testbed.engines.checkpoint.agent_task import TASK, agent_task, manifest_for
from testbed.engines.checkpoint.durable_run import run_durable
from testbed.engines.checkpoint.service import CheckpointQueue
from testbed.engines.checkpoint.stores import SqliteStore
from testbed.engines.checkpoint.temporal_adapter import DurableTaskInput, DurableTaskWorkflow
from testbed.processes import spawn, stop
from testbed.stack import Stack
from testbed.walkthroughs import workspace_files
from tests.checkpoint_tasks import manifest
from tests.events import HANG_S, wait_for, wait_for_async

ROOT = Path(__file__).resolve().parent.parent


class Worker:
    """``dah checkpoint worker`` as a process we can SIGKILL."""

    def __init__(self, db: Path, tmp: Path, name: str, lease_ms: int = 1000) -> None:
        self.log = tmp / f"{name}.log"
        with open(self.log, "wb") as out:
            self.proc = spawn([
                sys.executable, "-m", "testbed", "checkpoint", "worker", "--db", str(db), "--state-dir", str(tmp / "state"), "--identity", name,
                "--lease-ms", str(lease_ms), "--model-base-url", "http://127.0.0.1:9/v1"],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        wait_for(lambda: "READY" in self.log.read_text(), f"worker {name}'s READY", proc=self.proc, log=self.log,
                 every_s=0.05)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        stop(self.proc)


def _marks(path: Path) -> list[tuple[str, int]]:
    if not path.exists():
        return []
    return [(w, int(i)) for w, i in (line.split() for line in path.read_text().splitlines())]


async def test_a_worker_killed_mid_run_is_taken_over_without_rerunning_completed_steps(tmp_path: Path) -> None:
    db, marks = tmp_path / "checkpoint.sqlite3", tmp_path / "marks.txt"
    store = SqliteStore(db)
    queue = CheckpointQueue(db)
    first = Worker(db, tmp_path, "first", lease_ms=1000)
    second = None
    try:
        queue.submit("run-kill", "tests.checkpoint_tasks:counting_task", manifest(marks, steps=6, sleep_s=0.3))
        async def three_marks() -> bool:
            return len(_marks(marks)) >= 3

        await wait_for_async(three_marks, "the first worker's third step", every_s=0.02)
        first.kill()  # SIGKILL, in the middle of step 2's sleep
        killed_at = time.monotonic()
        second = Worker(db, tmp_path, "second", lease_ms=1000)
        result = await queue.wait("run-kill", timeout_s=HANG_S)
        took_over_after = time.monotonic() - killed_at
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert result == {"squares": [0, 1, 4, 9, 16, 25]}
    by_first = [i for w, i in _marks(marks) if w == "first"]
    by_second = [i for w, i in _marks(marks) if w == "second"]
    assert by_first[:2] == [0, 1] and by_second == list(range(by_first[-1], 6)), _marks(marks)
    # Steps the first worker completed were replayed from the store, not run again; only the step it was
    # in when it died (begun, never completed) ran twice, as its attempt counter records.
    steps = [await store.load_step("run-kill", i) for i in range(6)]
    assert [s.attempts for s in steps] == [1] * by_first[-1] + [2] + [1] * (5 - by_first[-1])
    assert took_over_after >= 0.5  # not before the dead worker's lease (1 s) ran out
    await store.close()
    queue.close()


async def test_two_workers_racing_for_one_run_exactly_one_wins(tmp_path: Path) -> None:
    db, marks = tmp_path / "checkpoint.sqlite3", tmp_path / "marks.txt"
    await SqliteStore(db).close()
    go = tmp_path / "go"
    racers = [subprocess.Popen([sys.executable, "-m", "tests.checkpoint_tasks", "--db", str(db), "--run-id", "race",
                                "--worker", f"racer-{n}", "--path", str(marks), "--go", str(go)],
                               stdout=subprocess.PIPE, text=True, cwd=ROOT) for n in range(4)]
    assert [p.stdout.readline() for p in racers] == ["READY\n"] * 4  # type: ignore[union-attr]
    go.touch()  # every racer starts its attempt at the same moment, however long each took to start
    outcomes = [json.loads(p.communicate(timeout=HANG_S)[0]) for p in racers]
    winners = [o["worker"] for o in outcomes if o["outcome"] == "won"]
    assert len(winners) == 1, outcomes
    assert sorted(o["outcome"] for o in outcomes) == ["lease_held"] * 3 + ["won"]
    assert _marks(marks) == [(winners[0], 0), (winners[0], 1), (winners[0], 2)]  # only the winner ran steps


def test_concurrent_emitters_in_separate_processes_first_emit_wins(tmp_path: Path) -> None:
    db = tmp_path / "checkpoint.sqlite3"
    emitters = [subprocess.Popen([sys.executable, "-m", "testbed", "checkpoint", "emit", "--db", str(db), "--run-id",
                                  "r", "--key", "approved", "--payload", json.dumps({"by": n})],
                                 stdout=subprocess.PIPE, text=True, cwd=ROOT) for n in range(6)]
    answers = [json.loads(p.communicate(timeout=HANG_S)[0]) for p in emitters]
    assert sum(a["accepted"] for a in answers) == 1, answers
    assert len({json.dumps(a["payload"]) for a in answers}) == 1  # every emitter sees the winner's payload


# -- the reference agent's loop on both backends ------------------------------------------------------------


def _config() -> AgentConfig:
    cfg = AgentConfig(model="scripted:multi_step")
    cfg.planning.initial_interval_s = cfg.tool.initial_interval_s = 0.2
    return cfg


async def test_the_agent_loop_runs_on_the_checkpoint_runner_and_on_temporal_with_the_same_result(
        stack: Stack) -> None:
    prompt = "Draft a plan in notes/plan.txt and mark it done."
    store = SqliteStore(stack.settings.sandbox_root.parent / "checkpoint.sqlite3")
    run_id = f"checkpoint-{uuid.uuid4().hex[:8]}"
    checkpoint = await run_durable(run_id, manifest_for(_config(), prompt), store, agent_task, worker_id="in-process")
    again = await run_durable(run_id, manifest_for(_config(), prompt), store, agent_task, worker_id="in-process")
    await store.close()
    assert (again.executed, again.replayed, again.result) == (0, checkpoint.executed, checkpoint.result)
    assert [s.intent for s in checkpoint.steps] == ["llm:plan", "tool:write_file", "llm:plan", "tool:read_file",
                                                 "llm:plan", "tool:write_file", "tool:list_files", "llm:plan"]
    wid = f"durable-task-{uuid.uuid4().hex[:8]}"
    on_temporal = await stack.client.execute_workflow(
        DurableTaskWorkflow.run, DurableTaskInput(task=TASK, run_id=wid, manifest=manifest_for(_config(),
                                                                                              prompt).__dict__),
        id=wid, task_queue=stack.task_queue)
    assert on_temporal == checkpoint.result
    assert "notes/done.txt" in checkpoint.result["reply"]
    for rid in (run_id, wid):
        assert workspace_files(stack.workspace(rid)) == {"notes/plan.txt": "step one: gather data",
                                                         "notes/done.txt": "done"}
        summary = stack.ledger.summary(rid)
        assert (summary.effects_applied, summary.duplicated_effects) == (2, 0)


def test_checkpoint_cli_refuses_bad_options(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "testbed", "checkpoint", "worker", "--db", str(tmp_path / "j.db"),
                          "--lease-ms", "5"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "--lease-ms must be at least 100" in out.stderr
