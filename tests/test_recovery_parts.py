"""A recovery wait cut into its parts (``chaos.recovery.recovery_parts``): detection, backoff, sticky wait, replay,
turn, client delivery and the time before the message was sent, from the saved run alone; and the lever benchmark's
count of false timeouts (``benchmarks.recovery_levers``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from benchmarks import recovery_levers
from chaos import recovery
from chaos.checker.verdict import check
from chaos.runner import run
from chaos.scenarios import SCENARIOS
from harness.event_history import RunRecord, UpdateRecord, WorkflowTaskRecord
from harness.operations import OK, Op
from harness.rundir import RunDir
from testbed.engines.workload import TIMEOUTS
from testbed.engines.temporal.engine import ReferenceOnTemporal

T0 = 1_800_000_000.0


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(T0 + seconds, tz=timezone.utc)


def op(index: int, process: str, kind: str, f: str, seconds: float, value: Any = None,
       invoke_index: int | None = None) -> Op:
    return Op(index, process, kind, f, value, seconds, T0 + seconds, invoke_index=invoke_index)


@dataclass
class _Data:
    """The parts of ``RunData`` recovery_parts reads, built by hand."""
    ops: list[Op]
    event_histories: dict[str, list[RunRecord]] = field(default_factory=dict)
    executions: list[dict[str, Any]] = field(default_factory=list)
    run: dict[str, Any] = field(default_factory=lambda: {"scenario": {"cluster": {"workers": 2}}})

    def ledger_rows(self, table: str) -> list[dict[str, Any]]:
        return self.executions if table == "executions" else []

    def updates(self, workflow_id: str) -> list[UpdateRecord] | None:
        chain = self.event_histories.get(workflow_id)
        return [u for r in chain for u in r.update_records] if chain else None


def _kill(seconds: float) -> list[Op]:
    return [op(0, "nemesis", "invoke", "kill_worker", seconds - 0.1),
            op(1, "nemesis", OK, "kill_worker", seconds + 0.01, {"worker": "w1", "identity": "w1-1",
                                                                "killed_at": T0 + seconds}, 0)]


def _send(index: int, sent: float, answered: float, n: int = 0) -> list[Op]:
    value = {"conversation": "c0", "n": n, "text": "What is 2 * 3?", "expect": "2 * 3 = 6"}
    return [op(index, "client-0", "invoke", "send_message", sent, value),
            op(index + 1, "client-0", OK, "send_message", answered, {"reply": "2 * 3 = 6"}, index)]


def _execution(worker: str, started: float, finished: float | None, attempt: int,
               scheduled: float | None = None) -> dict[str, Any]:
    return {"worker": worker, "started_at": T0 + started, "finished_at": None if finished is None else T0 + finished,
            "attempt": attempt, "activity_id": "3", "workflow_id": "c0", "run_id": "r", "kind": "model",
            "tool": "plan_next_action", "scheduled_at": None if scheduled is None else T0 + scheduled}


def _history(tasks: list[WorkflowTaskRecord], update: UpdateRecord) -> dict[str, list[RunRecord]]:
    from harness.event_history import ActivityRecord

    rec = RunRecord("c0", "r", workflow_tasks=tasks, update_records=[update])
    rec.activities = [ActivityRecord("3", "plan_next_action", 5, retry_policy=(0.1, 2.0, 4.0))]
    return {"c0": [rec]}


def test_a_kill_mid_model_call_is_detection_backoff_sticky_wait_replay_turn_and_delivery() -> None:
    # The model call dies with w1-1 at 10; its heartbeat timeout fires at 11.5, the retry is scheduled 0.1 s later
    # and starts at 11.65; the workflow task after it waits a second on w1-1's sticky queue, the next one replays
    # on w2-1; the reply exists at 14.0 and the client hears of it at 14.4.
    tasks = [WorkflowTaskRecord(10, identity="w1-1", outcome="completed", scheduled_at=at(9.3), started_at=at(9.31),
                                closed_at=at(9.35)),
             WorkflowTaskRecord(20, outcome="timed_out", scheduled_at=at(12.2), closed_at=at(13.2)),
             WorkflowTaskRecord(21, identity="w2-1", outcome="completed", scheduled_at=at(13.2),
                                started_at=at(13.25), closed_at=at(13.35))]
    data = _Data(_kill(10.0) + _send(2, 9.4, 14.4),
                 _history(tasks, UpdateRecord("msg-0", "send_message", outcome="completed", accepted_at=at(9.35),
                                              completed_at=at(14.0))),
                 [_execution("w1-1", 9.5, None, 1), _execution("w2-1", 11.65, 12.15, 2, scheduled=11.6)])
    out = recovery.recovery_parts(data)
    assert out["total_s"] == out["wait_s"] == out["held_s"] == 4.39 and len(out["by_fault"]) == 1
    assert out["parts"] == {"detection_s": 1.49, "no_worker_s": 0.0, "backoff_s": 0.15, "sticky_wait_s": 1.0, "replay_s": 0.1,
                            "turn_s": 1.25, "client_delivery_s": 0.4, "before_send_s": 0.0}
    assert round(sum(out["parts"].values()), 2) == out["total_s"]


def test_an_idle_conversation_waits_before_it_sends_and_a_lost_update_waits_for_its_resend() -> None:
    # Sent 0.49 s after the kill's end; the update the server lost waits for the re-send at 12.5 (client delivery,
    # 2 s), then the turn takes 0.5 s and the client hears of the reply 0.02 s later.
    resend = [op(4, "client-0", "invoke", "resend_message", 12.5, {"conversation": "c0", "n": 0, "attempt": 2}),
              op(5, "client-0", OK, "resend_message", 12.5, {"conversation": "c0", "n": 0, "attempt": 2}, 4)]
    data = _Data(_kill(10.0) + _send(2, 10.5, 13.02) + resend,
                 _history([], UpdateRecord("msg-0", "send_message", outcome="completed", accepted_at=at(12.6),
                                           completed_at=at(13.0))))
    parts = recovery.recovery_parts(data)["parts"]
    assert parts["before_send_s"] == 0.49 and parts["client_delivery_s"] == 2.02 and parts["turn_s"] == 0.5
    assert recovery.recovery_parts(data)["held_s"] == 2.52
    assert parts["detection_s"] == parts["sticky_wait_s"] == parts["replay_s"] == parts["backoff_s"] == 0.0


def test_a_kill_of_the_last_live_worker_waits_for_its_replacement() -> None:
    # One worker: the kill at 10 leaves none until the replacement polls at 11.2; the message, sent at 10.5, then
    # takes 0.3 s and the client hears of it at once.
    ops = _kill(10.0) + [op(4, "supervisor", "invoke", "restart_worker", 11.0, {"worker": "w1"}),
                         op(5, "supervisor", OK, "restart_worker", 11.2, {"worker": "w1", "identity": "w1-2"}, 4)]
    data = _Data(ops + _send(2, 10.5, 11.5),
                 _history([], UpdateRecord("msg-0", "send_message", outcome="completed", accepted_at=at(11.3),
                                           completed_at=at(11.5))), run={"scenario": {"cluster": {"workers": 1}}})
    parts = recovery.recovery_parts(data)["parts"]
    assert (parts["before_send_s"], parts["no_worker_s"], parts["turn_s"]) == (0.49, 0.7, 0.3)


def test_without_the_message_in_an_event_history_there_are_no_parts_and_no_fault_no_rows() -> None:
    out = recovery.recovery_parts(_Data(_kill(10.0) + _send(2, 10.5, 11.0)))
    assert out["parts"] is None and "no event history" in out["why"] and out["total_s"] == 0.99
    assert recovery.recovery_parts(_Data(_send(0, 1.0, 1.5))) == {}


def test_the_levers_step_from_main_to_the_fast_profile_one_at_a_time() -> None:
    steps = recovery_levers.levers()
    by_name = {s[0]: s for s in steps}
    main, last = steps[0][2], by_name[recovery_levers.FAST_STEP][2]  # fast as it ships; "retry" goes beyond it
    assert (main.heartbeat_s, main.sticky_timeout_s, main.heartbeat_throttle_s) == (1.5, 1.0, 0.5)
    fast = TIMEOUTS["fast"]
    for name in ("heartbeat_s", "heartbeat_throttle_s", "sticky_timeout_s", "workflow_task_timeout_s",
                 "initial_interval_s"):
        assert getattr(last, name) == getattr(fast, name), name
    assert steps[0][3] == {"try_timeout_s": 4.0, "resend_at_once": False}
    assert steps[1][3] == {"try_timeout_s": 2.0, "resend_at_once": True}
    # the variants of fast change one thing each: the workers' cache, the model's latency
    for variant, (cluster, args) in {"nocache": ({}, ("--max-cached-workflows", "0")),
                                     "latency500": ({"model_latency": "fixed:500"}, ())}.items():
        name, _, timeouts, client, got_cluster, got_args = by_name[variant]
        assert (got_cluster, got_args, client) == (cluster, args, by_name[recovery_levers.FAST_STEP][3]), name
        assert replace(timeouts, name="x", description="") == replace(last, name="x", description="")
    # a timeouts variant changes its one timeout and nothing else
    assert replace(by_name["heartbeat05"][2], name="x", description="") == \
        replace(last, name="x", description="", heartbeat_s=0.5)
    assert recovery_levers._pct([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5 and recovery_levers._pct([], 0.5) is None


@pytest.mark.slow
async def test_a_real_kill_run_is_decomposed_in_its_verdict_and_again_offline(tmp_path: Path) -> None:
    result = await run(SCENARIOS["kill_mid_turn"], ReferenceOnTemporal(), seed=2, out_root=tmp_path)
    saved = RunDir(result.run_dir).read_verdict()["recovery_parts"]
    assert saved["by_fault"] and saved["wait_s"] == max(r["wait_s"] for r in saved["by_fault"])
    for row in saved["by_fault"]:
        assert abs(sum(row["parts"].values()) - row["total_s"]) <= 0.05
    # the kills caught model calls: some wait went to noticing them (a heartbeat timeout, a sticky queue)
    assert sum(r["parts"]["detection_s"] + r["parts"]["sticky_wait_s"] for r in saved["by_fault"]) > 0
    check(result.run_dir)  # offline, from the files alone: the same parts
    assert json.loads((result.run_dir / "verdict.json").read_text())["recovery_parts"] == saved
    false = recovery_levers.false_timeouts(result.run_dir)
    assert set(false) == {"activity", "workflow_task", "sticky", "resend"} and all(v >= 0 for v in false.values())


def test_the_report_shows_each_runs_parts_and_a_soaks_percentiles_and_mean_parts() -> None:
    from reports import tables
    from reports.sources import ChaosRun, SoakRun

    parts = {"detection_s": 1.0, "backoff_s": 0.1, "sticky_wait_s": 0.3, "replay_s": 0.1, "turn_s": 1.0,
             "client_delivery_s": 0.0, "before_send_s": 0.0}
    runs = [ChaosRun("kill_mid_turn", Path("r1"), {}, [], "pass", "", {}, False, [], 0.0,
                     {"total_s": 2.5, "parts": parts}),
            ChaosRun("model_outage", Path("r2"), {}, [], "pass", "", {}, False, [], 0.0, {})]  # nothing to cut
    t = tables.recovery_parts(runs)
    assert t is not None and list(t.df["Scenario"]) == ["kill_mid_turn"]
    assert t.df.iloc[0]["Sticky wait (s)"] == 0.3 and t.df.iloc[0]["Recovery (s)"] == 2.5
    rows = [{"seed": s, "verdict": "pass", "recovery": {"worst_s": float(s), "parts": {**parts, "turn_s": float(s)}}}
            for s in range(1, 5)] + [{"seed": 9, "verdict": "pass", "recovery": {}}]  # a seed with no verdict.json
    soak = tables.soak_recovery(SoakRun("kill_mid_turn", Path("s"), {}, {}, rows))
    row = soak.df.iloc[0]
    assert (row["seeds"], row["p50 (s)"], row["max (s)"], row["mean turn (s)"]) == (4, 2.5, 4.0, 2.5)
    assert tables.soak_recovery(SoakRun("x", Path("s"), {}, {}, rows[-1:])) is None
