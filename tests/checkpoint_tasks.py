"""Task functions for the checkpoint engine's multi-process tests (importable by worker processes)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from testbed.engines.checkpoint.records import DurableRunManifest
from testbed.engines.checkpoint.steps import current_step, step_call


async def mark(path: str, i: int, sleep_s: float) -> int:
    """Append '<worker> <step index>' (a visible side effect per execution), then take a while."""
    with open(path, "a") as f:
        f.write(f"{current_step().worker_id} {i}\n")
        f.flush()
        os.fsync(f.fileno())
    await asyncio.sleep(sleep_s)
    return i * i


async def counting_task(ctx: Any) -> dict[str, Any]:
    out = []
    for i in range(ctx.input["steps"]):
        out.append(await ctx.step(f"mark:{i}", step_call(mark, path=ctx.input["path"], i=i,
                                                         sleep_s=ctx.input["sleep_s"]), kind="tool"))
    return {"squares": out}


def manifest(path: Path, steps: int, sleep_s: float) -> DurableRunManifest:
    return DurableRunManifest(project_id="tests", task={"id": "counting"},
                              input={"path": str(path), "steps": steps, "sleep_s": sleep_s})


def main() -> int:
    """``python -m tests.checkpoint_tasks race``: say READY, wait for the go file, then try to run one run."""
    from testbed.engines.checkpoint.records import LeaseHeldError
    from testbed.engines.checkpoint.durable_run import run_durable
    from testbed.engines.checkpoint.stores import SqliteStore

    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--worker", required=True)
    p.add_argument("--path", required=True)
    p.add_argument("--go", type=Path, required=True, help="a file whose appearance starts every racer at once")
    args = p.parse_args()

    async def go() -> str:
        store = SqliteStore(args.db)
        print("READY", flush=True)  # started and imported: a busy machine's start-up is behind it
        while not args.go.exists():
            await asyncio.sleep(0.001)
        try:
            await run_durable(args.run_id, manifest(Path(args.path), 3, 0.2), store, counting_task,
                              worker_id=args.worker, lease_ms=10_000)
            return "won"
        except LeaseHeldError:
            return "lease_held"
        finally:
            await store.close()

    print(json.dumps({"worker": args.worker, "outcome": asyncio.run(go())}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
