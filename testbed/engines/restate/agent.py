"""The reference agent's loop on Restate: one prompt to a final answer as one invocation of ``DahAgent/run``.

    python -m testbed.engines.restate.agent endpoint --port 9080 --state-dir .dah --identity e1 --model-base-url URL

``engine(state_dir, model_url)`` runs it in this process, with a Restate server it starts (``dah run --durability
restate``, the benchmarks); ``testbed.engines.restate.engine`` is the engine the chaos runs attack.

The handler runs ``loop.run_turn`` unchanged; its two effects are ``ctx.run_typed`` actions calling
``testbed.engines.steps.plan`` and ``steps.tool``, so the Restate server journals each model call and tool call and
a retried or recovered invocation replays them instead of running them again. Retry options come from the agent
config's planning and tool policies (``RunOptions``: max attempts, initial and maximum interval, factor); a
``ModelConfigurationError`` is terminal. A second handler, ``noop_steps``, times n no-op actions (what a step costs
Restate itself: the engines benchmark).

Identity of an action (the effect ledger's ``ExecutionIdentity``):

* ``workflow_id``: the run id, which the client sends both as the invocation's idempotency key and in the input
  (the SDK's ``request().idempotency_key`` is None for an ingress ``/send``, and the header is not passed on);
  without one, the invocation id;
* ``run_id``: ``"restate"``;
* ``activity_id``: the action's position in the handler (``0``, ``1``, ...), counted as the handler creates its
  ``ctx.run``s, which it does in a deterministic order: the same on every replay;
* ``attempt``: the SDK does not tell an action which attempt it is (``ctx.request()`` carries no retry count), so
  it is derived from the ledger: 1 + the executions of this idempotency key recorded before (a SIGKILLed attempt
  counts too, as it does for Restate's own retry count);
* ``worker``: this process's identity (what an aimed kill looks for).

Concurrent tool calls: ``run_turn`` runs one message's tool calls under ``asyncio.gather``. The Python SDK polls
its connection from whichever task awaits a Restate future, and concurrent awaits from several tasks are not a
supported pattern (its combinators, ``restate.gather``/``select``, are). So ``call_tool`` creates its
``ctx.run`` at once (journal order = the model's call order, since gather starts its tasks in order), and one
batch awaits every tool of that message with ``restate.gather``; each call then reads its own, completed, future.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import restate
from restate.exceptions import TerminalError
from restate.server import install_shutdown_hook

from agent import loop
from testbed.engines.checkpoint.agent_task import config_from
from agent.contracts import WORKFLOW_NATIVE_TOOLS, ActivityPolicy, AgentConfig
from testbed.engines import steps
from testbed.engines.restate.client import RestateClient
from testbed.engines.steps import StepResources
from agent.errors import ModelConfigurationError
from harness.recording import EffectLedger, ExecutionIdentity

SERVICE = "DahAgent"
HANDLER = "run"
NAME = "restate"

agent = restate.Service(SERVICE)
_resources: StepResources | None = None


def configure(resources: StepResources) -> None:
    """What this process's actions use (its ledger, workspaces, model and identity); before serving."""
    global _resources
    _resources = resources


def request_body(config: AgentConfig, prompt: str, run_id: str, workspace: str | None = None) -> dict[str, Any]:
    """The handler's input: the agent config, the prompt, the run id (also the idempotency key) and the workspace
    key its tools share (default: the run's own)."""
    body: dict[str, Any] = {"config": dataclasses.asdict(config), "prompt": prompt, "run_id": run_id}
    if workspace is not None:
        body["workspace"] = workspace
    return body


def run_options(policy: ActivityPolicy) -> restate.RunOptions:
    """The step's retry policy as Restate run options (``maximum_attempts`` 0: retried until it succeeds)."""
    return restate.RunOptions(type_hint=dict, max_attempts=policy.maximum_attempts or None,
                              initial_retry_interval=timedelta(seconds=policy.initial_interval_s),
                              max_retry_interval=timedelta(seconds=policy.maximum_interval_s),
                              retry_interval_factor=policy.backoff_coefficient)


def _identity(res: StepResources, workflow_id: str, activity_id: str) -> ExecutionIdentity:
    """This attempt's identity; the attempt counted from the ledger (the SDK does not expose it)."""
    ident = ExecutionIdentity(workflow_id, NAME, activity_id, 1, res.worker)
    earlier = sum(1 for e in res.ledger.executions(workflow_id) if e["idempotency_key"] == ident.idempotency_key)
    return dataclasses.replace(ident, attempt=earlier + 1)


def _configured() -> StepResources:
    if _resources is None or _resources.ledger is None:
        raise RuntimeError("restate_agent.configure(...) with an effect ledger must run before the endpoint serves")
    return _resources


async def _plan_action(workflow_id: str, activity_id: str, model: str, messages: list[dict[str, Any]],
                       tools: list[str], timeout_s: float) -> dict:
    res = _configured()
    try:
        return await steps.plan(res, _identity(res, workflow_id, activity_id), model, messages, tools, timeout_s)
    except ModelConfigurationError as exc:
        raise TerminalError(f"model configuration: {exc}") from exc


async def _tool_action(workflow_id: str, activity_id: str, name: str, arguments: dict[str, Any],
                       max_attempts: int, workspace: str | None) -> dict:
    res = _configured()
    return await steps.tool(res, _identity(res, workflow_id, activity_id), name, arguments, max_attempts, workspace)


class RestateEffects:
    """``loop.AgentEffects`` in a Restate handler: the model and each tool call are journaled ``ctx.run`` actions."""

    def __init__(self, ctx: restate.Context, config: AgentConfig, workspace: str | None, run_id: str | None
                 ) -> None:
        self.ctx = ctx
        self.config = config
        self.workspace = workspace
        request = ctx.request()
        self.workflow_id = run_id or request.idempotency_key or request.id
        self._actions = 0
        self._batch: list[Any] | None = None
        self._batch_done: asyncio.Task | None = None

    def _next_activity_id(self) -> str:
        self._actions += 1
        return str(self._actions - 1)

    async def plan(self, messages: list[dict[str, Any]], tools: list[str]) -> dict[str, Any]:
        cfg = self.config
        out = await self.ctx.run_typed("plan", _plan_action, run_options(cfg.planning),
                                       workflow_id=self.workflow_id, activity_id=self._next_activity_id(),
                                       model=cfg.model, messages=list(messages), tools=tools,
                                       timeout_s=max(1.0, cfg.planning.start_to_close_s - 1.0))
        return out["message"]

    async def call_tool(self, call: loop.ToolCall) -> loop.ToolResult:
        if call.name in WORKFLOW_NATIVE_TOOLS:
            return loop.ToolResult(call.id, call.name, loop.BAD_CALL,
                                   f"{call.name} is not available on the Restate engine (Temporal only)")
        future = self.ctx.run_typed(f"tool:{call.name}", _tool_action, run_options(self.config.tool),
                                    workflow_id=self.workflow_id, activity_id=self._next_activity_id(),
                                    name=call.name, arguments=call.arguments,
                                    max_attempts=self.config.tool.maximum_attempts, workspace=self.workspace)
        await self._await_batch(future)
        out = await future
        return loop.ToolResult(call.id, call.name, out["status"], out["content"])

    async def _await_batch(self, future: Any) -> None:
        """Wait, with one ``restate.gather``, for every tool future created in this tick (see the module doc)."""
        if self._batch is None:
            self._batch = []
            self._batch_done = asyncio.ensure_future(self._gather_batch())
        self._batch.append(future)
        done = self._batch_done
        await asyncio.shield(done)

    async def _gather_batch(self) -> None:
        await asyncio.sleep(0)  # the other tool calls of this message create their futures first
        batch, self._batch = self._batch, None
        await restate.gather(*batch)


@agent.handler(HANDLER)
async def run(ctx: restate.Context, body: dict) -> dict:
    """One prompt to a final answer (a one-shot run): ``steps.turn_result``'s shape."""
    cfg = config_from(body["config"])
    messages = loop.initial_messages(cfg.system_prompt)
    effects = RestateEffects(ctx, cfg, body.get("workspace"), body.get("run_id"))
    result = await loop.run_turn(messages, body["prompt"], effects, cfg.tools, cfg.max_steps_per_turn)
    return steps.turn_result(result, messages)


def _noop(i: int) -> int:
    return i


@agent.handler("noop_steps")
async def noop_steps(ctx: restate.Context, n: int) -> list[float]:
    """``n`` no-op ``ctx.run`` actions, each timed (ms): what a step costs Restate itself (the engines benchmark)."""
    return await steps.timed(n, lambda i: ctx.run_typed("noop", _noop, restate.RunOptions(type_hint=int), i=i))


def asgi_app() -> Any:
    return restate.app(services=[agent])


async def serve(port: int, stop: asyncio.Event, host: str = "127.0.0.1") -> None:
    """Serve the endpoint (HTTP/2 cleartext, hypercorn) on ``host:port`` until ``stop`` is set."""
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.5
    await hypercorn_serve(asgi_app(), config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]


# -- the in-process engine (dah run, the benchmarks) ------------------------------------------------------------

@dataclasses.dataclass
class InProcessRestate:
    """The agent on a Restate server this process started: ``run_turn`` submits one run and waits for it."""

    server: Any  # testbed.engines.restate.server.RestateServer
    client: RestateClient
    endpoint_url: str
    name: str = NAME

    def record(self) -> dict[str, Any]:
        """What ran: the endpoint, and the server with its durability settings (``RestateServer.record``)."""
        return {"name": self.name, "endpoint": self.endpoint_url, "server": self.server.record()}

    async def run_turn(self, config: AgentConfig, prompt: str, run_id: str, workspace: str | None = None
                       ) -> dict[str, Any]:
        """Run ``prompt`` as the run ``run_id`` (idempotent: the same id again is the same run) and return its
        result; RuntimeError (``RestateRunError``) if it failed."""
        await self.client.submit(run_id, request_body(config, prompt, run_id, workspace))
        return await self.client.wait(run_id, timeout_s=max(60.0, config.planning.start_to_close_s * 10))

    async def noop_steps(self, n: int) -> list[float]:
        """The time of each of ``n`` no-op steps of one invocation (ms)."""
        return await self.client.call("noop_steps", n)

    @property
    def banner(self) -> str:
        """What ``dah demo`` says first (``testbed.engines.base.Session``)."""
        return ("durable-agent-harness demo: the agent loop as a Restate service (each step a journaled ctx.run)\n"
                f"Restate: {self.server.admin_url} (state {self.server.base_dir})")

    async def describe_run(self, run_id: str) -> list[str]:
        """Where the run is, then its journaled actions as the Restate server reports them (``sys_journal``)."""
        rows = await asyncio.to_thread(
            self.server.query, "SELECT j.index, j.entry_type, j.name FROM sys_journal j JOIN sys_invocation i "
            "ON j.id = i.id WHERE i.idempotency_key = '" + run_id.replace("'", "''") + "' ORDER BY j.index")
        return [f"run id:      {run_id} (journal in {self.server.base_dir}; admin API {self.server.admin_url})",
                *(f"  ├─ journal {row['index']:<3} {row['entry_type']:<28} {row.get('name') or ''}" for row in rows)]


@contextlib.asynccontextmanager
async def engine(state_dir: Path, model_url: str, *, ledger: EffectLedger) -> AsyncIterator[InProcessRestate]:
    """A Restate server (its state in ``state_dir/restate``), this process serving the endpoint on a free port,
    registered; all stopped on exit. ``ledger``: the open effect ledger the steps record in.
    ``EngineUnavailable`` if there is no restate-server binary."""
    from agent import llm
    from testbed.engines import EngineUnavailable
    from agent.worker import WorkerSettings
    from testbed.processes import free_port
    from testbed.engines.restate.server import RestateServer, RestateServerError, find_restate_server

    try:
        find_restate_server()
    except RestateServerError as exc:
        raise EngineUnavailable(str(exc)) from None
    state_dir = Path(state_dir)
    settings = WorkerSettings.in_state_dir(state_dir)
    llm.preload_in_background()
    async with contextlib.AsyncExitStack() as exits:
        configure(StepResources(ledger=ledger, sandbox_root=settings.sandbox_root, model_base_url=model_url,
                                worker="in-process"))
        (state_dir / "logs").mkdir(parents=True, exist_ok=True)
        server = RestateServer(state_dir / "restate", log_file=state_dir / "logs" / "restate.log")
        await asyncio.to_thread(exits.enter_context, server)
        exits.callback(_keep_sigterm(asyncio.get_running_loop()))
        port = free_port("127.0.0.1")
        stop = asyncio.Event()
        serving = asyncio.create_task(serve(port, stop))

        async def halt() -> None:
            stop.set()
            await serving

        exits.push_async_callback(halt)
        url = f"http://127.0.0.1:{port}"
        await _register_when_up(server, url, serving)
        client = RestateClient(server.ingress_url)
        exits.push_async_callback(client.close)
        yield InProcessRestate(server=server, client=client, endpoint_url=url)


def _keep_sigterm(loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    """The SDK's app takes SIGTERM over when its first request arrives (``loop.add_signal_handler``); give it back
    to what handled it before the engine (``dah``'s, the benchmarks' ``stop_on_sigterm``, or the default: exit).
    Returns the undo, for the engine's exit."""
    previous = signal.getsignal(signal.SIGTERM)

    def restore() -> None:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, previous)

    def pass_on() -> None:
        restore()
        signal.raise_signal(signal.SIGTERM)

    try:
        install_shutdown_hook(loop, pass_on)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread: signals are not ours to route
        return lambda: None
    return restore


async def _register_when_up(server: Any, url: str, serving: asyncio.Task, timeout_s: float = 30.0) -> None:
    """Register the endpoint once it answers (hypercorn binds a moment after its task starts)."""
    from testbed.engines.restate.server import RestateServerError

    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        if serving.done():
            serving.result()  # raises why it stopped
            raise RuntimeError(f"the Restate endpoint at {url} stopped before it was registered")
        try:
            await asyncio.to_thread(server.register, url)
            return
        except RestateServerError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)


# -- the endpoint process (chaos workers) -----------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testbed.engines.restate.agent",
                                     description="The reference agent as a Restate service (DahAgent).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    p = sub.add_parser("endpoint", help="serve the DahAgent service (HTTP/2 cleartext) until SIGTERM/Ctrl-C")
    p.add_argument("--port", type=int, required=True,
                   help="the port to serve on (fixed per worker: Restate pins invocations to a deployment's URI)")
    p.add_argument("--state-dir", type=Path, default=Path(".dah"),
                   help="tool workspaces and the effect ledger live in STATE_DIR/sandbox (default .dah)")
    p.add_argument("--identity", help="this process's identity in the effect ledger (default host:pid)")
    p.add_argument("--model-base-url", help="the scripted model server's URL (default none: live models only)")
    return parser


async def _endpoint(args: argparse.Namespace) -> int:
    import socket

    from agent import llm
    from agent.worker import WorkerSettings

    identity = args.identity or f"{socket.gethostname()}:{uuid.uuid4().hex[:6]}"
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # The SDK's app takes over SIGTERM when its first request arrives (one handler per signal and loop): hooks
        # registered here run from its dispatcher too.
        install_shutdown_hook(asyncio.get_running_loop(), stop.set, sig)
    settings = WorkerSettings.in_state_dir(args.state_dir)
    with EffectLedger(settings.resolved_ledger_path) as ledger:
        configure(StepResources(ledger=ledger, sandbox_root=settings.sandbox_root, model_base_url=args.model_base_url,
                                worker=identity))
        llm.preload_in_background()  # LiteLLM's import takes seconds: not inside the first model step
        serving = asyncio.create_task(serve(args.port, stop))

        async def announce_warm() -> None:
            await llm.wait_loaded()
            print("WARM model client loaded", flush=True)

        warm = asyncio.create_task(announce_warm())
        await _wait_listening(args.port, serving)
        print(f"READY restate endpoint identity={identity} port={args.port} model={args.model_base_url}", flush=True)
        try:
            await serving
        finally:
            warm.cancel()
    return 0


async def _wait_listening(port: int, serving: asyncio.Task, timeout_s: float = 30.0) -> None:
    """Return once ``port`` accepts connections (the ready line must not come before)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        if serving.done():
            serving.result()
            raise RuntimeError(f"the endpoint stopped before listening on port {port}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.05)
    raise RuntimeError(f"the endpoint did not listen on port {port} within {timeout_s} s")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(_endpoint(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
