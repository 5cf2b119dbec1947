"""``dah checkpoint``: the checkpoint engine's worker, and a client for it.

    dah checkpoint worker --db .dah/checkpoint.sqlite3        # run queued runs until Ctrl-C / SIGTERM
    dah checkpoint run --db .dah/checkpoint.sqlite3 "What is 25 * 4?"   # submit a prompt, print the answer
    dah checkpoint emit --db F --run-id R --key K --payload '{"ok": true}'   # first emit wins
    dah checkpoint steps --db F --run-id R                  # a run's steps
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import uuid
from pathlib import Path

from harness.commands import CommandParser, tool
from testbed.engines.checkpoint.service import DEFAULT_LEASE_MS


def _add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", type=Path, default=Path(".dah/checkpoint.sqlite3"),
                   help="the SQLite file holding runs, steps, events and the queue (default .dah/checkpoint.sqlite3)")


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog=f"{tool('testbed')} checkpoint",
                                     description="The checkpoint durability engine (step-checkpointed runs in SQLite).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("worker", help="run queued runs until SIGTERM/Ctrl-C")
    _add_db(p)
    p.add_argument("--state-dir", type=Path, default=Path(".dah"),
                   help="tool workspaces and the effect ledger live in STATE_DIR/sandbox (default .dah)")
    p.add_argument("--model-base-url", help="scripted model server URL (default: start one in this process)")
    p.add_argument("--identity", help="worker id recorded as the lease holder (default host:pid:random)")
    p.add_argument("--lease-ms", type=int, default=DEFAULT_LEASE_MS,
                   help=f"lease length; a dead worker's runs are taken over after it (default {DEFAULT_LEASE_MS})")
    p.add_argument("--concurrency", type=int, default=8, help="runs executed at once (default 8)")

    p = sub.add_parser("run", help="submit one prompt and print the answer (needs a worker on the same --db)")
    _add_db(p)
    p.add_argument("prompt")
    p.add_argument("--model", default="scripted", help="as for 'dah run' (default scripted)")
    p.add_argument("--run-id", help="default: checkpoint-<random>")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the answer (default 300)")

    p = sub.add_parser("emit", help="emit an event to a run (first emit wins); prints accepted or existing")
    _add_db(p)
    p.add_argument("--run-id", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--payload", default="null", help="JSON (default null)")

    p = sub.add_parser("steps", help="print a run's steps as JSON lines")
    _add_db(p)
    p.add_argument("--run-id", required=True)
    return parser


async def _worker(args: argparse.Namespace) -> int:
    from agent import llm
    from testbed.engines.checkpoint.records import derive_worker_id
    from testbed.engines.checkpoint.service import CheckpointWorker
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


async def _run(args: argparse.Namespace) -> int:
    from agent.contracts import AgentConfig
    from testbed.engines.checkpoint.agent_task import TASK, manifest_for
    from testbed.engines.checkpoint.service import CheckpointQueue
    from testbed.engines.checkpoint.stores import SqliteStore

    await SqliteStore(args.db).close()  # the store's tables, for the queue's lease check
    queue = CheckpointQueue(args.db)
    run_id = args.run_id or f"checkpoint-{uuid.uuid4().hex[:12]}"
    queue.submit(run_id, TASK, manifest_for(AgentConfig(model=args.model), args.prompt))
    print(f"run id: {run_id} (queued)", file=sys.stderr, flush=True)
    try:
        result = await queue.wait(run_id, timeout_s=args.timeout)
    except (RuntimeError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        queue.close()
    print(f"answer: {result['reply']}")
    return 0


async def _emit(args: argparse.Namespace) -> int:
    from testbed.engines.checkpoint.stores import SqliteStore

    store = SqliteStore(args.db)
    try:
        accepted, record = await store.emit_event(args.run_id, args.key, json.loads(args.payload))
    finally:
        await store.close()
    print(json.dumps({"accepted": accepted, "payload": record.payload}), flush=True)
    return 0


async def _steps(args: argparse.Namespace) -> int:
    from testbed.engines.checkpoint.stores import SqliteStore

    store = SqliteStore(args.db)
    index = 0
    while (step := await store.load_step(args.run_id, index)) is not None:
        print(json.dumps({k: v for k, v in step.to_json().items() if k != "result"} | {"result": step.result}))
        index += 1
    await store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"worker": _worker, "run": _run, "emit": _emit, "steps": _steps}[args.command]
    try:
        return asyncio.run(handler(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
