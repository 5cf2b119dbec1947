"""The reference agent on DBOS Transact: real DBOS, the real scripted model, real processes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest

from agent.contracts import AgentConfig
from testbed.engines.dbos import agent as dbos_agent
from testbed.engines.dbos.engine import DbosEngine
from testbed.engines.workload import Workload
from chaos.generator import NemesisEvent
from chaos.runner import run
from chaos.scenarios import SCENARIOS
from harness.engines import registered
from harness.operations import load
from harness.verdict import NOT_APPLICABLE, PASS
from testbed.processes import spawn, stop
from testbed.stack import StackSpec, stack
from tests.events import HANG_S, wait_for, wait_for_async
from tests.run_directory import assert_valid

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "What is 25 * 4?"


def _executions(ledger: Path, run_id: str) -> list[tuple[str, str, int, str]]:
    db = sqlite3.connect(ledger)
    try:
        return db.execute("SELECT run_id, activity_id, attempt, tool FROM executions WHERE workflow_id = ? ORDER BY id",
                          (run_id,)).fetchall()
    finally:
        db.close()


def test_dah_run_on_dbos_answers_with_its_tool_calls_in_the_ledger(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "testbed", "run", "--durability", "dbos", "--state-dir",
                          str(tmp_path), "--workflow-id", "dbos-run-1", "--json", PROMPT],
                         capture_output=True, text=True, timeout=HANG_S, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert "100" in result["reply"] and result["tool_calls"] == [["calculator", "ok", "100"]]
    # Each step once, keyed by its DBOS function id: plan (1), the calculator (2), plan (3).
    assert _executions(tmp_path / "sandbox" / "ledger.sqlite3", "dbos-run-1") == [
        ("dbos", "1", 1, "plan_next_action"), ("dbos", "2", 1, "calculator"), ("dbos", "3", 1, "plan_next_action")]


async def test_the_engine_enters_twice_in_one_process_and_a_run_id_is_one_run(tmp_path: Path) -> None:
    async with stack(StackSpec(state_dir=tmp_path, ledger=True)) as s:
        for attempt in (1, 2):  # DBOS is a process-wide singleton: destroyed on exit, launched again
            async with dbos_agent.engine(tmp_path, s.model_url or "", ledger=s.ledger) as e:
                assert e.name == "dbos"
                record = e.record()["durability"]
                assert record["database"] == "sqlite" and record["journal_mode"] and record["synchronous"]
                first = await e.run_turn(AgentConfig(model="scripted"), PROMPT, f"twice-{attempt}")
                again = await e.run_turn(AgentConfig(model="scripted"), "something else", f"twice-{attempt}")
                assert "100" in first["reply"] and again == first  # the same id is the same run: not run again
                # Its three steps' first attempts, once each (a second run would enter them again); a later attempt
                # of one of them is a retry within the run (a model call that outlived its timeout on a busy machine).
                rows = _executions(s.ledger.path, f"twice-{attempt}")
                assert [(step, tool) for _, step, tried, tool in rows if tried == 1] == [
                    ("1", "plan_next_action"), ("2", "calculator"), ("3", "plan_next_action")], rows
                assert {(step, tool) for _, step, tried, tool in rows if tried > 1} <= {
                    ("1", "plan_next_action"), ("2", "calculator"), ("3", "plan_next_action")}, rows


async def test_the_engine_on_postgres_after_sqlite() -> None:
    if shutil.which("initdb") is None and not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        pytest.skip("PostgreSQL is not installed")
    state = Path(tempfile.mkdtemp(prefix="dah-dbos-pg-"))  # not under pytest's 0700 root: the server's user enters
    os.chmod(state, 0o755)
    try:
        async with stack(StackSpec(state_dir=state, ledger=True)) as s:
            for database in ("sqlite", "postgres"):
                async with dbos_agent.engine(state, s.model_url or "", database=database, ledger=s.ledger) as e:
                    result = await e.run_turn(AgentConfig(model="scripted"), PROMPT, f"on-{database}")
                    assert "100" in result["reply"] and e.name == {"sqlite": "dbos", "postgres": "dbos-postgres"}[database]
                    settings = e.record()["durability"]
            assert settings["fsync"] == "on" and settings["synchronous_commit"] == "on"  # as read from the server
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_a_second_live_worker_with_the_same_executor_id_is_refused(tmp_path: Path) -> None:
    """Two live processes with one executor id: the second would recover (re-run) the first one's workflows."""
    def worker(identity: str) -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"{identity}.log"
        with open(log, "wb") as out:
            proc = spawn([sys.executable, "-m", "testbed.engines.dbos.agent", "worker", "--database-url",
                          dbos_agent.sqlite_url(tmp_path / "dbos.sqlite3"), "--state-dir", str(tmp_path),
                          "--identity", identity, "--executor-id", "w1", "--model-base-url", "http://127.0.0.1:9/v1"],
                         stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        return proc, log

    first, log = worker("w1-1")
    try:
        wait_for(lambda: dbos_agent.READY in log.read_text(), "the first worker's READY", proc=first, log=log)
        second, second_log = worker("w1-2")
        assert second.wait(timeout=HANG_S) != 0
        assert "executor id 'w1' is held by a live worker" in second_log.read_text()
    finally:
        stop(first)


@pytest.mark.slow
async def test_a_worker_kill_on_dbos_loses_nothing_and_its_run_is_recovered(tmp_path: Path) -> None:
    scenario = replace(SCENARIOS["kill_mid_turn"],
                       events=(NemesisEvent(0.5, "kill_worker", {"when": "busy", "activity": "model", "down_s": 0.5}),),
                       workload=Workload(conversations=2, messages=3), fault_s=2.5)
    result = await run(scenario, DbosEngine(), seed=3, out_root=tmp_path)
    verdicts = {c.name: c.verdict for c in result.checks}
    assert verdicts == {"lost": PASS, "effects": PASS, "injection_evidence": PASS, "stats": PASS,
                        "temporal_history": NOT_APPLICABLE, "workflow_tasks": NOT_APPLICABLE,
                        "replay": NOT_APPLICABLE, "drain": NOT_APPLICABLE, "replies": NOT_APPLICABLE,
                        "context": NOT_APPLICABLE, "dbos_steps": PASS,
                        "restate_journal": NOT_APPLICABLE, "late": NOT_APPLICABLE}, result.checks
    assert result.verdict == PASS and result.row["faults"] == "1/1" and result.row["lost"] == 0
    kill = next(op for op in load(result.run_dir / "operations.jsonl")
                if op.process == "nemesis" and op.f == "kill_worker" and op.type == "ok")
    evidence = kill.value["evidence"]
    assert evidence and all(e["kind"] == "model" and e["worker"] == kill.value["identity"] for e in evidence)
    # The killed model call ran again (attempt 2, the same step id) once DBOS recovered its workflow.
    ledger = result.run_dir / "state" / "sandbox" / "ledger.sqlite3"
    for e in evidence:
        again = [x for x in _executions(ledger, e["workflow_id"]) if x[3] == "plan_next_action" and x[2] > e["attempt"]]
        assert again, f"{e['workflow_id']}: the killed model call never ran again"
    backend = json.loads((result.run_dir / "run.json").read_text())["backend"]
    assert backend["durability"]["database"] == "sqlite"
    assert_valid(result.run_dir)


@pytest.mark.finding  # DBOS's behaviour, which _claim_executor prevents: pytest -m finding tests/test_engine_dbos.py
async def test_two_live_processes_sharing_an_executor_id_run_one_step_twice(tmp_path: Path) -> None:
    """Why a worker claims its executor id (``_claim_executor``): DBOS's own behaviour without the claim. A process
    starting with a live one's executor id recovers (re-enqueues) the workflows that one is running, and they run
    again while the first execution is still going: the same step executes twice. Here the claim is sidestepped
    (the second worker has another state dir: its lock, and its own ledger) to show what it prevents."""
    from testbed.model_server import LatencyModel, ScriptedModelServer
    from testbed.scripted_routes import respond

    url = dbos_agent.sqlite_url(tmp_path / "dbos.sqlite3")
    with ScriptedModelServer(respond, latency=LatencyModel.parse("fixed:4000")) as model:
        def worker(state: Path) -> tuple[subprocess.Popen, Path]:
            log = tmp_path / f"{state.name}.log"
            with open(log, "wb") as out:
                proc = spawn([sys.executable, "-m", "testbed.engines.dbos.agent", "worker", "--database-url", url,
                              "--state-dir", str(state), "--identity", state.name, "--executor-id", "w1",
                              "--model-base-url", model.url], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
            wait_for(lambda: dbos_agent.READY in log.read_text(), f"{state.name}'s READY", proc=proc, log=log)
            return proc, log

        first, _ = worker(tmp_path / "a")
        client = dbos_agent.DbosClient(url)
        try:
            await client.submit("shared-1", AgentConfig(model="scripted"), PROMPT)
            ledger = tmp_path / "a" / "sandbox" / "ledger.sqlite3"

            async def started() -> bool:
                return ledger.exists() and bool(_executions(ledger, "shared-1"))

            await wait_for_async(started, "the first worker's start of the run")
            second, _ = worker(tmp_path / "b")  # the first is mid model call (4 s)
            try:
                result = await client.wait("shared-1", HANG_S)
            finally:
                stop(second)
        finally:
            stop(first)
            client.close()
    assert "100" in result["reply"]
    # The first model call (step 1) ran twice, the second starting while the first was still in flight: the re-enqueued
    # workflow was dequeued again (by either process; the first one's queue thread often wins) and run alongside.
    # DBOS then notices that the first execution no longer owns the workflow, but only when it records the step.
    calls = sorted(_step_runs(tmp_path / "a", "shared-1", "1") + _step_runs(tmp_path / "b", "shared-1", "1"))
    assert len(calls) >= 2 and calls[1][0] < calls[0][1], calls


def _step_runs(state: Path, run_id: str, step: str) -> list[tuple[float, float]]:
    """(started, finished) of each execution of one step, from a state dir's ledger (none if it has no ledger)."""
    ledger = state / "sandbox" / "ledger.sqlite3"
    if not ledger.exists():
        return []
    db = sqlite3.connect(ledger)
    try:
        return db.execute("SELECT started_at, coalesce(finished_at, 1e12) FROM executions WHERE workflow_id = ? AND "
                          "activity_id = ?", (run_id, step)).fetchall()
    finally:
        db.close()
