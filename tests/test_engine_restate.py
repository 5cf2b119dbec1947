"""The agent on Restate: a real restate-server, the scripted model, the endpoint served by hypercorn (in process for
the engine, a supervised process under chaos)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest

from agent.contracts import AgentConfig
from testbed.engines.restate.agent import engine, request_body
from testbed.engines.restate.engine import RestateEngine, journal_completions
from chaos.checker.restate_journal import re_executed
from harness.rundir import RESTATE_JOURNAL
from testbed.engines.workload import Workload
from chaos.generator import NemesisEvent
from chaos.runner import run
from chaos.scenarios import SCENARIOS
from harness.recording import EffectLedger, ExecutionIdentity
from harness.verdict import NOT_APPLICABLE, PASS
from testbed.model_server import ScriptedModelServer
from testbed.scripted_routes import respond
from tests.conftest import restate_server_installed
from tests.run_directory import assert_valid

needs_server = pytest.mark.skipif(not restate_server_installed(),
                                  reason="no restate-server binary; `make restate-server` installs it")


@needs_server
async def test_a_run_answers_with_its_tool_calls_in_the_ledger(tmp_path: Path) -> None:
    with ScriptedModelServer(respond) as model, EffectLedger(tmp_path / "ledger.sqlite3") as ledger:
        async with engine(tmp_path, model.url, ledger=ledger) as e:
            assert e.name == "restate" and e.record()["server"]["durability"]["log_rocksdb_wal_fsync"] is True
            result = await e.run_turn(AgentConfig(model="scripted"), "What is 25 * 4?", "run-1")
            assert "100" in result["reply"] and result["tool_calls"] == [["calculator", "ok", "100"]]
            # The same run id again is the same run, whatever the prompt: the first one's invocation and result.
            again = await e.client.submit("run-1", request_body(AgentConfig(model="scripted"), "What is 1 + 1?",
                                                                "run-1"))
            assert again["status"] == "PreviouslyAccepted"
            assert (await e.client.wait("run-1", 30))["reply"] == result["reply"]
            # Three tool calls at once: run concurrently, journaled and recorded in the model's order.
            parallel = await e.run_turn(AgentConfig(model="scripted:parallel"), "several", "run-2")
            assert [name for name, _, _ in parallel["tool_calls"]] == ["calculator", "weather", "calculator"]
    # Each action once, with its position in the run as its id (the parallel tools start in any order).
    steps = sorted(((x["workflow_id"], x["activity_id"], x["tool"], x["attempt"], x["outcome"]) for x in
                    EffectLedger(tmp_path / "ledger.sqlite3").executions()), key=lambda s: (s[0], int(s[1])))
    assert steps == [("run-1", "0", "plan_next_action", 1, "ok"), ("run-1", "1", "calculator", 1, "ok"),
                     ("run-1", "2", "plan_next_action", 1, "ok"),
                     ("run-2", "0", "plan_next_action", 1, "ok"), ("run-2", "1", "calculator", 1, "ok"),
                     ("run-2", "2", "weather", 1, "ok"), ("run-2", "3", "calculator", 1, "ok"),
                     ("run-2", "4", "plan_next_action", 1, "ok")]


@needs_server
@pytest.mark.slow
async def test_an_endpoint_kill_mid_model_call_loses_nothing(tmp_path: Path) -> None:
    # kill_mid_turn's own kill, which spares the last worker up: Restate runs one endpoint, so there is none to
    # spare, and the kill must aim all the same (it used to wait out its 15 s and kill blind)
    stock = SCENARIOS["kill_mid_turn"].events[0]
    assert stock.op == "kill_worker" and stock.args.get("spare") is True
    scenario = replace(SCENARIOS["kill_mid_turn"], events=(stock,), workload=Workload(conversations=2, messages=3),
                       fault_s=2.5)
    result = await run(scenario, RestateEngine(), seed=3, out_root=tmp_path)
    verdicts = {c.name: c.verdict for c in result.checks}
    assert verdicts == {"lost": PASS, "effects": PASS, "injection_evidence": PASS, "stats": PASS,
                        "temporal_history": NOT_APPLICABLE, "workflow_tasks": NOT_APPLICABLE,
                        "replay": NOT_APPLICABLE, "drain": NOT_APPLICABLE, "replies": NOT_APPLICABLE,
                        "context": NOT_APPLICABLE, "dbos_steps": NOT_APPLICABLE,
                        "restate_journal": PASS, "late": NOT_APPLICABLE}, result.checks
    assert result.verdict == PASS and result.row["faults"] == "1/1" and result.row["lost"] == 0
    ops = [json.loads(line) for line in (result.run_dir / "operations.jsonl").read_text().splitlines()]
    kill = next(o for o in ops if o["f"] == "kill_worker" and o["type"] == "ok")
    invoked = next(o for o in ops if o["index"] == kill["invoke_index"])
    assert kill["value"]["evidence"] and all(a["activity"] == "plan_next_action" for a in kill["value"]["evidence"])
    assert kill["value"]["spare"].startswith("not applied: the agent runs one worker"), kill
    assert kill["time"] - invoked["time"] < 10, (invoked, kill)  # aimed, not the blind kill at the end of 15 s
    journal = json.loads((result.run_dir / RESTATE_JOURNAL).read_text())
    assert journal["completions"] and journal["actions_journaled"] >= len(journal["completions"])
    assert_valid(result.run_dir)


class _Journal:
    """What ``journal_completions`` asks the server: one run's journal, two actions completed at 100.0 and 200.0."""

    def query(self, sql: str) -> list[dict]:
        def row(kind: str, entry: dict, at: str) -> dict:
            return {"run_id": "r", "entry_type": kind, "entry_lite_json": json.dumps(entry), "appended_at": at}

        return [row("Command: Run", {"Command": {"Run": {"completion_id": 1}}}, "1970-01-01T00:01:40.000Z"),
                row("Notification: Run", {"Notification": {"id": {"CompletionId": 1}}}, "1970-01-01T00:01:40.000Z"),
                row("Command: Run", {"Command": {"Run": {"completion_id": 2}}}, "1970-01-01T00:03:20.000Z"),
                row("Notification: Run", {"Notification": {"id": {"CompletionId": 2}}}, "1970-01-01T00:03:20.000Z")]


def test_the_journal_check_sees_an_action_run_again_after_the_journal_completed_it(tmp_path: Path) -> None:
    with EffectLedger(tmp_path / "ledger.sqlite3") as ledger:
        for activity in ("0", "0", "1"):  # action 0 once more after it completed; action 1 once, before
            ledger.end_execution(ledger.begin_execution(ExecutionIdentity("r", "restate", activity, 1, "w"), "t"),
                                 "ok")
        with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:  # when each ran, against the journal's clock
            for execution_id, (start, end) in enumerate([(99.0, 99.5), (150.0, 150.5), (199.9, 200.0)], 1):
                db.execute("UPDATE executions SET started_at = ?, finished_at = ? WHERE id = ?",
                           (start, end, execution_id))
        executions = ledger.executions()
    saved = journal_completions(_Journal())
    assert len(saved["completions"]) == 2
    late = re_executed(saved["completions"], executions)
    assert [(x["activity_id"], x["started_at"]) for x in late] == [("0", 150.0)]
