"""A worker in its own process: started, signalled and stopped by its pid.

    with WorkerProcess(address, task_queue="q", model_base_url=url) as w:
        w.kill()      # SIGKILL: a crash, mid-whatever
        w.start()     # a new process, a new identity

Each process is ``python -m agent worker`` with its own interpreter and
Temporal client. ``start`` returns once the worker prints READY (it is
polling). Output goes to a log file, never to a pipe nobody drains.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.faults import NO_FAULTS, AgentFaults
from testbed.processes import python_module_command, spawn, stop

log = logging.getLogger(__name__)


class WorkerStartError(RuntimeError):
    pass


@dataclass
class WorkerProcess:
    address: str
    task_queue: str
    model_base_url: str | None
    state_dir: Path = Path(".dah")
    identity_prefix: str = "worker"
    namespace: str = "default"
    faults: AgentFaults = NO_FAULTS  # handed to the process through its environment (harness.faults)
    extra_args: tuple[str, ...] = ()  # e.g. ("--workflow", "tests.mutants:WallClockAgentWorkflow")
    # Another agent's worker: a command with {address} {task_queue} {identity} ... placeholders (chaos targets).
    command_template: tuple[str, ...] | None = None
    ready_line: str = "READY"
    cwd: str | None = None
    env: dict[str, str] | None = None
    log_dir: Path | None = None
    start_timeout_s: float = 60.0
    generation: int = field(default=0, init=False)
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _log_path: Path | None = field(default=None, init=False, repr=False)

    @property
    def identity(self) -> str:
        return f"{self.identity_prefix}-{self.generation}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        if self.command_template is not None:
            values = {"python": sys.executable, "address": self.address, "namespace": self.namespace,
                      "task_queue": self.task_queue, "identity": self.identity,
                      "model_url": self.model_base_url or "", "state_dir": str(Path(self.state_dir).resolve())}
            out = []
            for part in self.command_template:
                for key, value in values.items():
                    part = part.replace("{" + key + "}", value)
                out.append(part)
            return out
        cmd = python_module_command(
            "agent", "worker", "--address", self.address, "--namespace", self.namespace,
            "--task-queue", self.task_queue, "--identity", self.identity, "--state-dir", str(self.state_dir),
        )
        if self.model_base_url:
            cmd += ["--model-base-url", self.model_base_url]
        return cmd + list(self.extra_args)

    def start(self, *, faults: AgentFaults | None = None) -> WorkerProcess:
        """Start a new process (a new generation and identity); wait until it polls. ``faults``: from now on
        (the hot-fix starts the next build without its bugs)."""
        if self.alive:
            raise WorkerStartError(f"worker {self.identity} (pid {self.pid}) is still running")
        if faults is not None:
            self.faults = faults
        self.generation += 1
        log_dir = self.log_dir or self.state_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log_path = log_dir / f"{self.identity}.log"
        with open(self._log_path, "wb") as out:
            self._proc = spawn(self.command(), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               cwd=self.cwd, env={**os.environ, **(self.env or {}), **self.faults.environment()})
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            text = self.output()
            if self.ready_line in text:
                log.info("worker %s ready (pid %s)", self.identity, self.pid)
                return self
            if self._proc.poll() is not None:
                raise WorkerStartError(f"worker {self.identity} exited with {self._proc.returncode}: {text[-2000:]}")
            time.sleep(0.05)
        self.stop()
        raise WorkerStartError(f"worker {self.identity} did not print READY within {self.start_timeout_s} s")

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc else None

    def wait_for(self, text: str, timeout_s: float = 60.0) -> bool:
        """Wait until this generation's output contains ``text`` (False on timeout or exit)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.output():
                return True
            if not self.alive:
                return False
            time.sleep(0.05)
        return False

    def output(self) -> str:
        return self._log_path.read_text(errors="replace") if self._log_path and self._log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: the process dies mid-step; nothing of it runs any more."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()

    def pause(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Graceful: SIGTERM, wait for the worker to finish shutting down (SIGKILL after a grace period)."""
        if self._proc is not None:
            self.resume()  # a stopped process cannot handle SIGTERM
            stop(self._proc, grace_s=15.0)

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
