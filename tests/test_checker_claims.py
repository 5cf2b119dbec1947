"""Checkers claim only what they saw: Jepsen's indeterminate operations, stale attempts versus re-execution,
workflow tasks that never recovered, properties nobody checked. On small saved runs built by hand."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from chaos.checker import lost, temporal_history, workflow_tasks
from chaos.checker.run_data import RunData
from chaos.checker.verdict import table_row
from chaos.runner import check
from harness.event_history import ActivityRecord, LocalActivityRecord, RunRecord, WorkflowTaskRecord
from harness.operations import FAIL, INFO, OK, OperationLog, Op
from harness.recording import EffectLedger, ExecutionIdentity
from harness.verdict import PASS, UNKNOWN, CheckResult

T0 = datetime(2026, 11, 22, 12, 0, 0, tzinfo=timezone.utc)


def _run_dir(tmp_path: Path, sends: list[tuple[str, str, dict | None]], final: list[dict] | None,
             target: dict | None = None) -> Path:
    """A run of one conversation: ``sends`` (text, completion type, completion value); ``final``: its final read."""
    run = tmp_path / "run"
    (run / "state").mkdir(parents=True)
    oplog = OperationLog(run / "operations.jsonl")
    planned = []
    for n, (text, kind, value) in enumerate(sends):
        expect = f"reply to {text}"
        planned.append({"text": text, "expect": expect, "kind": "calc", "path": None, "content": None,
                        "match": "exact"})
        op = oplog.invoke("client-0", "send_message", {"conversation": "c-0", "n": n, "text": text,
                                                         "expect": expect, "match": "exact"})
        oplog.complete(op, kind, value, error=None if kind == OK else "TimeoutError")
    oplog.close()
    conv = {"workflow_id": "c-0", "planned": planned, "started": True, "final_history": final,
            "final_status": "COMPLETED", "result": None}
    (run / "conversations.json").write_text(json.dumps({"workload": {}, "conversations": [conv]}))
    (run / "run.json").write_text(json.dumps({"schema": 2, "kind": "chaos", "name": "t", "status": "complete",
                                              "target": target or {}}))
    return run


def _said(*pairs: tuple[str, str]) -> list[dict]:
    out = []
    for text, reply in pairs:
        out += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
    return out


def test_an_indeterminate_send_may_or_may_not_have_happened(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [("a", OK, {"reply": "reply to a"}), ("b", INFO, None), ("c", INFO, None)],
                   _said(("a", "reply to a"), ("c", "reply to c")))
    result = lost.check(RunData(run))
    assert result.verdict == PASS, result.summary
    assert (result.details["indeterminate_absent"], result.details["indeterminate_present"]) == (1, 1)


def test_an_indeterminate_send_that_happened_must_be_answered_right(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [("a", INFO, None)], _said(("a", "wrong")))
    assert lost.check(RunData(run)).verdict == "fail"


def test_an_acknowledged_message_missing_from_the_conversation_is_lost(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [("a", OK, {"reply": "reply to a"}), ("b", OK, {"reply": "reply to b"})],
                   _said(("a", "reply to a")))
    result = lost.check(RunData(run))
    assert result.verdict == "fail" and result.details["lost"] == 1


def test_a_wrong_answer_is_not_shown_as_zero_lost(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [("a", OK, {"reply": "nonsense"})], _said(("a", "nonsense")))
    checks = [lost.check(RunData(run))]
    assert checks[0].verdict == "fail"
    assert table_row("t", [], checks)["lost"] == "0+1 bad"


def test_a_turn_that_failed_fails(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [("a", FAIL, None)], [])
    assert lost.check(RunData(run)).verdict == "fail"


def _with_history(tmp_path: Path, activity: ActivityRecord, executions: list[tuple[int, float, float | None]],
                  ) -> RunData:
    """One completed activity and its executions (attempt, started, scheduled) in a real ledger file."""
    run = _run_dir(tmp_path, [], [], target={"ledger": "ledger.sqlite3", "model_activity": "plan"})
    with EffectLedger(run / "state" / "ledger.sqlite3") as ledger:
        for attempt, started, scheduled in executions:
            ident = ExecutionIdentity("c-0", "r-1", activity.activity_id, attempt, f"w{attempt}", scheduled)
            eid = ledger.begin_execution(ident, activity.activity_type, model_call=True)
            ledger._conn.execute("UPDATE executions SET started_at = ?, finished_at = ? WHERE id = ?",
                                 (started, started + 0.1, eid))
    data = RunData(run)
    data.__dict__["event_histories"] = {"c-0": [RunRecord("c-0", "r-1", activities=[activity])]}
    return data


def _model_call(attempts: int) -> ActivityRecord:
    return ActivityRecord("5", "plan", 5, attempts=attempts, outcome="completed", scheduled_at=T0,
                          started_at=T0 + timedelta(seconds=3), closed_at=T0 + timedelta(seconds=4),
                          retry_policy=(0.5, 2.0, 4.0))


def test_a_stale_attempt_started_late_is_counted_not_failed(tmp_path: Path) -> None:
    t = T0.timestamp()
    # attempt 1 timed out; attempt 2 (scheduled at +2.5 s) completed at +4 s; the paused worker began 1 at +5 s
    data = _with_history(tmp_path, _model_call(2), [(2, t + 3.0, t + 2.5), (1, t + 5.0, t)])
    result = temporal_history.check(data)
    assert result.verdict == PASS, result.summary
    assert result.details["stale_attempts"] == 1 and result.details["stale_model_calls"] == 1


def test_the_completing_attempt_executed_again_after_completion_fails(tmp_path: Path) -> None:
    t = T0.timestamp()
    data = _with_history(tmp_path, _model_call(2), [(2, t + 3.0, t + 2.5), (2, t + 6.0, t + 2.5)])
    result = temporal_history.check(data)
    assert result.verdict == "fail" and "executed again after it completed" in result.summary


def test_retries_scheduled_closer_than_the_backoff_fail(tmp_path: Path) -> None:
    t = T0.timestamp()
    # the server's schedule times 0.1 s apart, where the policy's first backoff is 0.5 s
    data = _with_history(tmp_path, _model_call(2), [(1, t + 0.0, t), (2, t + 3.0, t + 0.1)])
    assert "scheduled 0.10s apart" in temporal_history.check(data).summary


def test_without_an_execution_log_nothing_is_claimed_about_re_execution(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [], [], target={"model_activity": "plan"})
    data = RunData(run)
    data.__dict__["event_histories"] = {"c-0": [RunRecord("c-0", "r-1", activities=[_model_call(1)])]}
    result = temporal_history.check(data)
    assert "none executed after completing" not in result.summary and "not checked" in result.summary


def _local_model_call(tmp_path: Path, executions: list[tuple[str, float]], tasks: list[tuple[str, float]]) -> RunData:
    """A model call run as a local activity, recorded (its marker) at +4 s by w1's workflow task; its executions
    (worker, started: each finished ok) and the workflow tasks each worker started (worker, started)."""
    run = _run_dir(tmp_path, [], [], target={"ledger": "ledger.sqlite3", "model_activity": "plan"})
    t = T0.timestamp()
    with EffectLedger(run / "state" / "ledger.sqlite3") as ledger:
        for worker, started in executions:
            eid = ledger.begin_execution(ExecutionIdentity("c-0", "r-1", "3", 1, worker, None), "plan",
                                         model_call=True)
            ledger.end_execution(eid, "ok")
            ledger._conn.execute("UPDATE executions SET started_at = ?, finished_at = ? WHERE id = ?",
                                 (t + started, t + started + 0.1, eid))
    la = LocalActivityRecord("3", "plan", 1, "completed", recorded_at=T0 + timedelta(seconds=4), worker="w1")
    wfts = [WorkflowTaskRecord(i, identity=w, outcome="started", started_at=T0 + timedelta(seconds=at))
            for i, (w, at) in enumerate(tasks)]
    data = RunData(run)
    data.__dict__["event_histories"] = {"c-0": [RunRecord("c-0", "r-1", local_activities=[la], workflow_tasks=wfts)]}
    return data


def test_a_local_activity_run_again_after_it_was_recorded_fails(tmp_path: Path) -> None:
    # w2 took a workflow task at +4.5 s, after the marker, and ran the call again at +5 s: the history told it
    data = _local_model_call(tmp_path, [("w1", 3.0), ("w2", 5.0)], [("w1", 2.9), ("w2", 4.5)])
    result = temporal_history.check(data)
    assert result.verdict == "fail" and "executed again after the history recorded it" in result.summary


def test_a_local_activity_run_late_on_a_task_taken_before_the_recording_is_stale_not_failed(tmp_path: Path) -> None:
    # w2 took the task at +1 s, was paused; w1 took it over and recorded the call at +4 s; w2 resumed at +5 s
    data = _local_model_call(tmp_path, [("w2", 1.1), ("w1", 3.0), ("w2", 5.0)], [("w2", 1.0), ("w1", 2.9)])
    result = temporal_history.check(data)
    assert result.verdict == PASS, result.summary
    # w2's first finish (+1.1 s) was never recorded: one repeat before the recording; its run at +5 s is stale
    assert result.details["stale_model_calls"] == 1 and result.details["local_repeated_before_recorded"] == 1


def test_a_stale_local_activity_run_after_a_kill_is_not_called_a_repeat_of_a_recorded_call(tmp_path: Path) -> None:
    # recorded at +4 s; a worker killed at +4.5 s; the paused w2 (its task taken at +1 s) ran the call at +5 s
    data = _local_model_call(tmp_path, [("w2", 1.1), ("w1", 3.0), ("w2", 5.0)], [("w2", 1.0), ("w1", 2.9)])
    t = T0.timestamp()
    data.__dict__["ops"] = [Op(0, "nemesis", "invoke", "kill_worker", None, 4.4, t + 4.4),
                            Op(1, "nemesis", OK, "kill_worker", {"identity": "w3-1", "killed_at": t + 4.5}, 4.5,
                               t + 4.5, invoke_index=0)]
    result = temporal_history.check(data)
    assert result.verdict == PASS, result.summary
    assert result.details["model_calls_completed_before_kills"] == 1 and result.details["stale_model_calls"] == 1


def test_a_local_activity_finished_twice_before_it_was_recorded_is_counted(tmp_path: Path) -> None:
    # w2 finished it at +1 s and died before its task completed; w1 ran it again and recorded it
    data = _local_model_call(tmp_path, [("w2", 1.0), ("w1", 3.0)], [("w2", 0.9), ("w1", 2.9)])
    result = temporal_history.check(data)
    assert result.verdict == PASS, result.summary
    assert result.details["local_repeated_before_recorded"] == 1 and "1 finished again" in result.summary


def _tasks(*outcomes: tuple[str, str]) -> list[WorkflowTaskRecord]:
    return [WorkflowTaskRecord(i, outcome=o, failure=f, cause="WORKFLOW_WORKER_UNHANDLED_FAILURE" if f else "",
                               scheduled_at=T0) for i, (o, f) in enumerate(outcomes)]


def test_a_workflow_task_failing_until_the_end_fails_naming_its_error(tmp_path: Path) -> None:
    data = RunData(_run_dir(tmp_path, [], []))
    stuck = RunRecord("c-0", "r-1", status="running",
                      workflow_tasks=_tasks(("completed", ""), ("failed", "KeyError: 'boom'")))
    data.__dict__["event_histories"] = {"c-0": [stuck]}
    result = workflow_tasks.check(data)
    assert result.verdict == "fail" and "KeyError: 'boom'" in result.summary


def test_a_workflow_task_that_failed_then_recovered_passes(tmp_path: Path) -> None:
    data = RunData(_run_dir(tmp_path, [], []))
    tasks = _tasks(("failed", "a new event arrived"), ("completed", ""))
    tasks[0].cause = "UNHANDLED_COMMAND"  # a task racing a new message: expected, not the workflow's fault
    fine = RunRecord("c-0", "r-1", status="completed", workflow_tasks=tasks)
    data.__dict__["event_histories"] = {"c-0": [fine]}
    assert workflow_tasks.check(data).verdict == PASS


def test_workflow_code_that_raised_fails_even_if_a_later_task_completed(tmp_path: Path) -> None:
    data = RunData(_run_dir(tmp_path, [], []))
    raised = RunRecord("c-0", "r-1", status="completed",
                       workflow_tasks=_tasks(("failed", "RuntimeError: planted"), ("completed", "")))
    data.__dict__["event_histories"] = {"c-0": [raised]}
    result = workflow_tasks.check(data)
    assert result.verdict == "fail" and "RuntimeError: planted" in result.summary


def test_a_property_the_target_left_unchecked_keeps_the_run_from_passing(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [("a", OK, {"reply": "reply to a"})], _said(("a", "reply to a")),
                   target={"checkers": ["lost", "stats"]})
    verdict, checks, _row = check(run)
    by = {c.name: c for c in checks}
    assert by["lost"].verdict == PASS and by["effects"].verdict == UNKNOWN
    assert verdict == UNKNOWN
    saved = json.loads((run / "verdict.json").read_text())
    assert "effects" in saved["not_checked"] and "lost" in saved["checked"]


def test_recovery_is_per_conversation_and_names_the_ones_that_never_recovered() -> None:
    from chaos.recovery import recovery

    ops = [Op(0, "nemesis", "invoke", "kill_worker", {}, 1.0, 1.0),
           Op(1, "nemesis", OK, "kill_worker", {}, 2.0, 2.0, None, 0),
           Op(2, "client-0", "invoke", "send_message", {"conversation": "a"}, 2.5, 2.5),
           Op(3, "client-0", OK, "send_message", {"reply": "x"}, 3.0, 3.0, None, 2),
           Op(4, "client-1", "invoke", "send_message", {"conversation": "b"}, 2.5, 2.5),
           Op(5, "client-1", INFO, "send_message", None, 60.0, 60.0, "TimeoutError", 4)]
    rec = recovery(ops)
    assert rec["by_conversation"] == {"a": 1.0} and rec["never"] == ["b"]
    assert table_row("t", ops, [CheckResult("lost", PASS, "")])["recovery_s"] == "never (1)"


def test_a_message_still_unanswered_long_after_the_heal_is_not_a_legal_indeterminate(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [("a", OK, {"reply": "reply to a"})], _said(("a", "reply to a")))
    ops = (run / "operations.jsonl").read_text()
    extra = [{"index": 2, "process": "nemesis", "type": "invoke", "f": "phase:heal", "time": 1.0, "wall": 1.0},
             {"index": 3, "process": "nemesis", "type": "ok", "f": "phase:heal", "time": 1.0, "wall": 1.0,
              "invoke_index": 2},
             {"index": 4, "process": "client-0", "type": "invoke", "f": "send_message", "time": 2.0, "wall": 2.0,
              "value": {"conversation": "c-0", "n": 1, "text": "b", "expect": "reply to b", "match": "exact"}},
             {"index": 5, "process": "client-0", "type": "info", "f": "send_message", "time": 70.0, "wall": 70.0,
              "error": "no reply within 60s", "invoke_index": 4}]
    (run / "operations.jsonl").write_text(ops + "".join(json.dumps(o) + "\n" for o in extra))
    result = lost.check(RunData(run))
    assert result.verdict == "fail" and "never took the message" in result.summary


def _update_run(run_id: str, *updates: tuple[str, str, str], status: str = "completed") -> RunRecord:
    from harness.event_history import UpdateRecord

    return RunRecord("c-0", run_id, status=status,
                     update_records=[UpdateRecord(uid, "send_message", text, "completed", reply)
                                     for uid, text, reply in updates])


def test_a_re_send_answered_again_in_the_next_run_is_one_message_not_two(tmp_path: Path) -> None:
    # msg-0 answered in run 1; the client, which never saw the reply, re-sent it after continue-as-new, and run 2
    # answered it from the replies it carried: the same message, once.
    run = _run_dir(tmp_path, [("a", OK, {"reply": "reply to a"})], _said(("a", "reply to a")))
    data = RunData(run)
    data.__dict__["event_histories"] = {"c-0": [
        _update_run("r-1", ("msg-0", "a", "reply to a"), status="continued_as_new"),
        _update_run("r-2", ("msg-0", "a", "reply to a"))]}
    result = lost.check(data)
    assert result.verdict == PASS, result.details["problems"]
    data = RunData(run)
    data.__dict__["event_histories"] = {"c-0": [
        _update_run("r-1", ("msg-0", "a", "reply to a"), status="continued_as_new"),
        _update_run("r-2", ("msg-0", "a", "another reply"))]}
    assert "answered differently" in lost.check(data).summary


def test_the_same_text_sent_twice_under_two_ids_and_answered_twice_is_doubled(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [("a", OK, {"reply": "reply to a"})], _said(("a", "reply to a"), ("a", "reply to a")))
    data = RunData(run)
    data.__dict__["event_histories"] = {"c-0": [
        _update_run("r-1", ("msg-0", "a", "reply to a"), ("msg-0b", "a", "reply to a"))]}
    assert lost.check(data).verdict == "fail"


def test_recovery_ends_at_the_first_correct_answer_not_at_a_refusal() -> None:
    from chaos.recovery import recovery

    sent = {"conversation": "a", "expect": "2 * 3 = 6", "match": "exact"}
    ops = [Op(0, "nemesis", "invoke", "kill_worker", {}, 1.0, 1.0),
           Op(1, "nemesis", OK, "kill_worker", {}, 2.0, 2.0, None, 0),
           Op(2, "client-0", "invoke", "send_message", sent, 2.5, 2.5),
           Op(3, "client-0", OK, "send_message", {"reply": "[Agent is busy processing another message]"}, 3.0, 3.0,
              None, 2),
           Op(4, "client-0", "invoke", "send_message", sent, 3.5, 3.5),
           Op(5, "client-0", OK, "send_message", {"reply": "2 * 3 = 6"}, 9.0, 9.0, None, 4),
           Op(6, "client-1", "invoke", "send_message", {**sent, "conversation": "b"}, 2.5, 2.5),
           Op(7, "client-1", OK, "send_message", {"reply": "[Agent is busy processing another message]"}, 3.0, 3.0,
              None, 6)]
    rec = recovery(ops)
    # a: the refusal at +1 s is not recovery; the correct answer at +7 s is. b: only ever refused.
    assert rec["by_conversation"] == {"a": 7.0} and rec["never"] == ["b"], rec


def _ledger_run(tmp_path: Path, model_call: bool, requests: int) -> RunData:
    """One completed model activity run once, in a ledger that marks it a model call or not; the model server
    counted ``requests``."""
    run = _run_dir(tmp_path, [], [], target={"ledger": "ledger.sqlite3", "model_activity": "plan"})
    record = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**record, "model_server": {"requests": requests}}))
    t = T0.timestamp()
    with EffectLedger(run / "state" / "ledger.sqlite3") as ledger:
        eid = ledger.begin_execution(ExecutionIdentity("c-0", "r-1", "5", 1, "w1", t), "plan", model_call=model_call)
        ledger._conn.execute("UPDATE executions SET started_at = ?, finished_at = ? WHERE id = ?",
                             (t + 3.0, t + 3.5, eid))
    data = RunData(run)
    data.__dict__["event_histories"] = {"c-0": [RunRecord("c-0", "r-1", activities=[_model_call(1)])]}
    return data


def test_hidden_retries_are_counted_only_where_the_ledger_marks_model_calls(tmp_path: Path) -> None:
    unmarked = temporal_history.check(_ledger_run(tmp_path / "unmarked", model_call=False, requests=28))
    assert "retries inside an attempt" in unmarked.summary and "cannot tell" in unmarked.summary, unmarked.summary
    assert "model request(s) were retries" not in unmarked.summary
    assert unmarked.details["model_requests"]["inside_attempts"] is None
    marked = temporal_history.check(_ledger_run(tmp_path / "marked", model_call=True, requests=28))
    assert "27 model request(s) were retries inside an attempt" in marked.summary, marked.summary


def test_a_retry_sooner_than_the_policy_is_not_a_violation_where_the_activity_may_choose_its_delay(
        tmp_path: Path) -> None:
    """An ApplicationError may set next_retry_delay (the OpenAI Agents SDK's model activity passes a 429's
    Retry-After), and the server honours it over the policy; the history keeps only the last failure. A
    correct agent's model_outage run failed with 'attempt 3 started 2.26s after scheduling; the backoff policy
    needs >= 3.00s'. Where the delay may be the activity's own, the spacing is not checked, and said; where the
    policy alone decides (the reference agent, or one failure seen that set no delay), it still fails."""
    def short_retry(sets_delay: bool, attempts: int) -> ActivityRecord:
        soon = 2.26 if attempts == 3 else 0.5  # the policy's floor: 3 s before attempt 3, 1 s before attempt 2
        return ActivityRecord("3", "call_model", 3, attempts=attempts, outcome="completed", scheduled_at=T0,
                              started_at=T0 + timedelta(seconds=soon), closed_at=T0 + timedelta(seconds=3),
                              retry_policy=(1.0, 2.0, 100.0), last_failure_sets_delay=sets_delay)

    cases = [  # (target, sets_delay, attempts) -> fails?
        ({"source": "t.toml"}, True, 3, False),  # its last failure chose the delay
        ({"source": "t.toml"}, False, 3, False),  # an earlier failure may have: the history cannot say
        ({"source": "t.toml"}, False, 2, True),  # the one failure is in the history, and chose nothing
        ({}, False, 3, True),  # the reference agent never chooses a delay
    ]
    for i, (target, sets_delay, attempts, fails) in enumerate(cases):
        run = _run_dir(tmp_path / str(i), [], [], target={**target, "model_activity": "call_model"})
        data = RunData(run)
        data.__dict__["event_histories"] = {"c-0": [RunRecord("c-0", "r-1",
                                                              activities=[short_retry(sets_delay, attempts)])]}
        result = temporal_history.check(data)
        print(i, result.verdict, result.summary[:160])
        assert (result.verdict == "fail") == fails, result.summary
        if not fails:
            assert "retry spacing of 1 activity retried sooner than the policy" in result.summary
