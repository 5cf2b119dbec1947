"""The travel chat worker: runs ``TravelChat`` and the travel agent's activities on one task queue.

    OPENAI_API_KEY=sk-... python -m travel_chat.worker --address localhost:7233 --task-queue travel-chat \\
        --model-url https://api.openai.com/v1

Every flag has an environment variable (shown in ``--help``). SIGTERM or Ctrl-C stops it gracefully: it
finishes the tasks it runs, then exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal


def parse_args() -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m travel_chat.worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--address", default=env("TEMPORAL_ADDRESS", "localhost:7233"),
                   help="Temporal frontend host:port (env TEMPORAL_ADDRESS; default %(default)s)")
    p.add_argument("--namespace", default=env("TEMPORAL_NAMESPACE", "default"),
                   help="Temporal namespace (env TEMPORAL_NAMESPACE; default %(default)s)")
    p.add_argument("--task-queue", default=env("TEMPORAL_TASK_QUEUE", "travel-chat"),
                   help="task queue to poll (env TEMPORAL_TASK_QUEUE; default %(default)s)")
    p.add_argument("--identity", default=env("TEMPORAL_IDENTITY"),
                   help="worker identity shown by Temporal (env TEMPORAL_IDENTITY; default: the SDK's, pid@host)")
    p.add_argument("--model-url", default=env("OPENAI_BASE_URL"),
                   help="base URL of an OpenAI-compatible API, ending in /v1 (env OPENAI_BASE_URL; default: OpenAI's)")
    p.add_argument("--model", default=env("TRAVEL_MODEL", "gpt-4.1-mini"),
                   help="model name at that API (env TRAVEL_MODEL; default %(default)s)")
    args = p.parse_args()
    if not env("OPENAI_API_KEY"):
        p.error("OPENAI_API_KEY is not set: the OpenAI client needs one (any value, for an endpoint that takes none)")
    return args


async def main() -> None:
    args = parse_args()
    # The agent reads its configuration from the environment when it is imported (in the workflow sandbox too).
    os.environ["TRAVEL_MODEL"] = args.model
    if args.model_url:
        os.environ["OPENAI_BASE_URL"] = args.model_url

    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
    from temporalio.client import Client
    from temporalio.worker import Worker

    from travel_chat.workflow import TravelChat

    client = await Client.connect(args.address, namespace=args.namespace, plugins=[PydanticAIPlugin()])
    worker = Worker(client, task_queue=args.task_queue, workflows=[TravelChat],
                    **({"identity": args.identity} if args.identity else {}))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(worker.shutdown()))
    print(f"travel chat worker polling {args.task_queue!r} at {args.address}", flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
