"""The nemesis: fault operations on the cluster, recorded with their evidence.

Each operation is recorded in the history as an invoke when it starts and an
ok (or info) when it ends, with ``value.evidence``: what was in flight when
the fault landed (activities running on the victim, a workflow held in a
worker's cache, bytes dropped by a proxy, requests the model refused). A fault
with no evidence hit nothing; the evidence checker will not let a run whose
faults all hit nothing pass.

Faults run at their scheduled times, each in its own task (``chaos.runner``), so two may overlap. A partition,
a slow link and a model outage take effect at once and then read what was in flight (``applied_at``); what
overlapping faults share is counted in the context (``downs``: a link stays down until the last ``down`` partition
of it ends; ``model_rules``: overlapping model outages are in force together; ``paused``: an aimed kill never thaws
a worker a pause holds), and toxics are named per operation.
A kill aimed at in-flight work, a pause, a drain and a server restart wait for their target by design.

A kill can be *aimed* (``kill_worker``): at a worker running a given activity
(``activity``: ``"model"``, ``"tool"`` for any other activity, or an activity
type's own name such as ``append_file``), at a worker holding a workflow task
(``at="workflow_task"``), or at a conversation about to continue-as-new or that
just did (``at="continue_as_new"``). An aimed kill first *freezes* (SIGSTOP) the
worker it means to hit, checks on the frozen process that the aim still holds
(its unfinished execution in the effect ledger, Temporal's pending workflow task
staying started while it is frozen, the run id), and only then SIGKILLs it; if
the moment has passed it lets the worker go on (SIGCONT) and waits for the next
one. So its ``evidence`` is what the frozen victim held when it died, not what
was seen a moment before, and a kill that never found its moment says so
(``evidence`` empty: ``injection_evidence`` will not count it).

While the victim is frozen, just before the SIGKILL, the nemesis also takes the server's own snapshot of the
conversations' pending activities (``frozen_snapshot``: each one's activity id, attempt, state, last worker
identity and last started time), because Temporal writes an attempt's started event only when the attempt closes:
a kill mid-call on an activity with a long start-to-close and no heartbeat may leave no retry, and so no trace of
the attempt in the history, before the run ends. ``injection_evidence`` counts such a kill as landed when that
snapshot shows the attempt running on the killed worker and the history shows the activity scheduled and not
closed at the kill.

Workers are named as the server sees them: ``WorkerProcess.polling_identity``, the harness's ``{identity}`` or, for
a worker command without it, the SDK's default ``<pid>@<hostname>``. The pending activities and workflow tasks the
nemesis matches, and the ``identity`` every kill, pause and drain records (which the checkers match against the
event history's worker identity and the ledger's), all use that name.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from pathlib import Path

from temporalio.client import Client

from testbed.faults.model import FaultRule
from harness.recording import MODEL_CALL, executions_in_flight
from testbed.faults.effects import EffectFault
from testbed.stack import Stack
from harness.operations import FAIL, INFO, OK, OperationLog
from testbed.faults.network import Toxic


@dataclass
class NemesisContext:
    stack: Stack  # the server, the model, the proxies and the supervised workers (testbed.stack)
    oplog: OperationLog
    workflow_ids: list[str]
    rng: random.Random
    model_activity: str = "plan_next_action"  # what "model" means in a nemesis argument, for this target
    driver_stop: Callable[[], None] | None = None  # stops the client load (called at heal)
    #: what is running right now, by the backend's own lights (checkpoint: the ledger's unfinished executions):
    #: [{"workflow_id", "activity", "attempt", "worker"}]; None: the observer's
    running: Callable[[NemesisContext], Awaitable[list[dict[str, Any]]]] | None = None
    #: the engine's in-flight observer, where it has one (``Engine.aiming``; Temporal's reads its server:
    #: ``testbed.engines.temporal.in_flight``): ``source``, ``running``, ``idle_holders``, ``snapshot``, ``aims`` and
    #: ``aim``; None: only ``running`` and the effect ledger say what is in flight
    #: the target's effect ledger, where this process can read it: the workers' own record of what runs now
    #: (aimed kills read it; None, or a file that does not exist here: they ask ``running`` / Temporal instead)
    ledger: Path | None = None
    #: the conversations' continue-as-new threshold in history events, where the backend knows it (0: unknown)
    continue_as_new_events: int = 0
    #: what overlapping faults share (faults run at their scheduled times, so two may hold the same link or the
    #: model at once): per proxy, how many ``down`` partitions hold it down; the model's fault rules in force
    downs: dict[int, int] = field(default_factory=dict)
    model_rules: list[FaultRule] = field(default_factory=list)
    #: workers a ``pause_worker`` holds frozen: an aimed kill that freezes one to check its aim and finds nothing
    #: leaves it frozen (thawing it would cut the pause short)
    paused: set[str] = field(default_factory=set)
    observer: Any = None

    @property
    def client(self) -> Client | None:
        return self.stack.client


async def in_flight(ctx: NemesisContext) -> list[dict[str, Any]]:
    """Activities running right now on some worker, across the run's conversations (none observable: [])."""
    if ctx.running is not None:
        return await ctx.running(ctx)
    return await ctx.observer.running(ctx) if ctx.observer is not None else []


def _source(ctx: NemesisContext) -> str:
    """Where ``in_flight`` reads (the operation's ``observed_by``)."""
    return "backend" if ctx.running is not None else getattr(ctx.observer, "source", "none")


def _worker_of(ctx: NemesisContext, identity: str) -> str | None:
    """The live worker the server sees as ``identity`` now (``polling_identity``: the harness's ``{identity}``, or
    the SDK's default ``<pid>@<hostname>`` for a worker command without it); a killed generation's activities still
    look running for a while."""
    for w in ctx.stack.workers:
        if w.process.polling_identity == identity and w.process.alive:
            return w.name
    return None


#: what ``kill_worker(at=...)`` can aim at (None: an activity, as ``when`` and ``activity`` say)
KILL_AIMS = ("activity", "workflow_task", "continue_as_new")


def aimed_at(aim: str | None, activity: str, model_activity: str, kind: str | None = None) -> bool:
    """Whether a running ``activity`` is what a nemesis argument aims at: None or "any" (every activity), "model"
    (the target's model activity), "tool" (any other activity: every tool), or an activity type's own name."""
    if aim in (None, "any"):
        return True
    is_model = activity == model_activity or kind == MODEL_CALL  # the ledger's kind, or the target's declaration
    if aim == "model":
        return is_model
    if aim == "tool":
        return not is_model
    return activity == aim


async def _wait_for_in_flight(ctx: NemesisContext, activity: str | None, timeout_s: float) -> list[dict[str, Any]]:
    """Activities running on live workers that ``activity`` aims at (``aimed_at``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = [a for a in await in_flight(ctx)
                   if aimed_at(activity, a["activity"], ctx.model_activity) and _worker_of(ctx, a["worker"])]
        if running:
            return running
        await asyncio.sleep(0.05)
    return []


async def _in_flight_while(ctx: NemesisContext, until: float) -> list[dict[str, Any]]:
    """What was running on live workers while a fault already in force lasts (until ``until``, wall clock), read
    every 0.1 s until something is: the evidence of a fault that starts on time rather than waiting for work."""
    while True:
        found = await _in_flight_now(ctx)
        if found or time.time() >= until:
            return found
        await asyncio.sleep(min(0.1, max(0.0, until - time.time())))


async def _in_flight_now(ctx: NemesisContext, limit_s: float = 1.0) -> list[dict[str, Any]]:
    """What is running on live workers now, read once (at most ``limit_s``): the evidence of a fault that starts
    on time rather than waiting for work to hit."""
    try:
        running = await asyncio.wait_for(in_flight(ctx), limit_s)
    except Exception:  # the server is unreachable, say: nothing observable
        return []
    return [a for a in running if _worker_of(ctx, a["worker"])]


async def _aimed_running(ctx: NemesisContext, activity: str | None) -> tuple[list[dict[str, Any]], str]:
    """(the activities ``activity`` aims at, running on live workers, where that was read: the effect ledger where
    this process can read it and it names the live workers, else the engine's ``running`` or Temporal)."""
    live = tuple(w.process.polling_identity for w in ctx.stack.workers if w.process.alive)
    rows = executions_in_flight(ctx.ledger, live) if ctx.ledger is not None and live else None
    if rows is not None:
        source = "effect_ledger"
    else:
        rows, source = await in_flight(ctx), _source(ctx)
    return [a for a in rows if aimed_at(activity, a["activity"], ctx.model_activity, a.get("kind"))
            and _worker_of(ctx, a["worker"])], source


def _key(a: dict[str, Any]) -> tuple[Any, ...]:
    return (a.get("execution"), a["workflow_id"], a["activity"], a["attempt"], a["worker"])


def _work(key: tuple[Any, ...]) -> tuple[Any, ...]:
    """A ``_key`` as every source names it: the conversation, attempt and worker (the ledger names a tool and an
    execution where Temporal names an activity type)."""
    return key[1], key[3], key[4]


#: a kill that found its moment: (worker name, identity, evidence, kill time, the server's snapshot taken frozen)
Hit = tuple[str, str, list[dict[str, Any]], float, dict[str, Any] | None]


async def _freeze_then_kill(ctx: NemesisContext, identity: str, down_s: float,
                            confirm: Callable[[], Awaitable[list[dict[str, Any]]]]
                            ) -> Hit | None:
    """SIGSTOP the live worker ``identity``; ask ``confirm`` (on the frozen process) what the aim found; if anything,
    take the server's pending-activity snapshot of the conversations (``pending_activities``, where there is a
    Temporal server), SIGKILL it (down ``down_s``) and return (worker name, identity, that evidence, kill time,
    snapshot); else SIGCONT it."""
    name = _worker_of(ctx, identity)
    if name is None:
        return None
    w = ctx.stack.worker(name)
    async with w.held() as proc:
        if proc.polling_identity != identity or not proc.alive:
            return None
        proc.pause()
        try:
            evidence = await confirm()
        except Exception:  # the server is down, say: the aim cannot be confirmed
            evidence = []
        if not evidence:
            if name not in ctx.paused:
                proc.resume()
            return None
        snapshot = None
        if ctx.observer is not None:
            try:
                snapshot = await ctx.observer.snapshot(ctx)
            except Exception as exc:  # a snapshot is extra evidence; the kill does not depend on it
                snapshot = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        w.down_until = time.monotonic() + down_s
        killed_at = time.time()
        proc.kill()
    return name, identity, evidence, killed_at, snapshot


def _another_up(ctx: NemesisContext, name: str | None) -> bool:
    """A worker other than ``name`` is up: alive, held down by no fault, paused by none, not being restarted (the
    supervisor holds its lock until the replacement polls)."""
    now = time.monotonic()
    return any(w.name != name and w.process.alive and now >= w.down_until and w.name not in ctx.paused
               and not w.lock.locked() for w in ctx.stack.workers)


#: what an engine's aims act through (``testbed.engines.temporal.in_flight``): the nemesis is the one place that
#: freezes and kills a worker
HANDS = SimpleNamespace(freeze_then_kill=_freeze_then_kill, worker_of=_worker_of, another_up=_another_up)


async def _aim_activity(ctx: NemesisContext, activity: str | None, down_s: float, wait_s: float,
                        spare: bool = False) -> tuple[Hit | None, dict[str, Any]]:
    """Kill a worker frozen while it runs an activity ``activity`` aims at (``spare``: only while another is up)."""
    deadline = time.monotonic() + wait_s
    probes, source = 0, ""
    while time.monotonic() < deadline:
        running, source = await _aimed_running(ctx, activity)
        if spare:
            running = [a for a in running if _another_up(ctx, _worker_of(ctx, a["worker"]))]
        if running:
            identity = running[0]["worker"]
            keys = {_key(a) for a in running if a["worker"] == identity}

            async def confirm(identity: str = identity, keys: set = keys, seen: str = source) -> list[dict[str, Any]]:
                now, read = await _aimed_running(ctx, activity)
                if read != seen:  # the ledger was busy, say: the same work, named as both sources name it
                    same = {_work(k) for k in keys}
                    return [a for a in now if a["worker"] == identity and _work(_key(a)) in same]
                return [a for a in now if a["worker"] == identity and _key(a) in keys]

            probes += 1
            hit = await _freeze_then_kill(ctx, identity, down_s, confirm)
            if hit is not None:
                return hit, {"observed_by": source, "probes": probes}
        await asyncio.sleep(0.003 if source == "effect_ledger" else 0.05)
    return None, {"observed_by": source, "probes": probes}


async def kill_worker(ctx: NemesisContext, when: str = "busy", activity: str | None = "model", down_s: float = 2.0,
                      wait_s: float = 15.0, at: str | None = None, phase: str = "any", history_events: int = 0,
                      hold_s: float = 0.25, spare: bool = False) -> dict[str, Any]:
    """SIGKILL a worker; it stays down ``down_s``, then the supervisor restarts it.

    ``at`` None (or "activity"): one running ``activity`` ("busy": "model", "tool", an activity type's name, or
    None for any), one idle but holding conversations in its cache ("idle", Temporal only), or any one, now
    ("any"). ``at`` "workflow_task": one holding a workflow task (``_aim_workflow_task``); "continue_as_new": one
    holding a conversation about to continue-as-new or that just did (``phase``; ``history_events``: the
    threshold, default the engine's ``continue_as_new_events``: the scenario's setting on the reference, a
    target file's ``continue_as_new_events`` on a target). An aimed kill that finds no moment within ``wait_s``
    kills a worker anyway, with empty ``evidence``. ``spare`` (an activity or workflow-task aim): never the last worker up; the aim
    waits while the other is down or not yet polling again (two aimed kills that overlap then never leave the
    agent without a worker, unless the scenario means to: ``spare`` False). An agent with one worker has none to
    spare: its kills aim all the same, and the completion's ``spare`` says so. The completion records ``aim`` and how the aim was observed
    (``observed_by``, ``probes``: how many times a worker was frozen to check it). A "before" kill whose threshold
    is unknown kills nothing: its operation completes ``fail`` (it certainly did not happen) with ``not_injected``
    saying why, which the faults column and ``injection_evidence`` show as not injected."""
    if at not in (None, *KILL_AIMS):
        raise ValueError(f"kill_worker at={at!r}: unknown; aims are {', '.join(KILL_AIMS)}")
    if phase not in ("before", "after", "any"):
        raise ValueError(f"kill_worker phase={phase!r}: one of before, after, any")
    at = None if at == "activity" else at
    aim: dict[str, Any] = {"when": when, "activity": activity, "at": at, **({"spare": True} if spare else {})}
    if at == "continue_as_new":
        aim.update(phase=phase, history_events=history_events or ctx.continue_as_new_events)
    op = ctx.oplog.invoke("nemesis", "kill_worker", {"when": when, "activity": activity, "down_s": down_s,
                                                       **({"at": at} if at else {}),
                                                       **({"spare": True} if spare else {}),
                                                       **({"phase": phase} if at == "continue_as_new" else {})})
    if at == "continue_as_new" and phase == "before" and not aim["history_events"]:
        why = ("the continue-as-new threshold is unknown, so no moment before one can be aimed at: declare the "
               "agent's continue_as_new_events in the target file (or give kill_worker history_events)")
        value = {"not_injected": why, "evidence": [], "aim": aim}
        ctx.oplog.complete(op, FAIL, value, error=f"not injected: {why}")
        return value
    evidence: list[Any] = []
    victim = None
    info: dict[str, Any] = {}
    if spare and len(ctx.stack.workers) < 2:
        # Nothing to spare: with one worker (Restate's one endpoint, say) a spared aim would wait for a second
        # worker that never comes, and every kill would be the blind one at the end of ``wait_s``.
        spare = False
        info["spare"] = "not applied: the agent runs one worker, so each kill stops it all until its restart"
    hit = None
    if at is not None and at not in getattr(ctx.observer, "aims", ()):
        info.update(observed_by=None, not_observable=f"{at}: this backend has no Temporal server to observe")
    elif at is not None:
        options = ({"hold_s": hold_s, "spare": spare} if at == "workflow_task" else
                   {"phase": phase, "threshold": aim["history_events"]})
        hit, observed = await ctx.observer.aim(at, ctx, HANDS, down_s=down_s, wait_s=wait_s, **options)
        info.update(observed)
    elif when == "busy":
        hit, observed = await _aim_activity(ctx, activity, down_s, wait_s, spare)
        info.update(observed)
    elif when == "idle":
        # A worker holding a conversation that waits for its next message (no activity of its own running).
        deadline = time.monotonic() + wait_s
        while victim is None and time.monotonic() < deadline:
            busy = {a["workflow_id"] for a in await in_flight(ctx)}
            held = await ctx.observer.idle_holders(ctx) if ctx.observer is not None else {}
            for w in ctx.stack.workers:
                waiting = [wid for wid, identity in held.items() if identity == w.process.polling_identity and wid not in busy]
                if waiting:
                    victim, evidence = w.name, [{"cached_idle_conversation": wid} for wid in waiting]
                    break
            else:
                await asyncio.sleep(0.1)
    snapshot = None
    if hit is not None:
        victim, identity, evidence, killed_at, snapshot = hit
    else:
        victim = victim or ctx.rng.choice(ctx.stack.workers).name
        w = ctx.stack.worker(victim)
        async with w.held() as proc:
            identity = proc.polling_identity
            w.down_until = time.monotonic() + down_s
            killed_at = time.time()
            proc.kill()
    value = {"worker": victim, "identity": identity, "evidence": evidence, "down_s": down_s, "killed_at": killed_at,
             "aim": aim, **info, **({"frozen_snapshot": snapshot} if snapshot is not None else {})}
    ctx.oplog.complete(op, OK, value)
    return value


async def pause_worker(ctx: NemesisContext, pause_s: float = 6.0, wait_s: float = 15.0) -> dict[str, Any]:
    """SIGSTOP a busy worker for longer than the heartbeat timeout, then SIGCONT it."""
    op = ctx.oplog.invoke("nemesis", "pause_worker", {"pause_s": pause_s})
    running = await _wait_for_in_flight(ctx, None, wait_s)
    victim = _worker_of(ctx, running[0]["worker"]) if running else None
    victim = victim or ctx.rng.choice(ctx.stack.workers).name
    w = ctx.stack.worker(victim)
    identity = w.process.polling_identity
    evidence = [a for a in running if a["worker"] == identity]
    async with w.held() as proc:
        proc.pause()
        paused_at = time.time()
        ctx.paused.add(victim)
    try:
        await asyncio.sleep(pause_s)
    finally:
        ctx.paused.discard(victim)
    async with w.held() as proc:
        proc.resume()
        resumed_at = time.time()
    value = {"worker": victim, "identity": identity, "evidence": evidence, "pause_s": pause_s, "paused_at": paused_at,
             "resumed_at": resumed_at}
    ctx.oplog.complete(op, OK, value)
    return value


async def drain_worker(ctx: NemesisContext, activity: str | None = "model", down_s: float = 1.0, wait_s: float = 15.0,
                       exit_within_s: float = 45.0) -> dict[str, Any]:
    """SIGTERM a worker running an activity ``activity`` aims at: a deploy's graceful stop. The worker is to stop
    polling, finish what it runs and exit by itself; the supervisor starts its replacement ``down_s`` after it exits.
    The ``drain`` checker then asks whether anything it ran was re-executed elsewhere."""
    op = ctx.oplog.invoke("nemesis", "drain_worker", {"activity": activity, "down_s": down_s})
    deadline = time.monotonic() + wait_s
    while True:
        running, source = await _aimed_running(ctx, activity)
        if running or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.003 if source == "effect_ledger" else 0.05)
    victim = _worker_of(ctx, running[0]["worker"]) if running else None
    victim = victim or ctx.rng.choice(ctx.stack.workers).name
    w = ctx.stack.worker(victim)
    async with w.held() as proc:
        identity = proc.polling_identity
        w.down_until = float("inf")  # the supervisor waits until it has exited
        signalled_at = time.time()
        proc.terminate()
    evidence = [a for a in running if a["worker"] == identity]
    exit_deadline = time.monotonic() + exit_within_s
    while proc.alive and time.monotonic() < exit_deadline:
        await asyncio.sleep(0.05)
    exited = not proc.alive
    exited_at = time.time() if exited else None
    if not exited:  # it did not drain in time: what a deploy tool would do next
        async with w.held() as held:
            held.kill()
    w.down_until = time.monotonic() + down_s
    value = {"worker": victim, "identity": identity, "evidence": evidence, "down_s": down_s,
             "signalled_at": signalled_at, "exited_at": exited_at, "exit_code": proc.returncode,
             "drained_in_s": round(exited_at - signalled_at, 2) if exited_at else None, "observed_by": source}
    ctx.oplog.complete(op, OK, value)
    return value


async def partition(ctx: NemesisContext, link: str = "temporal", mode: str = "blackhole", duration_s: float = 8.0,
                    toxicity: float = 1.0) -> dict[str, Any]:
    """Cut the workers' link to Temporal or to the model: ``blackhole`` (a partition: nothing gets through, nothing
    errors; what was sent is delivered when it heals, as TCP would), ``reset`` (TCP RST), ``down`` (connections
    refused), or ``drop`` (bytes thrown away on live connections: no real network does that to TCP; it tests a
    protocol's own resilience, see ``testbed.faults.network``). It starts on time; its evidence is the work seen in
    flight while it lasted (read every 0.1 s until some is) and what the proxy did: bytes held or thrown away,
    connections reset, and for ``down`` the live connections it cut (the workers' polls among them)."""
    proxy = ctx.stack.link(link)
    assert proxy is not None
    op = ctx.oplog.invoke("nemesis", "partition", {"link": link, "mode": mode, "duration_s": duration_s})
    before = proxy.stats()
    name = f"partition_{mode}_{op.index}"  # unique: an overlapping partition of the same link keeps its own
    if mode == "down":
        ctx.downs[id(proxy)] = ctx.downs.get(id(proxy), 0) + 1
        proxy.disable()
    else:
        proxy.add_toxic(Toxic(kind=mode, toxicity=toxicity, name=name))
    applied_at = time.time()
    running = await _in_flight_while(ctx, applied_at + duration_s)  # on time first; then what it caught
    await asyncio.sleep(max(0.0, applied_at + duration_s - time.time()))
    after = proxy.stats()
    if mode == "down":
        ctx.downs[id(proxy)] -= 1
        if not ctx.downs[id(proxy)]:  # the last one holding the link down
            proxy.enable()
    else:
        proxy.remove_toxic(name)
    dropped = {k: after.get(k, 0) - before.get(k, 0) for k in ("blackholed_bytes", "dropped_bytes", "resets", "refused_while_down")
               if isinstance(after.get(k), int) and after.get(k, 0) - before.get(k, 0) > 0}
    if mode == "down" and before.get("active"):  # the live connections taking the link down cut (the workers' own)
        dropped["connections_cut"] = before["active"]
    evidence = ([{"in_flight": a} for a in running] + ([{"proxy": dropped}] if dropped else [])) if (running or dropped) else []
    value = {"link": link, "mode": mode, "evidence": evidence, "proxy_delta": dropped, "applied_at": applied_at}
    ctx.oplog.complete(op, OK, value)
    return value


async def degrade_link(ctx: NemesisContext, link: str = "temporal", latency_ms: float = 300.0, jitter_ms: float = 100.0,
                       rate_kbps: float = 0.0, stream: str = "both", duration_s: float = 6.0,
                       toxicity: float = 1.0) -> dict[str, Any]:
    """A slow link, not a broken one: latency with jitter per direction, optionally a bandwidth cap."""
    proxy = ctx.stack.link(link)
    assert proxy is not None
    op = ctx.oplog.invoke("nemesis", "degrade_link", {"link": link, "latency_ms": latency_ms, "jitter_ms": jitter_ms,
                                                        "rate_kbps": rate_kbps, "stream": stream})
    before = proxy.stats()
    names = [f"degrade_latency_{stream}_{op.index}"]  # unique: an overlapping fault of the same link keeps its own
    await asyncio.to_thread(proxy.add_toxic, Toxic(kind="latency", stream=stream, latency_ms=latency_ms,
                                                   jitter_ms=jitter_ms, toxicity=toxicity, name=names[0]))
    if rate_kbps > 0:
        names.append(f"degrade_bandwidth_{stream}_{op.index}")
        await asyncio.to_thread(proxy.add_toxic, Toxic(kind="bandwidth", stream=stream, rate_kbps=rate_kbps,
                                                       toxicity=toxicity, name=names[1]))
    applied_at = time.time()
    running = await _in_flight_while(ctx, applied_at + duration_s)
    await asyncio.sleep(max(0.0, applied_at + duration_s - time.time()))
    for name in names:
        await asyncio.to_thread(proxy.remove_toxic, name)
    after = proxy.stats()
    moved = sum(after.get(k, 0) - before.get(k, 0) for k in ("bytes_upstream", "bytes_downstream"))
    evidence = [{"in_flight": a} for a in running] + ([{"bytes_delayed": moved}] if moved else [])
    value = {"link": link, "evidence": evidence if running or moved else [], "bytes_through": moved,
             "applied_at": applied_at}
    ctx.oplog.complete(op, OK, value)
    return value


async def restart_server(ctx: NemesisContext, down_s: float = 3.0) -> dict[str, Any]:
    """SIGKILL the Temporal server and start it again from its database file."""
    op = ctx.oplog.invoke("nemesis", "restart_server", {"down_s": down_s})
    running = await _wait_for_in_flight(ctx, None, 10.0)  # aimed: a restart with work in flight
    killed_at = time.time()
    await asyncio.to_thread(ctx.stack.server.kill)
    await asyncio.sleep(down_s)
    try:
        await asyncio.to_thread(ctx.stack.server.start)
    except Exception as exc:
        ctx.oplog.complete(op, INFO, {"evidence": running}, error=f"{type(exc).__name__}: {exc}")
        raise
    value = {"evidence": running, "pid": ctx.stack.server.pid, "killed_at": killed_at}
    ctx.oplog.complete(op, OK, value)
    return value


async def model_outage(ctx: NemesisContext, status: int = 503, duration_s: float = 6.0,
                       mode: str = "status") -> dict[str, Any]:
    """The model API refuses (503/429), hangs or answers garbage for a while."""
    op = ctx.oplog.invoke("nemesis", "model_outage", {"mode": mode, "status": status, "duration_s": duration_s})
    model = ctx.stack.model_server
    before = (await asyncio.to_thread(model.stats))["faults_applied"].get(mode, 0)
    # A hung request is dropped when the outage ends (as a dead API's connections eventually are).
    rule = FaultRule(mode=mode, status=status) if mode == "status" else \
        FaultRule(mode=mode, hang_s=duration_s) if mode == "hang" else FaultRule(mode=mode)
    ctx.model_rules.append(rule)
    await asyncio.to_thread(ctx.stack.set_model_faults, list(ctx.model_rules))
    applied_at = time.time()
    await asyncio.sleep(duration_s)
    ctx.model_rules.remove(rule)  # an overlapping outage's rule stays in force
    await asyncio.to_thread(ctx.stack.set_model_faults, list(ctx.model_rules))
    hits = (await asyncio.to_thread(model.stats))["faults_applied"].get(mode, 0) - before
    value = {"mode": mode, "requests_refused": hits, "evidence": [{"model_requests_faulted": hits}] if hits else [],
             "applied_at": applied_at}
    ctx.oplog.complete(op, OK, value)
    return value


async def effects_outage(ctx: NemesisContext, status: int = 503, duration_s: float = 6.0) -> dict[str, Any]:
    """The external effects service (``testbed.effects_service``) answers every note request ``status`` for a
    while, applying nothing: a correct agent's tool fails, is retried, and saves the note once the service is back.
    A run with no effects service (a target whose effects are not ``service``) cannot have this fault: the
    operation completes ``fail`` with ``not_injected``."""
    op = ctx.oplog.invoke("nemesis", "effects_outage", {"status": status, "duration_s": duration_s})
    service = ctx.stack.effects_service
    if service is None:
        why = "this run has no effects service (the target's effects are not \"service\")"
        value = {"not_injected": why, "evidence": []}
        ctx.oplog.complete(op, FAIL, value, error=f"not injected: {why}")
        return value
    before = (await asyncio.to_thread(service.stats))["status_faults"]
    await asyncio.to_thread(service.set_faults, [EffectFault("status", count=None, status=status,
                                                             duration_s=duration_s)])
    await asyncio.sleep(duration_s)
    await asyncio.to_thread(service.set_faults, [])
    hits = (await asyncio.to_thread(service.stats))["status_faults"] - before
    value = {"status": status, "requests_refused": hits,
             "evidence": [{"effects_requests_refused": hits}] if hits else []}
    ctx.oplog.complete(op, OK, value)
    return value


async def deploy_fix(ctx: NemesisContext, activity: str = "calculator", min_attempt: int = 2,
                     wait_s: float = 20.0) -> dict[str, Any]:
    """The hot-fix: once the buggy activity is stuck retrying, restart every worker without the bug."""
    op = ctx.oplog.invoke("nemesis", "deploy_fix", {"activity": activity})
    deadline = time.monotonic() + wait_s
    stuck: list[dict[str, Any]] = []
    while time.monotonic() < deadline and not stuck and ctx.observer is not None:
        stuck = await ctx.observer.retrying(ctx, activity, min_attempt)
        await asyncio.sleep(0.1)
    for w in ctx.stack.workers:
        async with w.held() as proc:
            await asyncio.to_thread(proc.stop)
            await asyncio.to_thread(proc.start, faults=proc.faults.without_bugs())
    value = {"evidence": stuck, "workers": [w.process.polling_identity for w in ctx.stack.workers]}
    ctx.oplog.complete(op, OK, value)
    return value


#: nemeses that need the embedded dev server (this harness owns its process), and why: an external cluster's
#: scenarios that use them are skipped, and random schedules against one never draw them
EMBEDDED_ONLY = {"restart_server": "needs the embedded server: cannot restart an external cluster"}

NEMESES = {
    "kill_worker": kill_worker,
    "pause_worker": pause_worker,
    "drain_worker": drain_worker,
    "partition": partition,
    "degrade_link": degrade_link,
    "restart_server": restart_server,
    "model_outage": model_outage,
    "effects_outage": effects_outage,
    "deploy_fix": deploy_fix,
}
