"""The checkpoint backend's local stack: a scripted model server, the effect ledger and an in-process
checkpoint worker, all on one SQLite file (what ``dah run --durability checkpoint`` and the benchmarks use)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.contracts import AgentConfig
from agent.checkpoint.agent_task import TASK, manifest_for
from agent.checkpoint.records import StepRecord
from agent.checkpoint.service import DEFAULT_LEASE_MS, CheckpointQueue, CheckpointWorker
from agent.checkpoint.steps import configure_worker
from agent.checkpoint.stores import SqliteStore
from harness.recording import EffectLedger


@dataclass
class CheckpointStack:
    db: Path
    queue: CheckpointQueue
    store: SqliteStore
    ledger: EffectLedger
    sandbox_root: Path
    model_server: Any

    async def run_prompt(self, config: AgentConfig, prompt: str, run_id: str | None = None,
                         timeout_s: float = 300.0) -> tuple[str, dict[str, Any]]:
        run_id = run_id or f"checkpoint-{uuid.uuid4().hex[:12]}"
        self.queue.submit(run_id, TASK, manifest_for(config, prompt))
        return run_id, await self.queue.wait(run_id, timeout_s=timeout_s)

    async def steps(self, run_id: str) -> list[StepRecord]:
        out = []
        while (step := await self.store.load_step(run_id, len(out))) is not None:
            out.append(step)
        return out


@contextlib.asynccontextmanager
async def checkpoint_stack(state_dir: Path, *, worker: bool = True, model_server: Any = None,
                        lease_ms: int = DEFAULT_LEASE_MS, identity: str = "in-process") -> AsyncIterator[CheckpointStack]:
    """``worker=False``: only the client side (workers run elsewhere on the same ``STATE_DIR/checkpoint.sqlite3``)."""
    db = state_dir / "checkpoint.sqlite3"
    sandbox = state_dir / "sandbox"
    async with contextlib.AsyncExitStack() as stack:
        if model_server is None and worker:
            from testbed.model_server import ScriptedModelServer
            from testbed.scripted_routes import respond

            model_server = stack.enter_context(ScriptedModelServer(respond))
        ledger = stack.enter_context(EffectLedger(sandbox / "ledger.sqlite3"))
        store = SqliteStore(db)
        stack.push_async_callback(store.close)
        queue = CheckpointQueue(db)
        stack.callback(queue.close)
        if worker:
            from agent import llm

            llm.preload_in_background()  # LiteLLM's ~5 s import, off the first model step
            configure_worker(ledger=ledger, sandbox_root=sandbox, model_base_url=model_server.url, identity=identity)
            stop = asyncio.Event()
            running = asyncio.create_task(CheckpointWorker(db, identity, lease_ms=lease_ms).run(stop))

            async def halt() -> None:
                stop.set()
                await running

            stack.push_async_callback(halt)
        yield CheckpointStack(db, queue, store, ledger, sandbox, model_server)
