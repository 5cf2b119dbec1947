"""The notes chat worker: runs ``ChatWorkflow`` and the agent's activities on one task queue.

    python -m pai_chat.worker --address localhost:7233 --task-queue notes-chat \\
        --model-url https://api.openai.com/v1 --effects-url http://127.0.0.1:8080

Every flag has an environment variable (shown in ``--help``). SIGTERM or Ctrl-C stops it gracefully:
it finishes the tasks it runs, then exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

#: the bugs ``--bug`` can plant (see pai_chat/agent.py); the agent is imported only once its environment is set
BUGS = ("no-idempotency-key", "swallow-tool-failure")


def parse_args() -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="python -m pai_chat.worker", description=__doc__.split("\n\n")[0])
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
    p.add_argument("--model", default=env("CHAT_MODEL", "gpt-4.1-mini"),
                   help="model name at that API (env CHAT_MODEL; default %(default)s)")
    p.add_argument("--effects-url", default=env("NOTES_URL"),
                   help="base URL of the notes service the save_note tool calls (env NOTES_URL)")
    p.add_argument("--bug", choices=BUGS, default=env("NOTES_AGENT_BUG") or None,
                   help="plant a bug, to see a test catch it (env NOTES_AGENT_BUG; default: none)")
    args = p.parse_args()
    if not args.effects_url:
        p.error("--effects-url is required (or set NOTES_URL), e.g. --effects-url http://127.0.0.1:8080")
    return args


async def main() -> None:
    args = parse_args()
    # The agent reads its configuration from the environment when it is imported (in the workflow sandbox too).
    os.environ.update({"CHAT_MODEL": args.model, "NOTES_URL": args.effects_url, "NOTES_AGENT_BUG": args.bug or ""})
    if args.model_url:
        os.environ["OPENAI_BASE_URL"] = args.model_url

    from pydantic_ai.durable_exec.temporal import PydanticAIPlugin
    from temporalio.client import Client
    from temporalio.worker import Worker

    from pai_chat.workflow import ChatWorkflow

    client = await Client.connect(args.address, namespace=args.namespace, plugins=[PydanticAIPlugin()])
    worker = Worker(client, task_queue=args.task_queue, workflows=[ChatWorkflow],
                    **({"identity": args.identity} if args.identity else {}))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(worker.shutdown()))
    print(f"notes chat worker polling {args.task_queue!r} at {args.address}"
          + (f" (planted bug: {args.bug})" if args.bug else ""), flush=True)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
