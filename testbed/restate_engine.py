"""The agent on Restate in this process, for ``dah run --durability restate`` and the benchmarks.

    async with engine(state_dir, model_url) as e:
        result = await e.run_turn(AgentConfig(), "What is 25 * 4?", "run-1")   # steps.turn_result's shape

``engine`` (also ``agent.engines.restate_agent.engine``) starts a ``restate-server`` (``testbed.restate_server``, its state in ``STATE_DIR/restate``), serves the
``DahAgent`` endpoint (``agent.engines.restate_agent``) with hypercorn on a free port in this process, registers
it, and stops everything on exit. It lives in the test bed, not next to the service: starting a server is the test
bed's job (tests/test_layout.py allows the agent that one import).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from restate.server import install_shutdown_hook

from agent import llm
from agent.contracts import AgentConfig
from agent.engines import restate_agent
from agent.engines.restate_client import RestateClient
from agent.engines.steps import StepResources
from agent.worker import WorkerSettings
from harness.recording import EffectLedger
from testbed.processes import free_port
from testbed.restate_server import RestateServer, RestateServerError


@dataclass
class RestateEngine:
    """The agent on a Restate server this process started: ``run_turn`` submits one run and waits for it."""

    server: RestateServer
    client: RestateClient
    endpoint_url: str
    name: str = restate_agent.NAME

    def record(self) -> dict[str, Any]:
        """What ran: the endpoint, and the server with its durability settings (``RestateServer.record``)."""
        return {"name": self.name, "endpoint": self.endpoint_url, "server": self.server.record()}

    async def run_turn(self, config: AgentConfig, prompt: str, run_id: str, workspace: str | None = None
                       ) -> dict[str, Any]:
        """Run ``prompt`` as the run ``run_id`` (idempotent: the same id again is the same run) and return its
        result; RuntimeError (``RestateRunError``) if it failed."""
        await self.client.submit(run_id, restate_agent.request_body(config, prompt, run_id, workspace))
        return await self.client.wait(run_id, timeout_s=max(60.0, config.planning.start_to_close_s * 10))


@contextlib.asynccontextmanager
async def engine(state_dir: Path, model_url: str, *, ledger: EffectLedger | None = None
                 ) -> AsyncIterator[RestateEngine]:
    """A Restate server (its state in ``state_dir/restate``), this process serving the endpoint on a free port,
    registered; all stopped on exit. ``ledger``: an open effect ledger (default: the state dir's, opened here)."""
    state_dir = Path(state_dir)
    settings = WorkerSettings.in_state_dir(state_dir)
    llm.preload_in_background()
    async with contextlib.AsyncExitStack() as exits:
        if ledger is None:
            ledger = exits.enter_context(EffectLedger(settings.resolved_ledger_path))
        restate_agent.configure(StepResources(ledger=ledger, sandbox_root=settings.sandbox_root,
                                              model_base_url=model_url, worker="in-process"))
        (state_dir / "logs").mkdir(parents=True, exist_ok=True)
        server = RestateServer(state_dir / "restate", log_file=state_dir / "logs" / "restate.log")
        await asyncio.to_thread(exits.enter_context, server)
        exits.callback(_keep_sigterm(asyncio.get_running_loop()))
        port = free_port("127.0.0.1")
        stop = asyncio.Event()
        serving = asyncio.create_task(restate_agent.serve(port, stop))

        async def halt() -> None:
            stop.set()
            await serving

        exits.push_async_callback(halt)
        url = f"http://127.0.0.1:{port}"
        await _register_when_up(server, url, serving)
        client = RestateClient(server.ingress_url)
        exits.push_async_callback(client.close)
        yield RestateEngine(server=server, client=client, endpoint_url=url)


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


async def _register_when_up(server: RestateServer, url: str, serving: asyncio.Task, timeout_s: float = 30.0) -> None:
    """Register the endpoint once it answers (hypercorn binds a moment after its task starts)."""
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
