"""One way to start things: ``async with stack(StackSpec(...)) as s`` brings up what a run needs and stops all
of it, in reverse order, on any exit path (return, exception, Ctrl-C).

    engine:   the engine's part (``EnginePart``: an engine, ``testbed.engines.base.Engine``, or a part of one): its
              server, exposed as ``Stack.server``, or where its server is when the stack starts none, and what it
              runs in this process (a client, in-process workers, a queue)
    model:    the scripted OpenAI-compatible server (latency, faults, seed), or an existing one (model_url)
    effects:  the external effects service the agent's tools call (``testbed.effects_service``), logging to
              ``effects_log``; its crash-after-effect fault kills the calling worker
              (``testbed.faults.effects.kill_caller``)
    proxies:  FaultProxy on the two links that matter (chaos): the server link (between the engine's server and
              its workers: ``server_proxy``) and worker->model
    workers:  N supervised worker processes or containers made by ``make_worker`` (restarted when they die)

The demo, ``dah run``, ``dah worker``, ``dah server``, the engines (``testbed.engines``), the benchmarks, the migration
fuzzer and the tests all start through here. Blocking start-ups run off the event loop; worker processes
start side by side (each imports LiteLLM: seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.contracts import DEFAULT_TASK_QUEUE
from agent.tools import workspace_for
from agent.worker import WorkerSettings
from harness.faults import AgentFaults
from harness.operations import OperationLog
from harness.recording import EffectLedger
from testbed.effects_service import EffectsService
from testbed.faults.effects import EffectFault, kill_caller
from testbed.faults.model import FaultRule
from testbed.model_server import LatencyModel, ScriptedModelServer
from testbed.faults.network import FaultProxy
from testbed import task_planner
from testbed.scripted_routes import respond
from testbed.supervisor import SupervisedWorker, Supervisor


@dataclass(frozen=True)
class Endpoints:
    """Where a worker process reaches the engine's server and the model (through the fault proxies, when there are
    any); ``env``: what its environment must add so it connects as this stack does (TLS, API key:
    ``EnginePart.child_environment``); ``effects_url``: the effects service, reached directly (its
    crash-after-effect fault finds the caller by its TCP port: a proxy in between would hide it), or ``""``."""

    address: str
    namespace: str
    model_url: str
    env: dict[str, str] = field(default_factory=dict)
    effects_url: str = ""
    server: str = ""  # the started server's own address, not through the proxy ("": none started here)


class EnginePart:
    """What the stack asks of the engine it runs (``StackSpec.engine``), with the defaults: nothing to start."""

    address = ""  # where its server is when the stack starts none (a cluster elsewhere: HOST:PORT); "": nowhere
    namespace = ""  # what its workers name, where it has namespaces
    worker_settings: Sequence[WorkerSettings] = ()  # the reference agent's in-process workers, where it runs some

    def server(self, spec: StackSpec) -> Any | None:
        """The engine's own server or database, started by the stack and exposed as ``Stack.server`` so the
        server nemeses work on it unchanged: a context manager with ``start()``, ``kill()``, ``pid``, ``port``,
        ``address`` and ``ui_url`` (None); None: the stack starts none."""
        return None

    async def start_in_stack(self, stack: Stack, exits: contextlib.AsyncExitStack) -> None:
        """Start what the engine runs in the stack's process (after the model, the proxies and the ledger, before
        the worker processes), stopped by ``exits``; nothing by default."""

    def child_environment(self, address: str) -> dict[str, str]:
        """What a worker process's environment adds to reach the engine's server at ``address``; nothing by default."""
        return {}


@dataclass
class StackSpec:
    state_dir: Path  # the workers' state: workspaces, effect ledger, checkpoint database
    logs_dir: Path | None = None  # default: <state_dir>/logs
    engine: EnginePart = field(default_factory=EnginePart)  # its server and what it runs here (default: nothing)
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
    ledger: bool = False  # open the reference agent's effect ledger even without an in-process worker
    faults: AgentFaults | None = None  # what the ledger's in-agent fault seams carry (default: the environment's)
    #: an effect ledger already open (another stack's): the in-process workers share it, and it stays open at exit
    effect_ledger: EffectLedger | None = None
    worker_processes: int = 0
    make_worker: Callable[[str, Endpoints], Any] | None = None  # name ("w1"...) -> WorkerProcess / ContainerWorker
    oplog: OperationLog | None = None  # where the supervisor records restarts
    cleanup: list[Callable[[], None]] = field(default_factory=list)  # called last (e.g. remove containers)

    @property
    def logs(self) -> Path:
        return self.logs_dir or self.state_dir / "logs"


@dataclass
class Stack:
    spec: StackSpec
    server: Any | None = None  # the engine's own server (EnginePart.server)
    client: Any | None = None  # the engine's client, where its start_in_stack makes one
    model_server: ScriptedModelServer | None = None
    effects_service: EffectsService | None = None
    server_proxy: FaultProxy | None = None  # the server link: what the partition nemeses of the server link cut
    model_proxy: FaultProxy | None = None
    ledger: EffectLedger | None = None  # the reference agent's effect ledger in this process
    workers: list[SupervisedWorker] = field(default_factory=list)

    def link(self, name: str) -> FaultProxy | None:
        """The proxy of a scenario's link: ``model``, or the server link (the scenarios name it after the engine
        they were written for; on another engine its server's link, ``harness.engines.Registered.stand_in``)."""
        return self.model_proxy if name == "model" else self.server_proxy

    @property
    def model_url(self) -> str | None:
        return self.model_server.url if self.model_server else self.spec.model_url

    @property
    def endpoints(self) -> Endpoints:
        """What worker processes are given: the proxies' addresses when there are proxies."""
        address = self.server_proxy.address if self.server_proxy else (
            self.server.address if self.server else self.spec.engine.address)
        model = f"http://{self.model_proxy.address}/v1" if self.model_proxy else (self.model_url or "")
        env = self.spec.engine.child_environment(address) if address else {}
        effects = self.effects_service.url if self.effects_service else ""
        return Endpoints(address, self.spec.engine.namespace, model, env, effects_url=effects,
                         server=getattr(self.server, "address", "") or "")

    @property
    def settings(self) -> WorkerSettings:
        """The first in-process worker's settings (without one: where the reference agent's state is)."""
        if self.spec.engine.worker_settings:
            return self.spec.engine.worker_settings[0]
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

    def workspace(self, workflow_id: str) -> Path:
        """The reference agent's workspace of one run."""
        return workspace_for(self.settings.sandbox_root, workflow_id)


@contextlib.asynccontextmanager
async def stack(spec: StackSpec) -> AsyncIterator[Stack]:
    """Everything ``spec`` asks for, started in order and stopped in reverse on any exit."""
    s = Stack(spec)
    spec.logs.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as exits:
        for fn in spec.cleanup:
            _stop_off_loop(exits, fn)
        if (server := spec.engine.server(spec)) is not None:
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
                        _host_port(spec.engine.address) if spec.engine.address else None))
            if upstream is not None:  # a cluster elsewhere: its link is attacked on this machine's side of it
                proxy = FaultProxy("server", upstream, seed=spec.seed, listen_port=spec.server_proxy_port)
                try:
                    s.server_proxy = await _enter_off_loop(exits, proxy)
                except OSError as exc:
                    raise RuntimeError(f"cannot put the fault proxy at 127.0.0.1:{spec.server_proxy_port}, the "
                                       f"address the target's workers hard-code ({exc.strerror or exc}): stop what "
                                       "listens there (a server of the engine?) and run again") from None
            if s.model_server is not None:
                s.model_proxy = await _enter_off_loop(
                    exits, FaultProxy("model", ("127.0.0.1", s.model_server.port), seed=spec.seed + 1))
        if spec.effect_ledger is not None:
            s.ledger = spec.effect_ledger
        elif spec.ledger:
            s.ledger = exits.enter_context(EffectLedger(s.settings.resolved_ledger_path, faults=spec.faults))
        await spec.engine.start_in_stack(s, exits)
        if spec.worker_processes:
            assert spec.make_worker is not None, "worker_processes needs make_worker"
            endpoints = s.endpoints
            s.workers = [SupervisedWorker(spec.make_worker(f"w{i}", endpoints))
                         for i in range(1, spec.worker_processes + 1)]
            _stop_off_loop(exits, _stop_workers, s.workers)
            await asyncio.to_thread(_start_workers, s.workers)
            supervisor = Supervisor(s.workers, spec.oplog).start()
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


def _host_port(address: str | None) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as a proxy's upstream; ValueError naming a malformed address."""
    host, sep, port = (address or "").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--address {address!r}: expected HOST:PORT, e.g. cluster.example.com:7233")
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
