"""The checkpoint engine as a service: a queue of runs in the SQLite file, and workers that run them.

A client submits a run (task name + manifest) and waits for its result; any
number of worker processes poll the same database file, take a run whose
lease is free or expired (``start_or_resume`` decides: a live lease held by
another worker refuses), and execute it with ``run_durable``. A worker that
dies mid-run stops renewing its lease; once the lease expires another worker
resumes the run from its committed steps. Recovery time is about one lease.

    dah checkpoint worker --db .dah/checkpoint.sqlite3 --model-base-url http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.commands import CommandParser, tool
from harness.durable_files import connect_wal
from testbed.engines.checkpoint.records import DurableRunError, DurableRunManifest, LeaseHeldError, canonical_json
from testbed.engines.checkpoint.durable_run import run_durable
from testbed.engines.checkpoint.steps import resolve
from testbed.engines.checkpoint.stores import SqliteStore

log = logging.getLogger(__name__)
DEFAULT_LEASE_MS = 5_000

_QUEUE_SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoint_queue (
    run_id TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    manifest TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('queued', 'done', 'failed')),
    result TEXT,
    error TEXT,
    finished_at REAL,
    finished_by TEXT
);
"""


class CheckpointQueue:
    """Runs waiting for a worker, and their results (same SQLite file as the store)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db = connect_wal(self.path)
        self._db.executescript(_QUEUE_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def submit(self, run_id: str, task: str, manifest: DurableRunManifest) -> bool:
        """Queue a run; False if that run id was already submitted (a resubmission is idempotent)."""
        data = canonical_json(asdict(manifest))
        return self._db.execute(
            "INSERT OR IGNORE INTO checkpoint_queue (run_id, task, manifest, submitted_at, status)"
            " VALUES (?, ?, ?, ?, 'queued')", (run_id, task, data, time.time())).rowcount == 1

    def queued(self) -> list[tuple[str, str, DurableRunManifest]]:
        """Queued runs whose lease is free or expired (the store's lease decides who finally gets one)."""
        now = time.time()
        rows = self._db.execute(
            "SELECT q.run_id, q.task, q.manifest FROM checkpoint_queue q LEFT JOIN durable_runs r ON r.run_id = q.run_id"
            " WHERE q.status = 'queued' AND (r.run_id IS NULL OR r.lease_holder_id IS NULL OR r.lease_expires_at <= ?)"
            " ORDER BY q.submitted_at", (now,)).fetchall()
        return [(r["run_id"], r["task"], DurableRunManifest(**json.loads(r["manifest"]))) for r in rows]

    def finish(self, run_id: str, worker: str, result: Any = None, error: str | None = None) -> None:
        self._db.execute(
            "UPDATE checkpoint_queue SET status = ?, result = ?, error = ?, finished_at = ?, finished_by = ?"
            " WHERE run_id = ? AND status = 'queued'",
            ("failed" if error else "done", None if error else json.dumps(result), error, time.time(), worker,
             run_id))

    def outcome(self, run_id: str) -> tuple[str, Any, str | None] | None:
        row = self._db.execute("SELECT status, result, error FROM checkpoint_queue WHERE run_id = ?",
                               (run_id,)).fetchone()
        if row is None:
            return None
        return row["status"], json.loads(row["result"]) if row["result"] else None, row["error"]

    async def wait(self, run_id: str, timeout_s: float = 300.0, poll_s: float = 0.01) -> Any:
        """The run's result; raises ``RuntimeError`` with the run's error if it failed."""
        deadline = time.monotonic() + timeout_s
        while True:
            out = self.outcome(run_id)
            if out is None:
                raise KeyError(f"run {run_id!r} was never submitted")
            status, result, error = out
            if status == "done":
                return result
            if status == "failed":
                raise RuntimeError(f"run {run_id!r} failed: {error}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id!r} did not finish within {timeout_s:g} s")
            await asyncio.sleep(poll_s)


class CheckpointWorker:
    """Polls the queue and runs what it can take, ``concurrency`` runs at a time."""

    def __init__(self, db: str | Path, worker_id: str, *, lease_ms: int = DEFAULT_LEASE_MS, concurrency: int = 8,
                 poll_s: float = 0.01) -> None:
        self.store = SqliteStore(db)  # creates the store's tables before the queue joins them
        self.queue = CheckpointQueue(db)
        self.worker_id = worker_id
        self.lease_ms = lease_ms
        self.concurrency = concurrency
        self.poll_s = poll_s
        self._running: dict[str, asyncio.Task] = {}

    async def _execute(self, run_id: str, task: str, manifest: DurableRunManifest) -> None:
        try:
            out = await run_durable(run_id, manifest, self.store, resolve(task), worker_id=self.worker_id,
                                    lease_ms=self.lease_ms)
        except LeaseHeldError:
            return  # another worker has it (we raced, or lost the lease): it will finish the run
        except DurableRunError as exc:  # divergence, mismatched input: no retry can fix it
            log.error("run %s failed: %s", run_id, exc)
            self.queue.finish(run_id, self.worker_id, error=f"{exc.code}: {exc}")
            return
        except Exception as exc:  # a step gave up (a non-retryable error): the run fails with it
            log.warning("run %s failed: %s", run_id, exc)
            with contextlib.suppress(LeaseHeldError):
                await self.store.end_run(run_id, self.worker_id, "failed")
            self.queue.finish(run_id, self.worker_id, error=f"{type(exc).__name__}: {exc}")
            return
        log.info("run %s completed (%d steps replayed, %d executed)", run_id, out.replayed, out.executed)
        self.queue.finish(run_id, self.worker_id, result=out.result)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                for run_id in [r for r, t in self._running.items() if t.done()]:
                    del self._running[run_id]
                if len(self._running) < self.concurrency:
                    for run_id, task, manifest in self.queue.queued():
                        if run_id in self._running or len(self._running) >= self.concurrency:
                            continue
                        self._running[run_id] = asyncio.create_task(self._execute(run_id, task, manifest))
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.poll_s)
        finally:
            for t in self._running.values():
                t.cancel()
            await asyncio.gather(*self._running.values(), return_exceptions=True)
            self.queue.close()
            await self.store.close()


# -- the worker process (dah worker --durability checkpoint)


def add_db(p: argparse.ArgumentParser) -> None:
    """``--db``: the worker's and every ``dah checkpoint`` client command's."""
    p.add_argument("--db", type=Path, default=Path(".dah/checkpoint.sqlite3"),
                   help="the SQLite file holding runs, steps, events and the queue (default .dah/checkpoint.sqlite3)")


def main(argv: list[str]) -> int:
    """``dah worker --durability checkpoint ...`` and ``dah checkpoint worker ...`` (``argv`` from ``worker``): this
    engine's worker process, with a parser of its own, as the other engines' workers have."""
    parser = CommandParser(prog=f"{tool('testbed')} checkpoint")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = sub.add_parser("worker", help="run queued runs until SIGTERM/Ctrl-C")
    add_db(p)
    p.add_argument("--state-dir", type=Path, default=Path(".dah"),
                   help="tool workspaces and the effect ledger live in STATE_DIR/sandbox (default .dah)")
    p.add_argument("--model-base-url", help="scripted model server URL (default: start one in this process)")
    p.add_argument("--identity", help="worker id recorded as the lease holder (default host:pid:random)")
    p.add_argument("--lease-ms", type=int, default=DEFAULT_LEASE_MS,
                   help=f"lease length; a dead worker's runs are taken over after it (default {DEFAULT_LEASE_MS})")
    p.add_argument("--concurrency", type=int, default=8, help="runs executed at once (default 8)")
    try:
        return asyncio.run(_worker(parser.parse_args(argv)))
    except KeyboardInterrupt:
        return 130


async def _worker(args: argparse.Namespace) -> int:
    """Run queued runs until SIGINT or SIGTERM; ``READY`` once polling, ``WARM`` once the model client is loaded."""
    from agent import llm
    from testbed.engines.checkpoint.records import derive_worker_id
    from testbed.engines.checkpoint.steps import configure_worker
    from agent.worker import WorkerSettings
    from testbed.stack import StackSpec, stack

    if args.lease_ms < 100 or args.concurrency < 1:
        print("error: --lease-ms must be at least 100 and --concurrency at least 1", file=sys.stderr)
        return 2
    identity = args.identity or derive_worker_id()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # The stack opens the ledger and, without --model-base-url, starts this worker's own scripted model server;
    # the worker runs here, under this process's own signals.
    spec = StackSpec(state_dir=args.state_dir, model=args.model_base_url is None,
                     model_url=args.model_base_url, ledger=True)
    async with stack(spec) as s:
        configure_worker(ledger=s.ledger, sandbox_root=WorkerSettings.in_state_dir(args.state_dir).sandbox_root,
                         model_base_url=s.model_url, identity=identity)
        worker = CheckpointWorker(args.db, identity, lease_ms=args.lease_ms, concurrency=args.concurrency)
        llm.preload_in_background()  # LiteLLM's import takes seconds: not inside the first model step

        async def announce_warm() -> None:
            await llm.wait_loaded()
            print("WARM model client loaded", flush=True)  # supervisors may wait for this before sending load

        warm = asyncio.create_task(announce_warm())
        print(f"READY checkpoint worker identity={identity} db={args.db} model={s.model_url} "
              f"lease_ms={args.lease_ms}", flush=True)
        try:
            await worker.run(stop)
        finally:
            warm.cancel()
    return 0
