"""Run a CalcAgent worker until SIGTERM / SIGINT.

    python -m examples.third_party_agent.worker --address HOST:PORT --task-queue Q \\
        --identity ID --model-url http://127.0.0.1:PORT/v1

Prints one line containing ``AGENT-WORKER-UP`` once the worker is running.
Exits 0 on a signal, 1 if the worker itself fails (so a supervisor restarts it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from temporalio.client import Client
from temporalio.worker import Worker

from examples.third_party_agent.app import CalcAgent, ModelGateway, calculate


async def serve(address: str, task_queue: str, identity: str, model_url: str, namespace: str) -> int:
    client = await Client.connect(address, namespace=namespace, identity=identity)
    gateway = ModelGateway(model_url)
    worker = Worker(client, task_queue=task_queue, workflows=[CalcAgent],
                    activities=[gateway.call_model, calculate], identity=identity)
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
    parser = argparse.ArgumentParser(prog="python -m examples.third_party_agent.worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", required=True, help="Temporal frontend HOST:PORT")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--identity", required=True, help="worker identity shown in Temporal's histories")
    parser.add_argument("--model-url", required=True, help="OpenAI-style base URL, e.g. http://127.0.0.1:8000/v1")
    args = parser.parse_args(argv)
    return asyncio.run(serve(args.address, args.task_queue, args.identity, args.model_url, args.namespace))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip finalization: Temporal's Rust threads can abort it (temporalio/sdk-python#300)
