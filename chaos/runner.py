"""One chaos run, start to verdict, on any engine (``testbed.engines``): the one run lifecycle.

    run directory -> run.json -> cluster -> setup -> warm-up -> faults -> heal -> settle -> final read -> save
    -> stop -> checkers -> complete

Every chaos run goes through ``run``: ``python -m chaos run``, the suite (``chaos.suite``), the soak
(``chaos.soak``), the planted-bug catalogue (``chaos.planted``) and the benchmarks' false-timeout measurement.
``run_captured`` is the same run as a suite or a soak counts it: an ``Outcome``, an error being one.

The run directory (``harness.rundir``) is written as the run goes: ``run.json`` first (status ``running``, the
scenario, seed, schedule, backend, target, machine, the command that reproduces it), ``operations.jsonl`` as
each operation happens, then ``conversations.json``, ``event_histories/``, ``logs/`` and ``state/``; at the end
``run.json`` says ``complete`` (or ``interrupted`` / ``terminated`` / ``failed``, with ``stopped_during`` the
phase) with per-phase times, and the checkers write ``verdict.json``. However a run ends, one function records
it: ``RunDir.end_with`` (through ``RunDir.recording``, the lifecycle chaos, benchmark and migration-fuzz runs
share). ``check`` does the last step alone, offline, on any run directory: it reads only saved files and names
no backend.

The cluster: by default each run starts its own and stops it (``testbed.stack.stack``). A caller may pass
``cluster``, a function from the run's ``StackSpec`` (this run's state, logs, seed, operation log) to the
``async with`` that gives the run its ``Stack``: a cluster that outlives one run (e.g. one Temporal server
for several seeds, each run's workers, model and proxies its own) is made that way.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from chaos.checker.late import LATE_WAIT, late_bound, pending_in
from chaos.checker.verdict import check as check_saved_run, table_row
from chaos.generator import NemesisEvent, schedule
from testbed.faults.nemesis import EMBEDDED_ONLY, NEMESES, NemesisContext
from chaos.replay_target import replay_target
from chaos.scenarios import SCENARIOS, ChaosScenario
from harness import operations
from harness.event_history import RunRecord
from harness.model_record import MODEL_RECORD
from harness.operations import OK, History
from harness.rundir import CONVERSATIONS, EFFECTS_SERVICE, RunDir, command_line, machine_info
from harness.commands import tool
from harness.verdict import FAIL, NOT_APPLICABLE, PASS, UNKNOWN, CheckResult
from testbed.engines.base import Engine
from testbed import isolation
from testbed.engines.byo.target import Target
from testbed.stack import Stack, StackSpec, stack
from testbed.engines.temporal.server import temporal_binary_or_none

log = logging.getLogger(__name__)
Progress = Callable[[str], None]
#: what gives a run its cluster: the run's StackSpec -> ``async with`` the Stack (default: start one, stop it after)
Cluster = Callable[[StackSpec], AbstractAsyncContextManager[Stack]]

@dataclass
class RunContext:
    """One run's lifecycle, passed whole from phase to phase (cluster up, drive, faults, heal, settle, late wait,
    final read, record): what it runs, where it records, and what it has started so far."""

    scenario: ChaosScenario
    events: list[NemesisEvent]  # the seeded schedule
    history: History  # the operation log
    phase: Callable[[str], None]  # records a phase's start (and says it)
    progress: Progress = lambda s: None
    nemeses: dict[str, Callable[..., Any]] = field(default_factory=lambda: NEMESES)
    cluster: Any = None  # the cluster, once up (``Stack``)
    driver: Any = None  # the load
    nemesis: NemesisContext | None = None  # what the faults act on
    #: the engine's view of what is still pending (the late wait); None: it cannot say
    latest_runs: Callable[[], Awaitable[list[RunRecord] | None]] | None = None


#: an ``Outcome``'s verdict when the run raised (the run directory says ``failed``)
ERROR = "error"


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


def reproduce_command(scenario: ChaosScenario, seed: int, engine: Engine, run: RunDir) -> str:
    """The command that runs this again: the named scenario's, or ``rerun`` of this run's saved definition."""
    if SCENARIOS.get(scenario.name) == scenario:
        return command_line(f"{tool('chaos')} run", {"--seed": seed, **engine.reproduce()}, [scenario.name])
    named = SCENARIOS.get(scenario.name)
    if named is not None and replace(named, workload=scenario.workload) == scenario \
            and replace(named.workload, conversations=scenario.workload.conversations,
                        messages=scenario.workload.messages) == scenario.workload:  # only the load was asked for
        return command_line(f"{tool('chaos')} run", {"--seed": seed, **engine.reproduce(),
                                                      "--conversations": scenario.workload.conversations,
                                                      "--messages": scenario.workload.messages}, [scenario.name])
    cluster = {k: v for k, v in engine.reproduce().items() if k in ("--address", "--namespace")}
    return command_line(f"{tool('chaos')} rerun", cluster, [str(run.path)])


class RunFailed(Exception):
    """``run`` ended with an error, already recorded in its run directory (``run.json``: status ``failed``,
    ``error``, ``reproduce``; the traceback in ``logs/runner-error.txt``)."""

    def __init__(self, scenario: str, seed: int, run_dir: Path, reproduce: str, error: str, wall_s: float) -> None:
        super().__init__(f"{scenario} (seed {seed}): {error}")
        self.scenario, self.seed, self.run_dir, self.reproduce = scenario, seed, run_dir, reproduce
        self.error, self.wall_s = error, round(wall_s, 1)


@dataclass
class Outcome:
    """One run as a suite or a soak counts it: its verdict (``pass``, ``fail``, ``unknown``, or ``error`` when
    the run raised), where it is and how to run it again."""

    label: str
    seed: int
    verdict: str
    run_dir: Path | None
    wall_s: float
    reproduce: str
    checks: list[CheckResult] = field(default_factory=list)
    row: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    #: verdict.json's ``safety`` and ``liveness`` (``chaos.checker.verdict.property_verdicts``) and its diagnoses
    properties: dict[str, str] = field(default_factory=dict)
    diagnoses: list[str] = field(default_factory=list)
    lint: list[str] = field(default_factory=list)  # verdict.json's lint findings, one line each

    def gated(self, gate: str = "all", lint_fails: bool = False) -> str:
        """The verdict a gate sees: the run's (``all``), or its ``safety`` or ``liveness`` verdict alone (an error
        stays an error; a property no check of applied passes that gate: there was nothing of it to fail);
        ``lint_fails``: a lint finding fails it too."""
        if self.verdict == ERROR:
            return self.verdict
        if lint_fails and self.lint:
            return FAIL
        if gate == "all":
            return self.verdict
        got = self.properties.get(gate, UNKNOWN)
        return PASS if got == NOT_APPLICABLE else got

    @classmethod
    def failed(cls, label: str, seed: int, run_dir: Path | None, wall_s: float, reproduce: str,
               error: str) -> Outcome:
        """A run that raised: verdict ``error``, its table row unknown but for its name."""
        return cls(label, seed, ERROR, run_dir, wall_s, reproduce, row=table_row(label, None, [], verdict=ERROR),
                   error=error)

    @property
    def non_pass(self) -> list[CheckResult]:
        """The checks that failed or could not tell (not_applicable ones count neither way)."""
        return [c for c in self.checks if c.verdict in (FAIL, UNKNOWN)]

    @property
    def error_line(self) -> str:
        """The error's first line (a worker's error may go on with its log's last lines)."""
        lines = [line for line in (self.error or "").splitlines() if line.strip()]
        return (lines[0] + (" (...)" if len(lines) > 1 else "")) if lines else ""

    def lines(self) -> list[str]:
        """What went wrong: the error (its further lines indented), or each failing/unknown check's summary."""
        if self.error:
            first, *rest = [line for line in self.error.splitlines() if line.strip()] or [""]
            return [f"error: {first}", *(f"  | {line}" for line in rest)]
        return [f"{c.name}: {c.shown()}" for c in self.non_pass]

    def as_row(self) -> dict[str, Any]:
        """``soak.json``'s row for this seed."""
        return {"seed": self.seed, "verdict": self.verdict, "run_dir": str(self.run_dir) if self.run_dir else None,
                "wall_s": round(self.wall_s, 1), "checks": {c.name: c.verdict for c in self.checks},
                "reproduce": self.reproduce,
                "non_pass": [{"check": c.name, "verdict": c.verdict, "summary": c.summary} for c in self.non_pass],
                "error": self.error}


async def run_captured(label: str, scenario: ChaosScenario, engine: Engine, *, seed: int, out_root: Path,
                       progress: Progress = lambda s: None, ui: bool = False,
                       on_run_dir: Callable[[Path], None] = lambda p: None, cluster: Cluster = stack) -> Outcome:
    """``run``, as a suite or a soak counts it: an error is an ``error`` outcome (the run directory already
    says ``failed``, with the error and the reproduce command; an error before there was one, such as an output
    directory that cannot be made, has none). Ctrl-C and cancellation still propagate."""
    started = time.monotonic()
    try:
        r = await run(scenario, engine, seed=seed, out_root=out_root, progress=progress, ui=ui,
                      on_run_dir=on_run_dir, cluster=cluster)
    except RunFailed as exc:
        return Outcome.failed(label, seed, exc.run_dir, exc.wall_s, exc.reproduce, exc.error)
    except Exception as exc:  # before the run had a directory
        reproduce = command_line(f"{tool('chaos')} run", {"--seed": seed, **engine.reproduce()}, [label])
        return Outcome.failed(label, seed, None, time.monotonic() - started, reproduce,
                              f"{type(exc).__name__}: {exc}")
    saved = RunDir(r.run_dir).read_verdict() or {}
    return Outcome(label, seed, r.verdict, r.run_dir, r.wall_s, r.reproduce, list(r.checks), dict(r.row),
                   properties={k: str(saved[k]) for k in ("safety", "liveness") if k in saved},
                   diagnoses=[str(d.get("line")) for d in saved.get("diagnoses") or [] if isinstance(d, dict)],
                   lint=[str(d.get("line")) for d in saved.get("lint") or [] if isinstance(d, dict)])


def run_folder(scenario: ChaosScenario, engine: Engine) -> str:
    """The folder of the runs root that a run of ``scenario`` on ``engine`` goes in: ``<out>/<this>/<stamp>``."""
    return scenario.name + engine.suffix


async def run(scenario: ChaosScenario, engine: Engine, *, seed: int, out_root: Path,
              progress: Progress = lambda s: None, ui: bool = False,
              on_run_dir: Callable[[Path], None] = lambda p: None, cluster: Cluster = stack) -> RunResult:
    """One run, start to verdict. An error (a worker dying at setup, a port clash, a harness bug) ends the run
    ``failed`` in its directory (``run.json``: ``error``, ``reproduce``) and raises ``RunFailed``, which carries
    the run directory, the error and the reproduce command, so a suite or a soak reports it and goes on.
    Ctrl-C and cancellation end it ``interrupted`` (SIGTERM: ``terminated``) and propagate unchanged.
    ``on_run_dir`` is told the run directory as soon as it exists; ``cluster`` gives the run its cluster."""
    started = time.monotonic()
    name = run_folder(scenario, engine)
    run_dir = RunDir.create(out_root / name)
    on_run_dir(run_dir.path)
    reproduce = reproduce_command(scenario, seed, engine, run_dir)
    try:
        with run_dir.recording("chaos", name, started=started, seed=seed, reproduce=reproduce) as rec:
            verdict, checks, row = await _run(scenario, engine, seed, progress, ui, cluster, name, run_dir, rec)
    except Exception as exc:  # recorded: run.json says failed, logs/runner-error.txt has the traceback
        raise RunFailed(name, seed, run_dir.path, reproduce, f"{type(exc).__name__}: {exc}",
                        time.monotonic() - started) from exc
    return RunResult(name, run_dir.path, verdict, checks, seed, run_dir.run["wall_s"], row, reproduce)


def unavailable_nemeses(engine: Engine) -> frozenset[str]:
    """The nemeses this engine's cluster cannot have (``testbed.faults.nemesis.EMBEDDED_ONLY`` on an external one)."""
    return frozenset(EMBEDDED_ONLY) if engine.external else frozenset()


def skip_reason(engine: Engine, scenario: ChaosScenario) -> str | None:
    """Why ``engine`` cannot run ``scenario`` at all (None: it can): a fixed fault its cluster cannot have.
    A skipped scenario is reported ``skipped``, never as a pass."""
    ops = sorted({e.op for e in scenario.events} & unavailable_nemeses(engine))
    return "; ".join(f"{op} {EMBEDDED_ONLY[op]}" for op in ops) or None


def nemesis_context(engine: Engine, stack: Stack, history: History, driver: Any, seed: int) -> NemesisContext:
    """What the nemeses act on: the stack, the driver's conversations, and what is in flight by the engine's own
    lights (``Engine.running``; None: its in-flight observer's) and what its aimed kills read
    (``Engine.aiming``)."""
    running = engine.running
    return NemesisContext(stack, history, driver.workflow_ids, random.Random(seed), engine.target.model_activity,
                          driver_stop=getattr(driver, "stop", None),
                          running=(lambda ctx: running(ctx.stack)) if running is not None else None,
                          **engine.aiming(stack, driver))


#: a settle that keeps seeing answers waits on, at most this many times its ``settle_s``
SETTLE_ROUNDS = 10


def _answered(history: History) -> int:
    return sum(1 for op in history.ops() if op.f == "send_message" and op.type == OK)


async def _settle(run: RunContext, load: asyncio.Future) -> None:
    """Wait for the load to finish: each ``settle_s`` that ends with it still running, it goes on while messages
    are still being answered (a big load, ``--conversations 50 --messages 10``, needs longer than a small one),
    and is abandoned only when a whole ``settle_s`` passed with no answer, or after ``SETTLE_ROUNDS`` of them;
    messages in flight then stay unknown (info), never a failure of the agent's."""
    scenario, history, progress = run.scenario, run.history, run.progress
    for round_ in range(1, SETTLE_ROUNDS + 1):
        before = _answered(history)
        try:
            await asyncio.wait_for(asyncio.shield(load), timeout=scenario.settle_s)
            return
        except asyncio.TimeoutError:
            answered = _answered(history) - before
            if not answered or round_ == SETTLE_ROUNDS:
                why = "no message was answered in the last" if not answered else f"{round_} rounds of"
                progress(f"{scenario.name}: load still running after {round_ * scenario.settle_s:.0f}s settle "
                         f"({why} {scenario.settle_s:.0f}s); abandoning it")
                return
            progress(f"{scenario.name}: load still running after {round_ * scenario.settle_s:.0f}s settle, "
                     f"{answered} message(s) answered in the last {scenario.settle_s:.0f}s; waiting on")


async def _run(scenario: ChaosScenario, engine: Engine, seed: int, progress: Progress, ui: bool, cluster: Cluster,
               name: str, run_dir: RunDir, rec: Any) -> tuple[str, list[CheckResult], dict[str, Any]]:
    """The run inside its recording (``RunDir.recording``): what ran, the cluster, the phases, the checkers."""
    events = schedule(scenario.events, scenario.random_events, scenario.fault_s, seed, unavailable_nemeses(engine))
    run_dir.update(scenario=asdict(scenario), schedule=[e.as_dict() for e in events], backend=engine.record(),
                   target=_target_record(scenario, engine), checkers=engine.checkers,
                   machine=await asyncio.to_thread(machine_info, temporal_binary_or_none()), phases={},
                   network=isolation.current().record())
    history = History(run_dir.operations)
    phases: dict[str, float] = {}
    stopped: list[bool] = []

    def phase(p: str) -> None:
        if p != "stopped":
            rec.doing = p  # what run.json's stopped_during says if the run is stopped
        phases[p] = round(history.now(), 3)
        history.event("nemesis" if p == "heal" else "generator", f"phase:{p}")
        progress(f"{name}: {'recording stopped' if p == 'stopped' else p} (t={history.now():.1f}s)")

    def stop_recording() -> None:
        if stopped:  # once: on the way to the checkers, or when the run ends before them
            return
        stopped.append(True)
        phase("stopped")
        history.close()
        run_dir.update(phases=phases)

    rec.before_ending = stop_recording
    phase("setup")
    spec = engine.stack_spec(scenario, run_dir, seed, history, ui)
    spec.model_record = run_dir.path / MODEL_RECORD  # what the model saw and said of each task (harness.model_record)
    async with cluster(spec) as s:
        if s.server is not None and getattr(s.server, "ui_url", None):
            progress(f"{name}: Temporal Web UI at {s.server.ui_url}/namespaces/{s.spec.engine.namespace}/workflows")
        driver = engine.make_driver(s, history, scenario, seed)
        driver = await driver if inspect.isawaitable(driver) else driver
        try:
            await drive_load(RunContext(scenario, events, history, phase, progress, cluster=s, driver=driver,
                                        nemesis=nemesis_context(engine, s, history, driver, seed),
                                        latest_runs=lambda: engine.latest_runs(s, driver)))
            run_dir.write_json(CONVERSATIONS, driver.to_json())
        finally:
            if hasattr(driver, "close"):  # a driver in a process of its own
                await asyncio.to_thread(driver.close)
        await engine.save(s, run_dir, driver)
        run_dir.update(model_server=s.model_server.stats() if s.model_server else None,
                       supervisor_restarts={w.name: w.restarts for w in s.workers},
                       effects_service={"log": EFFECTS_SERVICE, **s.effects_service.stats()}
                       if s.effects_service else None)
    stop_recording()
    progress(f"{name}: checking")
    rec.doing = "checking"
    # off the event loop: the runs side by side with this one (a suite's, a soak's) go on meanwhile
    return await asyncio.to_thread(check, run_dir.path, engine.target)  # the target this run was given


def _target_record(scenario: ChaosScenario, engine: Engine) -> dict[str, Any]:
    """What ``run.json`` says of the agent under test: the target, with the workflow class its workers really
    registered (a scenario may swap in a planted one on the reference), so replay runs the code that ran."""
    target = engine.target.as_dict()
    if scenario.cluster.workflow and getattr(engine.target, "is_reference", False):
        target["workflow"] = scenario.cluster.workflow
    return target


def check(path: Path, target: Target | None = None) -> tuple[str, list[CheckResult], dict[str, Any]]:
    """The run's verdict (``chaos.checker.verdict.check``: which checks apply, how they compose, ``verdict.json``);
    (verdict, checks, row). ``target``: a target file the user gave (``--target``, or the one a fresh run was
    started with), the only bring-your-own code replay runs besides one the run names that the user controls
    (``chaos.replay_target.replay_target``); nothing the run directory names is executed."""
    return check_saved_run(path, lambda declared: replay_target(path, declared, target))


#: the longest an event-ended fault phase waits for a killed worker's replacement after its last fault (seconds)
WORKERS_BACK_LIMIT_S = 20.0


def ends_on_events(scenario: ChaosScenario) -> bool:
    """Whether the fault phase ends when its scheduled faults have ended and every worker is back (``True``), or
    runs the scenario's whole ``fault_s`` (a scenario with nothing scheduled, or whose faults live in the workers:
    crash points and planted mutations act on whatever load the phase's length brings)."""
    continuous = scenario.cluster.crash_at or scenario.cluster.mutations
    return bool(scenario.events or scenario.random_events) and not continuous


async def _workers_back(cluster: Any, limit_s: float) -> None:
    """Until no worker is held down by a fault (its ``down_until`` past) and every worker process is alive again,
    for at most ``limit_s``: the heal would otherwise cut a kill's down time short."""
    deadline = time.monotonic() + limit_s
    workers = list(getattr(cluster, "workers", None) or [])
    while time.monotonic() < deadline:
        now = time.monotonic()
        if all(w.down_until <= now and w.process.alive for w in workers):
            return
        await asyncio.sleep(0.02)


class _OwnOps:
    """The run's operation log as one fault sees it: every record goes to the run's log; ``invoked`` keeps the
    operations this fault began, so an error is attributed to the fault that raised it while others overlap."""

    def __init__(self, history: History) -> None:
        self._history = history
        self.invoked: list[operations.Op] = []

    def invoke(self, process: str, f: str, value: Any = None) -> operations.Op:
        op = self._history.invoke(process, f, value)
        self.invoked.append(op)
        return op

    def __getattr__(self, name: str) -> Any:
        return getattr(self._history, name)


async def _fault(run: RunContext, event: NemesisEvent, fault_start: float) -> None:
    """One scheduled fault, begun at its time (``fault_start + at_s``) whatever the others are doing: faults the
    schedule overlaps overlap. An error is recorded (``nemesis_error``); the run goes on to heal and check."""
    history, progress, name = run.history, run.progress, run.scenario.name
    wait = fault_start + event.at_s - time.monotonic()
    if wait > 0:
        await asyncio.sleep(wait)
    progress(f"{name}: nemesis {event.op} {event.args}")
    own = _OwnOps(history)
    try:
        await run.nemeses[event.op](replace(run.nemesis, history=own), **event.args)
    except Exception as exc:  # recorded; the run goes on to heal and check
        # A nemesis that raised before recording its operation injected nothing (``op_recorded`` false): the
        # faults column and injection_evidence count it as a fault that did not happen (never as 1/1).
        recorded = any(op.process == "nemesis" and op.f == event.op for op in own.invoked)
        history.event("nemesis", "nemesis_error", {"op": event.op, "args": event.args, "op_recorded": recorded,
                                                   "error": f"{type(exc).__name__}: {exc}"})


async def drive_load(run: RunContext) -> None:
    """Warm-up, faults, heal, settle under the driver's load; the late wait (``run.latest_runs``: the engine's view
    of what is pending); then the final phase (the driver's final read)."""
    scenario, history, progress = run.scenario, run.history, run.progress
    run.phase("warm-up")
    load = asyncio.create_task(run.driver.run())
    try:
        await _warm_up_faults_heal_settle(run, load)
    finally:
        # Nothing outlives the run: on an error or Ctrl-C the load stops before the cluster does.
        if not load.done():
            load.cancel()
        await asyncio.gather(load, return_exceptions=True)
    if run.latest_runs is not None:
        await wait_late(scenario, run.latest_runs, history, progress)
    run.phase("final")
    try:
        await asyncio.wait_for(run.driver.finish(), timeout=getattr(scenario, "final_s", 90.0))
    except asyncio.TimeoutError:
        # Recorded; the conversations not read back are unknown to the checkers (the server's histories remain).
        history.event("generator", "final_timeout", {"after_s": getattr(scenario, "final_s", 90.0)})
        progress(f"{scenario.name}: the final phase did not end within {getattr(scenario, 'final_s', 90.0)}s; "
                 "checking what was recorded")


#: how often the late wait asks the server what is still pending, and how long one asking may take (seconds)
LATE_POLL_S, LATE_READ_S = 1.0, 20.0


async def _read_runs(latest_runs: Callable[[], Awaitable[list[RunRecord] | None]]) -> list[RunRecord] | None:
    """The engine's latest runs, or None if it cannot say or did not answer within ``LATE_READ_S``."""
    try:
        return await asyncio.wait_for(latest_runs(), timeout=LATE_READ_S)
    except asyncio.TimeoutError:
        return None


async def wait_late(scenario: ChaosScenario, latest_runs: Callable[[], Awaitable[list[RunRecord] | None]],
                    history: History, progress: Progress) -> None:
    """Before the final read: while the server still holds work open (``chaos.checker.late.pending_in``), wait
    for it, at most the agent's own bound (``late_bound``) or the scenario's ``late_cap_s``, whichever is lower.
    A reply that comes meanwhile is late, not lost (the ``late`` check). Recorded as the ``late_wait`` operation;
    an engine that cannot say what is pending (None) records none."""
    runs = await _read_runs(latest_runs)
    if runs is None:
        return
    pending = pending_in(runs)
    bound, why = late_bound(runs)
    limit = min(bound, scenario.late_cap_s)
    inv = history.invoke("generator", LATE_WAIT, {"pending": len(pending), "items": pending[:20], "bound_s": bound,
                                                  "why": why, "cap_s": scenario.late_cap_s, "limit_s": limit})
    start = time.monotonic()
    if pending:
        capped = f" (capped by the scenario's late_cap_s {scenario.late_cap_s:g} s)" if limit < bound else ""
        progress(f"{scenario.name}: {len(pending)} item(s) still pending on the server after the settle; waiting "
                 f"up to {limit:g} s for them ({why}){capped}")
    while pending and time.monotonic() - start < limit:
        await asyncio.sleep(LATE_POLL_S)
        runs = await _read_runs(latest_runs)
        pending = pending_in(runs) if runs is not None else pending  # unread: still as last seen
    waited = round(time.monotonic() - start, 1)
    if waited >= 1:
        progress(f"{scenario.name}: late wait over after {waited:g} s; "
                 + (f"{len(pending)} item(s) still pending" if pending else "nothing pending"))
    history.complete(inv, OK, {"waited_s": waited, "still_pending": len(pending), "cleared": not pending})


async def _warm_up_faults_heal_settle(run: RunContext, load: asyncio.Task) -> None:
    scenario, phase, cluster, ctx = run.scenario, run.phase, run.cluster, run.nemesis
    await asyncio.sleep(scenario.warmup_s)
    phase("faults")
    fault_start = time.monotonic()
    faults = [asyncio.create_task(_fault(run, event, fault_start)) for event in run.events]
    try:
        await asyncio.gather(*faults)
    finally:
        for task in faults:  # an error or Ctrl-C: no fault outlives the phase
            task.cancel()
        await asyncio.gather(*faults, return_exceptions=True)
    if ends_on_events(scenario):
        await _workers_back(cluster, limit_s=WORKERS_BACK_LIMIT_S)
    else:
        remaining = fault_start + scenario.fault_s - time.monotonic()
        if remaining > 0:
            await asyncio.sleep(remaining)
    phase("heal")
    if ctx.driver_stop is not None:
        ctx.driver_stop()  # no new messages: settle waits only for those in flight
    await asyncio.to_thread(cluster.heal)  # it may wait for the supervisor, which may be mid-restart
    phase("settle")
    try:
        await _settle(run, load)
    except Exception as exc:  # a crashed driver: recorded; its unfinished operations stay unknown (info)
        run.history.event("generator", "driver_error", {"error": f"{type(exc).__name__}: {exc}"})
        run.progress(f"{scenario.name}: the driver crashed ({type(exc).__name__}: {exc}); checking what was recorded")
