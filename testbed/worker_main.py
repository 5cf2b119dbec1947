"""``dah worker``: one reference-agent worker process on Temporal (what chaos, the migration fuzzer and a second
terminal start), until SIGTERM or Ctrl-C.

It prints ``READY`` once polling and ``WARM`` once the model client is loaded (what supervisors wait for), drains
on SIGTERM (``--drain-timeout``), and exits 3 when the worker fails fatally, so a supervisor restarts it. Besides
the agent's workflow and activities it registers the checkpoint engine's task on Temporal
(``testbed.engines.checkpoint.temporal_adapter``). The in-agent faults (``--crash-at``, ``--bug``, ``--mutation``,
or ``$DAH_CRASH_AT`` / ``$DAH_BUGS`` / ``$DAH_MUTATIONS``: ``harness/faults.py``) reach it here. Its options are
parsed by ``cli.dah`` (``python -m testbed worker``); ``model_knobs`` and ``connection`` serve dah's other commands too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from typing import Any

from harness.commands import UsageError

EXIT_WORKER_FAILED = 3


def model_knobs(args: argparse.Namespace) -> tuple[Any, list[Any]]:
    """The scripted model's ``--model-latency`` and ``--fault`` rules; UsageError naming a bad rule."""
    from testbed.faults.model import FaultRule
    from testbed.model_server import LatencyModel

    latency = LatencyModel.parse(args.model_latency)  # checked by the parser (add_model_latency)
    faults = []
    for spec in args.fault:
        try:
            faults.append(FaultRule.parse(spec))
        except ValueError as exc:
            raise UsageError(f"--fault: {exc}") from None
    return latency, faults


def connection(args: argparse.Namespace, *, embedded_default: bool = True) -> Any:
    """The Temporal connection: the flags over the environment over a temporal.toml profile (testbed.engines.temporal.connection)."""
    from testbed.engines.temporal.connection import connection_from_args

    try:
        return connection_from_args(args, embedded_default=embedded_default)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def stop_event() -> asyncio.Event:
    """Set on SIGTERM or SIGINT, so a supervised process shuts down gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _settings(args: argparse.Namespace) -> tuple[Any, Any]:
    """The worker's settings and in-agent faults from its flags and the environment; ``UsageError`` if they are bad."""
    from agent.tools import TOOLS
    from agent.worker import SANDBOX, WorkerSettings, default_identity, load_workflow
    from harness.faults import AgentFaults
    from testbed.faults import planted

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
    return settings, agent_faults


async def _serve(worker: Any, stop: asyncio.Event, ready: str) -> asyncio.Task | None:
    """Run ``worker``, saying ``ready``, then WARM once the model client is loaded: its running task once ``stop``
    is set; None if it ended by itself first (said)."""
    running = asyncio.create_task(worker.run())
    print(ready, flush=True)
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
        return None
    return running


async def cmd_worker(args: argparse.Namespace) -> int:
    from agent.worker import build_worker
    from testbed.engines.checkpoint.temporal_adapter import on_temporal_worker
    from testbed.engines.temporal.cluster import TemporalCluster
    from testbed.faults import planted
    from testbed.stack import StackSpec, stack

    latency, faults = model_knobs(args)
    conn = connection(args, embedded_default=False)
    settings, agent_faults = _settings(args)
    try:
        args.state_dir.mkdir(parents=True, exist_ok=True)  # a bad --state-dir: said now, not after seconds of start-up
    except OSError as exc:
        raise UsageError(f"cannot start the worker: {exc.filename}: {exc.strerror}; give a writable "
                         f"--state-dir (now {args.state_dir})") from None
    stop = stop_event()
    # The stack connects and, without --model-base-url, starts this worker's own scripted model server; the
    # worker itself runs here, not in the stack: a fatal failure must end this process (exit 3) for a supervisor.
    spec = StackSpec(state_dir=args.state_dir, engine=TemporalCluster(conn),
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
        running = await _serve(worker, stop, f"READY worker identity={settings.identity} task_queue="
                               f"{settings.task_queue} address={conn.address} model={settings.model_base_url}"
                               + (f" {agent_faults.describe()}" if agent_faults else ""))
        if running is None:
            return EXIT_WORKER_FAILED
        planted.on_sigterm(agent_faults, s.ledger, settings.identity)
        print(f"DRAINING: no new work; finishing what is in flight (up to {settings.drain_timeout_s:g} s)",
              flush=True)
        await worker.shutdown()
        await running
    print("worker stopped", flush=True)
    return 0
