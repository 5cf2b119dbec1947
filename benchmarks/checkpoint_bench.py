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

from temporalio.api.enums.v1 import EventType

from agent import loop
from agent.contracts import AgentConfig, AgentInput
from testbed.engines.checkpoint.agent_task import TASK, agent_task, manifest_for
from testbed.engines.checkpoint.records import DurableRunManifest
from testbed.engines.checkpoint.durable_run import run_durable
from testbed.engines.checkpoint.steps import step_call
from testbed.engines.checkpoint.stores import FileSystemStore, InMemoryStore, SqliteStore
from testbed.engines.checkpoint.temporal_adapter import DurableTaskInput, DurableTaskWorkflow
from agent.workflow import AgentWorkflow
from benchmarks.plain import PlainEffects
from harness.percentiles import summarise

PROMPT = "What is 25 * 4?"


async def noop_step(i: int) -> int:
    return i


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
            "raw_ms": {"sqlite_commit_fsync_ms": [round(v, 4) for v in commits],
                       "write_fsync_ms": [round(v, 4) for v in raw]}}


async def _checkpoint_steps(store: Any, n: int) -> list[float]:
    timings: list[float] = []

    async def task(ctx: Any) -> int:
        for i in range(n):
            t0 = time.perf_counter()
            await ctx.step(f"noop:{i}", step_call(noop_step, i=i), kind="logic")
            timings.append((time.perf_counter() - t0) * 1000)
        return n

    manifest = DurableRunManifest(project_id="bench", task={"id": "noop-steps"}, input={"n": n})
    await run_durable(f"noop-{uuid.uuid4().hex[:8]}", manifest, store, task, worker_id="bench")
    return timings


async def noop_task(ctx: Any) -> int:
    for i in range(ctx.input["n"]):
        await ctx.step(f"noop:{i}", step_call(noop_step, i=i), kind="logic")
    return ctx.input["n"]


async def _temporal_steps(client: Any, task_queue: str, n: int) -> tuple[list[float], float]:
    wid = f"bench-noop-steps-{uuid.uuid4().hex[:8]}"
    manifest = {"project_id": "bench", "task": {"id": "noop-steps"}, "input": {"n": n}}
    t0 = time.perf_counter()
    await client.execute_workflow(DurableTaskWorkflow.run, DurableTaskInput(
        task="benchmarks.checkpoint_bench:noop_task", run_id=wid, manifest=manifest), id=wid, task_queue=task_queue)
    wall_ms = (time.perf_counter() - t0) * 1000
    scheduled = []
    async for event in client.get_workflow_handle(wid).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled.append(event.event_time.ToDatetime().timestamp())
    return [(b - a) * 1000 for a, b in zip(scheduled, scheduled[1:])], wall_ms


async def _plain_steps(n: int) -> list[float]:
    timings = []
    for i in range(n):
        t0 = time.perf_counter()
        await noop_step(i)
        timings.append((time.perf_counter() - t0) * 1000)
    return timings


async def _turns(bench: Any, n: int) -> dict[str, list[float]]:
    from testbed.model_server import LatencyModel

    bench.model.set_latency(LatencyModel.parse("0"), seed=bench.options.seed)  # whatever an earlier section set
    cfg = AgentConfig(model="scripted")
    out: dict[str, list[float]] = {"plain": [], "checkpoint (sqlite)": [], "temporal (agent workflow)": [],
                                   "temporal (substrate task)": []}
    store = SqliteStore(bench.run.state / "checkpoint-agent.sqlite3")
    client, queue = bench.tuned.client, bench.tuned.task_queue()
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
        await client.execute_workflow(AgentWorkflow.run, AgentInput(config=cfg, prompt=PROMPT),
                                      id=f"bench-oneshot-{uuid.uuid4().hex[:8]}", task_queue=queue)
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
        steps: dict[str, list[float]] = {"plain": await _plain_steps(n_steps)}
        steps["checkpoint (memory)"] = await _checkpoint_steps(InMemoryStore(), n_steps)
        steps["checkpoint (files)"] = await _checkpoint_steps(FileSystemStore(work / "fs"), n_steps)
        sqlite_store = SqliteStore(work / "steps.sqlite3")
        steps["checkpoint (sqlite)"] = await _checkpoint_steps(sqlite_store, n_steps)
        await sqlite_store.close()
        temporal_steps, temporal_wall = await _temporal_steps(bench.tuned.client, bench.tuned.task_queue(), n_steps)
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
    # Each point carries its samples (samples_ms): the report's confidence intervals are computed from them.
    raw_floor = floor.pop("raw_ms")
    points = [{"measure": "floor", "backend": name, "n": stats["n"], "p50_ms": stats["p50"], "mean_ms": stats["mean"],
               "p95_ms": stats["p95"], "vs_floor": stats["p50"] / floor_p50, "samples_ms": raw_floor[key]}
              for name, key, stats in (("fsync'd SQLite commit", "sqlite_commit_fsync_ms",
                                        floor["sqlite_commit_fsync_ms"]),
                                       ("write + fsync", "write_fsync_ms", floor["write_fsync_ms"]))]
    points += [{"measure": "step", "backend": name, "n": st["n"], "p50_ms": st["p50"], "mean_ms": st["mean"],
                "p95_ms": st["p95"], "vs_floor": st["p50"] / floor_p50,
                "samples_ms": [round(v, 4) for v in steps[name]]} for name, st in per_step.items()]
    points += [{"measure": "turn", "backend": name, "n": st["n"], "p50_ms": st["p50"], "mean_ms": st["mean"],
                "p95_ms": st["p95"], "vs_floor": None, "samples_ms": turns[name]} for name, st in per_turn.items()]
    result = {
        "points": points,
        "floor": floor, "n_steps": n_steps, "n_turns": n_turns, "prompt": PROMPT,
        "per_step_ms": per_step, "per_step_raw_ms": {k: [round(v, 4) for v in vs] for k, vs in steps.items()},
        "temporal_noop_workflow_wall_ms": round(temporal_wall, 1),
        "checkpoint_sqlite_vs_floor": round(per_step["checkpoint (sqlite)"]["p50"] / floor_p50, 2),
        "per_turn_ms": per_turn, "per_turn_raw_ms": turns,
    }
    return result
