"""The nemesis: fault operations on the cluster, recorded with their evidence.

Each operation is recorded in the history as an invoke when it starts and an
ok (or info) when it ends, with ``value.evidence``: what was in flight when
the fault landed (activities running on the victim, a workflow held in a
worker's cache, bytes dropped by a proxy, requests the model refused). A fault
with no evidence hit nothing; the evidence checker will not let a run whose
faults all hit nothing pass.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client

from harness.faults import FaultRule
from testbed.stack import Stack
from harness.operations import INFO, OK, History
from testbed.net import Toxic


@dataclass
class NemesisContext:
    stack: Stack  # the server, the model, the proxies and the supervised workers (testbed.stack)
    history: History
    workflow_ids: list[str]
    rng: random.Random
    model_activity: str = "plan_next_action"  # what "model" means in a nemesis argument, for this target
    driver_stop: Callable[[], None] | None = None  # stops the client load (called at heal)
    #: what is running right now, by the backend's own lights (Temporal: pending activities; checkpoint: the
    #: ledger's unfinished executions): [{"workflow_id", "activity", "attempt", "worker"}]
    running: Callable[[NemesisContext], Awaitable[list[dict[str, Any]]]] | None = None

    @property
    def client(self) -> Client | None:
        return self.stack.client


async def in_flight(ctx: NemesisContext) -> list[dict[str, Any]]:
    """Activities running right now on some worker, across the run's conversations."""
    if ctx.running is not None:
        return await ctx.running(ctx)
    return await temporal_in_flight(ctx)


async def temporal_in_flight(ctx: NemesisContext) -> list[dict[str, Any]]:
    """Started activities, from Temporal's description of each conversation (its pending activities)."""
    found = []
    for wid in ctx.workflow_ids:
        try:
            desc = await ctx.client.get_workflow_handle(wid).describe()
        except Exception:  # not started yet, or the server is down: nothing observable
            continue
        for p in desc.raw_description.pending_activities:
            if p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
                found.append({"workflow_id": wid, "activity": p.activity_type.name, "attempt": p.attempt,
                              "worker": p.last_worker_identity})
    return found


async def last_task_workers(ctx: NemesisContext) -> dict[str, str]:
    """Open conversation -> the worker that ran its last workflow task (it holds the conversation in its cache)."""
    held: dict[str, str] = {}
    for wid in ctx.workflow_ids:
        try:
            handle = ctx.client.get_workflow_handle(wid)
            if (await handle.describe()).status.name != "RUNNING":
                continue
            last = None
            async for ev in handle.fetch_history_events():
                if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
                    last = ev.workflow_task_completed_event_attributes.identity
            if last:
                held[wid] = last
        except Exception:  # not started yet, or the server is down: nothing observable
            continue
    return held


def _worker_of(ctx: NemesisContext, identity: str) -> str | None:
    """The live worker with this identity now (a killed generation's activities still look running for a while)."""
    for w in ctx.stack.workers:
        if w.process.identity == identity and w.process.alive:
            return w.name
    return None


async def _wait_for_in_flight(ctx: NemesisContext, activity: str | None, timeout_s: float) -> list[dict[str, Any]]:
    """Activities running on live workers (``activity`` "model": the target's model activity)."""
    if activity == "model":
        activity = ctx.model_activity
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = [a for a in await in_flight(ctx)
                   if (activity is None or a["activity"] == activity) and _worker_of(ctx, a["worker"])]
        if running:
            return running
        await asyncio.sleep(0.05)
    return []


async def kill_worker(ctx: NemesisContext, when: str = "busy", activity: str | None = "model",
                      down_s: float = 2.0, wait_s: float = 15.0) -> dict[str, Any]:
    """SIGKILL a worker: one running ``activity`` ("busy"), one idle but holding conversations in its cache
    ("idle", Temporal only), or any one, now ("any"). It stays down ``down_s``; then the supervisor restarts it."""
    op = ctx.history.invoke("nemesis", "kill_worker", {"when": when, "activity": activity, "down_s": down_s})
    evidence: list[Any] = []
    victim = None
    if when == "busy":
        running = await _wait_for_in_flight(ctx, activity, wait_s)
        if running:
            victim = _worker_of(ctx, running[0]["worker"])
            evidence = [a for a in running if a["worker"] == running[0]["worker"]]
    elif when == "idle":
        # A worker holding a conversation that waits for its next message (no activity of its own running).
        deadline = time.monotonic() + wait_s
        while victim is None and time.monotonic() < deadline:
            busy = {a["workflow_id"] for a in await in_flight(ctx)}
            held = await last_task_workers(ctx)
            for w in ctx.stack.workers:
                waiting = [wid for wid, identity in held.items() if identity == w.process.identity and wid not in busy]
                if waiting:
                    victim, evidence = w.name, [{"cached_idle_conversation": wid} for wid in waiting]
                    break
            else:
                await asyncio.sleep(0.1)
    victim = victim or ctx.rng.choice(ctx.stack.workers).name
    w = ctx.stack.worker(victim)
    async with w.held() as proc:
        identity = proc.identity
        w.down_until = time.monotonic() + down_s
        killed_at = time.time()
        proc.kill()
    value = {"worker": victim, "identity": identity, "evidence": evidence, "down_s": down_s, "killed_at": killed_at}
    ctx.history.complete(op, OK, value)
    return value


async def pause_worker(ctx: NemesisContext, pause_s: float = 6.0, wait_s: float = 15.0) -> dict[str, Any]:
    """SIGSTOP a busy worker for longer than the heartbeat timeout, then SIGCONT it."""
    op = ctx.history.invoke("nemesis", "pause_worker", {"pause_s": pause_s})
    running = await _wait_for_in_flight(ctx, None, wait_s)
    victim = _worker_of(ctx, running[0]["worker"]) if running else None
    victim = victim or ctx.rng.choice(ctx.stack.workers).name
    w = ctx.stack.worker(victim)
    identity = w.process.identity
    evidence = [a for a in running if a["worker"] == identity]
    async with w.held() as proc:
        proc.pause()
    await asyncio.sleep(pause_s)
    async with w.held() as proc:
        proc.resume()
    value = {"worker": victim, "identity": identity, "evidence": evidence, "pause_s": pause_s}
    ctx.history.complete(op, OK, value)
    return value


async def partition(ctx: NemesisContext, link: str = "temporal", mode: str = "blackhole", duration_s: float = 8.0,
                    toxicity: float = 1.0) -> dict[str, Any]:
    """Cut the workers' link to Temporal or to the model: blackhole, reset (TCP RST) or down (refused)."""
    proxy = ctx.stack.temporal_proxy if link == "temporal" else ctx.stack.model_proxy
    assert proxy is not None
    op = ctx.history.invoke("nemesis", "partition", {"link": link, "mode": mode, "duration_s": duration_s})
    running = await _wait_for_in_flight(ctx, None, 10.0)
    before = proxy.stats()
    if mode == "down":
        proxy.disable()
    else:
        proxy.add_toxic(Toxic(kind=mode, toxicity=toxicity, name=f"partition_{mode}"))
    await asyncio.sleep(duration_s)
    after = proxy.stats()
    if mode == "down":
        proxy.enable()
    else:
        proxy.remove_toxic(f"partition_{mode}")
    dropped = {k: after.get(k, 0) - before.get(k, 0) for k in ("blackholed_bytes", "resets", "refused_while_down")
               if isinstance(after.get(k), int) and after.get(k, 0) - before.get(k, 0) > 0}
    evidence = ([{"in_flight": a} for a in running] + ([{"proxy": dropped}] if dropped else [])) if (running or dropped) else []
    value = {"link": link, "mode": mode, "evidence": evidence, "proxy_delta": dropped}
    ctx.history.complete(op, OK, value)
    return value


async def degrade_link(ctx: NemesisContext, link: str = "temporal", latency_ms: float = 300.0, jitter_ms: float = 100.0,
                       rate_kbps: float = 0.0, stream: str = "both", duration_s: float = 6.0,
                       toxicity: float = 1.0) -> dict[str, Any]:
    """A slow link, not a broken one: latency with jitter per direction, optionally a bandwidth cap."""
    proxy = ctx.stack.temporal_proxy if link == "temporal" else ctx.stack.model_proxy
    assert proxy is not None
    op = ctx.history.invoke("nemesis", "degrade_link", {"link": link, "latency_ms": latency_ms, "jitter_ms": jitter_ms,
                                                        "rate_kbps": rate_kbps, "stream": stream})
    running = await _wait_for_in_flight(ctx, None, 10.0)
    before = proxy.stats()
    names = [f"degrade_latency_{stream}"]
    await asyncio.to_thread(proxy.add_toxic, Toxic(kind="latency", stream=stream, latency_ms=latency_ms,
                                                   jitter_ms=jitter_ms, toxicity=toxicity, name=names[0]))
    if rate_kbps > 0:
        names.append(f"degrade_bandwidth_{stream}")
        await asyncio.to_thread(proxy.add_toxic, Toxic(kind="bandwidth", stream=stream, rate_kbps=rate_kbps,
                                                       toxicity=toxicity, name=names[1]))
    await asyncio.sleep(duration_s)
    for name in names:
        await asyncio.to_thread(proxy.remove_toxic, name)
    after = proxy.stats()
    moved = sum(after.get(k, 0) - before.get(k, 0) for k in ("bytes_upstream", "bytes_downstream"))
    evidence = [{"in_flight": a} for a in running] + ([{"bytes_delayed": moved}] if moved else [])
    value = {"link": link, "evidence": evidence if running or moved else [], "bytes_through": moved}
    ctx.history.complete(op, OK, value)
    return value


async def restart_server(ctx: NemesisContext, down_s: float = 3.0) -> dict[str, Any]:
    """SIGKILL the Temporal server and start it again from its database file."""
    op = ctx.history.invoke("nemesis", "restart_server", {"down_s": down_s})
    running = await _wait_for_in_flight(ctx, None, 10.0)
    await asyncio.to_thread(ctx.stack.server.kill)
    await asyncio.sleep(down_s)
    try:
        await asyncio.to_thread(ctx.stack.server.start)
    except Exception as exc:
        ctx.history.complete(op, INFO, {"evidence": running}, error=f"{type(exc).__name__}: {exc}")
        raise
    value = {"evidence": running, "pid": ctx.stack.server.pid}
    ctx.history.complete(op, OK, value)
    return value


async def model_outage(ctx: NemesisContext, status: int = 503, duration_s: float = 6.0,
                       mode: str = "status") -> dict[str, Any]:
    """The model API refuses (503/429), hangs or answers garbage for a while."""
    op = ctx.history.invoke("nemesis", "model_outage", {"mode": mode, "status": status, "duration_s": duration_s})
    model = ctx.stack.model_server
    before = (await asyncio.to_thread(model.stats))["faults_applied"].get(mode, 0)
    # A hung request is dropped when the outage ends (as a dead API's connections eventually are).
    rule = FaultRule(mode=mode, status=status) if mode == "status" else \
        FaultRule(mode=mode, hang_s=duration_s) if mode == "hang" else FaultRule(mode=mode)
    await asyncio.to_thread(ctx.stack.set_model_faults, [rule])
    await asyncio.sleep(duration_s)
    await asyncio.to_thread(ctx.stack.set_model_faults, [])
    hits = (await asyncio.to_thread(model.stats))["faults_applied"].get(mode, 0) - before
    value = {"mode": mode, "requests_refused": hits, "evidence": [{"model_requests_faulted": hits}] if hits else []}
    ctx.history.complete(op, OK, value)
    return value


async def deploy_fix(ctx: NemesisContext, activity: str = "calculator", min_attempt: int = 2,
                     wait_s: float = 20.0) -> dict[str, Any]:
    """The hot-fix: once the buggy activity is stuck retrying, restart every worker without the bug."""
    op = ctx.history.invoke("nemesis", "deploy_fix", {"activity": activity})
    deadline = time.monotonic() + wait_s
    stuck: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not stuck:
        for wid in ctx.workflow_ids:
            try:
                desc = await ctx.client.get_workflow_handle(wid).describe()
            except Exception:
                continue
            stuck += [{"workflow_id": wid, "activity": p.activity_type.name, "attempt": p.attempt,
                       "last_failure": p.last_failure.message[:120]}
                      for p in desc.raw_description.pending_activities
                      if p.activity_type.name == activity and p.attempt >= min_attempt]
        await asyncio.sleep(0.1)
    for w in ctx.stack.workers:
        async with w.held() as proc:
            await asyncio.to_thread(proc.stop)
            await asyncio.to_thread(proc.start, faults=proc.faults.without_bugs())
    value = {"evidence": stuck, "workers": [w.process.identity for w in ctx.stack.workers]}
    ctx.history.complete(op, OK, value)
    return value


NEMESES = {
    "kill_worker": kill_worker,
    "pause_worker": pause_worker,
    "partition": partition,
    "degrade_link": degrade_link,
    "restart_server": restart_server,
    "model_outage": model_outage,
    "deploy_fix": deploy_fix,
}
