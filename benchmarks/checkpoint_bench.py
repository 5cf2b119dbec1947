"""The ``checkpoint`` section: what a checkpointed step costs on each engine, against the physical floor.

All in one run, side by side:

- **floor**: one fsync'd SQLite commit on this disk (WAL, ``synchronous=FULL``, a one-row insert), and a
  raw ``write`` + ``fsync``: no durable step can cost less than one of these;
- **per-step overhead** of a no-op step: a plain ``await`` (the plain loop), the checkpoint runner on the
  in-memory, file-system and SQLite stores, and the same task on Temporal (``DurableTaskWorkflow``: each
  step an activity, timed from the history as the span between consecutive steps);
- **per-turn latency** of the reference agent on one prompt (model, calculator, model; the scripted model
  with no added latency): the plain loop, the checkpoint engine (SQLite), the Temporal agent workflow,
  and the substrate task on Temporal.
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

from agent import loop
from agent.contracts import AgentConfig
from testbed.engines.checkpoint.agent_task import TASK, agent_task, manifest_for, noop_step, noop_steps
from testbed.engines.checkpoint.durable_run import run_durable
from testbed.engines.checkpoint.stores import FileSystemStore, InMemoryStore, SqliteStore
from testbed.engines.checkpoint.temporal_adapter import DurableTaskInput, DurableTaskWorkflow
from testbed.engines.steps import timed
from benchmarks.plain import PlainEffects
from testbed.engines.temporal.on_server import ServerSession, noop_steps as temporal_noop_steps
from harness.percentiles import summarise

PROMPT = "What is 25 * 4?"
#: the floor's two points: (label, key of ``_floor``'s result)
FLOOR = (("fsync'd SQLite commit", "sqlite_commit_fsync_ms"), ("write + fsync", "write_fsync_ms"))


def _floor(directory: Path, n: int) -> dict[str, Any]:
    db = sqlite3.connect(directory / "floor.sqlite3", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS t (i INTEGER, v TEXT)")
    commits = []
    for i in range(n):
        t0 = time.perf_counter()
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO t VALUES (?, ?)", (i, "x" * 64))
        db.execute("COMMIT")
        commits.append((time.perf_counter() - t0) * 1000)
    db.close()
    raw = []
    with open(directory / "floor.bin", "ab") as f:
        for _ in range(n):
            t0 = time.perf_counter()
            f.write(b"x" * 64)
            f.flush()
            os.fsync(f.fileno())
            raw.append((time.perf_counter() - t0) * 1000)
    return {"sqlite_commit_fsync_ms": summarise(commits), "write_fsync_ms": summarise(raw),
            "raw_ms": {"sqlite_commit_fsync_ms": commits, "write_fsync_ms": raw}}


def point(samples: list[float], floor_p50: float | None, **label: Any) -> dict[str, Any]:
    """A point, ``label`` first, with its samples (the report's confidence intervals); ``vs_floor``: p50 / floor."""
    s = summarise(samples)
    return {**label, "n": s["n"], "p50_ms": s["p50"], "mean_ms": s["mean"], "p95_ms": s["p95"],
            "vs_floor": s["p50"] / floor_p50 if floor_p50 else None, "samples_ms": [round(v, 4) for v in samples]}


async def _turns(bench: Any, n: int) -> dict[str, list[float]]:
    from testbed.model_server import LatencyModel

    bench.model.set_latency(LatencyModel.parse("0"), seed=bench.options.seed)  # whatever an earlier section set
    cfg = AgentConfig(model="scripted")
    out: dict[str, list[float]] = {"plain": [], "checkpoint (sqlite)": [], "temporal (agent workflow)": [],
                                   "temporal (substrate task)": []}
    store = SqliteStore(bench.run.state / "checkpoint-agent.sqlite3")
    client, queue, temporal = bench.tuned.client, bench.tuned.task_queue(), ServerSession(bench.tuned)
    for i in range(n + 2):  # two warm-up rounds
        effects = PlainEffects(model="scripted", scripted_base_url=bench.model.url, ledger=bench.ledger,
                               sandbox_root=bench.sandbox_root, run_key=f"bench-plain-{uuid.uuid4().hex[:8]}")
        t0 = time.perf_counter()
        await loop.run_turn(loop.initial_messages(), PROMPT, effects, cfg.tools)
        plain = (time.perf_counter() - t0) * 1000

        t0 = time.perf_counter()
        await run_durable(f"bench-checkpoint-{uuid.uuid4().hex[:8]}", manifest_for(cfg, PROMPT), store, agent_task,
                          worker_id="bench")
        checkpointed = (time.perf_counter() - t0) * 1000

        t0 = time.perf_counter()
        await temporal.run_turn(cfg, PROMPT, f"bench-oneshot-{uuid.uuid4().hex[:8]}")
        workflow = (time.perf_counter() - t0) * 1000

        wid = f"bench-substrate-{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        await client.execute_workflow(DurableTaskWorkflow.run, DurableTaskInput(
            task=TASK, run_id=wid, manifest=manifest_for(cfg, PROMPT).__dict__), id=wid, task_queue=queue)
        substrate = (time.perf_counter() - t0) * 1000
        if i >= 2:
            for key, value in zip(out, (plain, checkpointed, workflow, substrate)):
                out[key].append(round(value, 3))
    await store.close()
    return out


async def checkpoint(bench: Any) -> dict[str, Any]:
    quick = bench.options.quick
    n_steps = 50 if quick else 300
    n_turns = 5 if quick else 30
    work = bench.run.state / "checkpoint-bench"
    work.mkdir(parents=True, exist_ok=True)
    with bench.sampler.section("checkpoint", lambda: {**bench.tuned.pids(),
                                                    "bench (client + worker + model)": os.getpid()}):
        floor = _floor(work, n_steps)
        bench.say(f"  floor: fsync'd SQLite commit p50 {floor['sqlite_commit_fsync_ms']['p50']:.3f} ms, "
                  f"write+fsync p50 {floor['write_fsync_ms']['p50']:.3f} ms")
        steps: dict[str, list[float]] = {"plain": await timed(n_steps, noop_step)}
        steps["checkpoint (memory)"] = await noop_steps(InMemoryStore(), n_steps)
        steps["checkpoint (files)"] = await noop_steps(FileSystemStore(work / "fs"), n_steps)
        sqlite_store = SqliteStore(work / "steps.sqlite3")
        steps["checkpoint (sqlite)"] = await noop_steps(sqlite_store, n_steps)
        await sqlite_store.close()
        temporal_steps, temporal_wall = await temporal_noop_steps(bench.tuned.client, bench.tuned.task_queue(), n_steps)
        steps["temporal (activity per step)"] = temporal_steps
        per_step = {name: summarise(values) for name, values in steps.items()}
        floor_p50 = floor["sqlite_commit_fsync_ms"]["p50"]
        for name, s in per_step.items():
            bench.say(f"  step {name:<30} p50 {s['p50']:9.3f} ms  mean {s['mean']:9.3f}  "
                      f"= {s['p50'] / floor_p50:7.2f}x the floor")
        turns = await _turns(bench, n_turns)
        per_turn = {name: summarise(values) for name, values in turns.items()}
        for name, s in per_turn.items():
            bench.say(f"  turn {name:<30} p50 {s['p50']:8.1f} ms  mean {s['mean']:8.1f}")
    raw_floor = floor.pop("raw_ms")
    points = [point(raw_floor[key], floor_p50, measure="floor", backend=name) for name, key in FLOOR]
    points += [point(values, floor_p50, measure="step", backend=name) for name, values in steps.items()]
    points += [point(values, None, measure="turn", backend=name) for name, values in turns.items()]
    return {
        "points": points,
        "floor": floor, "n_steps": n_steps, "n_turns": n_turns, "prompt": PROMPT,
        "per_step_ms": per_step, "per_step_raw_ms": {k: [round(v, 4) for v in vs] for k, vs in steps.items()},
        "temporal_noop_workflow_wall_ms": round(temporal_wall, 1),
        "checkpoint_sqlite_vs_floor": round(per_step["checkpoint (sqlite)"]["p50"] / floor_p50, 2),
        "per_turn_ms": per_turn, "per_turn_raw_ms": turns,
    }
