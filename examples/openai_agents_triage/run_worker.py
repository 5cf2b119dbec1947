# The customer-service sample's worker (temporalio/samples-python, openai_agents/customer_service/run_worker.py at
# e652a4d0e8; MIT License, Copyright (c) 2022 Temporal Technologies Inc.: see LICENSE), with its hard-coded server
# and task queue made flags and its model endpoint given by --model-url.
"""The customer-service worker: runs ``CustomerServiceWorkflow`` with ``OpenAIAgentsPlugin`` on one task queue.

    OPENAI_API_KEY=sk-... python -m run_worker --address localhost:7233 --task-queue openai-agents-task-queue \\
        --model-url https://api.openai.com/v1

Every flag has an environment variable (shown in ``--help``). SIGTERM or Ctrl-C stops it gracefully: it
finishes the tasks it runs, then exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from datetime import timedelta

# The SDK exports traces to OpenAI's platform whatever endpoint answers (the workflow opens a trace per message):
# off unless asked for (=false).
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "true")

from temporalio.client import Client  # noqa: E402
from temporalio.contrib.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from openai_agents.customer_service.workflows.customer_service_workflow import (  # noqa: E402
    CustomerServiceWorkflow,
)


def parse_args() -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m run_worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--address", default=env("TEMPORAL_ADDRESS", "localhost:7233"),
                   help="Temporal frontend host:port (env TEMPORAL_ADDRESS; default %(default)s)")
    p.add_argument("--namespace", default=env("TEMPORAL_NAMESPACE", "default"),
                   help="Temporal namespace (env TEMPORAL_NAMESPACE; default %(default)s)")
    p.add_argument("--task-queue", default=env("TEMPORAL_TASK_QUEUE", "openai-agents-task-queue"),
                   help="task queue to poll (env TEMPORAL_TASK_QUEUE; default %(default)s, the sample's)")
    p.add_argument("--identity", default=env("TEMPORAL_IDENTITY"),
                   help="worker identity shown by Temporal (env TEMPORAL_IDENTITY; default: the SDK's, pid@host)")
    p.add_argument("--model-url", default=env("OPENAI_BASE_URL"),
                   help="base URL of an API serving OpenAI's Responses API, ending in /v1 (env OPENAI_BASE_URL; "
                        "default: OpenAI's)")
    args = p.parse_args()
    if not env("OPENAI_API_KEY"):
        p.error("OPENAI_API_KEY is not set: the OpenAI client needs one (any value, for an endpoint that takes none)")
    return args


def make_plugin() -> OpenAIAgentsPlugin:
    """The plugin as the sample's worker builds it: each model call an activity of at most 30 s, through the
    SDK's default provider (the Responses API at ``OPENAI_BASE_URL``). A replay of its histories needs it too."""
    return OpenAIAgentsPlugin(model_params=ModelActivityParameters(start_to_close_timeout=timedelta(seconds=30)))


async def main() -> None:
    args = parse_args()
    if args.model_url:
        os.environ["OPENAI_BASE_URL"] = args.model_url  # read by the OpenAI client the model activity makes
    client = await Client.connect(args.address, namespace=args.namespace, plugins=[make_plugin()])
    worker = Worker(client, task_queue=args.task_queue, workflows=[CustomerServiceWorkflow],
                    **({"identity": args.identity} if args.identity else {}))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(worker.shutdown()))
    print(f"customer service worker polling {args.task_queue!r} at {args.address}", flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
