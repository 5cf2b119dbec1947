"""The journal backend's local stack: a scripted model server, the effect ledger and an in-process
journal worker, all on one SQLite file (what ``dah run --backend journal`` and the benchmarks use)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.contracts import AgentConfig
from agent.journal.agent_task import TASK, manifest_for
from agent.journal.records import StepRecord
from agent.journal.service import DEFAULT_LEASE_MS, JournalQueue, JournalWorker
from agent.journal.steps import configure_worker
from agent.journal.stores import SqliteStore
from harness.recording import EffectLedger


@dataclass
class JournalStack:
    db: Path
    queue: JournalQueue
    store: SqliteStore
    ledger: EffectLedger
    sandbox_root: Path
    model_server: Any

    async def run_prompt(self, config: AgentConfig, prompt: str, run_id: str | None = None,
                         timeout_s: float = 300.0) -> tuple[str, dict[str, Any]]:
        run_id = run_id or f"journal-{uuid.uuid4().hex[:12]}"
        self.queue.submit(run_id, TASK, manifest_for(config, prompt))
        return run_id, await self.queue.wait(run_id, timeout_s=timeout_s)

    async def steps(self, run_id: str) -> list[StepRecord]:
        out = []
        while (step := await self.store.load_step(run_id, len(out))) is not None:
            out.append(step)
        return out


@contextlib.asynccontextmanager
async def journal_stack(state_dir: Path, *, worker: bool = True, model_server: Any = None,
                        lease_ms: int = DEFAULT_LEASE_MS, identity: str = "in-process") -> AsyncIterator[JournalStack]:
    """``worker=False``: only the client side (workers run elsewhere on the same ``STATE_DIR/journal.sqlite3``)."""
    db = state_dir / "journal.sqlite3"
    sandbox = state_dir / "sandbox"
    async with contextlib.AsyncExitStack() as stack:
        if model_server is None and worker:
            from testbed.model_server import ScriptedModelServer
            from testbed.scripted_routes import respond

            model_server = stack.enter_context(ScriptedModelServer(respond))
        ledger = stack.enter_context(EffectLedger(sandbox / "ledger.sqlite3"))
        store = SqliteStore(db)
        stack.push_async_callback(store.close)
        queue = JournalQueue(db)
        stack.callback(queue.close)
        if worker:
            from agent import llm

            llm.preload_in_background()  # LiteLLM's ~5 s import, off the first model step
            configure_worker(ledger=ledger, sandbox_root=sandbox, model_base_url=model_server.url, identity=identity)
            stop = asyncio.Event()
            running = asyncio.create_task(JournalWorker(db, identity, lease_ms=lease_ms).run(stop))

            async def halt() -> None:
                stop.set()
                await running

            stack.push_async_callback(halt)
        yield JournalStack(db, queue, store, ledger, sandbox, model_server)
