"""Temporal's part in a stack (``testbed.stack.StackSpec.engine``), plugged in as every engine's is:
``TemporalCluster``. Beside it, the reference agent's prompts and conversations on such a stack, and
``WarmTemporal``, one embedded server that several runs (a soak's seeds) use in turn."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from agent.contracts import AgentConfig, AgentInput, AgentResult
from agent.worker import WorkerSettings, build_worker
from agent.workflow import AgentWorkflow
from harness.owner import ENV_OWNER, owner_environment
from harness.recording import EffectLedger
from testbed.engines.checkpoint.temporal_adapter import on_temporal_worker
from testbed.engines.temporal.connection import TemporalConnection, quiet_runtime
from testbed.engines.temporal.server import EmbeddedTemporal
from testbed.processes import ensure_reaper
from testbed.stack import EnginePart, Stack, StackSpec, stack


@dataclass
class TemporalCluster(EnginePart):
    """The embedded dev server (with a database file, so it can be killed and restarted) or a cluster elsewhere
    (``connection`` with an address); the stack's client of it (``Stack.client``) and in-process workers."""

    connection: TemporalConnection = field(default_factory=TemporalConnection)  # no address: the embedded server
    db: Path | None = None  # embedded: keep the server's state in this file (it survives a restart)
    port: int = 0
    tuned: bool = True  # embedded: raised per-shard queue read rates (testbed.engines.temporal.server)
    dynamic_config: dict[str, str] = field(default_factory=dict)  # embedded: more --dynamic-config-value
    #: embedded: SIGKILL the server at the end instead of its graceful stop (~1 s): for a caller that has read all
    #: it needs of it before the stack ends (a chaos run saves its histories first)
    kill_at_exit: bool = False
    ui: bool = False
    ui_port: int = 0
    log_level: str = "warn"
    quiet: bool = False  # the client's SDK core logs only errors (drivers under fault injection)
    worker_settings: list[WorkerSettings] = field(default_factory=list)  # in-process workers, one each

    @property
    def address(self) -> str:
        return self.connection.address or ""

    @property
    def namespace(self) -> str:
        return self.connection.namespace

    def child_environment(self, address: str) -> dict[str, str]:
        return self.connection.child_environment(address)

    def server(self, spec: StackSpec) -> EmbeddedTemporal | None:
        if not self.connection.embedded:
            return None
        return EmbeddedTemporal(db_filename=self.db, port=self.port, ui=self.ui, ui_port=self.ui_port,
                                tuned=self.tuned, namespace=self.namespace,
                                extra_dynamic_config=dict(self.dynamic_config), log_level=self.log_level,
                                log_file=spec.logs / "temporal.log")

    async def start_in_stack(self, stack: Stack, exits: contextlib.AsyncExitStack) -> None:
        """The client (of the server itself, never through the proxy), then the in-process workers."""
        if self.kill_at_exit and stack.server is not None:  # before the graceful stop, which then has nothing to do
            exits.push_async_callback(asyncio.to_thread, stack.server.kill)
        runtime = {"runtime": quiet_runtime()} if self.quiet else {}
        stack.client = await self.connection.connect(stack.server.address if stack.server else None, **runtime)
        if not self.worker_settings:
            return
        if stack.ledger is None:
            stack.ledger = exits.enter_context(EffectLedger(stack.settings.resolved_ledger_path,
                                                            faults=stack.spec.faults))
        if self.connection.embedded and self.db is None:
            # Nothing outside this process can resume their runs: what they leave running (a browser) ends with it.
            exits.enter_context(_owning_what_workers_leave())
        for settings in self.worker_settings:
            settings.model_base_url = settings.model_base_url or stack.model_url
            await exits.enter_async_context(build_worker(stack.client, settings, stack.ledger,
                                                         **on_temporal_worker(settings, stack.ledger)))


@contextlib.contextmanager
def _owning_what_workers_leave() -> Iterator[None]:
    """This process's in-process workers name it their owner (``harness.owner``), as its worker processes do."""
    before = os.environ.get(ENV_OWNER)
    os.environ.update(owner_environment())
    ensure_reaper()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV_OWNER, None)
        else:
            os.environ[ENV_OWNER] = before


# -- the reference agent on a stack with Temporal --------------------------------------------------------------

async def start_prompt(stack: Stack, config: AgentConfig, prompt: str | None, workflow_id: str | None = None
                       ) -> WorkflowHandle[Any, AgentResult]:
    """The reference agent's workflow on the stack's task queue: one prompt, or (None) a conversation."""
    assert stack.client is not None, "no Temporal client: the stack's engine is not a TemporalCluster"
    return await stack.client.start_workflow(
        AgentWorkflow.run, AgentInput(config=config, prompt=prompt),
        id=workflow_id or f"agent-{uuid.uuid4().hex[:12]}", task_queue=stack.task_queue)


async def run_prompt(stack: Stack, config: AgentConfig, prompt: str, workflow_id: str | None = None
                     ) -> tuple[AgentResult, WorkflowHandle[Any, AgentResult]]:
    handle = await start_prompt(stack, config, prompt, workflow_id)
    return await handle.result(), handle


async def start_conversation(stack: Stack, config: AgentConfig, workflow_id: str | None = None
                             ) -> WorkflowHandle[Any, AgentResult]:
    return await start_prompt(stack, config, None, workflow_id or f"chat-{uuid.uuid4().hex[:12]}")


# -- one server, several runs in turn --------------------------------------------------------------------------

class LeftRunning(RuntimeError):
    """A warm server still runs workflows an earlier run left: the next run on it would not be isolated."""


class WarmTemporal:
    """One embedded Temporal server that several runs use in turn, each with its own stack (workers, model server,
    proxies, effects service, ledger) and its own task queue: a ``chaos.runner.Cluster``. It saves each run the
    server's start (0.2-0.4 s) and its stop.

    Isolation: a run starts only on a server with no workflow running (else ``LeftRunning``, naming them: the run
    errors and the server is replaced); its workflows are terminated at its end (their timers and retries with
    them), before its workers stop, and the end waits until the server lists none running. Its task queue is its
    own (``<queue>-<n>``), so nothing dispatched for an earlier run reaches its workers. The server has no database
    file: a run that restarts or partitions the server needs a cluster of its own (the caller decides)."""

    def __init__(self, log_file: Path) -> None:
        self.log_file = log_file
        self.server: EmbeddedTemporal | None = None
        self.runs = 0

    @contextlib.asynccontextmanager
    async def __call__(self, spec: StackSpec) -> AsyncIterator[Stack]:
        cluster = spec.engine
        if not isinstance(cluster, TemporalCluster):
            raise TypeError(f"WarmTemporal runs stacks on Temporal; this spec's engine is {type(cluster).__name__}")
        if self.server is None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self.server = EmbeddedTemporal(log_file=self.log_file, namespace=cluster.namespace)
            await asyncio.to_thread(self.server.start)
        self.runs += 1
        # in place: what the engine's spec made (its workers' factory) reads the queue from the spec at start
        cluster.connection = TemporalConnection(address=self.server.address, namespace=cluster.namespace)
        spec.task_queue = f"{spec.task_queue}-{self.runs}"
        try:
            client = await cluster.connection.connect(runtime=quiet_runtime())
            left = await running_workflows(client)
            if left:
                raise LeftRunning(f"the warm Temporal server at {self.server.address} still runs {len(left)} "
                                  f"workflow(s) an earlier run left ({', '.join(left[:5])}): this run would not be "
                                  "isolated; the server is replaced for the next run")
        except BaseException:
            await self.close()
            raise
        async with stack(spec) as s:
            try:
                yield s
            finally:
                try:
                    await end_every_workflow(client)
                except BaseException:
                    await self.close()
                    raise

    async def close(self) -> None:
        if self.server is not None:
            await asyncio.to_thread(self.server.kill)
            self.server = None


async def running_workflows(client: Client) -> list[str]:
    """The ids of every workflow running in the client's namespace."""
    return [w.id async for w in client.list_workflows('ExecutionStatus="Running"')]


async def end_every_workflow(client: Client, wait_s: float = 5.0) -> None:
    """Terminate every workflow running in the client's namespace, then wait until the server lists none (its
    visibility store lags a write by a moment); LeftRunning if some are still listed after ``wait_s``."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while left := await running_workflows(client):
        for wid in left:
            with contextlib.suppress(Exception):  # it may have ended meanwhile
                await client.get_workflow_handle(wid).terminate(reason="the run ended (WarmTemporal)")
        if asyncio.get_running_loop().time() > deadline:
            raise LeftRunning(f"{len(left)} workflow(s) still running after they were terminated: "
                              f"{', '.join(left[:5])}")
        await asyncio.sleep(0.05)
