"""``dah worker``: one reference-agent worker process on Temporal (what chaos, the migration fuzzer and a second
terminal start), until SIGTERM or Ctrl-C.

It prints ``READY`` once polling and ``WARM`` once the model client is loaded (what supervisors wait for), drains
on SIGTERM (``--drain-timeout``), and exits 3 when the worker fails fatally, so a supervisor restarts it. Besides
the agent's workflow and activities it registers the checkpoint engine's task on Temporal
(``testbed.engines.checkpoint.temporal_adapter``). The in-agent faults (``--crash-at``, ``--bug``, ``--mutation``,
or ``$DAH_CRASH_AT`` / ``$DAH_BUGS`` / ``$DAH_MUTATIONS``: ``harness/faults.py``) reach it here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any

from agent.contracts import DEFAULT_TASK_QUEUE
from harness.engines import HOME, REGISTRY
from cli.options import UsageError, add_durability, connection, model_knobs

EXIT_WORKER_FAILED = 3


def add_worker_parser(sub: Any) -> None:
    """``dah worker`` and its options, on ``dah``'s subcommands."""
    from testbed.engines.temporal.connection import add_connection_arguments
    from testbed.model_server import add_model_latency

    p = sub.add_parser("worker", help="run one worker process until SIGTERM/Ctrl-C",
                       description="Run one agent worker (workflow + all activities). Prints a READY line once "
                                   "polling. Without --model-base-url it starts its own scripted model server.")
    add_durability(p, choices=(HOME,),
                   help=f"the engine (default {HOME}: this worker); the others' workers are 'dah worker --durability "
                        f"NAME ...' too ({', '.join(r.name for r in REGISTRY if r.worker)}), each with its own "
                        "options: 'dah worker --durability NAME --help'")
    p.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE, help=f"(default {DEFAULT_TASK_QUEUE})")
    p.add_argument("--identity", help="worker identity recorded in histories (default worker-<pid>@<host>)")
    p.add_argument("--state-dir", type=Path, default=Path(".dah"), help="workspaces live in STATE_DIR/sandbox")
    p.add_argument("--ledger", type=Path, help="effect ledger file (default STATE_DIR/sandbox/ledger.sqlite3)")
    p.add_argument("--model-base-url", help="scripted model server URL (http://host:port/v1), e.g. via a fault proxy")
    p.add_argument("--bug", action="append", default=[], metavar="TOOL",
                   help="inject a logic bug: TOOL raises on every attempt (the hot-fix scenario); repeatable "
                        "(also $DAH_BUGS; see harness/faults.py)")
    p.add_argument("--workflow", default="agent.workflow:AgentWorkflow", metavar="MODULE:CLASS",
                   help="the agent workflow class to register (default agent.workflow:AgentWorkflow)")
    p.add_argument("--crash-at", action="append", default=[], metavar="POINT",
                   help="SIGKILL this worker at POINT (after_model_call, after_effect), once per effect ledger "
                        "(also $DAH_CRASH_AT)")
    p.add_argument("--mutation", action="append", default=[], metavar="NAME",
                   help="a deliberately broken build, for checking the checkers: unkeyed_effects (every effect "
                        "applied on every attempt; unkeyed_append is its old name; also $DAH_MUTATIONS)")
    p.add_argument("--max-cached-workflows", type=int, default=1000, metavar="N",
                   help="workflows cached between tasks (default 1000); 0 disables the cache and the sticky queue, "
                        "so a task never waits the 10 s sticky timeout after this worker dies")
    p.add_argument("--sticky-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="how long a workflow task waits on this worker's sticky queue before any worker may take "
                        "it (default 10, the SDK's): after this worker dies, its workflows wait this long")
    p.add_argument("--drain-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="on SIGTERM/Ctrl-C: stop polling and let in-flight model calls and tools finish for up to "
                        "this long (default 30), then cancel the rest; 0 cancels at once")
    p.add_argument("--activity-pollers", type=int, default=5, metavar="N",
                   help="activity long polls open at once (default 5, the SDK's); a frozen worker's open polls "
                        "still take tasks, each then retried a heartbeat timeout later")
    p.add_argument("--heartbeat-throttle", type=float, default=0.5, metavar="SECONDS",
                   help="send an activity's heartbeats at least this often while it beats (default 0.5; the "
                        "SDK's own cap is 60, which leaves a 1.5 s heartbeat timeout 0.3 s of slack)")
    add_model_latency(p, default="0", default_text="0",
                      what="the response latency of the worker's own scripted model server")
    p.add_argument("--fault", action="append", default=[], help="fault of the worker's own scripted model server")
    p.add_argument("--seed", type=int, default=0)
    add_connection_arguments(p, embedded_default=False)
    p.set_defaults(func=cmd_worker)


def stop_event() -> asyncio.Event:
    """Set on SIGTERM or SIGINT, so a supervised process shuts down gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def cmd_worker(args: argparse.Namespace) -> int:
    from agent.tools import TOOLS
    from agent.worker import SANDBOX, WorkerSettings, build_worker, default_identity, load_workflow
    from harness.faults import AgentFaults
    from testbed.engines.checkpoint.temporal_adapter import on_temporal_worker
    from testbed.faults import planted
    from testbed.stack import StackSpec, stack

    latency, faults = model_knobs(args)
    conn = connection(args, embedded_default=False)
    try:
        # The flags, and whatever the environment asks for (how the chaos harness hands faults to any worker).
        env_faults = AgentFaults.from_environment()
        agent_faults = AgentFaults(env_faults.crash_at | set(args.crash_at), env_faults.bugs | set(args.bug),
                                   env_faults.mutations | set(args.mutation))
        unknown = sorted(agent_faults.bugs - set(TOOLS))
        if unknown:
            raise ValueError(f"--bug {', '.join(unknown)}: not a tool; tools are {', '.join(TOOLS)}")
        settings = WorkerSettings(
            task_queue=args.task_queue, sandbox_root=args.state_dir / SANDBOX, ledger_path=args.ledger,
            model_base_url=args.model_base_url, identity=args.identity or default_identity(),
            workflow=args.workflow, max_cached_workflows=args.max_cached_workflows,
            sticky_timeout_s=args.sticky_timeout, activity_pollers=args.activity_pollers,
            drain_timeout_s=planted.drain_timeout(agent_faults, args.drain_timeout),  # a planted bug: no drain
            heartbeat_throttle_s=args.heartbeat_throttle,
        )
        load_workflow(settings.workflow)  # a bad --workflow is a usage error, before connecting
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        args.state_dir.mkdir(parents=True, exist_ok=True)  # a bad --state-dir: said now, not after seconds of start-up
    except OSError as exc:
        raise UsageError(f"cannot start the worker: {exc.filename}: {exc.strerror}; give a writable "
                         f"--state-dir (now {args.state_dir})") from None
    stop = stop_event()
    # The stack connects and, without --model-base-url, starts this worker's own scripted model server; the
    # worker itself runs here, not in the stack: a fatal failure must end this process (exit 3) for a supervisor.
    spec = StackSpec(state_dir=args.state_dir, temporal="external", connection=conn,
                     model=args.model_base_url is None, model_url=args.model_base_url, model_latency=latency,
                     model_faults=faults, seed=args.seed, ledger=True, faults=agent_faults,
                     task_queue=args.task_queue)
    exits = contextlib.AsyncExitStack()
    try:
        s = await exits.enter_async_context(stack(spec))
    except OSError as exc:  # a file under the state dir, the model server's port: not Temporal
        raise UsageError(f"cannot start the worker: {exc}") from None
    except Exception as exc:
        raise UsageError(f"cannot reach Temporal at {conn.address} ({exc}); start one with 'dah server' "
                         "or pass --address") from None
    async with exits:
        settings.model_base_url = s.model_url
        worker = build_worker(s.client, settings, s.ledger, **on_temporal_worker(settings, s.ledger))
        running = asyncio.create_task(worker.run())
        print(f"READY worker identity={settings.identity} task_queue={settings.task_queue} "
              f"address={conn.address} model={settings.model_base_url}"
              + (f" {agent_faults.describe()}" if agent_faults else ""), flush=True)
        stopping = asyncio.create_task(stop.wait())

        async def announce_warm() -> None:
            from agent import llm

            await llm.wait_loaded()
            failed = llm.load_error()  # supervisors may wait for this line before sending load
            print("WARM model client loaded" + (f" (preload incomplete: {failed})" if failed else ""), flush=True)

        warm = asyncio.create_task(announce_warm())
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        warm.cancel()
        if running.done():
            # e.g. polls failed for about a minute (a long partition): exit so a supervisor restarts us.
            stopping.cancel()
            exc = running.exception()
            print(f"worker failed fatally: {type(exc).__name__}: {exc}" if exc else "worker stopped by itself",
                  flush=True)
            return EXIT_WORKER_FAILED
        planted.on_sigterm(agent_faults, s.ledger, settings.identity)
        print(f"DRAINING: no new work; finishing what is in flight (up to {settings.drain_timeout_s:g} s)",
              flush=True)
        await worker.shutdown()
        await running
    print("worker stopped", flush=True)
    return 0
