"""``BrowserEnv``: a real browser the agent drives, through the browser service (``browser_service``).

The environment is a proxy. ``build`` starts the service (``browser_local``:
a process on this machine driving its Chromium; ``browser_docker``: a
container), discovers the service's tools (``GET /tools``) and records where
the service is. Each tool the model calls is forwarded (``POST /call``); the
state shown to the model before each of its calls is the current page
(``GET /state``): URL, title, text and the numbered interactive elements that
``click_element`` and ``input_text`` take.

The service runs apart from the worker, so after a worker crash the next
worker re-attaches to the same browser session (``GET /health`` answers with
the recorded session id). It does not outlive the harness that owns the
worker (``DAH_OWNER``, ``harness.owner``): the service watches that process,
and a container carries its owner label for the harness's reaper. If the
service is gone, ``attach`` starts a new one, reopens the last page the record
knows, and says that it rebuilt it (what was typed into forms is lost). The access token lives in a 0600 file in the
environment's directory, never in the record (which lands in the history).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

import psutil

from agent.contracts import EnvRecord
from agent.envs.base import Env, EnvConfigError, EnvUnavailableError
from agent.envs.browser_service import ALLOWED_SCHEMES, find_chromium
from agent.errors import ToolExecutionError, ToolRetryableError, ToolValidationError
from agent.tools import Tool, ToolContext
from harness import own_module
from harness.owner import ENV_OWNER, OWNER_LABEL

CONTAINER_PORT = 9300
_LAUNCHED: dict[str, subprocess.Popen] = {}  # session id -> the service we started (reaped when it exits)


def _check_common(s: Any) -> None:
    for name in ("action_timeout_s", "max_state_chars", "idle_timeout_s", "start_timeout_s"):
        if getattr(s, name) <= 0:
            raise EnvConfigError(f"env.{name}: must be greater than 0, got {getattr(s, name)}")
    if s.start_url is not None and not s.start_url.startswith(ALLOWED_SCHEMES):
        raise EnvConfigError(f"env.start_url: must be an http(s) URL, got {s.start_url!r}")


@dataclasses.dataclass
class BrowserLocalSettings:
    executable_path: str | None = None  # default: chromium (or chromium-browser, google-chrome) on PATH
    headless: bool = True
    start_url: str | None = None
    action_timeout_s: float = 10.0
    max_state_chars: int = 4000
    idle_timeout_s: float = 1800.0  # the service exits after this long unused (a run never cleaned up)
    start_timeout_s: float = 60.0

    def check(self) -> None:
        _check_common(self)
        if self.executable_path is not None and not os.access(self.executable_path, os.X_OK):
            raise EnvConfigError(f"env.executable_path: {self.executable_path!r} is not an executable file")


@dataclasses.dataclass
class BrowserDockerSettings:
    image: str  # an image with this project, Playwright and Chromium (docker/browser.Dockerfile, built by python -m testbed.images)
    start_url: str | None = None
    action_timeout_s: float = 10.0
    max_state_chars: int = 4000
    idle_timeout_s: float = 1800.0
    start_timeout_s: float = 120.0

    def check(self) -> None:
        _check_common(self)
        if not self.image.strip():
            raise EnvConfigError("env.image: must name a Docker image, e.g. dah-browser:latest")


class _BrowserEnv(Env):
    backend: str

    # -- the service's HTTP API -------------------------------------------------------------------------

    def _token(self) -> str:
        return (self.directory / "token").read_text().strip()

    def _new_token(self) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        token = secrets.token_urlsafe(32)
        path = self.directory / "token"
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token)
        return token

    def _http(self, method: str, path: str, body: Any = None, *, url: str | None = None, timeout: float = 30.0,
              auth: bool = True) -> Any:
        base = url or self.record.data["url"]  # type: ignore[union-attr]
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(base + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if auth:
            request.add_header("Authorization", f"Bearer {self._token()}")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())

    async def _call(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        return await asyncio.to_thread(self._http, method, path, body, **kw)

    def _timeout(self) -> float:
        return self.settings.action_timeout_s * 3 + 10

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def _launch(self, session: str, token: str) -> dict[str, Any]:
        """Start the service; return the record data (at least url and session)."""
        raise NotImplementedError

    async def _stop(self, data: dict[str, Any]) -> str:
        raise NotImplementedError

    async def _wait_healthy(self, url: str, session: str, alive: Any) -> None:
        deadline = time.monotonic() + self.settings.start_timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
                health = await self._call("GET", "/health", url=url, timeout=2.0, auth=False)
                if health.get("session") == session:
                    return
            problem = alive()
            if problem:
                raise EnvUnavailableError(problem)
            await asyncio.sleep(0.1)
        raise EnvUnavailableError(f"the browser service at {url} did not answer within "
                                  f"{self.settings.start_timeout_s:g} s")

    async def build(self) -> EnvRecord:
        session = f"{self.env_id[:40]}-{secrets.token_hex(4)}"
        token = self._new_token()
        data = await self._launch(session, token)
        self.record = EnvRecord(name=self.name, env_id=self.env_id, data=data, note="")
        tools = await self._call("GET", "/tools", timeout=10.0)
        self.record.tools = tools
        self.record.note = f"started browser session {session} ({self.backend}) at {data['url']}"
        return self.record

    async def attach(self, record: EnvRecord) -> str:
        self.record = record
        session = record.data.get("session")
        try:
            health = await self._call("GET", "/health", timeout=3.0, auth=False)
            if health.get("session") == session and (self.directory / "token").exists():
                return f"re-attached to browser session {session} at {record.data['url']} ({health.get('url')})"
            why = f"a different service answers there (session {health.get('session')!r})"
        except (OSError, ValueError, urllib.error.URLError) as exc:
            why = f"it does not answer ({getattr(exc, 'reason', exc)})"
        last_url = record.data.get("last_url")
        with contextlib.suppress(Exception):
            await self._stop(record.data)  # whatever is left of it
        tools = record.tools
        await self.build()
        self.record.tools = tools or self.record.tools
        reopened = ""
        if last_url and last_url.startswith(ALLOWED_SCHEMES) and last_url != "about:blank":
            await self._call("POST", "/call", {"name": "go_to_url", "arguments": {"url": last_url}},
                             timeout=self._timeout())
            self.record.data["last_url"] = last_url
            reopened = f" and reopened {last_url} (anything typed into its forms was lost)"
        note = f"rebuilt: browser session {session} was gone ({why}); started {self.record.data['session']}{reopened}"
        self.record.note = note
        return note

    async def get_state(self) -> str:
        out = await self._call("GET", "/state", timeout=self._timeout())
        self.record.data["last_url"] = out.get("url")  # type: ignore[union-attr]
        return out["state"]

    def get_tools(self) -> list[Tool]:
        return [Tool(spec["function"]["name"], spec["function"].get("description", ""),
                     spec["function"].get("parameters", {"type": "object", "properties": {}}),
                     self._proxy(spec["function"]["name"]), expected_seconds=self._timeout())
                for spec in (self.record.tools if self.record else [])]

    def _proxy(self, name: str) -> Any:
        async def forward(args: dict[str, Any], ctx: ToolContext) -> str:
            try:
                out = await self._call("POST", "/call", {"name": name, "arguments": args}, timeout=self._timeout())
            except (OSError, urllib.error.URLError) as exc:
                # The service went away mid-call: retry (the next attempt re-attaches or rebuilds).
                raise ToolRetryableError(f"{name}: the browser service did not answer ({exc})") from None
            if out.get("ok"):
                self.record.data["last_url"] = out.get("url")  # type: ignore[union-attr]
                return out["content"]
            if out.get("kind") == "validation":
                raise ToolValidationError(out["content"])
            raise ToolExecutionError(out["content"])

        return forward

    async def cleanup(self) -> str:
        if self.record is None:
            return "nothing to clean up"
        with contextlib.suppress(Exception):
            await self._call("POST", "/shutdown", {}, timeout=5.0)
        stopped = await self._stop(self.record.data)
        shutil.rmtree(self.directory, ignore_errors=True)
        return f"closed browser session {self.record.data.get('session')}: {stopped}"


def _reap() -> None:
    for session, proc in list(_LAUNCHED.items()):
        if proc.poll() is not None:
            del _LAUNCHED[session]


class BrowserLocalEnv(_BrowserEnv):
    name = "browser_local"
    backend = "local Chromium"
    settings_class = BrowserLocalSettings
    settings: BrowserLocalSettings

    async def _launch(self, session: str, token: str) -> dict[str, Any]:
        _reap()
        try:
            import playwright  # noqa: F401
        except ImportError:
            raise EnvUnavailableError("browser_local needs Playwright's Python package: pip install playwright "
                                      "(no browser download: it drives the machine's Chromium)") from None
        exe = self.settings.executable_path or find_chromium()
        if exe is None:
            raise EnvUnavailableError("browser_local found no Chromium on PATH; install Debian's chromium package "
                                      "(apt-get install chromium) or set env.executable_path")
        port_file = self.directory / f"port-{session}"
        log_path = self.directory / f"service-{session}.log"
        s = self.settings
        cmd = [*own_module("agent.envs.browser_service"), "--port-file", str(port_file), "--session-id", session,
               "--executable", exe, "--action-timeout", str(s.action_timeout_s),
               "--max-text-chars", str(s.max_state_chars), "--idle-timeout", str(s.idle_timeout_s)]
        if not s.headless:
            cmd.append("--headed")
        if s.start_url:
            cmd += ["--start-url", s.start_url]
        # Only what the service needs: no API keys or other secrets of the worker's environment.
        env = {k: v for k, v in os.environ.items()
               if k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "DISPLAY", "XDG_RUNTIME_DIR", "PYTHONPATH",
                        ENV_OWNER)
               or k.startswith("PLAYWRIGHT_")}
        env["DAH_BROWSER_TOKEN"] = token
        with open(log_path, "ab") as log:
            # Its own session and no parent-death signal: the browser outlives a crashed worker (not its owner).
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=env, cwd=os.getcwd())
        _LAUNCHED[session] = proc

        def alive() -> str | None:
            if proc.poll() is None:
                return None
            tail = log_path.read_text(errors="replace")[-1500:]
            return f"the browser service exited with code {proc.returncode}:\n{tail}"

        deadline = time.monotonic() + s.start_timeout_s
        while not port_file.exists():
            if problem := alive():
                raise EnvUnavailableError(problem)
            if time.monotonic() > deadline:
                proc.kill()
                raise EnvUnavailableError(f"the browser service did not start within {s.start_timeout_s:g} s "
                                          f"(log: {log_path})")
            await asyncio.sleep(0.05)
        url = f"http://127.0.0.1:{int(port_file.read_text())}"
        await self._wait_healthy(url, session, alive)
        return {"url": url, "session": session, "pid": proc.pid, "backend": "local"}

    async def _stop(self, data: dict[str, Any]) -> str:
        session, pid = data.get("session"), data.get("pid")
        proc = _LAUNCHED.pop(session, None) if session else None
        if proc is not None:  # started by this process
            try:
                await asyncio.to_thread(proc.wait, 10)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)
            return f"service pid {proc.pid} exited"
        if not pid:
            return "no service pid recorded"
        try:
            p = psutil.Process(pid)
            if session not in " ".join(p.cmdline()):
                return f"pid {pid} is no longer the service (not touched)"
            try:
                await asyncio.to_thread(p.wait, 10)
            except psutil.TimeoutExpired:
                p.kill()
            return f"service pid {pid} stopped"
        except psutil.NoSuchProcess:
            return f"service pid {pid} had already exited"


class BrowserDockerEnv(_BrowserEnv):
    name = "browser_docker"
    backend = "Docker container"
    settings_class = BrowserDockerSettings
    settings: BrowserDockerSettings

    def _client(self) -> Any:
        from agent.envs.docker_engine import DockerEngineUnavailable, connect

        try:
            return connect(timeout_s=10.0)
        except DockerEngineUnavailable as exc:
            raise EnvUnavailableError(f"browser_docker needs a Docker engine: {exc}") from None

    async def _launch(self, session: str, token: str) -> dict[str, Any]:
        s = self.settings
        client = self._client()
        cmd = ["python", "-m", "agent.envs.browser_service", "--host", "0.0.0.0", "--port", str(CONTAINER_PORT),
               "--session-id", session, "--action-timeout", str(s.action_timeout_s),
               "--max-text-chars", str(s.max_state_chars), "--idle-timeout", str(s.idle_timeout_s)]
        if s.start_url:
            cmd += ["--start-url", s.start_url]
        labels = {"dah.env": self.env_id, "dah.session": session}
        if os.environ.get(ENV_OWNER):  # the owner's reaper removes it when the owner exits, however
            labels[OWNER_LABEL] = os.environ[ENV_OWNER]
        try:
            container = await asyncio.to_thread(
                client.containers.run, s.image, cmd, detach=True, environment={"DAH_BROWSER_TOKEN": token},
                ports={f"{CONTAINER_PORT}/tcp": ("127.0.0.1", None)}, shm_size="512m",
                labels=labels, name=f"dah-browser-{session}"[:60],
            )
            await asyncio.to_thread(container.reload)
            port = container.ports[f"{CONTAINER_PORT}/tcp"][0]["HostPort"]
        except Exception as exc:
            raise EnvUnavailableError(f"browser_docker could not start image {s.image!r}: {exc}") from None
        url = f"http://127.0.0.1:{port}"

        def alive() -> str | None:
            container.reload()
            if container.status in ("exited", "dead"):
                logs = container.logs(tail=30).decode(errors="replace")
                return f"the browser container {container.short_id} exited:\n{logs}"
            return None

        try:
            await self._wait_healthy(url, session, alive)
        except BaseException:
            with contextlib.suppress(Exception):  # a service that never came up leaves no container behind
                await asyncio.to_thread(container.remove, force=True)
            raise
        return {"url": url, "session": session, "container": container.id, "backend": "docker"}

    async def _stop(self, data: dict[str, Any]) -> str:
        container_id = data.get("container")
        if not container_id:
            return "no container recorded"
        client = self._client()
        try:
            container = await asyncio.to_thread(client.containers.get, container_id)
            await asyncio.to_thread(container.remove, force=True)
            return f"container {container_id[:12]} removed"
        except Exception as exc:
            return f"container {container_id[:12]}: {exc}"
