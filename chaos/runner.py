"""One chaos run, start to verdict.

    setup -> warm-up -> faults -> heal -> settle -> final check -> stop -> checkers

Writes ``runs/<scenario>/<timestamp>/``: ``history.jsonl`` (as it happens,
before any checker runs), ``conversations.json`` (the final reads),
``histories/`` (every Temporal history checked), ``logs/`` (workers and
server), ``state/`` (workspaces and the effect ledger) and ``journal.json``
(machine, versions, seed, configuration, schedule, per-phase timings, each
checker's result, the verdict). ``runs/<scenario>/latest`` points at it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
from temporalio.client import Client

from chaos.checker import run_checkers
from harness.verdict import CheckResult, compose, summarise
from harness.event_history import save_histories
from chaos.cluster import Cluster
from chaos.generator import schedule
from harness.operations import History
from chaos.nemesis import NEMESES, NemesisContext
from chaos.scenarios import ChaosScenario
from chaos.target import ALL_CHECKERS, REFERENCE, Target, load_callable

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


_runtime = None


def quiet_runtime():
    """The driver's Temporal runtime: its core logs only errors (retries during a fault are expected, not news)."""
    global _runtime
    if _runtime is None:
        from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

        _runtime = Runtime(telemetry=TelemetryConfig(
            logging=LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))))
    return _runtime


def reproduce_command(scenario: str, seed: int, target: Target) -> str:
    cmd = f"python -m chaos run {scenario} --seed {seed}"
    if target.source:
        cmd += f" --target {target.source}"
    return cmd


def machine_info() -> dict[str, Any]:
    import temporalio

    from testbed.temporal_server import find_temporal_binary

    try:
        server = subprocess.run([find_temporal_binary(), "--version"], capture_output=True, text=True,
                                timeout=20).stdout.strip()
    except Exception as exc:  # recorded, not fatal
        server = f"unknown ({exc})"
    cpu = platform.processor() or next((line.split(":", 1)[1].strip() for line in
                                        open("/proc/cpuinfo") if line.startswith("model name")), "unknown")
    return {
        "cores": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1), "cpu": cpu,
        "platform": platform.platform(), "python": sys.version.split()[0], "temporalio": temporalio.__version__,
        "temporal_cli": server,
    }


def link_latest(run_dir: Path) -> None:
    latest = run_dir.parent / "latest"
    tmp = run_dir.parent / ".latest.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(run_dir.name)
    os.replace(tmp, latest)


async def run(scenario: ChaosScenario, *, seed: int, out_root: Path, progress: Progress = lambda s: None,
              target: Target = REFERENCE, ui: bool = False, backend: str = "process",
              image: str | None = None) -> RunResult:
    started = time.monotonic()
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    run_dir = (out_root / scenario.name / stamp).resolve()
    run_dir.mkdir(parents=True)
    history = History(run_dir / "history.jsonl")
    events = schedule(scenario.events, scenario.random_events, scenario.fault_s, seed)
    spec = scenario.cluster
    spec = type(spec)(**{**asdict(spec), "seed": seed, "task_queue": target.task_queue or f"chaos-{scenario.name}"})
    if not target.is_reference:
        spec = type(spec)(**{**asdict(spec), "workflow": target.workflow})
    if ui or backend != "process":
        spec = type(spec)(**{**asdict(spec), "ui": ui, "backend": backend, "image": image})
    make_driver = load_callable(target.driver)
    journal: dict[str, Any] = {
        "scenario": {**asdict(scenario), "cluster": asdict(spec)},
        "seed": seed,
        "reproduce": reproduce_command(scenario.name, seed, target),
        "schedule": [e.as_dict() for e in events],
        "machine": await asyncio.to_thread(machine_info),
        "target": {**target.as_dict(), "workflow": spec.workflow, "cwd": target.cwd or os.getcwd()},
        "phases": {},
    }
    (run_dir / "journal.json").write_text(json.dumps(journal, indent=2, default=str))
    phases: dict[str, float] = {}

    def phase(name: str) -> None:
        phases[name] = round(history.now(), 3)
        history.event("nemesis" if name in ("heal",) else "generator", f"phase:{name}")
        progress(f"{scenario.name}: {name} (t={history.now():.1f}s)")

    phase("setup")
    cluster = Cluster(run_dir, spec, history, target)
    # Start and stop off the event loop: they block for seconds, and other runs may share this loop.
    try:
        await asyncio.to_thread(cluster.start)
        client = await Client.connect(cluster.server.address, runtime=quiet_runtime())
        if cluster.server.ui_url:
            progress(f"{scenario.name}: Temporal Web UI at {cluster.server.ui_url}/namespaces/default/workflows")
        driver = make_driver(client=client, history=history, task_queue=spec.task_queue, workload=scenario.workload,
                             seed=seed)
        if scenario.planning_max_attempts and hasattr(driver, "config"):
            driver.config.planning.maximum_attempts = scenario.planning_max_attempts
        ctx = NemesisContext(cluster, client, history, driver.workflow_ids, random.Random(seed), target.model_activity)
        ctx.driver_stop = getattr(driver, "stop", None)
        await drive_load(scenario, events, ctx, cluster, driver, phase, progress, history)
        (run_dir / "conversations.json").write_text(json.dumps(driver.to_json(), indent=2, default=str))
        await save_histories(client, driver.workflow_ids, run_dir / "histories")
        journal["model_server"] = cluster.model.stats()
        journal["supervisor_restarts"] = {w.name: w.restarts for w in cluster.workers}
    finally:
        await asyncio.to_thread(cluster.stop)
    phase("stopped")
    history.close()
    progress(f"{scenario.name}: checking")
    journal["phases"] = phases
    (run_dir / "journal.json").write_text(json.dumps(journal, indent=2, default=str))
    checks = await asyncio.to_thread(run_checkers, run_dir, list(target.checkers))
    journal["checkers_not_run"] = [c for c in ALL_CHECKERS if c not in target.checkers]
    verdict = compose(checks)
    journal["checks"] = [c.as_dict() for c in checks]
    journal["verdict"] = verdict
    journal["wall_s"] = round(time.monotonic() - started, 1)
    row = summarise(scenario.name, history.ops(), checks)
    journal["summary"] = row
    (run_dir / "journal.json").write_text(json.dumps(journal, indent=2, default=str))
    link_latest(run_dir)
    return RunResult(scenario.name, run_dir, verdict, checks, seed, journal["wall_s"], row, journal["reproduce"])


async def drive_load(scenario: ChaosScenario, events: list, ctx: Any, cluster: Any, driver: Any,
                     phase: Callable[[str], None], progress: Progress, history: History,
                     nemeses: dict[str, Callable[..., Any]] | None = None) -> None:
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
    await driver.finish()


async def _warm_up_faults_heal_settle(scenario: ChaosScenario, events: list, ctx: Any, cluster: Any,
                                      load: asyncio.Task, phase: Callable[[str], None], progress: Progress,
                                      history: History, nemeses: dict[str, Callable[..., Any]] | None = None) -> None:
    nemeses = nemeses or NEMESES
    await asyncio.sleep(scenario.warmup_s)
    phase("faults")
    fault_start = time.monotonic()
    for event in events:
        wait = fault_start + event.at_s - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        progress(f"{scenario.name}: nemesis {event.op} {event.args}")
        try:
            await nemeses[event.op](ctx, **event.args)
        except Exception as exc:  # recorded; the run goes on to heal and check
            history.event("nemesis", "nemesis_error", {"op": event.op, "error": f"{type(exc).__name__}: {exc}"})
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


def recheck(run_dir: Path) -> tuple[str, list[CheckResult], dict[str, Any]]:
    """Re-run every checker offline on a saved run; the journal is updated with the new results."""
    from harness.operations import load

    journal_path = run_dir / "journal.json"
    journal = json.loads(journal_path.read_text()) if journal_path.exists() else {}
    checks = run_checkers(run_dir, only=journal.get("target", {}).get("checkers"))
    if journal.get("backend") in ("checkpoint", "journal"):
        from chaos.checkpoint import not_applicable

        checks += not_applicable()
    journal["checks"] = [c.as_dict() for c in checks]
    journal["verdict"] = compose(checks)
    row = summarise(journal.get("scenario", {}).get("name", run_dir.parent.name), load(run_dir / "history.jsonl"),
                    checks)
    journal["summary"] = row
    journal_path.write_text(json.dumps(journal, indent=2, default=str))
    return journal["verdict"], checks, row
