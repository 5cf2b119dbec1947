"""The durability lint: each rule fires on the risky setting it names, with its evidence and a fix that fits it,
and stays silent on the safe one; histories are built as Temporal's protobufs and saved as the harness saves them,
so the lint reads them as it reads a real run's; the command informs (exit 0) unless ``--lint-fails``."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from google.protobuf.duration_pb2 import Duration
from temporalio.api.common.v1 import ActivityType, Payload, Payloads, RetryPolicy, WorkflowType
from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import ApplicationFailureInfo, Failure
from temporalio.api.history.v1 import (ActivityTaskCompletedEventAttributes, ActivityTaskFailedEventAttributes,
                                       ActivityTaskScheduledEventAttributes, ActivityTaskStartedEventAttributes,
                                       HistoryEvent, WorkflowExecutionContinuedAsNewEventAttributes,
                                       WorkflowExecutionSignaledEventAttributes,
                                       WorkflowExecutionStartedEventAttributes, WorkflowTaskCompletedEventAttributes,
                                       WorkflowTaskScheduledEventAttributes, WorkflowTaskStartedEventAttributes)
from temporalio.client import WorkflowHistory

from chaos import lint as L
from chaos.checker.run_data import RunData
from harness.event_history import LocalActivityRecord, RunRecord, WorkflowTaskRecord, save_chain

AT = datetime(2026, 11, 28, 12, 0, 0)
ROOT = Path(__file__).resolve().parent.parent
T = EventType


class _History:
    """One run's events, built in order as a server records them (ids from 1, times in seconds from ``AT``)."""

    def __init__(self, workflow_task_timeout_s: int = 10) -> None:
        self.events: list[HistoryEvent] = []
        self.add(T.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, 0.0, workflow_execution_started_event_attributes=(
            WorkflowExecutionStartedEventAttributes(workflow_type=WorkflowType(name="Chat"),
                                                    workflow_task_timeout=Duration(seconds=workflow_task_timeout_s))))
        self.timeout_s = workflow_task_timeout_s

    def add(self, event_type: int, at_s: float, **attributes: Any) -> int:
        ev = HistoryEvent(event_id=len(self.events) + 1, event_type=event_type, **attributes)
        ev.event_time.FromDatetime(AT + timedelta(seconds=at_s))
        self.events.append(ev)
        return ev.event_id

    def workflow_task(self, at_s: float, took_s: float) -> None:
        scheduled = self.add(T.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, at_s, workflow_task_scheduled_event_attributes=(
            WorkflowTaskScheduledEventAttributes(start_to_close_timeout=Duration(seconds=self.timeout_s))))
        started = self.add(T.EVENT_TYPE_WORKFLOW_TASK_STARTED, at_s, workflow_task_started_event_attributes=(
            WorkflowTaskStartedEventAttributes(scheduled_event_id=scheduled, identity="w1")))
        self.add(T.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, at_s + took_s, workflow_task_completed_event_attributes=(
            WorkflowTaskCompletedEventAttributes(scheduled_event_id=scheduled, started_event_id=started)))

    def activity(self, name: str, at_s: float, took_s: float, *, attempt: int = 1, last_failure: str = "",
                 fails_non_retryable: str = "", **scheduled: Any) -> None:
        """An activity scheduled with ``scheduled`` (timeouts in seconds, a ``retry_policy``), its last attempt
        started (after ``last_failure``, an application error type, if given), then completed, or failed with an
        application error raised non-retryable."""
        timeouts = {k: Duration(seconds=v) for k, v in scheduled.items() if k.endswith("_timeout")}
        sid = self.add(T.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, at_s, activity_task_scheduled_event_attributes=(
            ActivityTaskScheduledEventAttributes(activity_id=f"{name}-{at_s:g}", activity_type=ActivityType(name=name),
                                                 retry_policy=scheduled.get("retry_policy"), **timeouts)))
        failure = (Failure(message="declined", application_failure_info=ApplicationFailureInfo(type=last_failure))
                   if last_failure else None)
        started = self.add(T.EVENT_TYPE_ACTIVITY_TASK_STARTED, at_s, activity_task_started_event_attributes=(
            ActivityTaskStartedEventAttributes(scheduled_event_id=sid, attempt=attempt, identity="w1",
                                               last_failure=failure)))
        if fails_non_retryable:
            info = ApplicationFailureInfo(type=fails_non_retryable, non_retryable=True)
            self.add(T.EVENT_TYPE_ACTIVITY_TASK_FAILED, at_s + took_s, activity_task_failed_event_attributes=(
                ActivityTaskFailedEventAttributes(scheduled_event_id=sid, started_event_id=started,
                                                  failure=Failure(message="no", application_failure_info=info))))
        else:
            self.add(T.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, at_s + took_s, activity_task_completed_event_attributes=(
                ActivityTaskCompletedEventAttributes(scheduled_event_id=sid, started_event_id=started)))

    def signal(self, at_s: float, value: object) -> None:
        arg = Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(value).encode())
        self.add(T.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, at_s, workflow_execution_signaled_event_attributes=(
            WorkflowExecutionSignaledEventAttributes(signal_name="message", input=Payloads(payloads=[arg]))))

    def continue_as_new(self, at_s: float, next_run_id: str) -> None:
        self.add(T.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW, at_s,
                 workflow_execution_continued_as_new_event_attributes=(
                     WorkflowExecutionContinuedAsNewEventAttributes(new_execution_run_id=next_run_id)))


def _run_dir(path: Path, chains: dict[str, list[tuple[str, _History]]]) -> Path:
    """A minimal chaos run directory: run.json naming the model activity, operations.jsonl, and the event
    histories saved by the harness's own ``save_chain``."""
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"schema": 2, "kind": "chaos", "status": "complete",
                                               "target": {"model_activity": "invokeModel"}}))
    (path / "operations.jsonl").write_text("")
    for wid, chain in chains.items():
        save_chain([(rid, WorkflowHistory(wid, h.events)) for rid, h in chain], path / "event_histories" / wid)
    return path


UNLIMITED = RetryPolicy(maximum_attempts=0)


def _risky(path: Path) -> Path:
    """Every rule's risky setting: a 60 s model call with no heartbeat, retries without limit on an error the agent
    raises non-retryable elsewhere, a 0.8 s workflow task under a 1 s timeout, a signal with no id, and a run that
    grows without continuing as new."""
    h = _History(workflow_task_timeout_s=1)
    h.workflow_task(0.0, 0.8)
    h.activity("invokeModel", 1.0, 1.5, start_to_close_timeout=60, retry_policy=UNLIMITED)
    h.activity("invokeModel", 3.0, 0.9, start_to_close_timeout=60, retry_policy=UNLIMITED)
    h.activity("charge", 5.0, 0.1, attempt=7, last_failure="CardDeclined", start_to_close_timeout=5,
               retry_policy=UNLIMITED)
    h.activity("refund", 6.0, 0.1, fails_non_retryable="CardDeclined", start_to_close_timeout=5,
               retry_policy=UNLIMITED)
    h.activity("saveNote", 7.0, 0.1, schedule_to_close_timeout=30, retry_policy=UNLIMITED)
    h.signal(8.0, {"text": "hello"})
    return _run_dir(path, {"c-risky": [("r1", h)]})


def _safe(path: Path) -> Path:
    """The same agent made safe: the long call heartbeats, a short tool, bounded retries, a 10 s workflow task
    timeout, signals with ids, and the long run continued as new."""
    first = _History()
    first.workflow_task(0.0, 0.8)
    first.activity("invokeModel", 1.0, 1.5, start_to_close_timeout=60, heartbeat_timeout=5, retry_policy=UNLIMITED)
    first.activity("charge", 3.0, 0.1, attempt=3, last_failure="CardDeclined", start_to_close_timeout=5,
                   retry_policy=RetryPolicy(maximum_attempts=3))
    first.activity("refund", 4.0, 0.1, fails_non_retryable="CardDeclined", start_to_close_timeout=5,
                   retry_policy=UNLIMITED)
    first.activity("saveNote", 5.0, 0.1, start_to_close_timeout=10, retry_policy=UNLIMITED)
    first.signal(6.0, {"text": "hello", "message_id": "m-1"})
    first.continue_as_new(7.0, "r2")
    second = _History()
    second.workflow_task(8.0, 0.1)
    return _run_dir(path, {"c-safe": [("r1", first), ("r2", second)]})


SMALL = {"suggest_events": 20}  # the risky run's 20 events pass half of it; the safe chain's last run's 4 do not


def test_each_rule_fires_on_its_risky_setting_with_evidence_and_a_fix_that_fits(tmp_path: Path) -> None:
    findings, why = L.lint(RunData(_risky(tmp_path / "risky")), **SMALL)
    assert why is None
    by = {(f["rule"], f["evidence"].get("activity_type")): f for f in findings}
    assert [f["rule"] for f in findings] == sorted(f["rule"] for f in findings)
    assert {f["rule"] for f in findings} == set(L.RULES)  # every rule fires here, under the id --help lists
    assert set(by) == {("no-heartbeat-long-timeout", "invokeModel"), ("no-heartbeat-long-timeout", "saveNote"),
                       ("unbounded-retry-nonretryable", "charge"), ("workflow-task-timeout-near-replay", None),
                       ("history-growth-no-continue-as-new", None), ("signals-without-id", None)}
    model = by["no-heartbeat-long-timeout", "invokeModel"]
    assert model["line"].startswith("the model activity `invokeModel` has start-to-close 60 s and no heartbeat "
                                    "timeout: a worker that dies mid call is noticed only after 60 s (2 call(s))")
    # never a heartbeat timeout alone: the history cannot show whether the activity heartbeats
    assert model["fix"] == ("shorten start-to-close toward the activity's real latency (its slowest completed "
                            "attempt here took 1.5 s), or heartbeat while it runs and set a heartbeat timeout")
    assert model["setting"] == {"name": "start_to_close", "value_s": 60.0, "activity_type": "invokeModel"}
    assert model["evidence"]["count"] == 2 and model["evidence"]["workflow_id"] == "c-risky"
    tool = by["no-heartbeat-long-timeout", "saveNote"]
    assert "tool activity `saveNote` has schedule-to-close 30 s, no start-to-close and no heartbeat timeout" in tool["line"]
    retried = by["unbounded-retry-nonretryable", "charge"]
    assert "`charge` retries without limit on CardDeclined" in retried["line"]
    assert retried["evidence"]["attempts"] == 7 and "`refund` raised it as non-retryable" in retried["line"]
    task = by["workflow-task-timeout-near-replay", None]
    assert task["setting"] == {"name": "workflow_task_timeout", "value_s": 1.0} and "took 0.80 s" in task["line"]
    growth = by["history-growth-no-continue-as-new", None]["evidence"]
    assert growth["events"] == 20 and growth["longest_chain_run_events"] == 20 and growth["chain_runs"] == 1
    assert by["signals-without-id", None]["evidence"]["signals_without_id"] == 1


def test_every_rule_stays_silent_on_the_safe_setting(tmp_path: Path) -> None:
    assert L.lint(RunData(_safe(tmp_path / "safe")), **SMALL) == ([], None)


def test_a_retry_policy_listing_the_error_also_marks_it_and_nothing_is_guessed() -> None:
    from harness.event_history import ActivityRecord

    def act(name: str, **kw: Any) -> ActivityRecord:
        return ActivityRecord(name, name, 5, outcome="completed", **kw)

    risky = act("charge", attempts=7, last_failure_type="CardDeclined")
    careful = act("refund", non_retryable=("CardDeclined",))
    [f] = L.unbounded_retry_nonretryable({"c1": [RunRecord("c1", "r1", activities=[risky, careful])]})
    assert "the retry policy of `refund` lists it" in f["line"]
    unmarked = act("charge", attempts=7, last_failure_type="Timeout")  # nothing says it should stop: no guess
    assert L.unbounded_retry_nonretryable({"c1": [RunRecord("c1", "r1", activities=[unmarked, careful])]}) == []


def test_workflow_tasks_that_ran_local_activities_are_not_taken_for_replays() -> None:
    task = WorkflowTaskRecord(3, outcome="completed", started_at=AT, closed_at=AT + timedelta(seconds=0.8))
    local = LocalActivityRecord("1", "invokeModel", 1, "completed", AT + timedelta(seconds=0.8))
    run = RunRecord("c1", "r1", workflow_task_timeout_s=1.0, workflow_tasks=[task])
    assert L.workflow_task_timeout_near_replay({"c1": [run]})
    run.local_activities = [local]  # the SDK completes such a task at 80% of its timeout on purpose
    assert L.workflow_task_timeout_near_replay({"c1": [run]}) == []


def _lint(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "chaos", "lint", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_the_command_informs_by_default_and_fails_on_a_finding_only_when_asked(tmp_path: Path) -> None:
    risky, safe = _risky(tmp_path / "risky"), _safe(tmp_path / "safe")
    done = _lint(risky, safe)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith("  lint: ") for line in lines) == 5  # the growth rule needs the server's own sizes
    assert f"{safe}: nothing risky seen in its event histories" in lines
    assert lines[-1].startswith("5 finding(s) in 2 run(s)")
    assert _lint(risky, "--lint-fails").returncode == 1
    assert _lint(safe, "--lint-fails").returncode == 0


def test_the_command_refuses_a_path_that_is_no_run_and_says_when_there_is_nothing_to_lint(tmp_path: Path) -> None:
    done = _lint(tmp_path)
    assert done.returncode == 2 and f"{tmp_path} is not a chaos run directory" in done.stderr
    assert len(done.stderr.splitlines()) == 1
    (tmp_path / "operations.jsonl").write_text("")  # a run with no histories: could not look, said so
    done = _lint(tmp_path, "--lint-fails")
    assert done.returncode == 0 and L.NO_HISTORIES in done.stdout
    assert L.lint(RunData(tmp_path)) == ([], L.NO_HISTORIES)
