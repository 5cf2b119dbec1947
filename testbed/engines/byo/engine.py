"""Bring your own agent: an agent on Temporal that this project did not write, described by a target file
(``testbed/engines/byo/target.py``), run in its own Python.

The cluster is the reference's (server, model, proxies, supervised workers). The workers are the target's
command with the target's interpreter; the driver runs there too (``harness.driver_host``, spoken to over
its stdin and stdout: ``RemoteDriver``), and so does the replay of its histories (the replay checker). That
interpreter gets the target's ``cwd`` and ``env`` and, on its ``PYTHONPATH``, only the ``harness`` package
(standard library only), so the harness's own pins never meet the agent's.

Each worker process also gets the in-agent faults the scenario asks for and where to record: ``DAH_LEDGER``
(``worker_env``, when the target declares a ledger) and ``DAH_CRASH_AT`` / ``DAH_BUGS`` / ``DAH_MUTATIONS``
(``AgentFaults.environment()``, added by ``testbed.worker_process.WorkerProcess.start`` and by container
workers); the contract, and what a target must call for each, is in ``harness/faults.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.operations import History, Op
from testbed.engines.base import Engine, Scenario
from testbed.engines.workload import TIMEOUTS
from testbed.engines.byo.target import Target, target_environment
from testbed.engines.temporal.connection import TemporalConnection
from testbed.engines.temporal.engine import ReferenceOnTemporal
from testbed.engines.temporal.on_server import ReferenceOnServer
from testbed.processes import spawn, stop
from testbed.stack import Endpoints, Stack
from testbed.worker_process import tail

log = logging.getLogger(__name__)
READY_TIMEOUT_S = 120.0  # the driver process imports the target's packages and connects to Temporal


@dataclass
class OwnAgentOnTemporal(ReferenceOnTemporal):
    name: str = "target"
    target_file: Path | None = None

    @classmethod
    def made(cls, entry: dict[str, Any], *, workers: str | None = None, image: str | None = None,
             target: Target | None = None, target_file: Path | None = None,
             connection: TemporalConnection | None = None, on_server: Any = None, **_: Any) -> Engine:
        """The reference agent, or the agent a target file describes, on the embedded server or the
        cluster ``connection`` names, its workers placed by ``workers`` (processes, or Docker containers of
        ``image``); ``on_server``: the reference agent on a server this process runs (``temporal.on_server``)."""
        options = {"workers": workers or "process", "image": image, "connection": connection or TemporalConnection()}
        if target is not None and not target.is_reference:
            return cls(target, target_file=target_file, **entry, **options)
        if on_server is not None:
            return ReferenceOnServer(**entry, **options, on_server=on_server)
        return ReferenceOnTemporal(**entry, **options)

    def record(self) -> dict[str, Any]:
        # absolute: a saved run names the file given on the command line, whatever directory it is checked from
        return {**super().record(), "target_file": os.path.abspath(str(self.target_file or self.target.source))}

    def reproduce(self) -> dict[str, Any]:
        return {**super().reproduce(), "--target": self.target_file or self.target.source}

    def worker_env(self, values: dict[str, str], at: Endpoints | None = None) -> dict[str, str]:
        return {**super().worker_env(values, at), **target_environment(self.target)}

    async def make_driver(self, stack: Stack, history: History, scenario: Scenario, seed: int) -> RemoteDriver:
        driver = RemoteDriver(self.target, history, stack.server.address if stack.server else
                              stack.spec.engine.address, stack.spec.engine.namespace, stack.spec.task_queue,
                              driver_workload(scenario), seed, stack.spec.logs / "driver.log")
        await driver.started()
        return driver


def driver_workload(scenario: Scenario) -> dict[str, Any]:
    """What a target's driver receives as its ``workload`` (``harness.driver_api.Workload``): the scenario's load,
    and the scenario settings a driver honours (continue-as-new threshold, the timeouts profile's workflow task
    timeout)."""
    return {**asdict(scenario.workload), "scenario": scenario.name, "max_history_events": scenario.max_history_events,
            "workflow_task_timeout_s": TIMEOUTS[scenario.timeouts].workflow_task_timeout_s,
            "timeouts": scenario.timeouts}


class RemoteDriver:
    """The driver protocol (``testbed/engines/byo/target.py``) over a ``harness.driver_host`` process in the target's Python."""

    def __init__(self, target: Target, history: History, address: str, namespace: str, task_queue: str,
                 workload: dict[str, Any], seed: int, log_path: Path) -> None:
        self.history = history
        self.workflow_ids: list[str] = []
        self._ops: dict[int, Op] = {}
        self._data: dict[str, Any] | None = None
        self._loop = asyncio.get_running_loop()
        self._ready = threading.Event()
        self._announced = False
        self._run_done: asyncio.Future = self._loop.create_future()
        self._finished: asyncio.Future = self._loop.create_future()
        argv = [target.interpreter, "-m", "harness.driver_host", "--driver", target.driver, "--address", address,
                "--namespace", namespace, "--task-queue", task_queue, "--workload", json.dumps(workload),
                "--seed", str(seed), *(["--chat", json.dumps(target.chat)] if target.chat is not None else [])]
        self._unfit: str | None = None
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        with open(log_path, "wb") as err:
            self._proc = spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=target.cwd,
                               env={**os.environ, **target_environment(target)})
        self._describe = f"the target's driver {target.driver} in {target.interpreter}"
        self._reader = threading.Thread(target=self._read, name="driver-host", daemon=True)
        self._reader.start()

    async def started(self) -> None:
        """Wait (off the event loop) until the driver exists and has said which workflows it drives."""
        if not await asyncio.to_thread(self._ready.wait, READY_TIMEOUT_S) or not self._announced:
            self.close()
            if self._unfit:
                raise RuntimeError(f"the target's driver does not fit the driver API: {self._unfit}")
            raise RuntimeError(f"{self._describe} did not start (log {self.log_path}):\n"
                               f"{tail(self.log_path.read_text(errors='replace'))}")

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for raw in self._proc.stdout:
            try:
                msg = json.loads(raw)
            except ValueError:
                log.warning("driver host printed a non-protocol line: %r", raw[:200])
                continue
            event = msg.get("event")
            if event == "ready":
                self.workflow_ids[:] = msg["workflow_ids"]
                self._announced = True
                self._ready.set()
            elif event == "workflow_ids":
                self.workflow_ids[:] = msg["workflow_ids"]
            elif event == "unfit":
                self._unfit = str(msg.get("error"))[:1000]
            elif event == "invoke":
                self._ops[msg["id"]] = self.history.invoke(msg["process"], msg["f"], msg.get("value"))
            elif event == "complete" and msg["id"] in self._ops:
                self.history.complete(self._ops.pop(msg["id"]), msg["type"], msg.get("value"), msg.get("error"))
            elif event == "run_done":
                self._settle(self._run_done, msg.get("error"))
            elif event == "finished":
                self._data = msg.get("data")
                self._settle(self._finished, None)
        self._ready.set()  # the process ended: nobody waits forever
        self._settle(self._run_done, "the driver process exited")
        self._settle(self._finished, "the driver process exited")

    def _settle(self, future: asyncio.Future, error: str | None) -> None:
        def set_result() -> None:
            if not future.done():
                future.set_result(error)

        self._loop.call_soon_threadsafe(set_result)

    def _send(self, cmd: str) -> None:
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write((json.dumps({"cmd": cmd}) + "\n").encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass  # the process is gone; the futures say so

    async def run(self) -> None:
        self._send("run")
        error = await self._run_done
        if error:
            raise RuntimeError(f"the target's driver failed: {error} (log {self.log_path})")

    def stop(self) -> None:
        self._send("stop")

    async def finish(self) -> None:
        self._send("finish")
        error = await self._finished
        if error:
            raise RuntimeError(f"the target's driver could not finish: {error} (log {self.log_path})")

    def to_json(self) -> dict[str, Any]:
        return self._data or {"workload": {}, "conversations": []}

    def close(self) -> None:
        """End the driver process (close its stdin; then SIGTERM, SIGKILL if it lingers)."""
        if self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            stop(self._proc, grace_s=5)
        self._reader.join(timeout=5)
