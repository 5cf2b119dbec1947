"""Keeping workers alive: whatever killed a worker (a nemesis, a crash point, a worker that gave up after a long
partition), the supervisor starts it again after a delay and records the restart in the operation log.

A ``SupervisedWorker`` wraps any worker with the surface of ``testbed.worker_process.WorkerProcess`` (a process
or a container). A nemesis that kills or pauses a worker holds it (``held``) so the supervisor does not race
it, and may keep it down for a while (``down_until``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from harness.operations import FAIL, OK, OperationLog

log = logging.getLogger(__name__)


@dataclass
class SupervisedWorker:
    process: Any  # a WorkerProcess, or a ContainerWorker (the same surface)
    lock: threading.Lock = field(default_factory=threading.Lock)
    down_until: float = 0.0  # a nemesis holds it down until then (monotonic)
    restarts: int = 0

    @property
    def name(self) -> str:
        return self.process.identity_prefix

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[Any]:
        """Hold the worker away from the supervisor, acquiring off the event loop (a restart takes seconds)."""
        await asyncio.to_thread(self.lock.acquire)
        try:
            yield self.process
        finally:
            self.lock.release()


class Supervisor:
    """A thread that restarts dead workers every ``poll_s``, recording each restart in ``history``."""

    def __init__(self, workers: list[SupervisedWorker], oplog: OperationLog | None, poll_s: float = 0.2) -> None:
        self.workers = workers
        self.oplog = oplog
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            for w in self.workers:
                with w.lock:
                    if w.process.alive or time.monotonic() < w.down_until or self._stop.is_set():
                        continue
                    self._restart(w)

    def _restart(self, w: SupervisedWorker) -> None:
        code = w.process.returncode
        tail = w.process.output()[-400:]
        reason = "crash point" if "crash point" in tail else \
            "fatal worker failure" if "failed fatally" in tail else \
            "drained" if "worker stopped" in tail and code == 0 else "process died"
        op = self.oplog.invoke("supervisor", "restart_worker", {"worker": w.name, "exit_code": code,
                                                                  "reason": reason}) if self.oplog else None
        try:
            w.process.start()
            w.restarts += 1
            if op is not None:
                self.oplog.complete(op, OK, {"worker": w.name, "identity": w.process.polling_identity})
        except Exception as exc:  # recorded; the supervisor tries again next round
            log.warning("restarting worker %s failed: %s", w.name, exc)
            if op is not None:
                self.oplog.complete(op, FAIL, error=f"{type(exc).__name__}: {exc}")
