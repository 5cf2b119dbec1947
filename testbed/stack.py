"""One way to start things: ``async with stack(StackSpec(...)) as s`` brings up what a run needs and stops all
of it, in reverse order, on any exit path (return, exception, Ctrl-C).

    Temporal: the embedded dev server (with a database file, so it can be killed and restarted), or an
              existing cluster (TemporalConnection), or none
    engine:   another engine's parts (``testbed.engines.base.Engine``): its server (Restate, PostgreSQL), exposed
              as ``Stack.server``, and what it runs in this process (the checkpoint engine's queue and worker)
    model:    the scripted OpenAI-compatible server (latency, faults, seed), or an existing one (model_url)
    effects:  the external effects service the agent's tools call (``testbed.effects_service``), logging to
              ``effects_log``; its crash-after-effect fault kills the calling worker
              (``testbed.faults.effects.kill_caller``)
    proxies:  FaultProxy on the two links that matter (chaos): the server link (worker->Temporal, or between an
              engine's server and its workers: ``server_proxy``) and worker->model
    workers:  in-process Temporal workers (one per WorkerSettings), and N supervised worker processes or
              containers made by ``make_worker`` (restarted when they die)

``WarmTemporal`` is one embedded server that several runs use in turn (a soak's seeds), each its own stack on it,
its own task queue, its workflows ended at its end and none left from an earlier one.

The demo, ``dah run``, ``dah worker``, ``dah server``, the engines (``testbed.engines``), the benchmarks, the migration
fuzzer and the tests all start through here. Blocking start-ups run off the event loop; worker processes
start side by side (each imports LiteLLM: seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from agent.contracts import DEFAULT_TASK_QUEUE, AgentConfig, AgentInput, AgentResult
from agent.tools import workspace_for
from agent.worker import WorkerSettings, build_worker
from agent.workflow import AgentWorkflow
from harness.faults import AgentFaults
from harness.operations import History
from harness.owner import ENV_OWNER, owner_environment
from harness.recording import EffectLedger
from testbed.engines.temporal.connection import TemporalConnection, quiet_runtime
from testbed.engines.checkpoint.temporal_adapter import on_temporal_worker
from testbed.effects_service import EffectsService
from testbed.faults.effects import EffectFault, kill_caller
from testbed.faults.model import FaultRule
from testbed.model_server import LatencyModel, ScriptedModelServer
from testbed.faults.network import FaultProxy
from testbed.processes import ensure_reaper
from testbed import task_planner
from testbed.scripted_routes import respond
from testbed.supervisor import SupervisedWorker, Supervisor
from testbed.engines.temporal.server import EmbeddedTemporal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Endpoints:
    """Where a worker process reaches Temporal and the model (through the fault proxies, when there are any);
    ``env``: what its environment must add so it connects as this stack does (TLS, API key: see
    ``TemporalConnection.child_environment``); ``effects_url``: the effects service, reached directly (its
    crash-after-effect fault finds the caller by its TCP port: a proxy in between would hide it), or ``""``."""

    address: str
    namespace: str
    model_url: str
    env: dict[str, str] = field(default_factory=dict)
    effects_url: str = ""
    server: str = ""  # the embedded server's own address, not through the proxy ("": none, or an external cluster)


@dataclass
class StackSpec:
    state_dir: Path  # the workers' state: workspaces, effect ledger, checkpoint database
    logs_dir: Path | None = None  # default: <state_dir>/logs
    # -- Temporal
    temporal: str = "embedded"  # "embedded", "external" (connection.address) or "none"
    #: with temporal "none": the engine (``testbed.engines.base.Engine``) whose ``server(spec)`` is started here
    #: and exposed as ``Stack.server`` (so the server nemeses work on it unchanged), and whose
    #: ``start_in_stack(stack, exits)`` starts what it runs in this process
    engine: Any = None
    connection: TemporalConnection = field(default_factory=TemporalConnection)
    server_db: Path | None = None  # embedded: keep the server's state in this file (it survives a restart)
    server_port: int = 0
    tuned: bool = True  # embedded: raised per-shard queue read rates (testbed.engines.temporal.server)
    server_dynamic_config: dict[str, str] = field(default_factory=dict)  # embedded: more --dynamic-config-value
    #: embedded: SIGKILL the server at the end instead of its graceful stop (~1 s): for a caller that has read all
    #: it needs of it before the stack ends (a chaos run saves its histories first)
    kill_server_at_exit: bool = False
    ui: bool = False
    ui_port: int = 0
    server_log_level: str = "warn"
    quiet_client: bool = False  # the client's SDK core logs only errors (drivers under fault injection)
    # -- the model
    model: bool = True  # start the scripted model server; False: use model_url (or none: live models)
    model_url: str | None = None
    model_latency: LatencyModel | None = None
    model_faults: list[FaultRule] = field(default_factory=list)
    seed: int = 0
    #: the scripted model records every request of a task here (``harness.model_record``; None: no record)
    model_record: Path | None = None
    # -- the external effects service
    effects_log: Path | None = None  # start it, logging here (None: no service)
    effects_faults: list[EffectFault] = field(default_factory=list)  # armed from the start
    # -- links
    proxies: bool = False  # the server link and the model link go through FaultProxy (chaos)
    #: the server proxy's port (0: any free one); a target whose workers hard-code their address needs that one
    server_proxy_port: int = 0
    #: where the server proxy forwards, when the server calls the workers rather than the other way round
    #: (Restate's server calls its endpoint: the proxy stands in front of the endpoint); None: to the server
    server_proxy_to: tuple[str, int] | None = None
    # -- workers
    task_queue: str = DEFAULT_TASK_QUEUE  # where the reference agent's runs go (its in-process workers' own)
    temporal_workers: list[WorkerSettings] = field(default_factory=list)  # in-process, one each
    ledger: bool = False  # open the reference agent's effect ledger even without an in-process worker
    faults: AgentFaults | None = None  # what the ledger's in-agent fault seams carry (default: the environment's)
    #: an effect ledger already open (another stack's): the in-process workers share it, and it stays open at exit
    effect_ledger: EffectLedger | None = None
    worker_processes: int = 0
    make_worker: Callable[[str, Endpoints], Any] | None = None  # name ("w1"...) -> WorkerProcess / ContainerWorker
    history: History | None = None  # where the supervisor records restarts
    cleanup: list[Callable[[], None]] = field(default_factory=list)  # called last (e.g. remove containers)

    @property
    def logs(self) -> Path:
        return self.logs_dir or self.state_dir / "logs"


@dataclass
class Stack:
    spec: StackSpec
    server: EmbeddedTemporal | Any | None = None  # Any: the engine's own (Restate, PostgreSQL)
    client: Client | None = None
    model_server: ScriptedModelServer | None = None
    effects_service: EffectsService | None = None
    server_proxy: FaultProxy | None = None  # the server link: what the partition nemeses of link "temporal" cut
    model_proxy: FaultProxy | None = None

    def link(self, name: str) -> FaultProxy | None:
        """The proxy of a scenario's link: ``model``, or the server link (named ``temporal`` in the scenarios, which
        were written for Temporal; on another engine its server's link, ``harness.engines.Registered.stand_in``)."""
        return self.model_proxy if name == "model" else self.server_proxy
    ledger: EffectLedger | None = None  # the in-process workers' effect ledger
    workers: list[SupervisedWorker] = field(default_factory=list)

    @property
    def model_url(self) -> str | None:
        return self.model_server.url if self.model_server else self.spec.model_url

    @property
    def namespace(self) -> str:
        return self.spec.connection.namespace

    @property
    def endpoints(self) -> Endpoints:
        """What worker processes are given: the proxies' addresses when there are proxies."""
        address = self.server_proxy.address if self.server_proxy else (
            self.server.address if self.server else self.spec.connection.address or "")
        model = f"http://{self.model_proxy.address}/v1" if self.model_proxy else (self.model_url or "")
        env = self.spec.connection.child_environment(address) if address else {}
        effects = self.effects_service.url if self.effects_service else ""
        return Endpoints(address, self.namespace, model, env, effects_url=effects,
                         server=getattr(self.server, "address", "") or "")

    @property
    def settings(self) -> WorkerSettings:
        """The first in-process Temporal worker's settings (without one: where the reference agent's state is)."""
        if self.spec.temporal_workers:
            return self.spec.temporal_workers[0]
        return WorkerSettings.in_state_dir(self.spec.state_dir, task_queue=self.spec.task_queue)

    @property
    def task_queue(self) -> str:
        return self.settings.task_queue

    def worker(self, name: str) -> SupervisedWorker:
        for w in self.workers:
            if w.name == name:
                return w
        raise KeyError(f"no worker {name!r}; workers are {', '.join(w.name for w in self.workers)}")

    def set_model_faults(self, rules: list[FaultRule]) -> None:
        assert self.model_server is not None, "no scripted model server in this stack"
        self.model_server.set_faults(rules)

    def heal(self) -> None:
        """Undo every fault: links clean and up, workers resumed, the model healthy."""
        for proxy in (self.server_proxy, self.model_proxy):
            if proxy is not None:
                proxy.clear_toxics()
                if not proxy.enabled:
                    proxy.enable()
        if self.model_server is not None:
            self.model_server.set_faults([])
        for w in self.workers:
            with w.lock:
                w.process.resume()
                w.down_until = 0.0

    # -- the reference agent on this stack -------------------------------------------------------------------

    def workspace(self, workflow_id: str) -> Path:
        return workspace_for(self.settings.sandbox_root, workflow_id)

    def workflow_url(self, workflow_id: str) -> str | None:
        if self.server is None or not self.server.ui_url:
            return None
        return f"{self.server.ui_url}/namespaces/{self.namespace}/workflows/{workflow_id}"

    async def start_prompt(self, config: AgentConfig, prompt: str, workflow_id: str | None = None
                           ) -> WorkflowHandle[Any, AgentResult]:
        assert self.client is not None
        return await self.client.start_workflow(
            AgentWorkflow.run, AgentInput(config=config, prompt=prompt),
            id=workflow_id or f"agent-{uuid.uuid4().hex[:12]}", task_queue=self.task_queue)

    async def run_prompt(self, config: AgentConfig, prompt: str, workflow_id: str | None = None
                         ) -> tuple[AgentResult, WorkflowHandle[Any, AgentResult]]:
        handle = await self.start_prompt(config, prompt, workflow_id)
        return await handle.result(), handle

    async def start_conversation(self, config: AgentConfig, workflow_id: str | None = None
                                 ) -> WorkflowHandle[Any, AgentResult]:
        assert self.client is not None
        return await self.client.start_workflow(
            AgentWorkflow.run, AgentInput(config=config),
            id=workflow_id or f"chat-{uuid.uuid4().hex[:12]}", task_queue=self.task_queue)


@contextlib.asynccontextmanager
async def stack(spec: StackSpec) -> AsyncIterator[Stack]:
    """Everything ``spec`` asks for, started in order and stopped in reverse on any exit."""
    s = Stack(spec)
    spec.logs.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as exits:
        for fn in spec.cleanup:
            _stop_off_loop(exits, fn)
        if spec.temporal == "embedded":
            s.server = EmbeddedTemporal(db_filename=spec.server_db, port=spec.server_port, ui=spec.ui, ui_port=spec.ui_port,
                                        tuned=spec.tuned, namespace=spec.connection.namespace,
                                        extra_dynamic_config=dict(spec.server_dynamic_config),
                                        log_level=spec.server_log_level, log_file=spec.logs / "temporal.log")
            if spec.kill_server_at_exit:
                _stop_off_loop(exits, s.server.kill)
                await asyncio.to_thread(s.server.start)
            else:
                await exits.enter_async_context(s.server)
        elif spec.engine is not None and (server := spec.engine.server(spec)) is not None:
            s.server = server
            await _enter_off_loop(exits, s.server)
        if spec.model:
            s.model_server = ScriptedModelServer(respond, latency=spec.model_latency, faults=spec.model_faults,
                                                 seed=spec.seed, record=spec.model_record)
            await _enter_off_loop(exits, s.model_server)
            if spec.model_record is not None:  # the task planner's generator loads (~0.6 s) while the rest starts
                threading.Thread(target=task_planner.warm, name="task-planner-warm", daemon=True).start()
        if spec.effects_log is not None:
            s.effects_service = await _enter_off_loop(exits, EffectsService(
                spec.effects_log, kill_caller=lambda port: kill_caller(s, port), faults=list(spec.effects_faults)))
        if spec.proxies:
            upstream = (spec.server_proxy_to or (("127.0.0.1", s.server.port) if s.server is not None else
                        _host_port(spec.connection.address) if spec.temporal == "external" else None))
            if upstream is not None:  # an external cluster's link is attacked on this machine's side of it
                proxy = FaultProxy("server", upstream, seed=spec.seed, listen_port=spec.server_proxy_port)
                try:
                    s.server_proxy = await _enter_off_loop(exits, proxy)
                except OSError as exc:
                    raise RuntimeError(f"cannot put the fault proxy at 127.0.0.1:{spec.server_proxy_port}, the "
                                       f"address the target's workers hard-code ({exc.strerror or exc}): stop what "
                                       "listens there (a Temporal server?) and run again") from None
            if s.model_server is not None:
                s.model_proxy = await _enter_off_loop(
                    exits, FaultProxy("model", ("127.0.0.1", s.model_server.port), seed=spec.seed + 1))
        if spec.temporal != "none":
            runtime = {"runtime": quiet_runtime()} if spec.quiet_client else {}
            s.client = await spec.connection.connect(s.server.address if s.server else None, **runtime)
        if spec.effect_ledger is not None:
            s.ledger = spec.effect_ledger
        elif spec.ledger or spec.temporal_workers:
            s.ledger = exits.enter_context(EffectLedger(s.settings.resolved_ledger_path, faults=spec.faults))
        if spec.temporal_workers and spec.temporal == "embedded" and spec.server_db is None:
            # Nothing outside this process can resume their runs: what they leave running (a browser) ends with it.
            exits.enter_context(_owning_what_workers_leave())
        for settings in spec.temporal_workers:
            assert s.client is not None, "in-process Temporal workers need a Temporal server"
            settings.model_base_url = settings.model_base_url or s.model_url
            await exits.enter_async_context(build_worker(s.client, settings, s.ledger,
                                                         **on_temporal_worker(settings, s.ledger)))
        if spec.engine is not None:
            await spec.engine.start_in_stack(s, exits)
        if spec.worker_processes:
            assert spec.make_worker is not None, "worker_processes needs make_worker"
            endpoints = s.endpoints
            s.workers = [SupervisedWorker(spec.make_worker(f"w{i}", endpoints))
                         for i in range(1, spec.worker_processes + 1)]
            _stop_off_loop(exits, _stop_workers, s.workers)
            await asyncio.to_thread(_start_workers, s.workers)
            supervisor = Supervisor(s.workers, spec.history).start()
            _stop_off_loop(exits, supervisor.stop)  # runs before _stop_workers: nothing restarts what is being stopped
        yield s


def _stop_off_loop(exits: contextlib.AsyncExitStack, fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn(*args)`` on the way out, in a thread: a blocking stop (a thread's join, a server's shutdown) does
    not hold up the runs side by side on this event loop (a soak's, a suite's)."""
    exits.push_async_callback(asyncio.to_thread, fn, *args)


async def _enter_off_loop(exits: contextlib.AsyncExitStack, cm: contextlib.AbstractContextManager[Any]) -> Any:
    """``exits.enter_context(cm)``, its start and its stop each in a thread (``_stop_off_loop``)."""
    value = await asyncio.to_thread(cm.__enter__)
    exits.push_async_exit(lambda *exc: asyncio.to_thread(cm.__exit__, *exc))
    return value


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


def _host_port(address: str | None) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as a proxy's upstream; ValueError naming a malformed address."""
    host, sep, port = (address or "").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--address {address!r}: expected HOST:PORT, e.g. temporal.example.com:7233")
    return host.strip("[]"), int(port)


def _start_workers(workers: list[SupervisedWorker]) -> None:
    with ThreadPoolExecutor(len(workers)) as pool:
        list(pool.map(lambda w: w.process.start(), workers))


def _stop_workers(workers: list[SupervisedWorker]) -> None:
    """Everything worth keeping is saved by now: no graceful drain, just make sure each one is gone."""
    def kill(w: SupervisedWorker) -> None:
        with w.lock:
            w.process.kill()

    with ThreadPoolExecutor(len(workers)) as pool:
        list(pool.map(kill, workers))


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

    def __call__(self, spec: StackSpec) -> contextlib.AbstractAsyncContextManager[Stack]:
        return self._stack(spec)

    @contextlib.asynccontextmanager
    async def _stack(self, spec: StackSpec) -> AsyncIterator[Stack]:
        if self.server is None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self.server = EmbeddedTemporal(log_file=self.log_file, namespace=spec.connection.namespace)
            await asyncio.to_thread(self.server.start)
        self.runs += 1
        # in place: what the engine's spec made (its workers' factory) reads the queue from the spec at start
        spec.temporal, spec.server_db, spec.ui = "external", None, False
        spec.connection = TemporalConnection(address=self.server.address, namespace=spec.connection.namespace)
        spec.task_queue = f"{spec.task_queue}-{self.runs}"
        try:
            client = await spec.connection.connect(runtime=quiet_runtime())
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
                await client.get_workflow_handle(wid).terminate(reason="the run ended (testbed.stack.WarmTemporal)")
        if asyncio.get_running_loop().time() > deadline:
            raise LeftRunning(f"{len(left)} workflow(s) still running after they were terminated: "
                              f"{', '.join(left[:5])}")
        await asyncio.sleep(0.05)
