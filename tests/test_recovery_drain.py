"""Recovery, decomposed and drained: how long a fault held each kind of work up (``chaos.recovery``), a
graceful stop that hands back nothing (the ``drain`` checker, on a real cluster, for a draining worker and for one
that cancels instead), and the timeouts profiles the chaos runs use."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from chaos import recovery
from testbed.engines.temporal.engine import ReferenceOnTemporal
from chaos.checker import drain
from testbed.engines.workload import TIMEOUTS, Workload, chaos_agent_config
from chaos.generator import NemesisEvent
from chaos.runner import run
from chaos.scenarios import SCENARIOS
from harness.operations import OK, Op
from harness.verdict import FAIL, NOT_APPLICABLE, PASS, UNKNOWN

T0 = 1_800_000_000.0


def op(index: int, process: str, kind: str, f: str, wall: float, value: Any = None,
       invoke_index: int | None = None) -> Op:
    return Op(index, process, kind, f, value, wall - T0, wall, invoke_index=invoke_index)


def execution(worker: str, started: float, finished: float | None, attempt: int = 1, activity_id: str = "1",
              workflow_id: str = "wf", kind: str = "model", scheduled: float | None = None) -> dict[str, Any]:
    return {"worker": worker, "started_at": started, "finished_at": finished, "attempt": attempt,
            "activity_id": activity_id, "workflow_id": workflow_id, "run_id": "r", "kind": kind, "tool": "t",
            "scheduled_at": scheduled}


@dataclass
class Task:
    outcome: str
    scheduled_at: datetime | None
    started_at: datetime | None
    closed_at: datetime | None
    identity: str = ""


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(T0 + seconds, tz=timezone.utc)


def kill_ops(killed_at: float, back_at: float | None) -> list[Op]:
    ops = [op(0, "nemesis", "invoke", "kill_worker", killed_at - 0.1),
           op(1, "nemesis", OK, "kill_worker", killed_at + 0.01, {"worker": "w1", "identity": "w1-1",
                                                                  "killed_at": killed_at}, 0)]
    if back_at is not None:
        ops += [op(2, "supervisor", "invoke", "restart_worker", back_at - 0.5, {"worker": "w1"}),
                op(3, "supervisor", OK, "restart_worker", back_at, {"worker": "w1", "identity": "w1-2"}, 2)]
    return ops


def is_model(e: dict[str, Any]) -> bool:
    return e["kind"] == "model"


def test_a_kill_with_another_worker_alive_counts_from_the_kill_and_alone_from_the_replacement() -> None:
    ops = kill_ops(T0 + 10.0, T0 + 13.0)
    [two] = recovery.faults_from_ops(ops, workers=2)
    assert two["reference"] == T0 + 10.0 and two["reference_is"].startswith("fault")
    [one] = recovery.faults_from_ops(ops, workers=1)
    assert one["reference"] == T0 + 13.0 and one["reference_is"] == "worker polling again"
    [never] = recovery.faults_from_ops(kill_ops(T0 + 10.0, None), workers=1)
    assert never["reference"] is None  # no replacement ever polled: nothing to measure from, never a 0


def test_the_activity_wait_is_the_next_attempt_of_what_the_fault_caught() -> None:
    [fault] = recovery.faults_from_ops(kill_ops(T0 + 10.0, T0 + 13.0), workers=2)
    executions = [
        execution("w1-1", T0 + 9.5, None),  # caught by the kill ...
        execution("w2-1", T0 + 11.6, T0 + 12.0, attempt=2),  # ... and retried 1.6 s later elsewhere
        execution("w1-1", T0 + 9.0, T0 + 9.8, activity_id="2", kind="tool"),  # finished before the kill
        execution("w2-1", T0 + 9.9, None, activity_id="3"),  # another worker's: not this fault's
    ]
    out = recovery.activity_waits(fault, executions, is_model)
    assert out == {"caught": 1, "finished_in_place": 0, "model_call_s": 1.6, "tool_s": None}


def test_a_timed_out_workflow_task_waits_from_the_fault_or_its_scheduling_whichever_is_later() -> None:
    faults = recovery.faults_from_ops(kill_ops(T0 + 10.0, T0 + 13.0), workers=2)
    tasks = {"wf/r": [
        Task("completed", at(1.0), at(1.1), at(1.2)),
        Task("timed_out", at(12.0), None, at(13.0)),  # scheduled on the dead worker's sticky queue after the kill
        Task("completed", at(13.0), at(13.05), at(13.1)),
    ], "other/r": [
        Task("timed_out", at(9.8), at(9.9), at(11.4)),  # started on the dead worker before the kill
        Task("completed", at(11.4), at(11.5), at(11.6)),
    ]}
    [waits] = recovery.workflow_task_waits(faults, tasks)
    assert sorted(round(w, 2) for w in waits) == [1.05, 1.5]


def test_a_server_restart_holds_what_was_scheduled_before_it_and_started_after() -> None:
    ops = [op(0, "nemesis", "invoke", "restart_server", T0 + 5.0),
           op(1, "nemesis", OK, "restart_server", T0 + 7.0, {}, 0)]
    [fault] = recovery.faults_from_ops(ops, workers=2)
    assert (fault["at"], fault["reference"]) == (T0 + 5.0, T0 + 7.0)
    held = recovery.server_waits(fault, [execution("w1-1", T0 + 7.4, T0 + 8.0, scheduled=T0 + 4.9),
                                         execution("w1-1", T0 + 3.0, T0 + 4.0, scheduled=T0 + 2.9)], is_model)
    assert held["caught"] == 1 and held["model_call_s"] == 0.4


class _Data:
    """What the drain checker reads of a run (``RunData``'s surface)."""

    def __init__(self, ops: list[Op], executions: list[dict[str, Any]], tasks: list[Task] = (),
                 activities: list[Any] = ()) -> None:
        self.ops, self._executions = ops, executions
        self.event_histories = {"wf": [type("Run", (), {"run_id": "r", "workflow_tasks": list(tasks),
                                                        "activities": list(activities)})()]}

    def ledger_rows(self, table: str) -> list[dict[str, Any]]:
        return self._executions if table == "executions" else []


def drain_ops(exit_code: int | None = 0) -> list[Op]:
    return [op(0, "nemesis", "invoke", "drain_worker", T0 + 10.0),
            op(1, "nemesis", OK, "drain_worker", T0 + 10.6,
               {"worker": "w1", "identity": "w1-1", "signalled_at": T0 + 10.0,
                "exited_at": T0 + 10.5 if exit_code is not None else None, "exit_code": exit_code}, 0)]


def test_the_drain_checker_passes_only_what_finished_in_place() -> None:
    finished = [execution("w1-1", T0 + 9.8, T0 + 10.3)]
    assert drain.check(_Data(drain_ops(), finished)).verdict == PASS
    retried = [execution("w1-1", T0 + 9.8, None), execution("w2-1", T0 + 11.7, T0 + 12.0, attempt=2)]
    result = drain.check(_Data(drain_ops(), retried))
    assert result.verdict == FAIL and "re-executed" in result.summary and "server's" not in result.summary
    # the history says why the server started attempt 2: a heartbeat that came late, named with what can cause it
    from harness.event_history import ActivityRecord

    late_beat = ActivityRecord("1", "t", 5, attempts=2, outcome="completed", failure="activity Heartbeat timeout")
    result = drain.check(_Data(drain_ops(), retried, activities=[late_beat]))
    assert result.verdict == FAIL
    assert "(attempt 2 on w2-1, after the server's 'activity Heartbeat timeout'): re-executed" in result.summary
    assert "a worker short of CPU" in result.summary
    abandoned = [Task("timed_out", at(9.9), at(9.95), at(11.0), identity="w1-1")]
    assert drain.check(_Data(drain_ops(), finished, abandoned)).verdict == FAIL
    # handed to the worker 12 ms after its SIGTERM, then dropped by the SDK's shutdown: shown, not the drain's fault
    late = drain.check(_Data(drain_ops(), finished, [Task("timed_out", at(10.002), at(10.012), at(11.5),
                                                          identity="w1-1")]))
    assert late.verdict == PASS and late.details["dropped_after_signal"][0]["started_after_signal_s"] == 0.012
    assert "handed a worker after its SIGTERM (+0.012s)" in late.summary
    assert drain.check(_Data(drain_ops(exit_code=None), finished)).verdict == FAIL  # never exited: killed
    assert drain.check(_Data(drain_ops(), [execution("w1-1", T0 + 9.0, T0 + 9.5)])).verdict == UNKNOWN  # idle
    assert drain.check(_Data(drain_ops(), [])).verdict == UNKNOWN  # no ledger: cannot tell
    assert drain.check(_Data(kill_ops(T0 + 10.0, None), finished)).verdict == NOT_APPLICABLE
    # a drain the nemesis could not carry out (it raised: no completion recorded): nothing seen, so not a pass,
    # and not a failure of the agent either; with a recorded drain that failed, the failure wins
    unrecorded = [op(5, "nemesis", "invoke", "drain_worker", T0 + 20.0)]
    result = drain.check(_Data(drain_ops() + unrecorded, finished))
    assert result.verdict == UNKNOWN and "did not record whom it signalled" in result.summary
    assert drain.check(_Data(drain_ops() + unrecorded, retried)).verdict == FAIL


def test_the_timeouts_profiles_reach_the_agent_config() -> None:
    fast, defaults = chaos_agent_config("fast"), chaos_agent_config("defaults")
    assert fast.planning.heartbeat_s == TIMEOUTS["fast"].heartbeat_s == fast.tool.heartbeat_s
    assert fast.planning.initial_interval_s == TIMEOUTS["fast"].initial_interval_s
    assert (defaults.planning.heartbeat_s, defaults.tool.heartbeat_s) == (20.0, 10.0)  # the agent's own, untouched
    with pytest.raises(KeyError):
        chaos_agent_config("nonsense")


@pytest.mark.slow
async def test_a_drained_worker_hands_back_nothing_and_one_that_cancels_is_caught(tmp_path: Path) -> None:
    """On a real cluster: SIGTERM mid model call. The reference worker drains (the drain checker passes); the
    same worker built to cancel on SIGTERM (the SDK's default) has its model call re-executed (it fails)."""
    # Model calls of 1.5 s: the SIGTERM lands with most of the call still to run (at the end of a 0.5 s call, the
    # cancelling worker's call could finish in the milliseconds before the SDK cancels it, and nothing would show).
    # Heartbeats of 10 s ("distinct"), not the fast profile's 0.4 s: beside two CPU hogs a draining worker's heartbeat
    # came late, the server retried its model call, and the drain checker rightly failed a correct worker (the
    # subject here is the drain, not how fast a starved worker's heartbeat is).
    base = SCENARIOS["drain_worker"]
    scenario = replace(base, name="drain_once", timeouts="distinct",
                       events=(NemesisEvent(0.3, "drain_worker", {"activity": "model", "down_s": 0.5}),),
                       cluster=replace(base.cluster, model_latency="fixed:1500"),
                       workload=Workload(conversations=2, messages=2, append_ratio=0.0), fault_s=3.0, warmup_s=0.5)
    good = await run(scenario, ReferenceOnTemporal(), seed=5, out_root=tmp_path)
    verdicts = {c.name: c.verdict for c in good.checks}
    assert verdicts["drain"] == PASS and good.verdict == PASS, good.checks
    assert verdicts["lost"] == PASS
    mutant = replace(scenario, name="drain_once_cancels",
                     cluster=replace(scenario.cluster, mutations=("cancel_on_sigterm",)))
    bad = await run(mutant, ReferenceOnTemporal(), seed=5, out_root=tmp_path)
    verdicts = {c.name: c.verdict for c in bad.checks}
    assert verdicts["drain"] == FAIL and bad.verdict == FAIL, bad.checks
    assert verdicts["injection_evidence"] == PASS  # the mutated path ran, and the SIGTERM landed on a model call


def test_a_local_activity_run_again_from_attempt_1_is_its_retry() -> None:
    [fault] = recovery.faults_from_ops(kill_ops(T0 + 10.0, T0 + 13.0), workers=2)
    executions = [execution("w1-1", T0 + 9.9, None, kind="tool"),  # the calculator, inside the killed task ...
                  execution("w2-1", T0 + 11.6, T0 + 11.61, kind="tool")]  # ... run again by the next one: attempt 1
    assert recovery.activity_waits(fault, executions, is_model)["tool_s"] == 1.6


def test_a_timed_out_task_belongs_to_the_fault_on_the_worker_that_started_it() -> None:
    ops = kill_ops(T0 + 10.0, T0 + 13.0) + [
        op(4, "nemesis", "invoke", "kill_worker", T0 + 10.9),
        op(5, "nemesis", OK, "kill_worker", T0 + 11.0, {"worker": "w2", "identity": "w2-1", "killed_at": T0 + 11.0}, 4)]
    faults = recovery.faults_from_ops(ops, workers=2)
    tasks = {"wf/r": [Task("timed_out", at(9.9), at(9.95), at(11.5), identity="w1-1"),
                      Task("completed", at(11.5), at(11.52), at(11.6))]}
    waits = recovery.workflow_task_waits(faults, tasks)
    assert [[round(w, 2) for w in ws] for ws in waits] == [[1.52], []]  # the first kill's, though the second came later


def test_worker_settings_refuse_a_negative_drain_and_no_activity_poller(tmp_path: Path) -> None:
    from agent.worker import WorkerSettings

    with pytest.raises(ValueError, match="--drain-timeout"):
        WorkerSettings.in_state_dir(tmp_path, drain_timeout_s=-1.0)
    with pytest.raises(ValueError, match="--activity-pollers"):
        WorkerSettings.in_state_dir(tmp_path, activity_pollers=0)
    with pytest.raises(ValueError, match="--heartbeat-throttle"):
        WorkerSettings.in_state_dir(tmp_path, heartbeat_throttle_s=0.0)
    assert WorkerSettings.in_state_dir(tmp_path).drain_timeout_s == 30.0  # drains by default
