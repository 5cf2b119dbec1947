"""Faults on time (issue 31): every scheduled fault begins at its time whatever the others are doing, faults the
schedule overlaps overlap, an error is put down to the fault that raised it, and an event-ended fault phase ends
when its faults have (not at the scenario's clock) but never cuts a killed worker's down time short.

The scheduler is driven with stand-in nemeses (it is the runner's code under test, not an engine); the overlap
of faults on one link runs on a real ``FaultProxy``; two overlapping model outages are read from the rules the
nemesis hands the model server in turn."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from chaos.fault_timeline import fault_timeline
from chaos.runner import RunContext, _warm_up_faults_heal_settle, ends_on_events
from chaos.scenarios import SCENARIOS, ChaosScenario, ClusterSpec
from chaos.generator import NemesisEvent as E
from harness.operations import OK, OperationLog, load
from testbed.faults.model import FaultRule
from testbed.faults.nemesis import NemesisContext, model_outage, partition
from testbed.faults.network import FaultProxy


class _Cluster:
    """What the fault phase asks of a cluster: heal it, and its workers (none here)."""

    def __init__(self) -> None:
        self.workers: list[Any] = []
        self.healed_at: float | None = None

    def heal(self) -> None:
        self.healed_at = time.monotonic()


async def _phase(scenario: ChaosScenario, nemeses: dict[str, Any], tmp_path: Path,
                 cluster: Any = None) -> tuple[list[Any], dict[str, float], Any]:
    oplog = OperationLog(tmp_path / "operations.jsonl")
    phases: dict[str, float] = {}

    def phase(p: str) -> None:
        phases[p] = oplog.now()
        oplog.event("generator", f"phase:{p}")

    ctx = NemesisContext(stack=None, oplog=oplog, workflow_ids=[], rng=random.Random(1))  # type: ignore[arg-type]
    cluster = cluster or _Cluster()
    load = asyncio.create_task(asyncio.sleep(0))
    await _warm_up_faults_heal_settle(RunContext(scenario, list(scenario.events), oplog, phase, nemeses=nemeses,
                                                 cluster=cluster, nemesis=ctx), load)
    oplog.close()
    return load_ops(tmp_path), phases, cluster


def load_ops(tmp_path: Path) -> list[Any]:
    return load(tmp_path / "operations.jsonl")


def _sleeper(name: str) -> Any:
    async def nemesis(ctx: NemesisContext, duration_s: float, fail: bool = False) -> None:
        op = ctx.oplog.invoke("nemesis", name, {"duration_s": duration_s})
        await asyncio.sleep(duration_s)
        if fail:
            raise RuntimeError(f"{name} broke")
        ctx.oplog.complete(op, OK, {})
    return nemesis


async def test_overlapping_faults_start_on_time_and_overlap(tmp_path: Path) -> None:
    scenario = ChaosScenario("overlap", "", (E(0.2, "slow", {"duration_s": 1.0}), E(0.4, "slow", {"duration_s": 0.3}),
                                            E(0.5, "other", {"duration_s": 0.2})), warmup_s=0.0, fault_s=30.0)
    ops, phases, _ = await _phase(scenario, {"slow": _sleeper("slow"), "other": _sleeper("other")}, tmp_path)
    timeline = fault_timeline({"schedule": [e.as_dict() for e in scenario.events]}, ops)
    rows = timeline["faults"]
    assert [r["op"] for r in rows] == ["slow", "slow", "other"]
    # Each at its own time, not after the one before it ended (the first runs 1 s): a busy machine may start one
    # a little late (the timeline then counts it late), never by a whole fault's length.
    assert all(0 <= r["started_s"] - r["at_s"] < 0.8 for r in rows), rows
    assert rows[1]["started_s"] < rows[0]["ended_s"]  # the second began while the first still ran
    # The phase ended on its events (the long fault's end, 1.2 s), not at the scenario's 30 s.
    assert phases["heal"] - phases["faults"] < 15, phases  # half the 30 s: room for a busy machine


async def test_an_error_is_put_down_to_the_fault_that_raised_it_while_another_overlaps(tmp_path: Path) -> None:
    async def slow(ctx: NemesisContext, duration_s: float, before: bool = False) -> None:
        if before:  # raises before recording its operation, while the other "slow" fault has recorded its own
            await asyncio.sleep(duration_s)
            raise RuntimeError("no such link")
        op = ctx.oplog.invoke("nemesis", "slow", {})
        await asyncio.sleep(duration_s)
        raise RuntimeError("broke after starting")

    scenario = ChaosScenario("errors", "", (E(0.0, "slow", {"duration_s": 0.5}),
                                            E(0.05, "slow", {"duration_s": 0.2, "before": True})), warmup_s=0.0)
    ops, _, _ = await _phase(scenario, {"slow": slow}, tmp_path)
    errors = {o.value["args"].get("before", False): o.value for o in ops if o.f == "nemesis_error" and o.type == OK}
    assert errors[False]["op_recorded"] is True and "broke after starting" in errors[False]["error"]
    # Not recorded, although the log gained a "slow" invoke while it ran: its own operations are what count.
    assert errors[True]["op_recorded"] is False


async def test_a_clock_ended_phase_runs_its_whole_length(tmp_path: Path) -> None:
    scenario = ChaosScenario("crashes", "", (E(0.0, "slow", {"duration_s": 0.1}),),
                             cluster=ClusterSpec(crash_at=("after_effect",)), warmup_s=0.0, fault_s=1.5)
    assert not ends_on_events(scenario)
    _, phases, _ = await _phase(scenario, {"slow": _sleeper("slow")}, tmp_path)
    assert phases["heal"] - phases["faults"] >= 1.45


async def test_an_event_ended_phase_waits_for_a_killed_worker_to_be_back(tmp_path: Path) -> None:
    worker = SimpleNamespace(down_until=0.0, process=SimpleNamespace(alive=True))

    async def kill(ctx: NemesisContext, down_s: float) -> None:
        op = ctx.oplog.invoke("nemesis", "kill", {})
        worker.down_until = time.monotonic() + down_s
        worker.process.alive = False
        asyncio.get_running_loop().call_later(down_s + 0.1, setattr, worker.process, "alive", True)  # the restart
        ctx.oplog.complete(op, OK, {})

    cluster = _Cluster()
    cluster.workers = [worker]
    scenario = ChaosScenario("kill", "", (E(0.0, "kill", {"down_s": 0.6}),), warmup_s=0.0, fault_s=30.0)
    _, phases, _ = await _phase(scenario, {"kill": kill}, tmp_path, cluster)
    assert 0.65 <= phases["heal"] - phases["faults"] < 15, phases  # its restart, not the scenario's 30 s


def test_which_scenarios_end_on_their_events() -> None:
    assert ends_on_events(SCENARIOS["kill_mid_turn"]) and ends_on_events(SCENARIOS["mixed"])
    assert not ends_on_events(SCENARIOS["crash_after_effect"])  # its faults live in the workers
    assert not ends_on_events(replace(SCENARIOS["kill_mid_turn"], events=()))


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


async def test_two_overlapping_partitions_of_one_link_hold_it_until_the_last_ends(tmp_path: Path) -> None:
    with socket.socket() as upstream:
        upstream.bind(("127.0.0.1", 0))
        upstream.listen()
        proxy = FaultProxy("temporal", ("127.0.0.1", upstream.getsockname()[1]))
        proxy.start()
        try:
            stack = SimpleNamespace(link=lambda name: proxy, workers=[], client=None)
            ctx = NemesisContext(stack, OperationLog(tmp_path / "ops.jsonl"), [], random.Random(1),  # type: ignore[arg-type]
                                 running=lambda ctx: asyncio.sleep(0, []))
            port = int(proxy.address.rsplit(":", 1)[1])
            first = asyncio.create_task(partition(ctx, mode="down", duration_s=0.6))
            await asyncio.sleep(0.2)
            second = asyncio.create_task(partition(ctx, mode="down", duration_s=0.8))
            blackhole = asyncio.create_task(partition(ctx, mode="blackhole", duration_s=0.3))
            await first
            assert not await asyncio.to_thread(_connects, port)  # the second still holds it down
            await asyncio.gather(second, blackhole)
            assert await asyncio.to_thread(_connects, port)
            assert proxy.stats()["toxics"] == []
        finally:
            proxy.stop()


async def test_overlapping_model_outages_compose(tmp_path: Path) -> None:
    applied: list[list[FaultRule]] = []
    stack = SimpleNamespace(model_server=SimpleNamespace(stats=lambda: {"faults_applied": {}}),
                            set_model_faults=lambda rules: applied.append(list(rules)), workers=[], client=None)
    ctx = NemesisContext(stack, OperationLog(tmp_path / "ops.jsonl"), [], random.Random(1))  # type: ignore[arg-type]
    first = asyncio.create_task(model_outage(ctx, status=503, duration_s=0.4))
    await asyncio.sleep(0.1)
    await asyncio.gather(first, model_outage(ctx, status=429, duration_s=0.6))
    statuses = [[r.status for r in rules] for rules in applied]
    # 503; 503 and 429 together; when the 503 ends the 429 stays in force; then none
    assert statuses == [[503], [503, 429], [429], []], statuses


async def test_an_aimed_kill_that_finds_nothing_never_thaws_a_worker_a_pause_holds(tmp_path: Path) -> None:
    from contextlib import asynccontextmanager

    from testbed.faults.nemesis import _freeze_then_kill

    signals: list[str] = []
    process = SimpleNamespace(polling_identity="w1-1", alive=True, pause=lambda: signals.append("STOP"),
                              resume=lambda: signals.append("CONT"), kill=lambda: signals.append("KILL"))

    @asynccontextmanager
    async def held() -> Any:
        yield process

    worker = SimpleNamespace(name="w1", process=process, held=held, down_until=0.0)
    stack = SimpleNamespace(workers=[worker], worker=lambda name: worker, client=None)
    ctx = NemesisContext(stack, OperationLog(tmp_path / "ops.jsonl"), [], random.Random(1))  # type: ignore[arg-type]

    async def nothing() -> list[dict[str, Any]]:
        return []

    assert await _freeze_then_kill(ctx, "w1-1", 1.0, nothing) is None
    assert signals == ["STOP", "CONT"]  # an ordinary worker is let go on
    signals.clear()
    ctx.paused.add("w1")
    assert await _freeze_then_kill(ctx, "w1-1", 1.0, nothing) is None
    assert signals == ["STOP"]  # the pause still holds it
