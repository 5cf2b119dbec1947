"""The fault timeline (``chaos.fault_timeline``): the schedule read against the operation log, so a run says which
faults came late, which never began, and when an aimed kill landed."""

from __future__ import annotations

from harness.operations import INVOKE, OK, Op
from chaos.fault_timeline import TOLERANCE_S, fault_timeline, lines


def _log(*entries: tuple[str, str, float, dict | None]) -> list[Op]:
    """(process, f, time, completion value or None) -> an invoke and, with a value, its ok completion 0.05 s later."""
    ops: list[Op] = []
    for process, f, t, value in entries:
        inv = Op(len(ops), process, INVOKE, f, {}, time=t, wall=1000.0 + t)
        ops.append(inv)
        if value is not None:
            ops.append(Op(len(ops), process, OK, f, value, time=t + 0.05, wall=1000.05 + t, invoke_index=inv.index))
    return ops


def test_faults_run_one_after_another_are_late_and_a_fault_that_never_began_says_so() -> None:
    record = {"schedule": [{"at_s": 1.0, "op": "partition", "args": {}},
                           {"at_s": 1.2, "op": "pause_worker", "args": {}},
                           {"at_s": 3.0, "op": "model_outage", "args": {}}]}
    ops = _log(("generator", "phase:faults", 10.0, {}), ("nemesis", "partition", 11.0, {}),
               ("nemesis", "pause_worker", 15.0, {}))  # started when the partition ended; no model_outage at all
    t = fault_timeline(record, ops)
    rows = {r["op"]: r for r in t["faults"]}
    assert rows["partition"]["late"] is False and rows["partition"]["started_s"] == 1.0
    assert rows["pause_worker"]["late"] is True and rows["pause_worker"]["late_s"] == 3.8
    assert rows["model_outage"]["started_s"] is None and rows["model_outage"]["late"] is None
    assert t["late"] == 1 and t["tolerance_s"] == TOLERANCE_S
    shown = "\n".join(lines(t))
    assert "3.80 LATE" in shown and "never began" in shown


def test_an_aimed_kill_is_on_time_when_aiming_began_and_says_when_it_landed() -> None:
    record = {"schedule": [{"at_s": 0.5, "op": "kill_worker", "args": {"when": "busy", "activity": "model"}},
                           {"at_s": 0.6, "op": "kill_worker", "args": {"when": "idle"}}]}
    ops = _log(("generator", "phase:faults", 2.0, {}),
               ("nemesis", "kill_worker", 2.5, {"killed_at": 1000.0 + 4.0}),  # aimed at 0.5 s, killed at 2.0 s
               ("nemesis", "kill_worker", 2.6 + TOLERANCE_S / 2, {"killed_at": 1000.0 + 2.65}))
    aimed, idle = fault_timeline(record, ops)["faults"]
    assert aimed["late"] is False and aimed["aimed"] is True and aimed["landed_s"] == 2.0
    assert idle["late"] is False and "aimed" not in idle
    assert "aimed; struck at 2.00" in "\n".join(lines(fault_timeline(record, ops)))


def test_a_run_with_no_schedule_or_no_fault_phase_claims_nothing() -> None:
    assert fault_timeline({"schedule": []}, [])["faults"] == []
    t = fault_timeline({"schedule": [{"at_s": 1.0, "op": "partition"}]}, _log(("generator", "phase:setup", 0.0, {})))
    assert t["faults"] == [] and "no fault phase" in t["error"]
