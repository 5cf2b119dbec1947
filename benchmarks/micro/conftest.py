"""Fixtures of the micro-benchmarks: a large, consistent synthetic chaos run
directory (built once per session) and an event loop for the async PTC
interpreter.

The run directory has the layout ``chaos.runner`` saves and the checkers read:
``operations.jsonl`` (one ``harness.operations.Op`` per line), ``conversations.json``
(the final reads), ``run.json``, the per-conversation workspaces under
``state/sandbox/``, the effect ledger ``state/sandbox/ledger.sqlite3`` and
worker logs. It is built from the project's own pieces (``plan_message``,
``Op.as_dict``, ``EffectLedger``'s schema, ``workspace_for``) so its format
follows theirs. Everything in it is consistent: every checker that only reads
files must say ``pass``. No Temporal histories are saved (``histories/`` is
absent), so ``temporal_history`` and ``replay`` are not benchmarked.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from agent.tools import workspace_for
from agent.worker import LEDGER, WORKSPACES, WorkerSettings
from harness.recording import EffectLedger, write_ledger_rows
from harness.rundir import OPERATIONS, RunDir
from testbed.engines.workload import Workload, chaos_agent_config, plan_message
from harness.operations import INFO, INVOKE, OK, Op

CONVERSATIONS = 50
MESSAGES_PER_CONVERSATION = 97  # 50 x (start + 97 sends + end_chat + read) x (invoke + completion) = 10,000 client ops
KILLS = 5
SYSTEM_PROMPT = ("You are a durable agent. Use the tools for arithmetic, weather and files; files live in your "
                 "private workspace and paths are relative to it. When a tool reports an error, repair your call "
                 "or explain the failure. Answer concisely.")


def turn_messages(planned: Any, call_id: str) -> list[dict[str, Any]]:
    """One answered turn in OpenAI chat format: user, assistant tool call, tool result, final assistant reply."""
    if planned.kind == "append":
        name, args, result = "append_file", {"path": planned.path, "content": planned.content}, planned.expect
    else:
        expression = planned.text.removeprefix("What is ").removesuffix("?")
        name, args, result = "calculator", {"expression": expression}, planned.expect.rsplit(" = ", 1)[1]
    return [
        {"content": planned.text, "role": "user"},
        {"content": None, "role": "assistant",
         "tool_calls": [{"function": {"arguments": json.dumps(args), "name": name}, "id": call_id, "type": "function"}]},
        {"content": result, "name": name, "role": "tool", "tool_call_id": call_id},
        {"content": planned.expect, "role": "assistant"},
    ]


class _Writer:
    """Appends ``Op`` lines exactly as ``harness.operations.OperationLog`` does, with a deterministic clock."""

    def __init__(self, path: Path, t0_wall: float = 1_795_000_000.0) -> None:
        self.lines: list[str] = []
        self.path = path
        self.t = 0.0
        self.t0_wall = t0_wall
        self.client_ops = 0

    def _append(self, op: Op) -> Op:
        op.index = len(self.lines)
        self.t += 0.003
        op.time, op.wall = self.t, self.t0_wall + self.t
        self.lines.append(json.dumps(op.as_dict(), default=str))
        self.client_ops += op.process.startswith("client")
        return op

    def invoke(self, process: str, f: str, value: Any = None) -> Op:
        return self._append(Op(0, process, INVOKE, f, value))

    def complete(self, inv: Op, type_: str, value: Any = None, error: str | None = None) -> Op:
        return self._append(Op(0, inv.process, type_, inv.f, value, error=error, invoke_index=inv.index))

    def event(self, process: str, f: str, value: Any = None) -> None:
        self.complete(self.invoke(process, f, value), OK, value)

    def save(self) -> None:
        self.path.write_text("\n".join(self.lines) + "\n", encoding="utf-8")


def build_run_dir(run_dir: Path, conversations: int = CONVERSATIONS, messages: int = MESSAGES_PER_CONVERSATION,
                  seed: int = 0) -> dict[str, int]:
    """Write a consistent run of ``conversations`` x ``messages`` turns to ``run_dir``; returns its sizes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    run = _SyntheticRun(run_dir, conversations, messages, seed)
    run.operations()
    run.write_conversations()
    RunDir(run_dir).begin(
        "chaos", "micro_bench_synthetic", seed=seed, reproduce="(synthetic: benchmarks/micro/conftest.py)",
        scenario={"name": "micro_bench_synthetic", "description": "synthetic, consistent"},
        schedule=[{"at_s": 1.0 + k, "op": "kill_worker", "args": {"when": "busy"}} for k in range(KILLS)],
        target={"name": "reference-agent", "model_activity": "plan_next_action", "ledger": LEDGER,
                "workspace": WORKSPACES})
    run.write_ledger()
    _write_worker_logs(run_dir / "logs", run.tag)
    return {"history_lines": len(run.h.lines), "client_ops": run.h.client_ops, "info_sends": run.info_sends,
            "conversations": conversations, "messages_per_conversation": 1 + 4 * messages,
            "ledger_executions": len(run.executions), "effects": len(run.effects)}


class _SyntheticRun:
    """The run ``build_run_dir`` writes: its operation log as it goes, and the ledger rows and conversations that
    agree with it (every answer right, each kill landing mid model call, a few tool calls run twice but applied
    once)."""

    tag = "bench0"

    def __init__(self, run_dir: Path, conversations: int, messages: int, seed: int) -> None:
        self.run_dir, self.messages = run_dir, messages
        self.rng = random.Random(seed)
        self.wids = [f"chaos-{self.tag}-{i}" for i in range(conversations)]
        self.workload = Workload(conversations=conversations, messages=messages, append_ratio=0.4)
        self.h = _Writer(run_dir / OPERATIONS)
        self.planned: dict[str, list[Any]] = {w: [] for w in self.wids}
        self.msg_rngs = {w: random.Random(f"{seed}-messages-{i}") for i, w in enumerate(self.wids)}
        self.executions: list[tuple] = []
        self.effects: list[tuple] = []
        self.applications: list[tuple] = []
        self.info_sends = 0

    def operations(self) -> None:
        """The operation log: setup, the turns with ``KILLS`` kills spread among them, heal, the final reads."""
        h = self.h
        h.event("generator", "phase:setup")
        h.event("generator", "phase:warm-up")
        for i, wid in enumerate(self.wids):
            h.complete(h.invoke(f"client-{i}", "start_conversation", {"conversation": wid}), OK)
        kill_rounds = {self.messages * (k + 1) // (KILLS + 1): k for k in range(KILLS)}
        for n in range(self.messages):
            if n == self.messages // 10:
                h.event("generator", "phase:faults")
            if n in kill_rounds:
                self.kill(kill_rounds[n])
            self.turn(n)
        h.event("generator", "phase:heal")
        for i, wid in enumerate(self.wids):
            inv = h.invoke(f"client-{i}", "end_chat", {"conversation": wid})
            h.complete(inv, OK, {"reply": None, "turns": self.messages, "messages": 1 + 4 * self.messages,
                                 "run_index": 0, "ended_by": "end_chat"})
        for i, wid in enumerate(self.wids):
            inv = h.invoke(f"client-{i}", "read_conversation", {"conversation": wid})
            h.complete(inv, OK, {"messages": 1 + 4 * self.messages, "status": "COMPLETED"})
        h.event("generator", "phase:final")
        h.save()

    def kill(self, k: int) -> None:
        """The ``k``-th kill: the victim died mid model call, so its execution never finished (the ledger proves
        the fault landed)."""
        identity, wid = f"w{k % 2 + 1}-{k // 2 + 1}", self.wids[k]
        self.executions.append((f"{wid}/run-0/kill-{k}", wid, "run-0", f"kill-{k}", 1, "plan_next_action",
                                identity, self.h.t0_wall + self.h.t, None, None))
        inv = self.h.invoke("nemesis", "kill_worker", {"when": "busy", "activity": "plan_next_action", "down_s": 1.0})
        self.h.complete(inv, OK, {"worker": identity.split("-")[0], "identity": identity,
                                  "evidence": [{"running_activity": "plan_next_action", "workflow_id": wid}],
                                  "down_s": 1.0})

    def turn(self, n: int) -> None:
        """Message ``n`` of every conversation, sent at once, answered in a shuffled order; its ledger rows."""
        h, invokes = self.h, []
        for i, wid in enumerate(self.wids):
            msg = plan_message(wid, n, self.msg_rngs[wid], self.workload.append_ratio)
            self.planned[wid].append(msg)
            invokes.append(h.invoke(f"client-{i}", "send_message", {"conversation": wid, "n": n, "text": msg.text,
                                                                     "expect": msg.expect, "match": msg.match}))
        order = list(range(len(self.wids)))
        self.rng.shuffle(order)  # concurrent clients: completions interleave
        for i in order:
            wid, msg, inv = self.wids[i], self.planned[self.wids[i]][n], invokes[i]
            if self.rng.random() < 0.02:  # a timed-out send that was processed anyway: info, in the conversation once
                self.info_sends += 1
                h.complete(inv, INFO, error="TimeoutError: update did not return within 60.0 s")
            else:
                h.complete(inv, OK, {"reply": msg.expect, "turn": n + 1})
            self.ledger_rows(wid, n, msg)

    def ledger_rows(self, wid: str, n: int, msg: Any) -> None:
        """Two model calls and one tool call per turn; 5% of tool calls re-executed (attempt 2), deduplicated."""
        t = self.h.t0_wall + self.h.t
        tool_name = "append_file" if msg.kind == "append" else "calculator"
        for a, tool in ((f"{3 * n}", "plan_next_action"), (f"{3 * n + 1}", tool_name),
                        (f"{3 * n + 2}", "plan_next_action")):
            key = f"{wid}/run-0/{a}"
            attempts = 2 if tool != "plan_next_action" and self.rng.random() < 0.05 else 1
            for attempt in range(1, attempts + 1):
                self.executions.append((key, wid, "run-0", a, attempt, tool, f"w{attempt}-1", t, t + 0.01, "ok"))
            if tool == "append_file":
                self.effects.append((key, wid, tool, msg.path, f"sha-{n}", "applied", 1, msg.expect, 1, 1, t))
                self.applications.append((key, wid, tool, msg.path, 1, "w1-1", t))

    def write_conversations(self) -> None:
        """``conversations.json`` (each conversation's final history) and the workspaces' appended files."""
        sandbox = WorkerSettings.in_state_dir(self.run_dir / "state").sandbox_root
        convs = []
        for wid in self.wids:
            history = [{"content": SYSTEM_PROMPT, "role": "system"}]
            for n, msg in enumerate(self.planned[wid]):
                history += turn_messages(msg, f"call_{4 * n + 2}_0")
            convs.append({"workflow_id": wid, "planned": [asdict(m) for m in self.planned[wid]], "started": True,
                          "final_history": history, "final_status": "COMPLETED",
                          "result": {"ended_by": "end_chat", "messages": len(history), "reply": None,
                                     "run_index": 0, "turns": self.messages}})
            appends: dict[str, str] = {}
            for msg in self.planned[wid]:
                if msg.kind == "append":
                    appends[msg.path] = appends.get(msg.path, "") + msg.content
            ws = workspace_for(sandbox, wid)
            ws.mkdir(parents=True, exist_ok=True)
            for path, text in appends.items():
                (ws / path).write_text(text)
        (self.run_dir / "conversations.json").write_text(json.dumps(
            {"workload": asdict(self.workload), "config": asdict(chaos_agent_config()), "conversations": convs},
            indent=2, default=str))

    def write_ledger(self) -> None:
        """The ledger: the project's own schema, filled through the recording API (one transaction per table)."""
        ledger_path = self.run_dir / "state" / LEDGER
        EffectLedger(ledger_path).close()
        columns = {"executions": ("idempotency_key", "workflow_id", "run_id", "activity_id", "attempt", "tool",
                                  "worker", "started_at", "finished_at", "outcome", "kind"),
                   "effects": ("idempotency_key", "workflow_id", "tool", "target", "digest", "state", "apply_count",
                               "result", "first_attempt", "applied_attempt", "updated_at"),
                   "applications": ("idempotency_key", "workflow_id", "tool", "target", "attempt", "worker", "at")}
        rows = {"executions": [(*e, "model" if e[5] == "plan_next_action" else "tool") for e in self.executions],
                "effects": self.effects, "applications": self.applications}
        for table, cols in columns.items():
            write_ledger_rows(ledger_path, table, [dict(zip(cols, r)) for r in rows[table]])


def _write_worker_logs(logs: Path, tag: str) -> None:
    """Worker logs: mostly noise, a few tracebacks (the stats checker scans them)."""
    logs.mkdir(exist_ok=True)
    for name in ("w1-1", "w2-1", "w1-2"):
        lines = []
        for j in range(2000):
            lines.append(f"2026-11-22 10:00:{j % 60:02d} INFO activity completed workflow_id=chaos-{tag}-{j % 50}")
            if j % 400 == 399:
                lines += ["Traceback (most recent call last):", '  File "agent/activities.py", line 1, in run',
                          "    raise ConnectionResetError(104)", "ConnectionResetError: [Errno 104] Connection reset"]
        (logs / f"{name}.log").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="session")
def synthetic_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    run_dir = tmp_path_factory.mktemp("micro") / "run"
    sizes = build_run_dir(run_dir)
    return run_dir, sizes


@pytest.fixture(scope="module")
def bench_loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A private event loop for sync benchmark functions (pytest-asyncio's session loop is not running then)."""
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
