"""The ``engines`` section: the same agent loop on every durable engine, side by side in one run.

    python -m benchmarks --only engines

Engines (each a one-shot run of the reference agent per turn: the same ``agent.loop.run_turn``, the same two step
bodies from ``testbed.engines.steps``, the same scripted model in this process, the same effect ledger):

- **plain**: the loop with no durability (``benchmarks.plain.PlainEffects``): the baseline;
- **checkpoint**: the checkpoint engine's runner on its SQLite store, in this process;
- **temporal**: the agent workflow on the tuned embedded dev server, an in-process worker;
- **dbos**, **dbos-postgres**: DBOS Transact in this process, its system database SQLite or a PostgreSQL
  server this run starts;
- **restate**: a Restate server this run starts, the agent's service served by this process.

Measured per engine:

- **Table 2**: per-turn latency on the ``reply`` and ``tool`` workloads with the instant model (``mock``) and the
  emulated model (``model``: the run's latency distribution, the same seeded sequence for every engine), and the
  turn minus the time spent inside model steps (read from the effect ledger, the same way for every engine);
- **per-step cost**: a no-op step (nothing but the engine's durability), against the floor of this disk (one
  fsync'd SQLite commit; a raw write + fsync).

Engines run one after another (DBOS is one per process), each warmed up first. Each engine's configuration is
recorded with its durability settings as read from it (``config``), so a reader can see what each write costs.
An engine that cannot start here (a missing binary) is reported ``unavailable`` with the reason, never left out
silently.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import loop
from testbed.engines.checkpoint.agent_task import agent_task, manifest_for
from testbed.engines.checkpoint.durable_run import run_durable
from testbed.engines.checkpoint.stores import SqliteStore
from agent.contracts import AgentConfig, AgentInput
from testbed.engines import EngineUnavailable
from agent.workflow import AgentWorkflow
from benchmarks import checkpoint_bench
from benchmarks.conversations import WORKLOADS, Workload, _check
from benchmarks.plain import PlainEffects
from harness.engines import PLAIN, names as engine_names, registered
from harness.percentiles import summarise
from harness.recording import MODEL_CALL, read_ledger
from testbed.model_server import LatencyModel

ENGINE_NAMES = (PLAIN, *engine_names())  # the baseline, then every engine (harness.engines.REGISTRY)
MOCK_LATENCY = "fixed:0"


@dataclass
class _Plain:
    bench: Any
    name: str = "plain"

    def record(self) -> dict[str, Any]:
        return {"durability": "none: the loop calls the model and the tools directly, nothing is persisted"}

    async def run_turn(self, config: AgentConfig, prompt: str, run_id: str) -> dict[str, Any]:
        effects = PlainEffects(model=config.model, scripted_base_url=self.bench.model.url, ledger=self.bench.ledger,
                               sandbox_root=self.bench.sandbox_root, run_key=run_id)
        messages = loop.initial_messages(config.system_prompt)
        result = await loop.run_turn(messages, prompt, effects, config.tools, config.max_steps_per_turn)
        return {"reply": result.reply}

    async def noop_steps(self, n: int) -> list[float]:
        return await checkpoint_bench._plain_steps(n)


@dataclass
class _Checkpoint:
    store: SqliteStore
    path: Path
    name: str = "checkpoint"

    def record(self) -> dict[str, Any]:
        return {"store": f"SQLite {self.path.name}", **_sqlite_settings(self.store)}

    async def run_turn(self, config: AgentConfig, prompt: str, run_id: str) -> dict[str, Any]:
        out = await run_durable(run_id, manifest_for(config, prompt), self.store, agent_task, worker_id="bench")
        return out.result

    async def noop_steps(self, n: int) -> list[float]:
        return await checkpoint_bench._checkpoint_steps(self.store, n)


@dataclass
class _Temporal:
    local: Any  # sections.LocalServer
    name: str = "temporal"

    def record(self) -> dict[str, Any]:
        server = self.local.server
        return {"server": f"the embedded dev server ({self.local.profile} profile)" if server else "an external cluster",
                "persistence": "SQLite file (--db-filename); its connection settings are the server's own and "
                               "not readable from outside it" if server else "the cluster's",
                "worker": "in-process, eager activities, sandboxed workflow"}

    async def run_turn(self, config: AgentConfig, prompt: str, run_id: str) -> dict[str, Any]:
        result = await self.local.client.execute_workflow(AgentWorkflow.run, AgentInput(config=config, prompt=prompt),
                                                          id=run_id, task_queue=self.local.task_queue())
        return {"reply": result.reply or ""}

    async def noop_steps(self, n: int) -> list[float]:
        timings, _ = await checkpoint_bench._temporal_steps(self.local.client, self.local.task_queue(), n)
        return timings


def _sqlite_settings(store: SqliteStore) -> dict[str, Any]:
    db = store._db
    sync = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    return {"journal_mode": db.execute("PRAGMA journal_mode").fetchone()[0],
            "synchronous": sync.get(db.execute("PRAGMA synchronous").fetchone()[0], "?")}


@contextlib.asynccontextmanager
async def _engine(bench: Any, name: str) -> AsyncIterator[Any]:
    """The engine ``name``, started for this run and stopped after it."""
    state = bench.run.state / "engines" / name
    state.mkdir(parents=True, exist_ok=True)
    if name == "plain":
        yield _Plain(bench)
    elif name == "checkpoint":
        store = SqliteStore(state / "checkpoint.sqlite3")
        try:
            yield _Checkpoint(store, state / "checkpoint.sqlite3")
        finally:
            await store.close()
    elif name == "temporal":
        yield _Temporal(bench.tuned)
    elif name.startswith("dbos"):
        from testbed.engines.dbos.agent import engine

        database = registered(name).options["database"]
        async with engine(state, bench.model.url, database=database, ledger=bench.ledger) as e:
            yield e
    elif name == "restate":
        from testbed.engines.restate.agent import engine

        async with engine(state, bench.model.url, ledger=bench.ledger) as e:
            yield e
    else:
        raise ValueError(f"unknown engine {name!r}; engines are {', '.join(ENGINE_NAMES)}")


def _model_ms(ledger_path: Path, run_id: str) -> float:
    """Time spent inside model steps of a run (their ledger executions: the model call and the client library
    around it), the same measure on every engine."""
    rows = read_ledger(ledger_path, "executions", workflow_id=run_id, timeout_s=30.0)
    return round(sum(e["finished_at"] - e["started_at"] for e in rows
                     if e["kind"] == MODEL_CALL and e["finished_at"] is not None) * 1000.0, 3)


async def _series(bench: Any, engine: Any, mode: str, workload: Workload, turns: int, warmup: int
                  ) -> dict[str, Any]:
    latency = MOCK_LATENCY if mode == "mock" else bench.options.model_latency
    bench.model.set_latency(LatencyModel.parse(latency), seed=bench.options.seed)  # the same sequence per engine
    config = AgentConfig(model="scripted")
    config.tools = [t for t in config.tools if t not in ("spawn", "wait", "run_ptc")]  # Temporal-only tools
    name = f"{engine.name}/{mode}/{workload.name}"
    rows = []
    for n in range(1, warmup + turns + 1):
        run_id = f"bench-{name.replace('/', '-')}-{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        result = await engine.run_turn(config, workload.prompt(n), run_id)
        ms = (time.perf_counter() - t0) * 1000.0
        _check(name, config.model, workload, n, result["reply"])
        if n > warmup:
            rows.append({"i": n - warmup, "client_ms": round(ms, 3),
                         "model_ms": _model_ms(bench.ledger.path, run_id)})
    total = summarise([r["client_ms"] for r in rows])
    over = summarise([r["client_ms"] - r["model_ms"] for r in rows])
    bench.say(f"  {name:<28} n={total['n']:<3} p50 {total['p50']:8.1f} ms  p95 {total['p95']:8.1f}  "
              f"minus model p50 {over['p50']:7.1f} ms")
    return {"name": name, "engine": engine.name, "model_mode": mode, "workload": workload.name,
            "model_latency": latency, "turns": rows}


async def engines(bench: Any) -> dict[str, Any]:
    quick = bench.options.quick
    turns = bench.options.engines_turns
    warmup = bench.options.warmup
    n_steps = 30 if quick else 200
    work = bench.run.state / "engines"
    work.mkdir(parents=True, exist_ok=True)
    floor = checkpoint_bench._floor(work, n_steps)
    floor_p50 = floor["sqlite_commit_fsync_ms"]["p50"]
    bench.say(f"  floor: fsync'd SQLite commit p50 {floor_p50:.3f} ms, write+fsync p50 "
              f"{floor['write_fsync_ms']['p50']:.3f} ms")
    series: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    configs: dict[str, Any] = {}
    unavailable: dict[str, str] = {}
    wanted = [e for e in bench.options.engines if e != "temporal" or bench.tuned is not None]
    with bench.sampler.section("engines", lambda: {**(bench.tuned.pids() if bench.tuned else {}),
                                                   "bench (client + engines + model)": os.getpid()}):
        for name in wanted:
            bench.say(f"  [{name}]")
            try:
                async with _engine(bench, name) as engine:
                    configs[name] = engine.record()
                    for workload_name in bench.options.workloads:
                        for mode in ("mock", "model"):
                            series.append(await _series(bench, engine, mode, WORKLOADS[workload_name], turns, warmup))
                    await engine.noop_steps(5)  # warm-up
                    values = await engine.noop_steps(n_steps)
            except EngineUnavailable as exc:  # the engine cannot run here: said, never silently left out
                unavailable[name] = str(exc)
                bench.say(f"  [{name}] unavailable: {exc}")
                continue
            s = summarise(values)
            steps.append({"engine": name, "n": s["n"], "p50_ms": s["p50"], "mean_ms": s["mean"], "p95_ms": s["p95"],
                          "vs_floor": s["p50"] / floor_p50, "samples_ms": [round(v, 4) for v in values]})
            bench.say(f"  step {name:<16} p50 {s['p50']:9.3f} ms  mean {s['mean']:9.3f}  = "
                      f"{s['p50'] / floor_p50:7.2f}x the floor")
    raw_floor = floor.pop("raw_ms")
    floor_points = [{"engine": label, "n": floor[key]["n"], "p50_ms": floor[key]["p50"], "mean_ms": floor[key]["mean"],
                     "p95_ms": floor[key]["p95"], "vs_floor": floor[key]["p50"] / floor_p50,
                     "samples_ms": raw_floor[key]}
                    for label, key in (("fsync'd SQLite commit", "sqlite_commit_fsync_ms"),
                                       ("write + fsync", "write_fsync_ms"))]
    return {"series": series, "steps": steps, "floor": floor_points, "configs": configs, "unavailable": unavailable,
            "turns": turns, "warmup": warmup, "n_steps": n_steps, "engines": wanted,
            "model_time": "time inside model steps, from the effect ledger's model-call executions"}
