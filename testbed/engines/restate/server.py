"""A Restate server (``restate-server``) owned by this object: free ports, state on disk, always stopped.

    with RestateServer(state_dir / "restate", log_file=logs / "restate.log") as server:
        server.register("http://127.0.0.1:9080")     # a deployment (an SDK endpoint), forced
        server.ingress_url                            # POST {ingress_url}/DahAgent/run/send
        server.kill(); server.start()                 # SIGKILL, then resume from the same base dir

The binary is found as ``find_restate_server`` says (never downloaded: ``make restate-server`` installs it from
npm). The node keeps its state (metadata, the log, the partition stores: RocksDB) under ``base_dir``, so a
SIGKILL followed by ``start()`` resumes every invocation from disk, on the same ports (chosen once, at the first
start). ``port`` is the admin API's port: the one a "server" nemesis needs to know (it is the process that
holds the journal; the ingress is on ``ingress_url``). ``record()`` states the durability settings the server
itself reports (``--dump-config``; ``settings`` without a server).

Besides ports, the configuration sets only what a test bed needs: no telemetry, TCP only (no Unix sockets
under the base dir: their path length is limited), 4 partitions (one node), plain log lines, and a default
invocation retry policy with a 2 s ceiling (Restate's default grows to 1 min: a killed SDK endpoint would wait
that long to be tried again; a ``ctx.run`` with its own retry options is not affected).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.processes import ServerProcess, free_port

log = logging.getLogger(__name__)

ENV_BINARY = "DAH_RESTATE_SERVER"
NPM_BINARY = Path("restate/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server")
VERSION = "1.7.12"  # what ``make restate-server`` installs
#: the default invocation retry policy (see the module docstring)
RETRY_POLICY = {"initial-interval": "200ms", "exponentiation-factor": 2.0, "max-interval": "2s",
                "max-attempts": 200, "on-max-attempts": "pause"}


class RestateServerError(RuntimeError):
    pass


def find_restate_server() -> str:
    """``$DAH_RESTATE_SERVER``, else the npm package's binary under this interpreter's prefix, else
    ``restate-server`` on PATH; RestateServerError saying how to install it otherwise."""
    chosen = os.environ.get(ENV_BINARY)
    if chosen:
        if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
            raise RestateServerError(f"${ENV_BINARY}={chosen!r} is not an executable file")
        return chosen
    for candidate in (str(Path(sys.prefix) / NPM_BINARY), shutil.which("restate-server")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise RestateServerError(f"no restate-server binary found (looked for ${ENV_BINARY}, {Path(sys.prefix) / NPM_BINARY}"
                             f" and restate-server on PATH); `make restate-server` installs it (npm, version {VERSION})")


def _toml(config: dict[str, Any]) -> str:
    """The few shapes this module writes (top-level scalars, one level of tables) as TOML."""
    def value(v: Any) -> str:
        return json.dumps(v) if not isinstance(v, bool) else str(v).lower()

    lines = [f"{k} = {value(v)}" for k, v in config.items() if not isinstance(v, dict)]
    for table, entries in config.items():
        if isinstance(entries, dict):
            lines += ["", f"[{table}]"] + [f"{k} = {value(v)}" for k, v in entries.items()]
    return "\n".join(lines) + "\n"


def settings(config: dict[str, Any]) -> dict[str, Any]:
    """The binary, its version, the retry policy and the storage settings that decide what a crash can lose, as
    ``restate-server --dump-config`` reports them for ``config`` (no server is started)."""
    binary = find_restate_server()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(_toml(config))
        f.flush()
        out = subprocess.run([binary, "--config-file", f.name, "--dump-config"], capture_output=True, text=True,
                             timeout=30, check=True).stdout
    dumped = tomllib.loads(out)
    provider = dumped.get("bifrost", {}).get("default-provider")
    log_store = dumped.get("log-server", {}) if provider == "replicated" else dumped.get("bifrost", {}).get("local", {})
    fsync = not log_store.get("rocksdb-disable-wal-fsync", False)
    return {"binary": binary, "version": version, "default_retry_policy": dict(RETRY_POLICY),
            "durability": {
                "log_provider": provider, "replication": dumped.get("default-replication"),
                "log_rocksdb_wal": not log_store.get("rocksdb-disable-wal", False), "log_rocksdb_wal_fsync": fsync,
                "partitions": dumped.get("default-num-partitions"),
                "statement": (f"the log (bifrost, provider {provider!r}, replication "
                              f"{dumped.get('default-replication')}) is RocksDB with its write-ahead log "
                              f"{'fsynced' if fsync else 'NOT fsynced'} on each write (batch)")}}


@dataclass
class RestateServer(ServerProcess):
    """A single-node ``restate-server`` whose state lives in ``base_dir``."""

    base_dir: Path
    log_file: Path | None = None
    ip: str = "127.0.0.1"
    startup_timeout_s: float = 60.0
    ingress_port: int = 0
    admin_port: int = 0
    node_port: int = 0
    ui_url: str | None = None  # the nemeses ask; Restate's UI is not served here
    name = "restate-server"
    error = RestateServerError
    ready_interval_s = 0.05
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _pending: list[str] = field(default_factory=list, init=False, repr=False)  # what start-up still waits for

    @property
    def port(self) -> int:
        """The admin API's port (what identifies this server to the nemeses)."""
        return self.admin_port

    @property
    def address(self) -> str:
        """``host:port`` of the admin API (``Stack.endpoints`` hands a server's address to worker processes)."""
        return f"{self.ip}:{self.admin_port}"

    @property
    def ingress_url(self) -> str:
        return f"http://{self.ip}:{self.ingress_port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.ip}:{self.admin_port}"

    @property
    def config_file(self) -> Path:
        return self.base_dir / "dah-restate.toml"

    def config(self) -> dict[str, Any]:
        return {"node-name": "dah", "listen-mode": "tcp", "disable-telemetry": True, "default-num-partitions": 4,
                "log-format": "compact", "log-disable-ansi-codes": True,
                "bind-address": f"{self.ip}:{self.node_port}",
                "advertised-address": f"http://{self.ip}:{self.node_port}/",
                "admin": {"bind-address": f"{self.ip}:{self.admin_port}"},
                "ingress": {"bind-address": f"{self.ip}:{self.ingress_port}"},
                "default-retry-policy": RETRY_POLICY}

    def argv(self) -> list[str]:
        return [find_restate_server(), "--config-file", str(self.config_file), "--base-dir",
                str(self.base_dir / "data"), "--no-logo"]

    def prepare(self) -> None:
        """The ports of the first start again, and the configuration file."""
        for name in ("ingress_port", "admin_port", "node_port"):
            if not getattr(self, name):
                setattr(self, name, free_port(self.ip))
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(_toml(self.config()))
        self._pending = [f"{self.admin_url}/health", f"{self.ingress_url}/restate/health", "query"]

    def log_path(self) -> Path:
        return self.log_file or self.base_dir / "restate.log"

    def describe(self) -> str:
        return f"{self.name} (admin {self.admin_url}, ingress {self.ingress_url})"

    def ready(self) -> bool:
        """Admin /health answers, the ingress too, and a query of the invocation table (every partition has a
        leader: invocations can be taken and read)."""
        while self._pending:
            try:
                if self._pending[0] == "query":
                    self.query("SELECT count(*) AS n FROM sys_invocation")
                else:
                    with urllib.request.urlopen(self._pending[0], timeout=1.0) as resp:
                        if resp.status != 200:
                            return False
            except (urllib.error.URLError, OSError, RestateServerError):
                return False
            self._pending.pop(0)
        return True

    def awaited(self) -> str:
        return self._pending[0]

    def kill(self) -> None:
        """SIGKILL the server (a crash); ``start()`` resumes from the base dir."""
        super().kill()

    # -- the admin API ------------------------------------------------------------------------------------------

    def admin(self, method: str, path: str, body: dict[str, Any] | None = None, timeout_s: float = 30.0) -> Any:
        """One admin API call; its JSON answer. RestateServerError with the server's message on an HTTP error."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.admin_url}{path}", data=data, method=method,
                                     headers={"content-type": "application/json", "accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise RestateServerError(f"restate admin {method} {path}: HTTP {exc.code}: "
                                     f"{exc.read().decode(errors='replace')[:500]}") from None
        return json.loads(raw) if raw else None

    def register(self, uri: str) -> dict[str, Any]:
        """Register (forced: again is fine) the SDK endpoint at ``uri`` as a deployment; the admin API's answer."""
        return self.admin("POST", "/deployments", {"uri": uri, "force": True})

    def query(self, sql: str) -> list[dict[str, Any]]:
        """Rows of an SQL query on the server's introspection tables (``sys_invocation``, ``sys_journal``...)."""
        return self.admin("POST", "/query", {"query": sql})["rows"]

    def record(self) -> dict[str, Any]:
        return {**settings(self.config()), "base_dir": str(self.base_dir), "admin_url": self.admin_url,
                "ingress_url": self.ingress_url}
