"""The durability lint: each rule fires on the risky setting it names, with its evidence and a fix that fits it,
and stays silent on the safe one; the command informs (exit 0) unless ``--lint-fails``."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

from chaos import lint as L
from harness.event_history import ActivityRecord, RunRecord, WorkflowTaskRecord

AT = datetime(2026, 11, 28, 12, 0, 0)
ROOT = Path(__file__).resolve().parent.parent


def _act(name: str, took_s: float = 0.5, **kw: object) -> ActivityRecord:
    return ActivityRecord(name, name, 5, outcome="completed", scheduled_at=AT, started_at=AT,
                          closed_at=AT + timedelta(seconds=took_s), retry_policy=(1.0, 2.0, 10.0), **kw)


def _h(*runs: RunRecord) -> dict[str, list[RunRecord]]:
    out: dict[str, list[RunRecord]] = {}
    for r in runs:
        out.setdefault(r.workflow_id, []).append(r)
    return out


def test_a_long_timeout_with_no_heartbeat_is_flagged_and_told_to_shorten_or_heartbeat() -> None:
    h = _h(RunRecord("c1", "r1", activities=[_act("invokeModel", 1.2, start_to_close_s=60.0),
                                              _act("saveNote", start_to_close_s=30.0, heartbeat_s=5.0),
                                              _act("quick", start_to_close_s=5.0)]))
    [f] = L.no_heartbeat_long_timeout(h, "invokeModel")
    assert f["setting"] == {"name": "start_to_close", "value_s": 60.0, "activity_type": "invokeModel"}
    assert f["line"].startswith("the model activity `invokeModel` has start-to-close 60 s and no heartbeat timeout")
    assert f["fix"] == ("shorten start-to-close toward the activity's real latency (its slowest completed attempt "
                        "here took 1.2 s), or heartbeat while it runs and set a heartbeat timeout")
    assert f["evidence"]["heartbeat_s"] is None and f["evidence"]["count"] == 1


def test_unbounded_retries_on_an_error_the_agent_marks_non_retryable_elsewhere() -> None:
    risky = _act("charge", attempts=7, last_failure_type="CardDeclined")
    careful = _act("refund", non_retryable=("CardDeclined",))
    [f] = L.unbounded_retry_nonretryable(_h(RunRecord("c1", "r1", activities=[risky, careful])), None)
    assert "`charge` retries without limit on CardDeclined" in f["line"] and f["evidence"]["attempts"] == 7
    bounded = _act("charge", attempts=3, last_failure_type="CardDeclined", maximum_attempts=3)
    assert L.unbounded_retry_nonretryable(_h(RunRecord("c1", "r1", activities=[bounded, careful])), None) == []
    unmarked = _act("charge", attempts=7, last_failure_type="Timeout")  # nothing says it should stop: no guess
    assert L.unbounded_retry_nonretryable(_h(RunRecord("c1", "r1", activities=[unmarked, careful])), None) == []


def _task(took_s: float) -> WorkflowTaskRecord:
    return WorkflowTaskRecord(3, outcome="completed", scheduled_at=AT, started_at=AT,
                              closed_at=AT + timedelta(seconds=took_s))


def test_a_workflow_task_timeout_near_the_longest_task_is_flagged() -> None:
    [f] = L.workflow_task_timeout_near_replay(
        _h(RunRecord("c1", "r1", workflow_task_timeout_s=1.0, workflow_tasks=[_task(0.2), _task(0.7)])), None)
    assert f["setting"] == {"name": "workflow_task_timeout", "value_s": 1.0} and "took 0.70 s" in f["line"]
    assert L.workflow_task_timeout_near_replay(
        _h(RunRecord("c1", "r1", workflow_task_timeout_s=10.0, workflow_tasks=[_task(0.7)])), None) == []


def test_a_history_growing_without_continue_as_new_is_flagged() -> None:
    big = RunRecord("c1", "r2", events=6000, history_bytes=1000)
    [f] = L.history_growth(_h(RunRecord("c1", "r1", events=9000, next_run_id="r2"), big), None)
    assert f["evidence"]["events"] == 6000 and f["evidence"]["longest_chain_run_events"] == 9000
    assert L.history_growth(_h(RunRecord("c1", "r1", events=6000, next_run_id="r2")), None) == []  # it continued


def test_signals_without_an_id_are_flagged() -> None:
    [f] = L.signals_without_id(_h(RunRecord("c1", "r1", signals=3, signals_without_id=2)), None)
    assert f["line"].startswith("2 signal(s) in 1 run(s) carry no id")
    assert L.signals_without_id(_h(RunRecord("c1", "r1", signals=3)), None) == []


def test_the_command_refuses_a_path_that_is_no_run_and_informs_by_default(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "chaos", "lint", str(tmp_path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 2 and "is not a chaos run directory" in done.stderr
    (tmp_path / "operations.jsonl").write_text("")  # a run with no histories: nothing to lint, said so
    done = subprocess.run([sys.executable, "-m", "chaos", "lint", str(tmp_path), "--lint-fails"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and L.NO_HISTORIES in done.stdout
