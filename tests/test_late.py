"""Late is not lost: what the late wait waits for and how long (from the agent's own settings), and how a late
reply, a failure of liveness alone and a safety failure compose into the run's two verdicts and its gate."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from chaos.checker.late import LATE_MARGIN_S, NO_ACTIVITY_BOUND_S, late_bound, pending_in
from chaos.checker.verdict import plan, property_verdicts
from chaos.runner import Outcome
from harness.event_history import ActivityRecord, RunRecord, UpdateRecord
from harness.operations import Op
from harness.verdict import FAIL, NOT_APPLICABLE, PASS, UNKNOWN, CheckResult

AT = datetime(2026, 11, 28, 12, 0, 0)


def _activity(name: str, outcome: str = "completed", **kw: object) -> ActivityRecord:
    return ActivityRecord(name, name, 5, outcome=outcome, scheduled_at=AT, retry_policy=(1.0, 2.0, 10.0), **kw)


def test_pending_work_is_what_an_open_run_holds_unanswered() -> None:
    open_run = RunRecord("chat-1", "r1", status="running",
                         activities=[_activity("invokeModel", "running"), _activity("saveNote")],
                         update_records=[UpdateRecord("chat-1-m3", "send"), UpdateRecord("chat-1-m2", "send",
                                                                                         outcome="completed")])
    closed = RunRecord("chat-2", "r2", status="completed", activities=[_activity("invokeModel", "running")],
                       update_records=[UpdateRecord("chat-2-m0", "send")])
    assert pending_in([open_run, closed]) == [{"workflow_id": "chat-1", "update": "chat-1-m3"},
                                              {"workflow_id": "chat-1", "activity": "invokeModel"}]
    assert pending_in([]) == []


def test_the_bound_is_the_agents_longest_detecting_timeout_plus_its_first_backoff() -> None:
    run = RunRecord("chat-1", "r1", activities=[
        _activity("invokeModel", start_to_close_s=60.0),  # no heartbeat: start-to-close notices a dead worker
        _activity("saveNote", start_to_close_s=300.0, heartbeat_s=5.0)])  # a heartbeat notices sooner
    bound, why = late_bound([run])
    assert bound == 60.0 + 1.0 + LATE_MARGIN_S
    assert why == f"invokeModel's start-to-close 60 s + first retry after 1 s + {LATE_MARGIN_S:g} s margin"
    assert late_bound([RunRecord("chat-1", "r1")])[0] == NO_ACTIVITY_BOUND_S


def test_safety_and_liveness_are_decided_apart() -> None:
    late = CheckResult("late", FAIL, "1 late")
    slow = CheckResult("workflow_tasks", FAIL, "completed 61 s after the heal", {"liveness_only": True})
    lost = CheckResult("lost", PASS, "none lost")
    assert property_verdicts([lost, late, slow]) == {"safety": PASS, "liveness": FAIL}
    broken = CheckResult("workflow_tasks", FAIL, "non-determinism", {"liveness_only": False})
    assert property_verdicts([lost, CheckResult("late", PASS, ""), broken]) == {"safety": FAIL, "liveness": PASS}
    assert property_verdicts([CheckResult("lost", UNKNOWN, "?"), CheckResult("late", NOT_APPLICABLE, "")]) == \
        {"safety": UNKNOWN, "liveness": NOT_APPLICABLE}


def test_a_gate_on_one_property_ignores_the_other_and_never_passes_an_error() -> None:
    o = Outcome("kill_mid_turn", 1, FAIL, Path("."), 1.0, "", properties={"safety": PASS, "liveness": FAIL})
    assert (o.gated("all"), o.gated("safety"), o.gated("liveness")) == (FAIL, PASS, FAIL)
    assert Outcome("x", 1, FAIL, None, 1.0, "").gated("safety") == UNKNOWN  # no record of it: unknown, not pass
    assert Outcome("x", 1, "error", None, 1.0, "", properties={"safety": PASS}).gated("safety") == "error"
    assert Outcome("x", 1, PASS, None, 1.0, "", properties={"safety": PASS, "liveness": NOT_APPLICABLE}
                   ).gated("liveness") == PASS


def test_late_applies_only_to_a_run_that_recorded_its_wait_and_is_declared_with_lost() -> None:
    ops = [Op(0, "generator", "invoke", "phase:final", None, 1.0, 1.0)]
    record = {"target": {"checkers": ["lost", "workflow_tasks"]}, "backend": {"name": "temporal"}}
    chosen = plan(record, ops)
    assert "late" in chosen.not_applicable and "late" not in chosen.opted_out
    waited = ops + [Op(1, "generator", "invoke", "late_wait", {"pending": 1}, 2.0, 2.0)]
    chosen = plan(record, waited)
    assert "late" in chosen.run  # a target that declared lost declared the liveness half split out of it
    assert "late" in plan({**record, "target": {"checkers": ["workflow_tasks"]}}, waited).opted_out


def test_a_scenario_under_another_timeouts_profile_gets_a_task_queue_that_is_a_name() -> None:
    from chaos.scenarios import SCENARIOS
    from dataclasses import replace
    from harness.placeholders import PLACEHOLDER_NAME
    from testbed.engines.temporal.engine import ReferenceOnTemporal

    queue = ReferenceOnTemporal().task_queue(replace(SCENARIOS["kill_idle"], name="kill_idle~defaults"))
    assert queue == "chaos-kill_idle-defaults" and PLACEHOLDER_NAME.fullmatch(queue)
