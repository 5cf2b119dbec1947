"""The notes chat worker: runs ``ChatWorkflow``, the model activities and ``save_note`` on one task queue.

    python -m oai_chat.worker --address localhost:7233 --task-queue notes-chat \\
        --model-url https://api.openai.com/v1 --effects-url http://127.0.0.1:8080

Every flag has an environment variable (shown in ``--help``). SIGTERM or Ctrl-C stops it gracefully:
it finishes the tasks it runs, then exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from datetime import timedelta

# The SDK exports traces to OpenAI's platform whatever endpoint answers: off unless asked for (=false).
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "true")

from agents.models.openai_provider import OpenAIProvider  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.openai_agents import ModelActivityParameters, OpenAIAgentsPlugin  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from oai_chat.tools import BUGS, save_note  # noqa: E402
from oai_chat.workflow import ChatWorkflow  # noqa: E402


def parse_args() -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m oai_chat.worker", description=__doc__.split("\n\n")[0])
    p.add_argument("--address", default=env("TEMPORAL_ADDRESS", "localhost:7233"),
                   help="Temporal frontend host:port (env TEMPORAL_ADDRESS; default %(default)s)")
    p.add_argument("--namespace", default=env("TEMPORAL_NAMESPACE", "default"),
                   help="Temporal namespace (env TEMPORAL_NAMESPACE; default %(default)s)")
    p.add_argument("--task-queue", default=env("TEMPORAL_TASK_QUEUE", "notes-chat"),
                   help="task queue to poll (env TEMPORAL_TASK_QUEUE; default %(default)s)")
    p.add_argument("--identity", default=env("TEMPORAL_IDENTITY"),
                   help="worker identity shown by Temporal (env TEMPORAL_IDENTITY; default: the SDK's, pid@host)")
    p.add_argument("--model-url", default=env("OPENAI_BASE_URL"),
                   help="base URL of an OpenAI-compatible API, ending in /v1 (env OPENAI_BASE_URL; default: OpenAI's)")
    p.add_argument("--effects-url", default=env("NOTES_URL"),
                   help="base URL of the notes service the save_note tool calls (env NOTES_URL)")
    p.add_argument("--model-start-to-close", type=float, default=float(env("MODEL_START_TO_CLOSE", "60")),
                   metavar="SECONDS", help="the model activity's start-to-close timeout (env MODEL_START_TO_CLOSE; "
                                           "default %(default)g)")
    p.add_argument("--model-heartbeat", type=float, default=float(env("MODEL_HEARTBEAT", "5")), metavar="SECONDS",
                   help="the model activity's heartbeat timeout: how soon a worker that died mid call is noticed; 0: "
                        "none, and only the start-to-close notices it (env MODEL_HEARTBEAT; default %(default)g)")
    p.add_argument("--bug", choices=BUGS, default=env("NOTES_AGENT_BUG") or None,
                   help="plant a bug, to see a test catch it (env NOTES_AGENT_BUG; default: none)")
    args = p.parse_args()
    if not args.effects_url:
        p.error("--effects-url is required (or set NOTES_URL), e.g. --effects-url http://127.0.0.1:8080")
    return args


def make_plugin(model_url: str | None = None, start_to_close_s: float = 60.0,
                heartbeat_s: float = 5.0) -> OpenAIAgentsPlugin:
    """The plugin the worker (and a replay of its histories) runs with: model calls as activities.

    ``start_to_close_s`` and ``heartbeat_s`` (0: no heartbeat timeout) are the model activity's timeouts.
    With ``model_url`` the model calls go to that OpenAI-compatible endpoint, else to ``OPENAI_BASE_URL``
    or OpenAI's; either way through the SDK's default provider (the Responses API), and Temporal retries
    a failed call, not the OpenAI client.
    """
    provider = OpenAIProvider(openai_client=AsyncOpenAI(base_url=model_url, max_retries=0)) if model_url else None
    return OpenAIAgentsPlugin(
        model_params=ModelActivityParameters(  # a dead worker is noticed after heartbeat_s (0: start_to_close_s)
            start_to_close_timeout=timedelta(seconds=start_to_close_s),
            heartbeat_timeout=timedelta(seconds=heartbeat_s) if heartbeat_s else None),
        model_provider=provider,
    )


async def main() -> None:
    args = parse_args()
    os.environ.update({"NOTES_URL": args.effects_url, "NOTES_AGENT_BUG": args.bug or ""})
    plugin = make_plugin(args.model_url, args.model_start_to_close, args.model_heartbeat)
    client = await Client.connect(args.address, namespace=args.namespace, plugins=[plugin])
    worker = Worker(client, task_queue=args.task_queue, workflows=[ChatWorkflow], activities=[save_note],
                    **({"identity": args.identity} if args.identity else {}))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(worker.shutdown()))
    print(f"notes chat worker polling {args.task_queue!r} at {args.address}"
          + (f" (planted bug: {args.bug})" if args.bug else ""), flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
