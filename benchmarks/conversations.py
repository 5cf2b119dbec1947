"""Timed conversations: the durable agent (a Workflow Update per turn) and the plain loop.

A *series* is one conversation of ``warmup + turns`` messages of one workload,
each timed from the client. Durable and plain series take the same inputs;
with the same latency seed, the scripted model sleeps the same sequence of
latencies in both, so turn ``i`` of one is comparable with turn ``i`` of the other.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from agent.contracts import AgentConfig, AgentInput, AgentReply, ChatMessage
from harness.recording import EffectLedger
from agent.llm import is_scripted
from agent.workflow import AgentWorkflow
from benchmarks.breakdown import breakdown_by_update, with_client
from benchmarks.plain import PlainConversation, PlainEffects
from harness.event_history import fetch_histories, save_chain

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    prompt: Callable[[int], str]
    expect: Callable[[int], str]  # the scripted model's reply contains this


WORKLOADS: dict[str, Workload] = {
    w.name: w for w in [
        Workload("reply", "'Reply with the number i': one model call per turn (the reference's benchmark)",
                 lambda i: f"Reply with the number {i}", lambda i: str(i)),
        Workload("tool", "'What is i * 7?': model call, calculator activity, model call",
                 lambda i: f"What is {i} * 7?", lambda i: f"= {i * 7}"),
    ]
}


class BenchError(RuntimeError):
    """A benchmark could not produce a trustworthy figure (a wrong reply, a failed turn)."""


def _check(series: str, model: str, workload: Workload, i: int, reply: str) -> None:
    # A live model answers in its own words: only the scripted model's replies are checked exactly.
    if is_scripted(model) and workload.expect(i) not in reply:
        raise BenchError(f"{series}: turn {i} answered {reply[:120]!r}, expected it to contain {workload.expect(i)!r}")


def series_record(name: str, section: str, loop: str, model_mode: str, workload: Workload, model_latency: str,
                  server: str | None, eager: bool | None, turns: list[dict[str, Any]]) -> dict[str, Any]:
    return {"name": name, "section": section, "loop": loop, "model_mode": model_mode, "workload": workload.name,
            "model_latency": model_latency, "server": server, "eager": eager, "turns": turns}


class DurableConversation:
    """One conversation workflow driven a turn at a time (``await turn(n)``), so that another series can take its
    turns in between (the overhead section's A B A B); ``finish()`` ends it and reads its event history."""

    def __init__(self, client: Client, task_queue: str, config: AgentConfig, workload: Workload, *, name: str,
                 warmup: int, histories_dir: Path | None) -> None:
        self.client, self.task_queue, self.config, self.workload = client, task_queue, config, workload
        self.name, self.warmup, self.histories_dir = name, warmup, histories_dir
        self.wid = f"bench-{name.replace('/', '-')}-{uuid.uuid4().hex[:8]}"
        self.chat: WorkflowHandle | None = None
        self.timed: list[tuple[int, str, float, int]] = []

    async def start(self) -> None:
        await self.client.start_workflow(AgentWorkflow.run, AgentInput(config=self.config), id=self.wid,
                                         task_queue=self.task_queue)
        self.chat = self.client.get_workflow_handle_for(AgentWorkflow.run, self.wid)  # follows continue-as-new

    async def turn(self, n: int) -> int:
        """Message ``n`` (1-based, warm-up included); the measured turn's index ``i`` (<= 0: a warm-up turn)."""
        assert self.chat is not None, "start() first"
        i = n - self.warmup
        uid = f"turn-{i}" if i > 0 else f"warmup-{n}"
        started = time.perf_counter()
        reply: AgentReply = await self.chat.execute_update(AgentWorkflow.send_message,
                                                           ChatMessage(self.workload.prompt(n)), id=uid)
        ms = (time.perf_counter() - started) * 1000.0
        _check(self.name, self.config.model, self.workload, n, reply.text)
        if i > 0:
            self.timed.append((i, uid, ms, reply.steps))
        return i

    async def end(self) -> None:
        if self.chat is None:
            return
        try:
            await self.chat.signal(AgentWorkflow.end_chat)
            await self.chat.result()
        except Exception as exc:  # the figures are what matter; a conversation that will not end is logged
            log.warning("%s: conversation %s did not end cleanly: %s", self.name, self.wid, exc)

    async def results(self) -> tuple[list[dict], list[dict]]:
        """(per-turn latency rows, per-turn breakdown rows), from the timings and the event history."""
        chain = await fetch_histories(self.client, self.wid)
        if self.histories_dir is not None:
            save_chain(chain, self.histories_dir / self.name.replace("/", "__") / self.wid)
        parts = breakdown_by_update(h for _, h in chain)
        rows, breakdown = [], []
        for i, uid, ms, steps in self.timed:
            b = parts.get(uid)
            rows.append({"i": i, "client_ms": round(ms, 3), "model_ms": round(b["model_ms"], 3) if b else None,
                         "steps": steps, "activities": b["act_count"] if b else None})
            if b is not None:
                breakdown.append({"i": i, **with_client(b, ms)})
        return rows, breakdown


async def durable_series(client: Client, task_queue: str, config: AgentConfig, workload: Workload, *, name: str,
                         turns: int, warmup: int, histories_dir: Path | None,
                         after_turn: Callable[[int, WorkflowHandle], Awaitable[None]] | None = None
                         ) -> tuple[list[dict], list[dict]]:
    """Run one conversation workflow; (per-turn latency rows, per-turn breakdown rows).

    ``await after_turn(i, conversation handle)`` runs after each measured turn, outside the timing.
    """
    conversation = DurableConversation(client, task_queue, config, workload, name=name, warmup=warmup,
                                       histories_dir=histories_dir)
    await conversation.start()
    try:
        for n in range(1, warmup + turns + 1):
            i = await conversation.turn(n)
            if i > 0 and after_turn is not None:
                await after_turn(i, conversation.chat)
    finally:
        await conversation.end()
    return await conversation.results()


async def plain_series(model: str, scripted_base_url: str | None, ledger: EffectLedger, sandbox_root: Path,
                       tools: list[str], workload: Workload, *, name: str, turns: int, warmup: int,
                       one_shot: bool = False) -> list[dict[str, Any]]:
    """``one_shot``: every turn a fresh conversation (as the checkpoint engine's runs are), not one growing one."""
    effects = PlainEffects(model=model, scripted_base_url=scripted_base_url, ledger=ledger, sandbox_root=sandbox_root,
                           run_key=f"bench-{name.replace('/', '-')}-{uuid.uuid4().hex[:8]}")
    conversation = PlainConversation(effects, tools)
    rows = []
    for n in range(1, warmup + turns + 1):
        i = n - warmup
        if one_shot:
            conversation = PlainConversation(effects, tools)
        effects.model_ms, calls_before = 0.0, effects.model_calls + effects.tool_calls
        started = time.perf_counter()
        reply, steps = await conversation.send(workload.prompt(n))
        ms = (time.perf_counter() - started) * 1000.0
        _check(name, model, workload, n, reply)
        if i > 0:
            rows.append({"i": i, "client_ms": round(ms, 3), "model_ms": round(effects.model_ms, 3), "steps": steps,
                         "activities": effects.model_calls + effects.tool_calls - calls_before})
    return rows


async def checkpoint_series(store: Any, config: AgentConfig, workload: Workload, *, name: str, turns: int,
                         warmup: int) -> list[dict[str, Any]]:
    """Table 2's durable series on the checkpoint engine: each turn one run of the agent task (in process,
    ``run_durable`` on the SQLite store); the model's own latency summed from the run's ``llm`` steps."""
    from testbed.engines.checkpoint.agent_task import agent_task, manifest_for
    from testbed.engines.checkpoint.durable_run import run_durable

    rows = []
    for n in range(1, warmup + turns + 1):
        i = n - warmup
        run_id = f"bench-{name.replace('/', '-')}-{uuid.uuid4().hex[:8]}"
        started = time.perf_counter()
        out = await run_durable(run_id, manifest_for(config, workload.prompt(n)), store, agent_task,
                                worker_id="bench")
        ms = (time.perf_counter() - started) * 1000.0
        _check(name, config.model, workload, n, out.result["reply"])
        if i > 0:
            model_ms = sum(s.result["latency_ms"] for s in out.steps if s.kind == "llm")
            rows.append({"i": i, "client_ms": round(ms, 3), "model_ms": round(model_ms, 3),
                         "steps": out.result["steps"], "activities": len(out.steps)})
    return rows
