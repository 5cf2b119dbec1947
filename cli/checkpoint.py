"""``dah checkpoint``: a client of the checkpoint engine, and its worker (``testbed.engines.checkpoint.service``).

    dah checkpoint worker --db .dah/checkpoint.sqlite3        # run queued runs until Ctrl-C / SIGTERM
    dah checkpoint run --db .dah/checkpoint.sqlite3 "What is 25 * 4?"   # submit a prompt, print the answer
    dah checkpoint emit --db F --run-id R --key K --payload '{"ok": true}'   # first emit wins
    dah checkpoint steps --db F --run-id R                  # a run's steps
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid

from harness.commands import CommandParser, tool
from testbed.engines.checkpoint.service import add_db, main as worker


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog=f"{tool('testbed')} checkpoint",
                                     description="The checkpoint durability engine (step-checkpointed runs in SQLite).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    sub.add_parser("worker", help="run queued runs until SIGTERM/Ctrl-C", add_help=False)  # checkpoint.service

    p = sub.add_parser("run", help="submit one prompt and print the answer (needs a worker on the same --db)")
    add_db(p)
    p.add_argument("prompt")
    p.add_argument("--model", default="scripted", help="as for 'dah run' (default scripted)")
    p.add_argument("--run-id", help="default: checkpoint-<random>")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the answer (default 300)")

    p = sub.add_parser("emit", help="emit an event to a run (first emit wins); prints accepted or existing")
    add_db(p)
    p.add_argument("--run-id", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--payload", default="null", help="JSON (default null)")

    p = sub.add_parser("steps", help="print a run's steps as JSON lines")
    add_db(p)
    p.add_argument("--run-id", required=True)
    return parser


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


def main(argv: list[str]) -> int:
    if argv[:1] == ["worker"]:  # the engine's worker process, whose parser is its own
        return worker(argv)
    args = build_parser().parse_args(argv)
    handler = {"run": _run, "emit": _emit, "steps": _steps}[args.command]
    try:
        return asyncio.run(handler(args))
    except KeyboardInterrupt:
        return 130

