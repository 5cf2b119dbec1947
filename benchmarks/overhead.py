"""The ``overhead`` section: the durable overhead per turn against the floor of its shape, measured in pairs.

The reference worker runs in its own process (``dah worker``, as deployed) on the tuned server, with the instant
model; per agent configuration (``OVERHEAD_CONFIGS``) and workload, one conversation of serial turns. Beside each
agent series whose steps are all dispatched or all local runs the *floor* of the same shape: an Update running the
same number of trivial activities (``benchmarks.floor``) from a second worker process on the same server.

The two are measured **interleaved, turn by turn** (agent turn 1, floor turn 1, floor turn 2, agent turn 2, ...:
which goes first alternates, so neither always runs second), so both see the same machine at the same moment: on a shared machine whose load changes from minute to minute, a
floor measured after its agent series compares two different machines. Each agent turn's ``vs_floor`` is its
overhead (client latency minus the model's own) over its paired floor turn's latency; a round's figure per series
is the median of those per-pair ratios.

``--overhead-rounds N`` repeats the section N times; ``--overhead-load K`` runs every round twice, idle and with K
CPU-bound processes beside it (started and killed by pid here: ``benchmarks.load``), so the ratio's spread over
rounds shows idle against loaded, side by side. The first idle round keeps the series' plain names; the others are
suffixed ``@idle-r<N>`` / ``@load<K>-r<N>`` and carry ``round`` and ``load_processes``.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

from agent.contracts import AgentConfig
from benchmarks.conversations import WORKLOADS, DurableConversation, Workload, series_record
from benchmarks.floor import FloorStep, FloorWorkflow
from benchmarks.load import cpu_hogs
from benchmarks.options import Bench
from benchmarks.sections import MOCK_LATENCY, PROCESS_VARIANT, say_series
from harness.percentiles import floor_ratio_spreads, median_floor_ratio
from testbed.model_server import LatencyModel
from testbed.worker_process import reference_worker

FLOOR_VARIANT = "floor"  # the floor worker's task queue: LocalServer.task_queue(FLOOR_VARIANT)

#: the agent configurations the overhead section measures (AgentConfig fields): name -> fields
OVERHEAD_CONFIGS: dict[str, dict[str, Any]] = {
    "activities": {},
    "local-tools": {"local_tools": ["calculator"]},
    "local-model": {"local_model": True},
    "local-all": {"local_model": True, "local_tools": ["calculator"]},
}
#: what a reply turn (one model call, no tool) would measure twice: the tool settings change nothing there
OVERHEAD_REPLY_SKIPS = ("local-tools", "local-all")
#: steps per turn: a reply turn is one model call; a tool turn two model calls and the calculator
STEPS = {"reply": 1, "tool": 3}


def floor_shape(config: AgentConfig, workload: str) -> tuple[int, bool] | None:
    """(trivial activities, local) of the floor a turn of this configuration compares with; None for a turn
    whose steps are a mix of dispatched and local activities (no floor has that shape)."""
    local_model, local_tool = config.local_model, bool(config.local_tools)
    if STEPS[workload] == 1:
        return 1, local_model
    return (3, local_model) if local_model == local_tool else None


def floor_name(activities: int, is_local: bool) -> str:
    return f"floor/{activities}-{'local' if is_local else 'dispatched'}"


def round_suffix(round_no: int, load: int) -> str:
    """What a series' name carries past the first idle round (whose names stay as they always were)."""
    if round_no == 1 and load == 0:
        return ""
    return f"@{f'load{load}' if load else 'idle'}-r{round_no}"


class Series(Protocol):
    async def turn(self, n: int) -> int: ...


async def interleave(a: Series, b: Series, messages: int) -> None:
    """``a`` and ``b`` take turns, one message each, the one that goes first alternating: a 1, b 1, b 2, a 2, a 3,
    b 3, ... (warm-up included), so that neither side always runs right after the other (on a warm or a cold
    worker, a server just written to or idle for a turn)."""
    for n in range(1, messages + 1):
        first, second = (a, b) if n % 2 else (b, a)
        await first.turn(n)
        await second.turn(n)


def pair_with_floor(rows: list[dict[str, Any]], floor_rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent's turn rows, each with its paired floor turn (the same ``i``): ``floor_ms`` and ``vs_floor``, the
    turn's overhead (client minus model) over the floor turn's latency; None where a side is missing."""
    floor = {r["i"]: r["client_ms"] for r in floor_rows}
    out = []
    for r in rows:
        f = floor.get(r["i"])
        over = r["client_ms"] - (r.get("model_ms") or 0.0)
        out.append({**r, "floor_ms": f, "vs_floor": round(over / f, 4) if f else None})
    return out


class FloorSeries:
    """The floor workflow driven a turn at a time, like ``DurableConversation``: one Update per turn running
    ``activities`` trivial activities, dispatched or local."""

    def __init__(self, client: Any, task_queue: str, activities: int, is_local: bool, *, name: str,
                 warmup: int) -> None:
        self.client, self.task_queue, self.activities, self.is_local = client, task_queue, activities, is_local
        self.name, self.warmup = name, warmup
        self.handle: Any = None
        self.rows: list[dict[str, Any]] = []

    async def start(self) -> None:
        wid = f"bench-{self.name.replace('/', '-').replace('@', '-')}-{uuid.uuid4().hex[:8]}"
        self.handle = await self.client.start_workflow(FloorWorkflow.run, id=wid, task_queue=self.task_queue)

    async def turn(self, n: int) -> int:
        started = time.perf_counter()
        await self.handle.execute_update(FloorWorkflow.step, FloorStep(self.activities, self.is_local))
        ms = (time.perf_counter() - started) * 1000.0
        i = n - self.warmup
        if i > 0:
            self.rows.append({"i": i, "client_ms": round(ms, 3), "model_ms": 0.0})
        return i

    async def end(self) -> None:
        if self.handle is not None:
            await self.handle.signal(FloorWorkflow.end)
            await self.handle.result()


async def overhead(bench: Bench) -> dict[str, Any]:
    """Every round (``--overhead-rounds``), idle and, with ``--overhead-load K``, beside K CPU-bound processes;
    each round every agent series interleaved with its floor. Overhead = client latency minus the model's own
    (read from the history, markers included)."""
    local = bench.tuned
    bench.model.set_latency(LatencyModel.parse(MOCK_LATENCY), seed=bench.options.seed)
    floor_worker = reference_worker(local.address, local.task_queue(FLOOR_VARIANT), bench.model.url, bench.run.state,
                                    namespace=local.stack.endpoints.namespace, identity_prefix="bench-floor",
                                    extra_args=("--workflow", "benchmarks.floor:FloorWorkflow"), warm_line="WARM",
                                    log_dir=bench.run.logs / local.profile, env=local.stack.endpoints.env)
    await asyncio.to_thread(floor_worker.start)
    loads = (0, bench.options.overhead_load) if bench.options.overhead_load else (0,)
    hogs: dict[str, int] = {}  # the resource sampler's view of the CPU-bound processes running now

    def processes() -> dict[str, int]:
        return {**local.pids(), "bench (client + model)": os.getpid(), **hogs}

    series, breakdowns = [], []
    try:
        with bench.sampler.section("overhead", processes):
            for round_no in range(1, bench.options.overhead_rounds + 1):
                for load in loads:
                    with cpu_hogs(load) as pids:
                        hogs.update({f"cpu-bound process {n + 1}": pid for n, pid in enumerate(pids)})
                        if len(loads) > 1 or bench.options.overhead_rounds > 1:
                            bench.say(f"  round {round_no}, "
                                      + (f"{load} CPU-bound process(es) beside it" if load else "idle"))
                        try:
                            got, parts = await _round(bench, round_no, load)
                        finally:
                            hogs.clear()
                    series += got
                    breakdowns += parts
    finally:
        await asyncio.to_thread(floor_worker.stop)
    _say_spreads(bench, series)
    bench.extend("latency", series)
    bench.extend("breakdown", breakdowns)
    return {"series": [s["name"] for s in series]}


async def _round(bench: Bench, round_no: int, load: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One round: every configuration and workload, each agent series interleaved with its floor."""
    local, opts = bench.tuned, bench.options
    suffix, tags = round_suffix(round_no, load), {"round": round_no, "load_processes": load}
    series, breakdowns = [], []
    for workload_name in opts.workloads:
        for name, fields in OVERHEAD_CONFIGS.items():
            if workload_name == "reply" and name in OVERHEAD_REPLY_SKIPS:
                continue
            workload: Workload = WORKLOADS[workload_name]
            series_name = f"process/{name}/{workload_name}{suffix}"
            config = AgentConfig(model="scripted", **fields)
            agent = DurableConversation(local.client, local.task_queue(PROCESS_VARIANT), config, workload,
                                        name=series_name, warmup=opts.warmup, histories_dir=bench.run.event_histories)
            shape = floor_shape(config, workload_name)
            floor = (FloorSeries(local.client, local.task_queue(FLOOR_VARIANT), *shape,
                                 name=floor_name(*shape) + suffix, warmup=opts.warmup) if shape else None)
            await agent.start()
            try:
                if floor is None:
                    for n in range(1, opts.warmup + opts.turns + 1):
                        await agent.turn(n)
                else:
                    await floor.start()
                    try:
                        await interleave(agent, floor, opts.warmup + opts.turns)
                    finally:
                        await floor.end()
            finally:
                await agent.end()
            rows, parts = await agent.results()
            if floor is not None:
                rows = pair_with_floor(rows, floor.rows)
            say_series(bench, series_name, rows)
            record = series_record(series_name, "overhead", "durable", "mock", workload, MOCK_LATENCY,
                                   local.profile, True, rows)
            record.update(variant=name, process=True, local_tools=list(config.local_tools),
                          local_model=config.local_model, floor=floor.name if floor else None, **tags)
            series.append(record)
            breakdowns.append({"name": series_name, "turns": parts})
            if floor is not None:
                say_series(bench, floor.name, floor.rows)
                bench.say(f"  {'':<28} vs {floor.name}: median of per-turn ratios {median_floor_ratio(rows):.2f}x")
                series.append({"name": floor.name, "section": "overhead", "loop": "floor", "model_mode": None,
                               "workload": None, "model_latency": None, "server": local.profile, "eager": True,
                               "turns": floor.rows, "variant": floor_name(*shape), "process": True,
                               "floor_activities": shape[0], "floor_local": shape[1], "paired_with": series_name,
                               **tags})
    return series, breakdowns


def _say_spreads(bench: Bench, series: Sequence[dict[str, Any]]) -> None:
    """The ratio per series over the rounds, idle and loaded side by side."""
    spreads = floor_ratio_spreads(series)
    loads = sorted({s["load_processes"] for s in spreads})
    rounds = max((s["n"] for s in spreads), default=0)
    bench.say(f"  overhead / floor, median of per-turn ratios per round; over {rounds} round(s): "
              "median [min-max] (IQR q1-q3)")
    by = {(s["series"], s["load_processes"]): s for s in spreads}
    bench.say(f"  {'series':<28} {'floor':<20} "
              + "  ".join(f"{'idle' if k == 0 else f'{k} CPU-bound':<32}" for k in loads))
    for name, floor in dict.fromkeys((s["series"], s["floor"]) for s in spreads):
        cells = []
        for k in loads:
            s = by.get((name, k))
            cells.append(f"{s['median']:.2f}x [{s['min']:.2f}-{s['max']:.2f}] ({s['q1']:.2f}-{s['q3']:.2f})"
                         if s else "-")
        bench.say(f"  {name:<28} {floor:<20} " + "  ".join(f"{c:<32}" for c in cells))
