"""The benchmark sections. Each is ``async def section(bench) -> dict`` whose result is saved as ``<file>.json``.

* ``table2``: the paper's Table 2: durable vs plain loop, mock vs model, per workload, on the tuned server.
* ``tuning``: the per-step overhead before/after tuning: stock vs tuned server, eager activities on/off, the
  workflow sandbox on/off, the calculator as a local activity, the worker in-process vs in its own process.
* ``overhead``: in ``benchmarks/overhead.py``.
* ``length``: per-turn latency and history size against conversation length, continue-as-new off/on.
* ``throughput``: turns/s against concurrent conversations and worker processes.
* ``recovery``: the time a worker SIGKILL adds to a turn, against the activity heartbeat timeout.
* ``micro``: pytest-benchmark micro-benchmarks (``benchmarks/micro``), in a subprocess.

The series of a section run in the same process on the same machine, one
after another: on a machine whose load changes from minute to minute, series
measured minutes apart compare different machines. The overhead section, whose
ratios are a goal, therefore interleaves each agent series with its floor turn
by turn (``benchmarks/overhead.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client

from agent.contracts import DEFAULT_TOOLS, ActivityPolicy, AgentConfig, AgentInput, ChatMessage
from agent.worker import WorkerSettings
from testbed.engines.checkpoint import CHECKPOINT_DB
from agent.workflow import AgentWorkflow
from benchmarks.breakdown import breakdown_by_update, with_client
from benchmarks.conversations import WORKLOADS, BenchError, durable_series, plain_series, series_record
from benchmarks.options import Bench
from harness.percentiles import percentile, summarise
from harness.event_history import fetch_histories
from harness.operations import History
from harness.rundir import LOGS, OPERATIONS, STATE, RunDir
from testbed.engines.temporal.cluster import TemporalCluster
from testbed.engines.temporal.connection import TemporalConnection
from testbed.model_server import LatencyModel
from testbed.stack import EnginePart, Endpoints, Stack, StackSpec, stack
from testbed.worker_process import reference_worker

MOCK_LATENCY = "fixed:0"


#: worker variants every local server runs, each on its own task queue: name -> WorkerSettings overrides
VARIANTS: dict[str, dict[str, bool]] = {
    "eager": {},  # the SDK's defaults: eager activity execution, sandboxed workflows
    "no-eager": {"eager_activities": False},
    "no-sandbox": {"workflow_sandbox": False},
    "local-tools": {},  # the default worker; the agent runs its calculator as a local activity (VARIANT_CONFIG)
    "process": {},  # the reference worker in its own process (``dah worker``), as it is deployed
}
#: the variant served by a worker process instead of an in-process worker
PROCESS_VARIANT = "process"
#: agent configuration a variant changes (AgentConfig fields): what the conversations it measures ask for
VARIANT_CONFIG: dict[str, dict[str, Any]] = {"local-tools": {"local_tools": ["calculator"]}}


@dataclass
class LocalServer:
    """An embedded server with one in-process worker per variant (see ``VARIANTS``), on a ``testbed.stack``."""

    stack: Stack
    profile: str  # "tuned" | "stock" | "external" (a cluster given by --address / $TEMPORAL_ADDRESS / a profile)
    run_tag: str = ""  # on an external cluster: in every task queue, so another run's workers never take its tasks

    @property
    def server(self) -> Any:
        return self.stack.server

    @property
    def client(self) -> Client:
        return self.stack.client

    def task_queue(self, variant: str = "eager") -> str:
        return f"bench-{self.profile}{self.run_tag}-{variant}"

    @property
    def address(self) -> str:
        """Where a worker process reaches this server."""
        return self.stack.endpoints.address

    def pids(self) -> dict[str, int]:
        """The server's process, for the resource sampler (an external cluster's is not on this machine)."""
        return {f"temporal-server ({self.profile})": self.server.pid} if self.server else {}


@contextlib.asynccontextmanager
async def local_server(run: RunDir, options: Any, *, tuned: bool, model: bool = False, model_url: str | None = None,
                       ledger: Any = None, temporal: bool = True) -> AsyncIterator[LocalServer]:
    """The embedded server (tuned or stock) with the variants' workers; ``model``: start the run's model server
    and open its effect ledger too (the first local server does; the others use its ``model_url`` and
    ``ledger``: every in-process worker of the run shares one). ``temporal=False``: only the model."""
    connection = getattr(options, "connection", None)
    external = temporal and connection is not None and not connection.embedded
    profile = "external" if external else "tuned" if tuned else "stock"
    local = LocalServer(None, profile, f"-{uuid.uuid4().hex[:8]}" if external else "")  # type: ignore[arg-type]
    workers = [WorkerSettings.in_state_dir(run.state, task_queue=local.task_queue(variant), model_base_url=model_url,
                                           identity=f"bench-{profile}-{variant}", **overrides)
               for variant, overrides in VARIANTS.items() if variant != PROCESS_VARIANT] if temporal else []
    cluster = TemporalCluster(connection if external else TemporalConnection(), tuned=tuned, quiet=True,
                              worker_settings=workers)
    spec = StackSpec(state_dir=run.state, logs_dir=run.logs / profile, engine=cluster if temporal else EnginePart(),
                     model=model, model_url=model_url, seed=options.seed, ledger=True, effect_ledger=ledger)
    async with stack(spec) as s:
        local.stack = s
        process = None
        if temporal:  # the same worker, in its own process (forked warm: see testbed/forkserver.py)
            process = reference_worker(local.address, local.task_queue(PROCESS_VARIANT), model_url or s.model_url,
                                       run.state, namespace=s.endpoints.namespace,
                                       identity_prefix=f"bench-{profile}-{PROCESS_VARIANT}", warm_line="WARM",
                                       log_dir=run.logs / profile, env=s.endpoints.env)
            await asyncio.to_thread(process.start)
        try:
            yield local
        finally:
            if process is not None:
                await asyncio.to_thread(process.stop)


def _processes(bench: Bench, *servers: LocalServer):
    return lambda: {**{k: v for s in servers for k, v in s.pids().items()},
                    "bench (client + worker + model)": os.getpid()}


def _model_for(bench: Bench, mode: str) -> tuple[str, str]:
    """(model name, latency label) of a model mode."""
    if mode == "model" and bench.options.model != "scripted":
        return bench.options.model, f"live:{bench.options.model}"
    return "scripted", MOCK_LATENCY if mode == "mock" else bench.options.model_latency


def say_series(bench: Bench, name: str, rows: list[dict[str, Any]]) -> None:
    s = summarise([r["client_ms"] for r in rows])
    over = summarise([r["client_ms"] - (r["model_ms"] or 0.0) for r in rows])
    bench.say(f"  {name:<28} n={s['n']:<4} mean {s['mean']:8.1f} ms  p50 {s['p50']:8.1f}  p95 {s['p95']:8.1f}  "
              f"overhead (minus model) p50 {over['p50']:7.1f} ms")


async def _latency_series(bench: Bench, local: LocalServer | None, section: str, loop: str, mode: str,
                          workload_name: str, turns: int, variant: str = "eager"
                          ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    workload = WORKLOADS[workload_name]
    model, latency = _model_for(bench, mode)
    server = local.profile if local else None
    name = f"{loop}/{mode}/{workload_name}" if section == "table2" else f"{server}/{variant}/{workload_name}"
    if model == "scripted":  # the same latency sequence for every series: turn i is comparable across them
        bench.model.set_latency(LatencyModel.parse(latency), seed=bench.options.seed)
    config = AgentConfig(model=model, **(VARIANT_CONFIG.get(variant, {}) if loop == "durable" else {}))
    if loop == "durable" and bench.options.durability == "checkpoint":
        from testbed.engines.checkpoint.stores import SqliteStore
        from benchmarks.conversations import checkpoint_series

        store = SqliteStore(bench.run.state / CHECKPOINT_DB)
        try:
            rows = await checkpoint_series(store, config, workload, name=name, turns=turns, warmup=bench.options.warmup)
        finally:
            await store.close()
        breakdown = None
    elif loop == "durable":
        assert local is not None
        # Tuning runs several conversations at once, as a server hosting many agents does: per-shard rate
        # limits only show once the server's dispatch rate passes them.
        concurrent = bench.options.tuning_concurrency if section == "tuning" else 1
        results = await asyncio.gather(*(
            durable_series(local.client, local.task_queue(variant), config, workload, name=name, turns=turns,
                           warmup=bench.options.warmup, histories_dir=bench.run.event_histories)
            for _ in range(concurrent)))
        rows = [{**r, "conversation": c} for c, (rs, _) in enumerate(results) for r in rs]
        parts = [{**p, "conversation": c} for c, (_, ps) in enumerate(results) for p in ps]
        breakdown = {"name": name, "turns": parts}
    else:
        # Against the checkpoint engine (one run per turn) the plain loop also starts afresh every turn.
        rows = await plain_series(model, bench.model.url, bench.ledger, bench.sandbox_root, config.tools, workload,
                                  name=name, turns=turns, warmup=bench.options.warmup,
                                  one_shot=bench.options.durability == "checkpoint")
        breakdown = None
    say_series(bench, name, rows)
    record = series_record(name, section, loop, mode, workload, latency, server,
                           VARIANTS[variant].get("eager_activities", True) if loop == "durable" else None, rows)
    record["backend"] = bench.options.durability if loop == "durable" else None
    if loop == "durable":
        record["variant"] = variant
        record["sandbox"] = VARIANTS[variant].get("workflow_sandbox", True)
        record["local_tools"] = list(config.local_tools)
    return record, breakdown


async def table2(bench: Bench) -> dict[str, Any]:
    series, breakdowns = [], []
    local = bench.tuned
    with bench.sampler.section("table2", _processes(bench, *([local] if local else []))):
        for workload in bench.options.workloads:
            for mode in ("mock", "model"):
                for loop in ("durable", "plain"):
                    record, parts = await _latency_series(bench, local, "table2", loop, mode, workload,
                                                          bench.options.turns)
                    series.append(record)
                    if parts:
                        breakdowns.append(parts)
    bench.extend("latency", series)
    bench.extend("breakdown", breakdowns)
    return {"series": [s["name"] for s in series]}


async def tuning(bench: Bench) -> dict[str, Any]:
    """Stock vs tuned dev server, and worker variants (eager activities off, sandbox off, local tools, the worker in its
    own process), side by side.

    The tool workload with the mock model (four workflow tasks and three activities per turn, so the
    per-step costs dominate), ``tuning_concurrency`` conversations at once. Series alternate between
    the servers so that drift on a shared machine hits both.
    """
    series, breakdowns = [], []
    async with local_server(bench.run, bench.options, tuned=False, model_url=bench.model.url,
                            ledger=bench.ledger) as stock:
        with bench.sampler.section("tuning", _processes(bench, stock, bench.tuned)):
            for variant in VARIANTS:
                for local in (stock, bench.tuned):
                    record, parts = await _latency_series(bench, local, "tuning", "durable", "mock", "tool",
                                                          bench.options.tuning_turns, variant)
                    series.append(record)
                    breakdowns.append(parts)
    bench.extend("latency", series)
    bench.extend("breakdown", breakdowns)
    return {"series": [s["name"] for s in series]}


async def length(bench: Bench) -> dict[str, Any]:
    """One long conversation without and with continue-as-new; history size read after every turn."""
    out = []
    local = bench.tuned
    bench.model.set_latency(LatencyModel.parse(MOCK_LATENCY), seed=bench.options.seed)
    with bench.sampler.section("length", _processes(bench, local)):
        for name, every in (("can_off", 0), ("can_on", bench.options.can_every_events)):
            sizes: dict[int, tuple[int, int, str]] = {}

            async def after_turn(i: int, chat: Any) -> None:
                desc = await chat.describe()
                sizes[i] = (desc.raw_description.workflow_execution_info.history_size_bytes,
                            desc.history_length, desc.run_id)
                if i % 50 == 0:
                    bench.say(f"    length/{name}: {i}/{bench.options.length_turns} turns")

            rows, _ = await durable_series(local.client, local.task_queue(), AgentConfig(max_history_events=every),
                                           WORKLOADS["reply"], name=f"length/{name}",
                                           turns=bench.options.length_turns, warmup=0, histories_dir=None,
                                           after_turn=after_turn)
            run_ids: list[str] = []
            for r in rows:
                size, events, run_id = sizes[r["i"]]
                if run_id not in run_ids:
                    run_ids.append(run_id)
                r.update(history_bytes=size, history_events=events, run_index=run_ids.index(run_id))
            say_series(bench, f"length/{name}", rows)
            bench.say(f"    history at the last turn: {rows[-1]['history_bytes'] / 1024:.0f} KiB, "
                      f"{rows[-1]['history_events']} events, {len(run_ids)} run(s)")
            out.append({"name": name, "continue_as_new": f"every {every} events" if every else "server-suggested",
                        "turns": rows})
    return {"series": out}


# -- cluster sections: worker processes behind the chaos harness's proxies ---------------------------------


@contextlib.asynccontextmanager
async def cluster(bench: Bench, name: str, workers: int) -> AsyncIterator[tuple[Stack, str]]:
    """Worker processes behind fault proxies (no faults), as in chaos runs: (the stack, its task queue).
    Each cluster keeps its own state, logs and operation log under ``clusters/<name>/``."""
    base = bench.run_dir / "clusters" / name
    history = History(base / OPERATIONS)
    connection = getattr(bench.options, "connection", None)
    external = connection is not None and not connection.embedded
    task_queue = f"bench-{name}" + (f"-{uuid.uuid4().hex[:8]}" if external else "")  # a shared cluster: its own

    def worker(slot: str, at: Endpoints) -> Any:
        return reference_worker(at.address, task_queue, at.model_url, base / STATE, namespace=at.namespace,
                                identity_prefix=slot, warm_line="WARM", log_dir=base / LOGS, env=at.env)

    # external: the workers reach the cluster through the proxy, as chaos runs do
    cluster = TemporalCluster(connection if external else TemporalConnection(), quiet=True)
    spec = StackSpec(state_dir=base / STATE, logs_dir=base / LOGS, engine=cluster,
                     model_latency=LatencyModel.parse(MOCK_LATENCY), seed=bench.options.seed, proxies=True,
                     worker_processes=workers, make_worker=worker, history=history)
    bench.say(f"  starting {workers} worker process(es) ({name})")
    try:
        async with stack(spec) as s:
            yield s, task_queue
    finally:
        history.close()


def _cluster_processes(c: Any):
    return lambda: {**({"temporal-server": c.server.pid} if c.server else {}),
                    **{f"worker {w.name}": w.process.pid for w in c.workers},
                    "bench (client + model)": os.getpid()}


async def _conversation(client: Client, task_queue: str, turns: int, latencies: list[float]) -> int:
    workload = WORKLOADS["reply"]
    wid = f"bench-tput-{uuid.uuid4().hex[:10]}"
    await client.start_workflow(AgentWorkflow.run, AgentInput(config=AgentConfig()), id=wid, task_queue=task_queue)
    chat = client.get_workflow_handle_for(AgentWorkflow.run, wid)
    errors = 0
    for i in range(1, turns + 1):
        started = time.perf_counter()
        try:
            reply = await chat.execute_update(AgentWorkflow.send_message, ChatMessage(workload.prompt(i)))
            errors += workload.expect(i) not in reply.text
        except Exception:  # counted: a throughput figure with failed turns must say so
            errors += 1
        latencies.append((time.perf_counter() - started) * 1000.0)
    await chat.signal(AgentWorkflow.end_chat)
    await chat.result()
    return errors


async def throughput(bench: Bench) -> dict[str, Any]:
    points = []
    for workers in bench.options.worker_counts:
        async with cluster(bench, f"throughput-w{workers}", workers) as (c, task_queue):
            client = c.client
            with bench.sampler.section(f"throughput-w{workers}", _cluster_processes(c)):
                await _conversation(client, task_queue, 2, [])  # warm every worker's cache path
                for conversations in bench.options.concurrency:
                    latencies: list[float] = []
                    started = time.perf_counter()
                    errors = await asyncio.gather(*(
                        _conversation(client, task_queue, bench.options.throughput_turns, latencies)
                        for _ in range(conversations)))
                    wall = time.perf_counter() - started
                    turns = conversations * bench.options.throughput_turns
                    point = {"workers": workers, "conversations": conversations,
                             "turns_per_conversation": bench.options.throughput_turns, "turns": turns,
                             "wall_s": round(wall, 3), "turns_per_s": round(turns / wall, 2),
                             "p50_ms": round(percentile(latencies, 50), 2),
                             "p95_ms": round(percentile(latencies, 95), 2), "errors": sum(errors)}
                    points.append(point)
                    bench.say(f"  workers={workers} conversations={conversations:<3} {point['turns_per_s']:7.1f} "
                              f"turns/s  p50 {point['p50_ms']:7.1f} ms  p95 {point['p95_ms']:7.1f} ms"
                              f"{'  ERRORS ' + str(point['errors']) if point['errors'] else ''}")
    return {"points": points}


async def recovery(bench: Bench) -> dict[str, Any]:
    """A turn whose tool runs ``tool_s`` seconds, with and without SIGKILLing the worker running it."""
    from testbed.engines.temporal.in_flight import TemporalInFlight
    from testbed.faults.nemesis import NemesisContext, kill_worker

    import random

    points = []
    tool_s = bench.options.recovery_tool_s
    workload_prompt = f"Work for {tool_s:g} seconds"
    async with cluster(bench, "recovery", 2) as (c, task_queue):
        client = c.client
        ctx = NemesisContext(c, c.spec.history, [], random.Random(bench.options.seed), observer=TemporalInFlight())
        with bench.sampler.section("recovery", _cluster_processes(c)):
            for hb in bench.options.heartbeats:
                policy = ActivityPolicy(start_to_close_s=120.0, heartbeat_s=hb, initial_interval_s=1.0,
                                        maximum_interval_s=10.0)
                config = AgentConfig(tools=[*DEFAULT_TOOLS, "slow_task"], tool=policy)
                wid = f"bench-recovery-hb{hb:g}-{uuid.uuid4().hex[:8]}"
                ctx.workflow_ids[:] = [wid]
                await client.start_workflow(AgentWorkflow.run, AgentInput(config=config), id=wid,
                                            task_queue=task_queue)
                chat = client.get_workflow_handle_for(AgentWorkflow.run, wid)

                async def turn(uid: str) -> float:
                    started = time.perf_counter()
                    reply = await chat.execute_update(AgentWorkflow.send_message, ChatMessage(workload_prompt), id=uid)
                    if "finished after" not in reply.text:
                        raise BenchError(f"recovery hb={hb}: the turn answered {reply.text[:120]!r}")
                    return (time.perf_counter() - started) * 1000.0

                baseline = await turn("baseline")
                killed_turn = asyncio.create_task(turn("killed"))
                await asyncio.sleep(bench.options.kill_after_s)
                kill = await kill_worker(ctx, when="busy", activity="slow_task", down_s=0.5, wait_s=10.0)
                killed = await killed_turn
                await chat.signal(AgentWorkflow.end_chat)
                await chat.result()
                parts = breakdown_by_update(h for _, h in await fetch_histories(client, wid))
                point = {"heartbeat_s": hb, "tool_s": tool_s, "kill_after_s": bench.options.kill_after_s,
                         "retry_initial_interval_s": policy.initial_interval_s,
                         "baseline_ms": round(baseline, 1), "killed_ms": round(killed, 1),
                         "recovery_s": round((killed - baseline) / 1000.0, 2), "killed_worker": kill["worker"],
                         "kill_evidence": kill["evidence"],
                         "killed_turn": with_client(parts["killed"], killed) if "killed" in parts else None,
                         "baseline_turn": with_client(parts["baseline"], baseline) if "baseline" in parts else None}
                if not kill["evidence"]:
                    point["note"] = "the kill found no slow_task running; this point does not measure recovery"
                points.append(point)
                bench.say(f"  heartbeat {hb:>5.1f} s: baseline {baseline / 1000:5.1f} s, with a kill "
                          f"{killed / 1000:5.1f} s -> recovery {point['recovery_s']:5.1f} s"
                          f"{'  (' + point['note'] + ')' if 'note' in point else ''}")
                # The victim restarts after down_s; wait until it is warm before the next point.
                await asyncio.to_thread(lambda: [w.process.wait_for("WARM", 90.0) for w in c.workers])
    return {"points": points}


def micro(bench: Bench) -> dict[str, Any]:
    out = bench.run_dir / "micro.json"
    cmd = [sys.executable, "-m", "pytest", str(Path(__file__).parent / "micro"), "-q", "-p", "no:cacheprovider",
           "-o", "addopts=", f"--benchmark-json={out}", "--benchmark-sort=name"]
    if bench.options.quick:
        cmd += ["--benchmark-max-time=0.05", "--benchmark-min-rounds=3", "--benchmark-warmup=off"]
    bench.say("  " + " ".join(cmd[2:]))
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    bench.run.logs.mkdir(exist_ok=True)
    (bench.run.logs / "micro.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise BenchError(f"micro-benchmarks failed (exit {proc.returncode}); see {bench.run_dir / 'logs/micro.txt'}:\n"
                         + (proc.stdout + proc.stderr)[-1500:])
    return {}
