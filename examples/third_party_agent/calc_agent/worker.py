"""Run a CalcAgent worker until SIGTERM / SIGINT.

    python -m calc_agent.worker --address HOST:PORT --task-queue Q --identity ID \\
        --model-url http://127.0.0.1:PORT/v1 --state-dir DIR --ledger DIR/ledger.sqlite3

Prints one line containing ``AGENT-WORKER-UP`` once the worker is running.
Exits 0 on a signal, 1 if the worker itself fails (so a supervisor restarts it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

from temporalio.client import Client
from temporalio.worker import Worker

from calc_agent.app import CalcAgent, ModelGateway, Notebook, calculate
from harness.recording import EffectLedger


async def serve(address: str, task_queue: str, identity: str, model_url: str, namespace: str, state_dir: Path,
                ledger_path: Path) -> int:
    client = await Client.connect(address, namespace=namespace, identity=identity)
    ledger = EffectLedger(ledger_path)  # the harness's in-agent faults, if any, come with its environment
    (state_dir / "answers").mkdir(parents=True, exist_ok=True)
    gateway = ModelGateway(model_url, ledger, identity, answers=state_dir / "answers")
    notebook = Notebook(state_dir / "notes", ledger, identity)
    worker = Worker(client, task_queue=task_queue, workflows=[CalcAgent],
                    activities=[gateway.call_model, notebook.append_note, calculate], identity=identity)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    running = asyncio.create_task(worker.run())
    print(f"AGENT-WORKER-UP identity={identity} task_queue={task_queue}", flush=True)
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if running.done():
        stopping.cancel()
        exc = running.exception()
        print(f"worker failed fatally: {type(exc).__name__}: {exc}" if exc else "worker stopped by itself", flush=True)
        return 1
    await worker.shutdown()
    await running
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calc_agent.worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", required=True, help="Temporal frontend HOST:PORT")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--identity", required=True, help="worker identity shown in Temporal's histories")
    parser.add_argument("--model-url", required=True, help="OpenAI-style base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--state-dir", type=Path, required=True, help="the notebook lives in STATE_DIR/notes")
    parser.add_argument("--ledger", type=Path, required=True, help="the effect ledger file (harness.recording)")
    args = parser.parse_args(argv)
    return asyncio.run(serve(args.address, args.task_queue, args.identity, args.model_url, args.namespace,
                             args.state_dir, args.ledger))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip finalization: Temporal's Rust threads can abort it (temporalio/sdk-python#300)
