"""One chaos run, start to verdict, on any backend (``testbed.engines``): the only run loop.

    setup -> warm-up -> faults -> heal -> settle -> final read -> stop -> checkers

The run directory (``harness.rundir``) is written as the run goes: ``run.json``
first (status ``running``, the scenario, seed, schedule, backend, target,
machine, the command that reproduces it), ``operations.jsonl`` as each
operation happens, then ``conversations.json``, ``event_histories/``,
``logs/`` and ``state/``; at the end ``run.json`` says ``complete`` (or
``interrupted`` / ``terminated`` / ``failed``, with ``stopped_during`` the
phase) with per-phase times, and the checkers write ``verdict.json``. ``check`` does the last step alone, offline, on any run
directory: it reads only saved files and names no backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaos.checker import ALL_CHECKERS, ENGINE_CHECKERS, FAULT_CHECKERS, run_checkers
from chaos.checker.recovery import decompose
from chaos.checker.run_data import RunData
from chaos.generator import NemesisEvent, schedule
from chaos.nemesis import EMBEDDED_ONLY, NEMESES, NemesisContext
from chaos.replay_target import replay_target
from chaos.scenarios import SCENARIOS, ChaosScenario
from harness import operations
from harness.operations import History
from harness.rundir import (CONVERSATIONS, EFFECTS_SERVICE, SCHEMA, VERDICT_JSON, RunDir, command_line, machine_info,
                            stopped_status)
from harness.verdict import FAIL, NOT_APPLICABLE, PASS, UNKNOWN, CheckResult, compose, recovery, summarise
from testbed.engines.base import Engine
from testbed.engines.target import Target
from testbed.stack import Stack, stack
from testbed.temporal_server import temporal_binary_or_none

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


@dataclass
class RunResult:
    scenario: str
    run_dir: Path
    verdict: str
    checks: list[CheckResult]
    seed: int
    wall_s: float
    row: dict[str, Any] = field(default_factory=dict)
    reproduce: str = ""


def reproduce_command(scenario: ChaosScenario, seed: int, backend: Engine, run: RunDir) -> str:
    """The command that runs this again: the named scenario's, or ``rerun`` of this run's saved definition."""
    if SCENARIOS.get(scenario.name) == scenario:
        return command_line("python -m chaos run", {"--seed": seed, **backend.reproduce()}, [scenario.name])
    cluster = {k: v for k, v in backend.reproduce().items() if k in ("--address", "--namespace")}
    return command_line("python -m chaos rerun", cluster, [str(run.path)])


#: in a failed run's logs/: the harness's traceback of the error that ended it
RUNNER_ERROR = "runner-error.txt"


class RunFailed(Exception):
    """``run`` ended with an error, already recorded in its run directory (``run.json``: status ``failed``,
    ``error``, ``reproduce``; the traceback in ``logs/runner-error.txt``)."""

    def __init__(self, scenario: str, seed: int, run_dir: Path, reproduce: str, error: str, wall_s: float) -> None:
        super().__init__(f"{scenario} (seed {seed}): {error}")
        self.scenario, self.seed, self.run_dir, self.reproduce = scenario, seed, run_dir, reproduce
        self.error, self.wall_s = error, round(wall_s, 1)


async def run(scenario: ChaosScenario, backend: Engine, *, seed: int, out_root: Path,
              progress: Progress = lambda s: None, ui: bool = False,
              on_run_dir: Callable[[Path], None] = lambda p: None) -> RunResult:
    """One run, start to verdict. An error (a worker dying at setup, a port clash, a harness bug) ends the run
    ``failed`` in its directory (``run.json``: ``error``, ``reproduce``) and raises ``RunFailed``, which carries
    the run directory, the error and the reproduce command, so a suite or a soak reports it and goes on.
    Ctrl-C and cancellation end it ``interrupted`` (SIGTERM: ``terminated``) and propagate unchanged.
    ``on_run_dir`` is told the run directory as soon as it exists."""
    started = time.monotonic()
    name = scenario.name + backend.suffix
    run_dir = RunDir.create(out_root / name)
    on_run_dir(run_dir.path)
    reproduce = reproduce_command(scenario, seed, backend, run_dir)
    try:
        return await _run(scenario, backend, seed, progress, ui, started, name, run_dir, reproduce)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):  # recording the failure must not hide it
            _end_unrecorded(run_dir, "failed", started, name, seed, reproduce, error)
            run_dir.logs.mkdir(parents=True, exist_ok=True)
            (run_dir.logs / RUNNER_ERROR).write_text("".join(traceback.format_exception(exc)))
        raise RunFailed(name, seed, run_dir.path, reproduce, error, time.monotonic() - started) from exc
    except BaseException:  # Ctrl-C, SIGTERM, cancellation: where nothing recorded it yet (before run.json)
        with contextlib.suppress(Exception):
            _end_unrecorded(run_dir, stopped_status(), started, name, seed, reproduce)
        raise


def _end_unrecorded(run_dir: RunDir, status: str, started: float, name: str, seed: int, reproduce: str,
                    error: str | None = None) -> None:
    """End a run that ended where nothing recorded it (still ``running``, or no ``run.json`` yet: stopped while
    it gathered the machine's facts): with ``status``, so no run directory is left without one."""
    if run_dir.run.get("status") not in (None, "running"):
        return
    if not run_dir.run.get("kind"):
        run_dir.update(schema=SCHEMA, kind="chaos", name=name, seed=seed, reproduce=reproduce)
    run_dir.finish(status, time.monotonic() - started, error, run_dir.run.get("stopped_during") or "setup")


def unavailable_nemeses(engine: Engine) -> frozenset[str]:
    """The nemeses this engine's cluster cannot have (``chaos.nemesis.EMBEDDED_ONLY`` on an external one)."""
    return frozenset(EMBEDDED_ONLY) if engine.external else frozenset()


def skip_reason(engine: Engine, scenario: ChaosScenario) -> str | None:
    """Why ``engine`` cannot run ``scenario`` at all (None: it can): a fixed fault its cluster cannot have.
    A skipped scenario is reported ``skipped``, never as a pass."""
    ops = sorted({e.op for e in scenario.events} & unavailable_nemeses(engine))
    return "; ".join(f"{op} {EMBEDDED_ONLY[op]}" for op in ops) or None


def nemesis_context(engine: Engine, stack: Stack, history: History, driver: Any, seed: int) -> NemesisContext:
    """What the nemeses act on: the stack, the driver's conversations, and what is in flight by the engine's own
    lights (``Engine.running``; None: Temporal's pending activities) and what its aimed kills read
    (``Engine.aiming``)."""
    running = engine.running
    return NemesisContext(stack, history, driver.workflow_ids, random.Random(seed), engine.target.model_activity,
                          driver_stop=getattr(driver, "stop", None),
                          running=(lambda ctx: running(ctx.stack)) if running is not None else None,
                          **engine.aiming(stack, driver))


async def _run(scenario: ChaosScenario, backend: Engine, seed: int, progress: Progress, ui: bool, started: float,
               name: str, run_dir: RunDir, reproduce: str) -> RunResult:
    history = History(run_dir.operations)
    events = schedule(scenario.events, scenario.random_events, scenario.fault_s, seed, unavailable_nemeses(backend))
    run_dir.begin("chaos", name, seed=seed, reproduce=reproduce,
                  scenario=asdict(scenario), schedule=[e.as_dict() for e in events], backend=backend.record(),
                  target=_target_record(scenario, backend), checkers=backend.checkers,
                  machine=await asyncio.to_thread(machine_info, temporal_binary_or_none()), phases={})
    phases: dict[str, float] = {}
    doing = ["setup"]  # the phase under way: what run.json's stopped_during says if the run is stopped

    def phase(p: str) -> None:
        if p != "stopped":
            doing[0] = p
        phases[p] = round(history.now(), 3)
        history.event("nemesis" if p == "heal" else "generator", f"phase:{p}")
        progress(f"{name}: {p} (t={history.now():.1f}s)")

    def stop_recording() -> None:
        phase("stopped")
        history.close()
        run_dir.update(phases=phases)

    phase("setup")
    with run_dir.ending_if_it_fails(started, stop_recording, lambda: doing[0]):
        async with stack(backend.stack_spec(scenario, run_dir, seed, history, ui)) as s:
            if s.server is not None and s.server.ui_url:
                progress(f"{name}: Temporal Web UI at {s.server.ui_url}/namespaces/{s.namespace}/workflows")
            driver = backend.make_driver(s, history, scenario, seed)
            driver = await driver if inspect.isawaitable(driver) else driver
            try:
                ctx = nemesis_context(backend, s, history, driver, seed)
                await drive_load(scenario, events, ctx, s, driver, phase, progress, history, NEMESES)
                run_dir.write_json(CONVERSATIONS, driver.to_json())
            finally:
                if hasattr(driver, "close"):  # a driver in a process of its own
                    await asyncio.to_thread(driver.close)
            await backend.save(s, run_dir, driver)
            run_dir.update(model_server=s.model_server.stats() if s.model_server else None,
                           supervisor_restarts={w.name: w.restarts for w in s.workers},
                           effects_service={"log": EFFECTS_SERVICE, **s.effects_service.stats()}
                           if s.effects_service else None)
    stop_recording()
    progress(f"{name}: checking")
    with run_dir.ending_if_it_fails(started, doing=lambda: "checking"):
        verdict, checks, row = check(run_dir.path, backend.target)  # the target this run was given
    run_dir.finish("complete", time.monotonic() - started)
    return RunResult(name, run_dir.path, verdict, checks, seed, run_dir.run["wall_s"], row, run_dir.run["reproduce"])


def _target_record(scenario: ChaosScenario, backend: Engine) -> dict[str, Any]:
    """What ``run.json`` says of the agent under test: the target, with the workflow class its workers really
    registered (a scenario may swap in a planted one on the reference), so replay runs the code that ran."""
    target = backend.target.as_dict()
    if scenario.cluster.workflow and getattr(backend.target, "is_reference", False):
        target["workflow"] = scenario.cluster.workflow
    return target


def check(path: Path, target: Target | None = None) -> tuple[str, list[CheckResult], dict[str, Any]]:
    """Run every checker on the run's saved files and write ``verdict.json``; (verdict, checks, row).

    The same on a fresh run, on a run re-checked later (everything is recomputed, with today's checkers) and on
    a run directory copied to another machine. ``target``: a target file the user gave (``--target``, or the one
    a fresh run was started with), the only bring-your-own code replay runs besides one the run names that the
    user controls (``testbed.engines.target.replay_target``); nothing the run directory names is executed. A checker the
    target opted out of is not run, and is ``unknown`` ("not checked"), never left out: a run cannot pass on a
    property nobody checked. Only what the backend cannot have (Temporal histories on the checkpoint backend)
    is ``not_applicable``, with its reason."""
    run_dir = RunDir(path)
    record = run_dir.read_run()
    declared = (record.get("target") or {}).get("checkers") or ALL_CHECKERS
    not_applicable = dict((record.get("backend") or {}).get("not_applicable") or {})
    if not_applicable.keys() & {"temporal_history", "replay"}:
        not_applicable.setdefault("workflow_tasks", not_applicable.get("temporal_history") or
                                  not_applicable.get("replay"))
    ops = operations.load(run_dir.operations)
    faults_run = {op.f for op in ops if op.process == "nemesis"}
    for checker, fault in FAULT_CHECKERS.items():
        if fault not in faults_run:
            not_applicable.setdefault(checker, f"no {fault} in this run")
    backend_name = (record.get("backend") or {}).get("name") or "temporal"
    for checker, engines in ENGINE_CHECKERS.items():
        if backend_name not in engines:
            not_applicable.setdefault(checker, f"reads {' or '.join(engines)}'s own records; this run is on "
                                               f"{backend_name}")
    opted_out = [c for c in ALL_CHECKERS if c not in declared and c not in not_applicable]
    only = [c for c in ALL_CHECKERS if c in declared and c not in not_applicable]
    replay_with = replay_target(run_dir.path, RunData(path).target, target) if "replay" in only else None
    checks = run_checkers(path, only, replay_with)
    checks += [CheckResult(c, UNKNOWN, "not checked: the target's 'checkers' leaves it out, so this property is "
                                       "unverified") for c in opted_out]
    checks += [CheckResult(c, NOT_APPLICABLE, f"not applicable: {why}") for c, why in not_applicable.items()]
    verdict = compose(checks)
    name = record.get("name") or run_dir.path.parent.name
    row = summarise(name, ops, checks)
    try:
        decomposed = decompose(RunData(path))
    except Exception as exc:  # a measurement, not a check: a run it cannot read still gets its verdict
        decomposed = {"error": f"{type(exc).__name__}: {exc}", "model_call_s": None, "tool_s": None,
                      "workflow_task_s": None}
    row["model_rec_s"], row["tool_rec_s"], row["wft_rec_s"] = (decomposed.get("model_call_s"), decomposed.get("tool_s"),
                                                               decomposed.get("workflow_task_s"))
    run_dir.write_json(VERDICT_JSON, {
        "schema": SCHEMA, "verdict": verdict, "checks": [c.as_dict() for c in checks],
        "checked": [c.name for c in checks if c.verdict in (PASS, FAIL)],
        "not_checked": {c.name: c.summary for c in checks if c.verdict in (UNKNOWN, NOT_APPLICABLE)},
        "checkers_not_run": opted_out + list(not_applicable),
        "recovery": recovery(ops),
        "recovery_decomposition": decomposed,
        "summary": row})
    return verdict, checks, row


async def drive_load(scenario: ChaosScenario, events: list[NemesisEvent], ctx: Any, cluster: Any, driver: Any,
                     phase: Callable[[str], None], progress: Progress, history: History,
                     nemeses: dict[str, Callable[..., Any]]) -> None:
    """Warm-up, faults, heal, settle under the driver's load; then the final phase (the driver's final read)."""
    phase("warm-up")
    load = asyncio.create_task(driver.run())
    try:
        await _warm_up_faults_heal_settle(scenario, events, ctx, cluster, load, phase, progress, history, nemeses)
    finally:
        # Nothing outlives the run: on an error or Ctrl-C the load stops before the cluster does.
        if not load.done():
            load.cancel()
        await asyncio.gather(load, return_exceptions=True)
    phase("final")
    try:
        await asyncio.wait_for(driver.finish(), timeout=getattr(scenario, "final_s", 90.0))
    except asyncio.TimeoutError:
        # Recorded; the conversations not read back are unknown to the checkers (the server's histories remain).
        history.event("generator", "final_timeout", {"after_s": getattr(scenario, "final_s", 90.0)})
        progress(f"{scenario.name}: the final phase did not end within {getattr(scenario, 'final_s', 90.0)}s; "
                 "checking what was recorded")


async def _warm_up_faults_heal_settle(scenario: ChaosScenario, events: list[NemesisEvent], ctx: Any, cluster: Any,
                                      load: asyncio.Task, phase: Callable[[str], None], progress: Progress,
                                      history: History, nemeses: dict[str, Callable[..., Any]]) -> None:
    await asyncio.sleep(scenario.warmup_s)
    phase("faults")
    fault_start = time.monotonic()
    for event in events:
        wait = fault_start + event.at_s - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        progress(f"{scenario.name}: nemesis {event.op} {event.args}")
        before = len(history.ops())
        try:
            await nemeses[event.op](ctx, **event.args)
        except Exception as exc:  # recorded; the run goes on to heal and check
            # A nemesis that raised before recording its operation injected nothing (``op_recorded`` false): the
            # faults column and injection_evidence count it as a fault that did not happen (never as 1/1).
            recorded = any(op.process == "nemesis" and op.f == event.op and op.type == operations.INVOKE
                           for op in history.ops()[before:])
            history.event("nemesis", "nemesis_error", {"op": event.op, "args": event.args, "op_recorded": recorded,
                                                       "error": f"{type(exc).__name__}: {exc}"})
    remaining = fault_start + scenario.fault_s - time.monotonic()
    if remaining > 0:
        await asyncio.sleep(remaining)
    phase("heal")
    if ctx.driver_stop is not None:
        ctx.driver_stop()  # no new messages: settle waits only for those in flight
    await asyncio.to_thread(cluster.heal)  # it may wait for the supervisor, which may be mid-restart
    phase("settle")
    try:
        await asyncio.wait_for(asyncio.shield(load), timeout=scenario.settle_s)
    except asyncio.TimeoutError:
        progress(f"{scenario.name}: load still running after {scenario.settle_s}s settle; abandoning it")
    except Exception as exc:  # a crashed driver: recorded; its unfinished operations stay unknown (info)
        history.event("generator", "driver_error", {"error": f"{type(exc).__name__}: {exc}"})
        progress(f"{scenario.name}: the driver crashed ({type(exc).__name__}: {exc}); checking what was recorded")
