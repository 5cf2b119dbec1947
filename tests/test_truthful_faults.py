"""Faults are reported as they happened, on any target: a scheduled fault that could not be injected is shown as
not injected (never ``1/1``) and keeps the run from passing; the continue-as-new threshold reaches a target's
nemesis from its target file; a kill confirmed on a frozen worker counts as landed from the server's snapshot.
On small run directories built by hand, and the nemesis itself without a cluster where it decides before any."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from temporalio import activity, workflow
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from testbed.engines.byo.engine import OwnAgentOnTemporal
from chaos.checker import injection_evidence
from chaos.checker.run_data import RunData
from testbed.engines.temporal.in_flight import TemporalInFlight
from testbed.faults.nemesis import NemesisContext, kill_worker
from chaos.runner import check, nemesis_context
from testbed.engines.byo.target import load_target
from harness.operations import FAIL, History
from harness.verdict import PASS, UNKNOWN
from tests.run_directory import problems

THRESHOLD_ERROR = ("ValueError: kill_worker at=continue_as_new phase=before needs the threshold: history_events, "
                   "or a scenario that sets max_history_events")


def _run_dir(tmp_path: Path, write_ops) -> Path:
    """A run directory with no conversations whose operation log ``write_ops(history)`` writes."""
    run = tmp_path / "run"
    (run / "state").mkdir(parents=True)
    history = History(run / "operations.jsonl")
    write_ops(history)
    history.close()
    (run / "conversations.json").write_text(json.dumps({"workload": {}, "conversations": []}))
    (run / "run.json").write_text(json.dumps({
        "schema": 2, "kind": "chaos", "name": "kill_continue_as_new", "status": "complete",
        "target": {"checkers": ["injection_evidence"]},
        "schedule": [{"at_s": 0.5, "op": "kill_worker", "args": {"at": "continue_as_new", "phase": "before"}},
                     {"at_s": 3.5, "op": "model_outage", "args": {}}]}))
    return run


def _a_fault_that_landed(history: History) -> None:
    op = history.invoke("nemesis", "model_outage", {"mode": "status"})
    history.complete(op, "ok", {"mode": "status", "requests_refused": 3, "evidence": [{"model_requests_faulted": 3}]})


@pytest.mark.parametrize("recorded_as", ["nemesis_error_of_an_older_run", "nemesis_error", "failed_operation"])
def test_a_fault_that_was_not_injected_is_shown_so_and_the_run_cannot_pass(tmp_path: Path, recorded_as: str) -> None:
    def ops(history: History) -> None:
        if recorded_as == "failed_operation":  # what the nemesis records now
            op = history.invoke("nemesis", "kill_worker", {"at": "continue_as_new", "phase": "before"})
            history.complete(op, FAIL, {"not_injected": "the continue-as-new threshold is unknown, so no moment "
                                                        "before one can be aimed at", "evidence": []})
        else:  # a nemesis that raised before recording its operation (as the "before" kill did on a target)
            flag = {} if recorded_as == "nemesis_error_of_an_older_run" else {"op_recorded": False}
            history.event("nemesis", "nemesis_error", {"op": "kill_worker", "error": THRESHOLD_ERROR, **flag})
        _a_fault_that_landed(history)

    run = _run_dir(tmp_path, ops)
    result = injection_evidence.check(RunData(run))
    assert result.verdict == UNKNOWN, result.summary
    assert "1 of 2 fault(s) not injected" in result.summary, result.summary
    assert [m["f"] for m in result.details["not_injected"]] == ["kill_worker"]
    assert result.details["injected"] == 1 and result.details["landed"] == 1
    verdict, _checks, row = check(run)
    assert verdict == UNKNOWN
    assert row["faults"].startswith("1/2 (1 not injected: "), row["faults"]  # it showed 1/1 and passed
    assert [p for p in problems(run) if "verdict.json" in p] == []  # the row keeps the run directory's schema


def test_a_nemesis_error_after_its_operation_was_recorded_is_not_counted_twice(tmp_path: Path) -> None:
    def ops(history: History) -> None:  # restart_server: killed the server, then could not start it again
        op = history.invoke("nemesis", "restart_server", {"down_s": 3.0})
        history.complete(op, "info", {"evidence": [{"activity": "plan"}]}, error="RuntimeError: no port")
        history.event("nemesis", "nemesis_error", {"op": "restart_server", "error": "RuntimeError: no port",
                                                   "op_recorded": True})

    result = injection_evidence.check(RunData(_run_dir(tmp_path, ops)))
    assert result.details["not_injected"] == [] and result.details["injected"] == 1, result.details
    assert result.verdict == PASS, result.summary


async def test_a_kill_before_continue_as_new_with_no_threshold_is_recorded_as_not_injected(tmp_path: Path) -> None:
    history = History(tmp_path / "operations.jsonl")
    ctx = NemesisContext(stack=None, history=history, workflow_ids=["c-0"], rng=random.Random(1))  # type: ignore[arg-type]
    value = await kill_worker(ctx, at="continue_as_new", phase="before", down_s=1.0)  # it raised ValueError
    assert "continue_as_new_events" in value["not_injected"] and value["evidence"] == []
    ops = history.ops()
    assert [(o.f, o.type) for o in ops] == [("kill_worker", "invoke"), ("kill_worker", FAIL)]
    assert ops[1].error.startswith("not injected: ")


TARGET = '''
name = "byo"
worker = ["{python}", "-m", "my_agent", "--address", "{address}", "--task-queue", "{task_queue}"]
driver = "my_agent:make_driver"
workflow = "my_agent:Chat"
'''


def test_the_targets_continue_as_new_threshold_reaches_its_nemesis(tmp_path: Path) -> None:
    path = tmp_path / "chaos-target.toml"
    driver = SimpleNamespace(workflow_ids=["c-0"])  # a target's driver (RemoteDriver) has no agent config
    path.write_text(TARGET + "continue_as_new_events = 40\n")
    ctx = nemesis_context(OwnAgentOnTemporal(load_target(path)), None, None, driver, 1)  # type: ignore[arg-type]
    assert ctx.continue_as_new_events == 40
    path.write_text(TARGET)
    assert nemesis_context(OwnAgentOnTemporal(load_target(path)), None, None, driver, 1  # type: ignore[arg-type]
                           ).continue_as_new_events == 0
    path.write_text(TARGET + 'continue_as_new_events = "40"\n')
    with pytest.raises(ValueError, match="continue_as_new_events"):
        load_target(path)


def test_a_target_that_continues_as_new_when_suggested_is_suggested_it_at_the_scenarios_threshold(
        tmp_path: Path) -> None:
    """``continue_as_new_suggested``: the embedded server is told to suggest continue-as-new past the scenario's
    threshold, and a kill aimed before one waits for that length; a scenario with no threshold, a server the
    harness does not start, or a target that does not declare it changes nothing."""
    from chaos.scenarios import SCENARIOS
    from harness.rundir import RunDir
    from testbed.engines.temporal.engine import SUGGEST_CONTINUE_AS_NEW

    path = tmp_path / "chaos-target.toml"
    driver = SimpleNamespace(workflow_ids=["c-0"])

    def spec_of(text: str, scenario: str, **engine: object) -> object:
        path.write_text(TARGET + text)
        own = OwnAgentOnTemporal(load_target(path), **engine)  # type: ignore[arg-type]
        run = RunDir.create(tmp_path / "runs" / scenario)
        spec = own.stack_spec(SCENARIOS[scenario], run, 1, History(run.path / "operations.jsonl"), False)
        return own, spec

    own, spec = spec_of("continue_as_new_suggested = true\n", "kill_continue_as_new")
    threshold = SCENARIOS["kill_continue_as_new"].max_history_events
    assert spec.engine.dynamic_config == {SUGGEST_CONTINUE_AS_NEW: str(threshold)}  # type: ignore[attr-defined]
    assert nemesis_context(own, SimpleNamespace(spec=spec), None, driver, 1  # type: ignore[arg-type]
                           ).continue_as_new_events == threshold
    for text, scenario in [("continue_as_new_suggested = true\n", "kill_mid_turn"), ("", "kill_continue_as_new")]:
        own, spec = spec_of(text, scenario)
        assert spec.engine.dynamic_config == {}, (text, scenario)  # type: ignore[attr-defined]
        assert nemesis_context(own, SimpleNamespace(spec=spec), None, driver, 1  # type: ignore[arg-type]
                               ).continue_as_new_events == 0
    path.write_text(TARGET + 'continue_as_new_suggested = "yes"\n')
    with pytest.raises(ValueError, match="continue_as_new_suggested"):
        load_target(path)


T0 = 1_795_000_000.0
VICTIM = "worker-1-1"


def _kill_mid_call(tmp_path: Path, snapshot_worker: str = VICTIM, closed_s: float | None = None,
                   snapshot: bool = True, aim: str = "model", tool_ran: bool = False):
    """A run of one kill of a busy worker with no effect ledger, mid-call on ``call_model`` (activity 5 of c-0,
    scheduled at T0, its attempt started at T0+1 on ``snapshot_worker`` by the server's snapshot, the kill at T0+5).
    The history has the activity scheduled and (``closed_s`` None) never closed: no retry before the run ended."""
    from datetime import datetime, timezone

    from harness.event_history import ActivityRecord, RunRecord

    pending = {"taken_at": T0 + 4.99, "not_described": [], "pending_activities": [
        {"workflow_id": "c-0", "run_id": "r-1", "activity_id": "5", "activity": "call_model", "state": "STARTED",
         "attempt": 1, "worker": snapshot_worker, "scheduled": T0, "last_started": T0 + 1.0}]}

    def ops(history: History) -> None:
        op = history.invoke("nemesis", "kill_worker", {"when": "busy", "activity": aim, "down_s": 1.0})
        history.complete(op, "ok", {
            "worker": "worker-1", "identity": VICTIM, "killed_at": T0 + 5.0, "down_s": 1.0,
            "evidence": [{"workflow_id": "c-0", "activity": "call_model", "attempt": 1, "worker": VICTIM}],
            "aim": {"when": "busy", "activity": aim, "at": None}, "observed_by": "temporal_pending_activities",
            **({"frozen_snapshot": pending} if snapshot else {})})

    def at(s: float) -> datetime:
        return datetime.fromtimestamp(T0 + s, tz=timezone.utc)

    run = _run_dir(tmp_path, ops)
    record = json.loads((run / "run.json").read_text())
    record["target"]["model_activity"] = "call_model"
    (run / "run.json").write_text(json.dumps(record))
    data = RunData(run)
    activity = ActivityRecord("5", "call_model", 5, outcome="running" if closed_s is None else "completed",
                              scheduled_at=at(0.0), closed_at=None if closed_s is None else at(closed_s),
                              started_at=None if closed_s is None else at(1.0),
                              worker="" if closed_s is None else snapshot_worker,
                              attempts=0 if closed_s is None else 1)
    tools = [ActivityRecord("3", "lookup", 3, outcome="completed", scheduled_at=at(-3.0), closed_at=at(-2.0),
                            started_at=at(-2.9), worker=VICTIM, attempts=1)] if tool_ran else []
    data.__dict__["event_histories"] = {"c-0": [RunRecord("c-0", "r-1", activities=tools + [activity])]}
    return data


def test_a_kill_mid_call_confirmed_on_the_frozen_worker_counts_as_landed(tmp_path: Path) -> None:
    result = injection_evidence.check(_kill_mid_call(tmp_path))
    assert result.verdict == PASS, result.summary  # it said "all faults landed on idle workers"
    evidence = result.details["faults"][0]["evidence"]
    assert len(evidence) == 1 and "server's snapshot" in evidence[0]["history"], evidence


@pytest.mark.parametrize("case", ["no_snapshot", "another_worker", "closed_before_the_kill"])
def test_a_snapshot_proves_a_landing_only_on_the_victim_for_an_activity_open_at_the_kill(tmp_path: Path,
                                                                                        case: str) -> None:
    data = _kill_mid_call(tmp_path, snapshot=case != "no_snapshot",
                          snapshot_worker="worker-2-1" if case == "another_worker" else VICTIM,
                          closed_s=3.0 if case == "closed_before_the_kill" else None)
    result = injection_evidence.check(data)
    assert result.verdict == UNKNOWN and "idle workers" in result.summary, result.summary




@pytest.mark.parametrize("tool_ran", [False, True])
def test_a_kill_aimed_at_a_tool_lands_only_on_a_tool_and_says_when_the_agent_has_none(tmp_path: Path,
                                                                                     tool_ran: bool) -> None:
    """kill_mid_tool on an agent whose tools run in workflow code: the kill found a model call in flight, which
    is not what it aimed at. Never a pass; with no tool activity anywhere in the run, it says it cannot apply."""
    result = injection_evidence.check(_kill_mid_call(tmp_path, aim="tool", tool_ran=tool_ran))
    assert result.verdict == UNKNOWN and result.details["faults"][0]["landed"] is False, result.summary
    if tool_ran:  # a tool ran, just not on the victim at the kill: the run cannot pass, and nothing is claimed
        assert "idle workers" in result.summary and "not applicable" not in result.summary, result.summary
    else:
        assert result.summary.startswith("not applicable to this agent: a kill aimed at tool cannot apply: no "
                                         "activity but the model's (call_model) ran"), result.summary


def test_crash_after_effect_on_an_agent_that_declares_no_effect_says_it_cannot_apply(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, lambda history: None)
    record = json.loads((run / "run.json").read_text())
    record.update(schedule=[], scenario={"cluster": {"crash_at": ["after_effect"]}},
                  target={"checkers": ["injection_evidence"], "effects": "none", "effects_reason": "it calls nothing"})
    (run / "run.json").write_text(json.dumps(record))
    result = injection_evidence.check(RunData(run))
    assert result.verdict == UNKNOWN and result.summary.startswith(
        'not applicable to this agent: its crashes come right after an external effect, and the target declares '
        'none (effects = "none": it calls nothing)'), result.summary

RELEASE = asyncio.Event()


@activity.defn(name="call_model")
async def slow_model_call() -> str:
    """A model call that lasts until the test lets it end (a long start-to-close, no heartbeat)."""
    await RELEASE.wait()
    return "answer"


@workflow.defn(name="TruthLongCall")
class LongCall:
    @workflow.run
    async def run(self) -> str:
        return await workflow.execute_activity("call_model", start_to_close_timeout=timedelta(minutes=5))


async def test_a_kill_mid_call_on_a_real_server_lands_by_the_snapshot_taken_frozen(stack, tmp_path: Path) -> None:
    """On a real Temporal server: the aimed kill freezes the worker running the call, snapshots the server's pending
    activities, and the saved history (the activity scheduled, its attempt never closed, no started event yet)
    with that snapshot makes injection_evidence count the kill as landed. The worker process is a stand-in that
    records pause/kill (the in-process worker really runs the attempt under that identity)."""
    from harness.event_history import save_histories
    from testbed.supervisor import SupervisedWorker
    from tests.test_aimed_faults import FakeProcess

    RELEASE.clear()
    queue, wid = f"truth-{uuid.uuid4().hex[:8]}", f"truth-{uuid.uuid4().hex[:8]}"
    proc = FakeProcess("w1")
    workers = [SupervisedWorker(proc)]
    cluster = SimpleNamespace(workers=workers, client=stack.client, worker=lambda name: workers[0])
    run = tmp_path / "run"
    _run_dir(tmp_path, lambda history: None)
    ctx = NemesisContext(cluster, History(run / "operations.jsonl"), [wid], random.Random(1),  # type: ignore[arg-type]
                         model_activity="call_model", observer=TemporalInFlight())
    async with Worker(stack.client, task_queue=queue, workflows=[LongCall], activities=[slow_model_call],
                      identity=proc.identity, workflow_runner=UnsandboxedWorkflowRunner()):
        handle = await stack.client.start_workflow(LongCall.run, id=wid, task_queue=queue)
        try:
            value = await kill_worker(ctx, when="busy", activity="model", down_s=0.5, wait_s=15.0)
            assert proc.calls == ["pause", "kill"] and value["observed_by"] == "temporal_pending_activities"
            pending = value["frozen_snapshot"]["pending_activities"]
            assert [(p["activity"], p["state"], p["worker"], p["attempt"], p["run_id"]) for p in pending] == [
                ("call_model", "STARTED", "w1-1", 1, handle.result_run_id)], pending
            assert pending[0]["last_started"] <= value["killed_at"]
            assert await save_histories(stack.client, [wid], run / "event_histories") == []
        finally:
            RELEASE.set()
            await handle.result()
    ctx.history.close()
    data = RunData(run)
    [activity_record] = data.event_histories[wid][0].activities
    assert activity_record.started_at is None and activity_record.closed_at is None  # no trace of the attempt
    result = injection_evidence.check(data)
    assert result.verdict == PASS, result.summary
    assert "server's snapshot" in result.details["faults"][0]["evidence"][0]["history"]
