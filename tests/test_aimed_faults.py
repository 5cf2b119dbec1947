"""Aimed faults: kills that wait for the moment they aim at (an activity, a workflow task, a continue-as-new) and
prove it, mutations that prove they ran, and the environment contract that carries in-agent faults to a target's
workers. So the harness can tell "the bug was not exercised" from "there is no bug".

Cheap: unit-level (a fake worker to freeze and kill, a real effect ledger, synthetic run directories), plus one
real run of ``kill_continue_as_new`` on the reference agent (~35 s).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from testbed.engines.byo.engine import OwnAgentOnTemporal
from chaos.checker.verdict import run_checkers
from testbed.engines.temporal.in_flight import TemporalInFlight
from testbed.faults.nemesis import NemesisContext, _another_up, aimed_at, kill_worker
from chaos.runner import run
from chaos.scenarios import SCENARIOS, ClusterSpec, scenario_from_dict
from testbed.engines.byo.target import Target
from harness.faults import ENV_BUGS, ENV_CRASH_AT, ENV_MUTATIONS, AgentFaults
from harness.operations import OperationLog
from harness.owner import ENV_OWNER, owner_value
from harness.recording import ENV_LEDGER, EffectLedger, ExecutionIdentity, executions_in_flight
from harness.rundir import RunDir
from harness.verdict import PASS, UNKNOWN
from testbed.stack import Endpoints
from testbed.supervisor import SupervisedWorker
from tests.run_directory import assert_valid

LEDGER = "sandbox/ledger.sqlite3"


def ident(worker: str = "w1-1", activity_id: str = "1", attempt: int = 1, wid: str = "c0") -> ExecutionIdentity:
    return ExecutionIdentity(wid, "run-1", activity_id, attempt, worker)


# -- the ledger: a mutated path that ran is recorded -----------------------------------------------------------


def test_the_ledger_records_each_time_a_mutated_path_runs(tmp_path: Path) -> None:
    mutant = EffectLedger(tmp_path / "l.sqlite3", faults=AgentFaults(mutations=frozenset({"unkeyed_effects"})))
    for attempt in (1, 2):  # a retry of one activity: the mutant applies again, and says so each time
        mutant.apply_once(ident(attempt=attempt), "append_file", "log.txt", "d", apply=lambda: "ok",
                          already_present=lambda: False)
    rows = mutant.mutations()
    assert [(r["mutation"], r["worker"], r["workflow_id"], r["tool"]) for r in rows] == \
        [("unkeyed_effects", "w1-1", "c0", "append_file")] * 2
    assert mutant.summary().duplicated_effects == 1
    mutant.close()
    honest = EffectLedger(tmp_path / "l.sqlite3", faults=AgentFaults())
    honest.apply_once(ident(activity_id="2"), "append_file", "log.txt", "d", apply=lambda: "ok",
                      already_present=lambda: False)
    assert len(honest.mutations()) == 2  # the honest build ran no mutated path
    honest.close()


# -- what an aim matches, and what the ledger says is running -------------------------------------------------


def test_aims_match_the_model_any_tool_or_one_activity_type() -> None:
    assert aimed_at("model", "plan_next_action", "plan_next_action")
    assert not aimed_at("model", "append_file", "plan_next_action")
    assert aimed_at("tool", "append_file", "plan_next_action") and aimed_at("tool", "calculator", "call_llm")
    assert not aimed_at("tool", "call_llm", "call_llm")
    assert aimed_at("append_file", "append_file", "x") and not aimed_at("append_file", "write_file", "x")
    assert aimed_at(None, "anything", "x") and aimed_at("any", "anything", "x")
    # A model call is one by the ledger's kind or by the target's declared model activity.
    assert aimed_at("model", "whatever", "plan_next_action", kind="model")
    assert aimed_at("model", "plan_next_action", "plan_next_action", kind="tool")
    assert not aimed_at("tool", "whatever", "plan_next_action", kind="model")


def test_the_ledger_shows_what_runs_now(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    assert executions_in_flight(path) == []
    with EffectLedger(path, faults=AgentFaults()) as ledger:
        done = ledger.begin_execution(ident(activity_id="1"), "plan_next_action", model_call=True)
        ledger.end_execution(done, "ok")
        running = ledger.begin_execution(ident(activity_id="2"), "append_file")
        assert [(a["activity"], a["kind"], a["worker"], a["execution"]) for a in executions_in_flight(path)] == \
            [("append_file", "tool", "w1-1", running)]
        assert executions_in_flight(path, ("w1-1", "w2-1")) == executions_in_flight(path)
        # A ledger that names none of the live workers (another identity than {identity}) cannot aim a kill.
        assert executions_in_flight(path, ("w1-2", "w2-1")) is None


# -- the kill: freeze, confirm on the frozen worker, then kill (or let it go on) -------------------------------


@dataclass
class FakeProcess:
    identity_prefix: str
    generation: int = 1
    calls: list[str] = field(default_factory=list)
    dead: bool = False
    sdk_default: str | None = None  # a worker command without {identity}: the server sees it as <pid>@<hostname>

    @property
    def identity(self) -> str:
        return f"{self.identity_prefix}-{self.generation}"

    @property
    def polling_identity(self) -> str:
        return self.sdk_default or self.identity

    @property
    def alive(self) -> bool:
        return not self.dead

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")

    def kill(self) -> None:
        self.calls.append("kill")
        self.dead = True


def fake_context(tmp_path: Path, ledger: Path | None) -> tuple[NemesisContext, dict[str, FakeProcess]]:
    procs = {n: FakeProcess(n) for n in ("w1", "w2")}
    workers = [SupervisedWorker(p) for p in procs.values()]
    stack = SimpleNamespace(workers=workers, client=None,
                            worker=lambda name: next(w for w in workers if w.name == name))
    ctx = NemesisContext(stack, OperationLog(tmp_path / "operations.jsonl"), ["c0"], random.Random(1), ledger=ledger,
                         observer=TemporalInFlight())
    return ctx, procs


async def test_a_kill_aimed_at_a_tool_freezes_the_worker_running_it_and_kills_it_there(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    with EffectLedger(path, faults=AgentFaults()) as ledger:
        ledger.begin_execution(ident(worker="w2-1", activity_id="7"), "append_file")
        ledger.begin_execution(ident(worker="w1-1", activity_id="8"), "plan_next_action", model_call=True)
    ctx, procs = fake_context(tmp_path, path)
    value = await kill_worker(ctx, when="busy", activity="tool", down_s=0.5, wait_s=1.0)
    assert value["worker"] == "w2" and value["identity"] == "w2-1"
    assert procs["w2"].calls == ["pause", "kill"] and procs["w1"].calls == []
    assert [(e["activity"], e["workflow_id"]) for e in value["evidence"]] == [("append_file", "c0")]
    assert value["aim"] == {"when": "busy", "activity": "tool", "at": None}
    assert value["observed_by"] == "effect_ledger" and value["probes"] == 1
    assert {"worker", "identity", "evidence", "down_s", "killed_at"} <= set(value)  # what the checkers read


async def test_a_kill_that_spares_the_last_worker_waits_until_another_is_up(tmp_path: Path) -> None:
    """kill_mid_tool's two aims may overlap: with ``spare`` the second never takes the last worker up. While w1 is
    down (held by a fault, then restarting), w2's tool call is not aimed at; once w1 is back, it is."""
    path = tmp_path / "l.sqlite3"
    with EffectLedger(path, faults=AgentFaults()) as ledger:
        ledger.begin_execution(ident(worker="w2-1", activity_id="7"), "append_file")
    ctx, procs = fake_context(tmp_path, path)
    w1 = ctx.stack.worker("w1")
    procs["w1"].dead = True  # killed by the first fault, held down
    w1.down_until = time.monotonic() + 60
    value = await kill_worker(ctx, when="busy", activity="tool", down_s=0.5, wait_s=0.3, spare=True)
    assert value["evidence"] == [] and value["probes"] == 0 and value["aim"]["spare"] is True
    procs["w1"].dead = procs["w2"].dead = False  # the miss killed one unaimed, as any miss does: both back
    w1.down_until = 0.0
    with w1.lock:  # w1 replaced, but the supervisor holds it until the replacement polls: not up yet
        assert not _another_up(ctx, "w2") and _another_up(ctx, "w1")
    ctx.paused.add("w1")  # a pause holds it: not up either
    assert not _another_up(ctx, "w2")
    ctx.paused.discard("w1")
    assert _another_up(ctx, "w2")
    for p in procs.values():
        p.calls.clear()
    value = await kill_worker(ctx, when="busy", activity="tool", down_s=0.5, wait_s=1.0, spare=True)
    assert value["worker"] == "w2" and procs["w2"].calls == ["pause", "kill"] and procs["w1"].calls == []
    assert [e["activity"] for e in value["evidence"]] == ["append_file"]


async def test_a_worker_with_the_sdk_default_identity_is_found_and_recorded_as_the_server_sees_it(
        tmp_path: Path) -> None:
    """A target whose worker command lacks {identity}: its activities run (and are listed, and recorded) under
    <pid>@<hostname>, not the harness's w2-1. The aimed kill finds that worker, and records the identity the event
    history will name, which injection_evidence matches."""
    path = tmp_path / "l.sqlite3"
    with EffectLedger(path, faults=AgentFaults()) as ledger:
        ledger.begin_execution(ident(worker="4242@host", activity_id="7"), "append_file")
    ctx, procs = fake_context(tmp_path, path)
    procs["w2"].sdk_default = "4242@host"
    value = await kill_worker(ctx, when="busy", activity="tool", down_s=0.5, wait_s=1.0)
    assert value["worker"] == "w2" and value["identity"] == "4242@host", value
    assert procs["w2"].calls == ["pause", "kill"] and procs["w1"].calls == []
    assert value["observed_by"] == "effect_ledger" and [e["activity"] for e in value["evidence"]] == ["append_file"]


async def test_a_kill_whose_moment_never_comes_kills_anyway_with_no_evidence(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    with EffectLedger(path, faults=AgentFaults()) as ledger:
        ledger.begin_execution(ident(worker="w2-1"), "append_file")  # a tool runs; the aim is another activity
    ctx, procs = fake_context(tmp_path, path)
    value = await kill_worker(ctx, when="busy", activity="write_file", down_s=0.5, wait_s=0.3)
    assert value["evidence"] == [] and value["probes"] == 0
    assert sum(p.calls == ["kill"] for p in procs.values()) == 1  # killed without being frozen first


async def test_a_ledger_that_does_not_name_the_workers_is_not_used_to_aim(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    with EffectLedger(path, faults=AgentFaults()) as ledger:
        ledger.begin_execution(ident(worker="pid-4242@host"), "append_file")
    ctx, procs = fake_context(tmp_path, path)
    value = await kill_worker(ctx, when="busy", activity="tool", down_s=0.5, wait_s=0.2)
    assert value["observed_by"] == "temporal_pending_activities" and value["evidence"] == []


async def test_a_moment_that_passed_lets_the_frozen_worker_go_on(tmp_path: Path) -> None:
    """The aim no longer holds on the frozen worker (its tool finished in between): SIGCONT, not SIGKILL."""
    path = tmp_path / "l.sqlite3"
    ledger = EffectLedger(path, faults=AgentFaults())
    execution = ledger.begin_execution(ident(worker="w1-1"), "append_file")
    ctx, procs = fake_context(tmp_path, path)

    def finish_when_frozen() -> None:
        procs["w1"].calls.append("pause")
        ledger.end_execution(execution, "ok")

    procs["w1"].pause = finish_when_frozen  # type: ignore[method-assign]
    value = await kill_worker(ctx, when="busy", activity="append_file", down_s=0.5, wait_s=0.3)
    ledger.close()
    assert procs["w1"].calls[:2] == ["pause", "resume"] and value["probes"] == 1 and value["evidence"] == []


async def test_aims_that_need_temporal_say_so_on_a_backend_without_it(tmp_path: Path) -> None:
    ctx, _ = fake_context(tmp_path, None)
    ctx.observer = None  # an engine without an in-flight observer of its own
    value = await kill_worker(ctx, at="workflow_task", down_s=0.1, wait_s=0.1)
    assert value["evidence"] == [] and "no Temporal server" in value["not_observable"]
    with pytest.raises(ValueError, match="aims are"):
        await kill_worker(ctx, at="the_moon")


# -- injection_evidence on synthetic run directories ------------------------------------------------------------


def run_dir(tmp_path: Path, ops: list[dict[str, Any]], mutations: tuple[str, ...] = (),
            ledger: bool = True) -> tuple[Path, EffectLedger | None]:
    path = tmp_path / "run"
    (path / "state" / "sandbox").mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({
        "schema": 2, "kind": "chaos", "name": "synthetic", "status": "complete",
        "target": {"ledger": LEDGER if ledger else None, "model_activity": "plan_next_action"},
        "scenario": {"name": "synthetic", "cluster": {"mutations": list(mutations)}},
        "schedule": [{"at_s": 0.5, "op": o["f"], "args": {}} for o in ops if o["type"] == "invoke"]}))
    (path / "operations.jsonl").write_text("".join(json.dumps({"index": i, "time": 1.0 + i, "wall": 1.0 + i, **o})
                                                   + "\n" for i, o in enumerate(ops)))
    return path, EffectLedger(path / "state" / LEDGER, faults=AgentFaults()) if ledger else None


def kill_ops(value: dict[str, Any], args: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [{"process": "nemesis", "type": "invoke", "f": "kill_worker",
             "value": args or {"when": "busy", "activity": "tool", "down_s": 1.0}},
            {"process": "nemesis", "type": "ok", "f": "kill_worker", "value": value, "invoke_index": 0}]


def injection(path: Path) -> Any:
    [result] = run_checkers(path, only=["injection_evidence"])
    return result


def test_a_declared_mutation_that_never_ran_is_unknown_even_when_faults_landed(tmp_path: Path) -> None:
    path, ledger = run_dir(tmp_path, kill_ops({"identity": "w1-1", "evidence": [], "killed_at": 5.0}),
                           mutations=("unkeyed_effects",))
    ledger.begin_execution(ident(worker="w1-1"), "append_file")  # the victim died mid-tool: the kill landed
    ledger.close()
    result = injection(path)
    assert result.verdict == UNKNOWN, result
    assert "mutation unkeyed_effects never ran: the bug was not exercised" in result.summary
    assert result.details["landed"] == 1 and result.details["mutations"]["unkeyed_effects"]["exercised"] == 0


def test_a_declared_mutation_that_ran_counts_and_its_old_name_is_the_same_one(tmp_path: Path) -> None:
    path, ledger = run_dir(tmp_path, kill_ops({"identity": "w1-1", "evidence": [], "killed_at": 5.0}),
                           mutations=("unkeyed_append",))
    ledger.begin_execution(ident(worker="w1-1"), "append_file")
    ledger.record_mutation("unkeyed_effects", ident(worker="w2-1"), "append_file")
    ledger.close()
    result = injection(path)
    assert result.verdict == PASS, result
    assert result.details["mutations"]["unkeyed_effects"]["exercised"] == 1
    assert "unkeyed_effects x1" in result.summary


def test_a_declared_crash_point_that_never_fired_is_unknown_even_when_a_kill_landed(tmp_path: Path) -> None:
    path, ledger = run_dir(tmp_path, kill_ops({"identity": "w1-1", "evidence": [], "killed_at": 5.0}))
    ledger.begin_execution(ident(worker="w1-1"), "append_file")
    ledger.close()
    record = json.loads((path / "run.json").read_text())
    record["scenario"]["cluster"]["crash_at"] = ["after_effect"]
    (path / "run.json").write_text(json.dumps(record))
    result = injection(path)
    assert result.verdict == UNKNOWN and "crash point after_effect never fired" in result.summary, result


def test_a_mutation_without_a_ledger_to_witness_it_is_unknown(tmp_path: Path) -> None:
    path, _ = run_dir(tmp_path, [], mutations=("unkeyed_effects",), ledger=False)
    result = injection(path)
    assert result.verdict == UNKNOWN and "no effect ledger" in result.summary


def test_a_workflow_task_kill_counts_on_the_nemesis_evidence_when_no_history_was_saved(tmp_path: Path) -> None:
    seen = [{"workflow_id": "c0", "workflow_task": {"state": "STARTED", "attempt": 1,
                                                    "scheduled": "2026-01-01T00:00:00", "started": None},
             "worker": "w1-1", "held_frozen_s": 0.3}]
    path, ledger = run_dir(tmp_path, kill_ops({"identity": "w1-1", "evidence": seen, "killed_at": 5.0},
                                              {"when": "busy", "activity": "model", "down_s": 1.0,
                                               "at": "workflow_task"}))
    ledger.close()  # no unfinished execution: the ledger cannot witness a workflow task, and is not asked to
    result = injection(path)
    assert result.verdict == PASS and result.details["faults"][0]["aim"] == "workflow_task"
    path2, ledger2 = run_dir(tmp_path / "2", kill_ops({"identity": "w1-1", "evidence": [], "killed_at": 5.0},
                                                      {"when": "busy", "activity": "model", "at": "workflow_task"}))
    ledger2.close()
    assert injection(path2).verdict == UNKNOWN


# -- the environment contract: a target's workers get the faults ------------------------------------------------

ENV_PRINTER = ("import json, os, time; "
               "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('DAH_')})); "
               "print('READY', flush=True); time.sleep(60)")


def test_a_targets_workers_get_the_faults_and_the_ledger_through_their_environment(tmp_path: Path) -> None:
    target = Target(name="env-printer", worker=("{python}", "-c", ENV_PRINTER, "{address}", "{task_queue}"),
                    ready_line="READY", warm_line=None, ledger="ledger.sqlite3", env={"MINE": "1"}, source="x.toml")
    scenario = scenario_from_dict({"name": "env", "description": "",
                                   "cluster": {"crash_at": ["after_effect"], "bugs": ["calculator"],
                                               "mutations": ["unkeyed_effects"]}})
    rd = RunDir.create(tmp_path)
    spec = OwnAgentOnTemporal(target).stack_spec(scenario, rd, 1, OperationLog(rd.operations), ui=False)
    worker = spec.make_worker("w1", Endpoints("127.0.0.1:1", "default", "http://127.0.0.1:2/v1"))
    worker.start()
    try:
        env = json.loads(worker.output().splitlines()[0])
    finally:
        worker.kill()
    assert env == {ENV_CRASH_AT: "after_effect", ENV_BUGS: "calculator", ENV_MUTATIONS: "unkeyed_effects",
                   ENV_LEDGER: str(rd.state / "ledger.sqlite3"), ENV_OWNER: owner_value()}
    assert AgentFaults.from_environment(env) == ClusterSpec(crash_at=("after_effect",), bugs=("calculator",),
                                                            mutations=("unkeyed_effects",)).faults


def test_the_contract_is_documented_where_targets_look() -> None:
    import harness.faults

    doc = (Path(__file__).resolve().parent.parent / "docs" / "your-agent.md").read_text()
    for name in (ENV_LEDGER, ENV_CRASH_AT, ENV_BUGS, ENV_MUTATIONS, "after_model_call", "after_effect",
                 "unkeyed_effects", "record_mutation"):
        assert name in harness.faults.__doc__ and name in doc, name


# -- one real run: kills around continue-as-new on the reference agent ------------------------------------------


@pytest.mark.slow
async def test_kills_around_continue_as_new_land_and_the_reference_agent_passes(tmp_path: Path) -> None:
    from testbed.engines.temporal.engine import ReferenceOnTemporal

    scenario = SCENARIOS["kill_continue_as_new"]
    result = await run(scenario, ReferenceOnTemporal(), seed=3, out_root=tmp_path)
    checks = {c.name: c for c in result.checks}
    assert result.verdict == PASS, [(c.name, c.verdict, c.summary) for c in result.checks]
    faults = checks["injection_evidence"].details["faults"]
    assert [f.get("aim") for f in faults] == ["continue_as_new", "continue_as_new"] and all(f["landed"] for f in faults)
    # The conversations did continue as new (more than one run each), and the run directory keeps its contract.
    chains = [p for p in (result.run_dir / "event_histories").iterdir() if p.is_dir()]
    assert chains and all(len(list(p.glob("*.json"))) > 1 for p in chains)
    assert json.loads((result.run_dir / "run.json").read_text())["scenario"]["max_history_events"] == 30
    assert_valid(result.run_dir)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", __file__]))
