"""The ``engines`` section: the same agent loop on every durable engine, side by side in one run.

    python -m benchmarks --only engines

Engines (each a one-shot run of the reference agent per turn: the same ``agent.loop.run_turn``, the same two step
bodies from ``testbed.engines.steps``, the same scripted model in this process, the same effect ledger), each through
its own session in this process (``Engine.in_process``, as ``dah run`` runs it):

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
An engine that cannot start here (a missing binary), or whose session measures no no-op step, is reported
``unavailable`` with the reason, never left out silently.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent import loop
from agent.contracts import AgentConfig
from testbed.engines import EngineUnavailable, SessionSpec, make_engine
from testbed.engines.checkpoint.agent_task import noop_step
from testbed.engines.steps import timed
from benchmarks import checkpoint_bench
from benchmarks.conversations import WORKLOADS, Workload, _check
from benchmarks.plain import PlainEffects
from harness.engines import PLAIN, names as engine_names
from harness.percentiles import summarise
from harness.recording import MODEL_CALL, read_ledger
from testbed.model_server import LatencyModel

ENGINE_NAMES = (PLAIN, *engine_names())  # the baseline, then every engine (harness.engines.REGISTRY)
MOCK_LATENCY = "fixed:0"


@dataclass
class NoDurability:
    """The baseline beside the engines (``PLAIN``): the agent loop calling the model and the tools directly."""

    bench: Any

    def record(self) -> dict[str, Any]:
        return {"durability": "none: the loop calls the model and the tools directly, nothing is persisted"}

    async def run_turn(self, config: AgentConfig, prompt: str, run_id: str) -> dict[str, Any]:
        effects = PlainEffects(model=config.model, scripted_base_url=self.bench.model.url, ledger=self.bench.ledger,
                               sandbox_root=self.bench.sandbox_root, run_key=run_id)
        messages = loop.initial_messages(config.system_prompt)
        result = await loop.run_turn(messages, prompt, effects, config.tools, config.max_steps_per_turn)
        return {"reply": result.reply}

    async def noop_steps(self, n: int) -> list[float]:
        return await timed(n, noop_step)


def _session(bench: Any, name: str) -> contextlib.AbstractAsyncContextManager[Any]:
    """The engine ``name`` in this process (``Engine.in_process``) on its own state dir, the run's model and ledger."""
    if name == PLAIN:
        return contextlib.nullcontext(NoDurability(bench))
    state = bench.run.state / "engines" / name
    state.mkdir(parents=True, exist_ok=True)
    return make_engine(name, on_server=bench.tuned).in_process(SessionSpec(state, bench.model.url, bench.ledger))


def _model_ms(ledger_path: Path, run_id: str) -> float:
    """Time spent inside model steps of a run (their ledger executions: the model call and the client library
    around it), the same measure on every engine."""
    rows = read_ledger(ledger_path, "executions", workflow_id=run_id, timeout_s=30.0)
    return round(sum(e["finished_at"] - e["started_at"] for e in rows
                     if e["kind"] == MODEL_CALL and e["finished_at"] is not None) * 1000.0, 3)


async def _series(bench: Any, engine: str, session: Any, mode: str, workload: Workload, turns: int, warmup: int
                  ) -> dict[str, Any]:
    latency = MOCK_LATENCY if mode == "mock" else bench.options.model_latency
    bench.model.set_latency(LatencyModel.parse(latency), seed=bench.options.seed)  # the same sequence per engine
    config = AgentConfig(model="scripted")
    config.tools = [t for t in config.tools if t not in ("spawn", "wait", "run_ptc")]  # Temporal-only tools
    name = f"{engine}/{mode}/{workload.name}"
    rows = []
    for n in range(1, warmup + turns + 1):
        run_id = f"bench-{name.replace('/', '-')}-{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        result = await session.run_turn(config, workload.prompt(n), run_id)
        ms = (time.perf_counter() - t0) * 1000.0
        _check(name, config.model, workload, n, result["reply"])
        if n > warmup:
            rows.append({"i": n - warmup, "client_ms": round(ms, 3),
                         "model_ms": _model_ms(bench.ledger.path, run_id)})
    total = summarise([r["client_ms"] for r in rows])
    over = summarise([r["client_ms"] - r["model_ms"] for r in rows])
    bench.say(f"  {name:<28} n={total['n']:<3} p50 {total['p50']:8.1f} ms  p95 {total['p95']:8.1f}  "
              f"minus model p50 {over['p50']:7.1f} ms")
    return {"name": name, "engine": engine, "model_mode": mode, "workload": workload.name,
            "model_latency": latency, "turns": rows}


async def engines(bench: Any) -> dict[str, Any]:
    turns = bench.options.engines_turns
    warmup = bench.options.warmup
    n_steps = 30 if bench.options.quick else 200
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
    with bench.sampler.section("engines", lambda: {**(bench.tuned.pids() if bench.tuned else {}),
                                                   "bench (client + engines + model)": os.getpid()}):
        for name in bench.options.engines:
            bench.say(f"  [{name}]")
            try:
                async with _session(bench, name) as session:
                    configs[name] = session.record()
                    for workload in (WORKLOADS[w] for w in bench.options.workloads):
                        for mode in ("mock", "model"):
                            series.append(await _series(bench, name, session, mode, workload, turns, warmup))
                    await session.noop_steps(5)  # warm-up
                    values = await session.noop_steps(n_steps)
            except EngineUnavailable as exc:  # it cannot run, or time a no-op step, here: said, never left out
                unavailable[name] = str(exc)
                bench.say(f"  [{name}] unavailable: {exc}")
                continue
            steps.append(s := checkpoint_bench.point(values, floor_p50, engine=name))
            bench.say(f"  step {name:<16} p50 {s['p50_ms']:9.3f} ms  mean {s['mean_ms']:9.3f}  = "
                      f"{s['vs_floor']:7.2f}x the floor")
    raw_floor = floor.pop("raw_ms")
    floor_points = [checkpoint_bench.point(raw_floor[key], floor_p50, engine=label)
                    for label, key in checkpoint_bench.FLOOR]
    return {"series": series, "steps": steps, "floor": floor_points, "configs": configs, "unavailable": unavailable,
            "turns": turns, "warmup": warmup, "n_steps": n_steps, "engines": list(bench.options.engines),
            "model_time": "time inside model steps, from the effect ledger's model-call executions"}
