"""A target's driver, run in the target's own Python: ``python -m harness.driver_host --driver MODULE:NAME ...``.

The chaos runner starts this with the target's interpreter (the target's ``cwd`` first on its path, and only
``harness`` added: ``harness.pythonpath_for_targets``), so the driver imports the agent's own packages under
the agent's own pins. The driver is the target file's ``make_driver(client=, history=, task_queue=,
workload=, seed=)`` under the driver API (``harness.driver_api``: checked before it is called, and the object
it returns too), or, with ``--chat TABLE``, the built-in ``harness.chat_driver``; its ``history`` here is a
``RemoteOperationLog`` that sends each operation to the runner, which records it in the run's operation log as it
happens.

The protocol: JSON lines. The runner writes commands to stdin: ``{"cmd": "run"}`` (start the load),
``{"cmd": "stop"}`` (no new messages), ``{"cmd": "finish"}`` (end the conversations and read them back);
closing stdin means "stop everything". This process writes events to stdout: ``{"event": "ready",
"workflow_ids": [...]}`` once the driver exists, ``{"event": "invoke" | "complete", "id": n, ...}`` per
operation, ``{"event": "workflow_ids", "workflow_ids": [...]}`` when the driver makes more workflows (one per
message), ``{"event": "unfit", "error": "..."}`` (then it exits 2) when the driver does not fit the API, ``{"event": "run_done", "error": null | "..."}`` when the load ends, and ``{"event": "finished",
"data": <to_json()>}`` after the final reads. Logging goes to stderr. Standard library and temporalio only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import threading
import time
from typing import Any

from harness.driver_api import Workload, check_driver, load_factory
from harness.operations import OK, Op

log = logging.getLogger("harness.driver_host")
_out_lock = threading.Lock()


def send(message: dict[str, Any]) -> None:
    line = json.dumps(message, default=str)
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class RemoteOperationLog:
    """The ``OperationLog`` surface a driver uses (invoke, complete, event, now), sent to the runner."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self._next = 0
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self._t0

    def invoke(self, process: str, f: str, value: Any = None) -> Op:
        with self._lock:
            index, self._next = self._next, self._next + 1
        send({"event": "invoke", "id": index, "process": process, "f": f, "value": value})
        return Op(index, process, "invoke", f, value, self.now(), time.time())

    def complete(self, invoked: Op, type_: str, value: Any = None, error: str | None = None) -> Op:
        send({"event": "complete", "id": invoked.index, "type": type_, "value": value, "error": error})
        return Op(invoked.index, invoked.process, type_, invoked.f, value, self.now(), time.time(), error,
                  invoked.index)

    def event(self, process: str, f: str, value: Any = None) -> Op:
        op = self.invoke(process, f, value)
        self.complete(op, OK, value)
        return op


async def serve(args: argparse.Namespace) -> int:
    from temporalio.client import Client

    workload = Workload.from_dict(json.loads(args.workload))
    if args.chat:
        from harness.chat_driver import make_driver

        factory, problem = make_driver, None
        extra = {"chat": json.loads(args.chat),
                 "on_workflow": lambda ids: send({"event": "workflow_ids", "workflow_ids": list(ids)})}
    else:
        factory, problem = load_factory(args.driver)
        extra = {}
    if problem:
        send({"event": "unfit", "error": problem})
        return 2
    client = await Client.connect(args.address, namespace=args.namespace)
    driver = factory(client=client, history=RemoteOperationLog(), task_queue=args.task_queue, workload=workload,
                     seed=args.seed, **extra)
    problem = check_driver(driver)
    if problem:
        send({"event": "unfit", "error": f"driver {args.driver}: {problem}"})
        return 2
    send({"event": "ready", "workflow_ids": list(driver.workflow_ids)})
    loop = asyncio.get_running_loop()
    commands: asyncio.Queue[str | None] = asyncio.Queue()

    def read_commands() -> None:  # stdin on a thread: a pending read must not block shutdown
        for line in sys.stdin:
            if line.strip():
                loop.call_soon_threadsafe(commands.put_nowait, json.loads(line).get("cmd"))
        loop.call_soon_threadsafe(commands.put_nowait, None)

    threading.Thread(target=read_commands, name="commands", daemon=True).start()
    running: asyncio.Task | None = None

    async def load() -> None:
        try:
            await driver.run()
            send({"event": "run_done", "error": None})
        except asyncio.CancelledError:
            send({"event": "run_done", "error": "cancelled"})
            raise
        except Exception as exc:  # the runner records it; the operations it left open stay unknown (info)
            send({"event": "run_done", "error": f"{type(exc).__name__}: {exc}"})

    while True:
        cmd = await commands.get()
        if cmd == "run" and running is None:
            running = asyncio.create_task(load())
        elif cmd == "stop" and hasattr(driver, "stop"):
            driver.stop()
        elif cmd == "finish":
            if running is not None and not running.done():
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
            await driver.finish()
            send({"event": "finished", "data": driver.to_json()})
        elif cmd is None:
            if running is not None and not running.done():
                running.cancel()
                await asyncio.gather(running, return_exceptions=True)
            return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.driver_host", description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver", required=True, help="MODULE:NAME of the target's make_driver")
    parser.add_argument("--chat", help="the target's [chat] table as JSON: drive it with harness.chat_driver")
    parser.add_argument("--address", required=True)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--workload", required=True, help="the scenario's workload as JSON")
    parser.add_argument("--seed", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(serve(args))


if __name__ == "__main__":
    from harness.exit import exit_now

    exit_now(main())
