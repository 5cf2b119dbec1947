"""Agent environments: configuration, each environment's lifecycle, the shell's isolation and limits,
and the scripted scenarios on the real dev server (shell, browser, a worker SIGKILLed mid-command)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import psutil
import pytest

from cli.dah import main as cli_main
from agent.config_file import ConfigFileError, load_agent_config
from agent.contracts import AgentConfig, AgentInput, EnvConfig
from agent.envs.base import EnvConfigError, EnvContext, EnvUnavailableError
from agent.envs.registry import get_env, parse_env_config
from agent.envs.sandbox import bwrap_available
from harness.event_history import fetch_chain
from harness.recording import EffectLedger, ExecutionIdentity
from testbed.stack import Stack
from agent.tools import ToolContext, run_tool
from agent.transcript import transcript
from testbed.worker_process import reference_worker
from agent.workflow import AgentWorkflow
from tests.events import HANG_S, wait_for_async
from testbed.engines.temporal.cluster import run_prompt, start_prompt

HAVE_BWRAP, WHY_NO_BWRAP = bwrap_available()
needs_bwrap = pytest.mark.skipif(not HAVE_BWRAP, reason=f"no bubblewrap isolation here: {WHY_NO_BWRAP}")


# -- configuration ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, expected", [
    ({"name": "docker_shell"}, "env.name: unknown environment 'docker_shell'; allowed values: base, shell_local, "
                               "browser_local, browser_docker"),
    ({"timeout_s": 3}, "env.name: missing; allowed values: base, shell_local"),
    ({"name": "browser_docker"}, "env.image: required by environment 'browser_docker' and missing"),
    ({"name": "shell_local", "timeout": 3}, "env.timeout: not an option of environment 'shell_local'; its options "
                                            "are: isolation, timeout_s"),
    ({"name": "shell_local", "isolation": "chroot"}, "env.isolation: must be one of 'bwrap', 'none', got 'chroot'"),
    ({"name": "shell_local", "max_processes": "many"}, "env.max_processes: must be an integer, got 'many'"),
    ({"name": "browser_local", "start_url": "file:///etc/passwd"}, "env.start_url: must be an http(s) URL"),
])
def test_a_bad_env_config_is_refused_naming_the_field_and_allowed_values(raw: dict, expected: str) -> None:
    with pytest.raises(EnvConfigError) as err:
        parse_env_config(raw)
    assert expected in str(err.value)


def test_config_file_chooses_the_environment_and_the_cli_refuses_a_bad_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "agent.yaml"
    good.write_text("model: scripted:shell\ntools: [calculator]\nenv:\n  name: shell_local\n  timeout_s: 5\n")
    cfg = load_agent_config(good)
    assert (cfg.model, cfg.tools, cfg.env) == ("scripted:shell", ["calculator"],
                                               EnvConfig("shell_local", {"timeout_s": 5}))
    assert load_agent_config(tmp_path / "agent.yaml").env.options["timeout_s"] == 5
    (tmp_path / "typo.yaml").write_text("modle: scripted\n")
    with pytest.raises(ConfigFileError, match="unknown key 'modle'; allowed keys: model, tools"):
        load_agent_config(tmp_path / "typo.yaml")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"env": {"name": "browser_cloud"}}))
    assert cli_main(["run", "--config", str(bad), "hello"]) == 2
    err = capsys.readouterr().err
    assert "bad.json: env.name: unknown environment 'browser_cloud'; allowed values: base, shell_local" in err


# -- lifecycles, without Temporal --------------------------------------------------------------------------


def _ctx(tmp_path: Path) -> tuple[EnvContext, EffectLedger]:
    ledger = EffectLedger(tmp_path / "ledger.sqlite3")
    return EnvContext(root=tmp_path / "envs", ledger=ledger), ledger


async def test_base_env_has_no_state_no_tools_and_nothing_to_build(tmp_path: Path) -> None:
    ctx, _ = _ctx(tmp_path)
    env = get_env(EnvConfig(), ctx, "run-1")
    record = await env.build()
    assert (await env.get_state(), env.get_tools(), record.tools) == ("", [], [])
    assert "attached" in await get_env(EnvConfig(), ctx, "run-1").attach(record)
    assert await env.cleanup() == "nothing to clean up"
    assert not (tmp_path / "envs").exists()


class _Bash:
    """The shell environment's bash tool, called the way the env_tool activity calls it."""

    def __init__(self, env, ledger: EffectLedger) -> None:
        self.env, self.ledger, self.calls = env, ledger, 0

    async def __call__(self, command: str) -> str:
        self.calls += 1
        ident = ExecutionIdentity("wf", "run", f"act-{self.calls}", 1, "test-worker")
        ctx = ToolContext(workspace=self.env.directory, ledger=self.ledger, ident=ident)
        return await run_tool(self.env.get_tools()[0], {"command": command}, ctx)


@needs_bwrap
async def test_shell_lifecycle_state_tools_and_cleanup(tmp_path: Path) -> None:
    ctx, ledger = _ctx(tmp_path)
    env = get_env(parse_env_config({"name": "shell_local", "keep_workspace": False}), ctx, "run-2")
    record = await env.build()
    assert record.tool_names() == ["bash"] and record.data["workspace"].endswith("run-2/workspace")
    state = await env.get_state()
    assert "Current time: 20" in state and "You can only run bash commands in your workspace!!!" in state
    assert f"Your workspace: /workspace (on the host: {env.workspace})" in state
    bash = _Bash(env, ledger)
    assert "hello" in await bash("echo hello > a.txt && cat a.txt")
    assert (env.workspace / "a.txt").read_text() == "hello\n"
    again = get_env(parse_env_config({"name": "shell_local"}), ctx, "run-2")
    assert (await again.attach(record)).startswith("re-attached to workspace")
    assert ledger.summary().effects_applied == 1
    assert (await env.cleanup()).startswith("removed")
    assert not env.directory.exists()
    gone = get_env(parse_env_config({"name": "shell_local"}), ctx, "run-2")
    assert (await gone.attach(record)).startswith("rebuilt: the workspace")
    assert (gone.workspace / "a.txt").exists() is False


async def test_shell_refuses_to_run_without_isolation_unless_opted_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, ledger = _ctx(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no bwrap on PATH
    bwrap_available.cache_clear()
    try:
        with pytest.raises(EnvUnavailableError) as err:
            await get_env(parse_env_config({"name": "shell_local"}), ctx, "run-3").build()
        assert "bubblewrap (bwrap) is not installed" in str(err.value)
        assert "'isolation: none'" in str(err.value)
        opted_out = get_env(parse_env_config({"name": "shell_local", "isolation": "none"}), ctx, "run-4")
        await opted_out.build()
        assert "Commands run without isolation" in await opted_out.get_state()
        out = await _Bash(opted_out, ledger)("echo unisolated > u.txt; cat u.txt; echo $HOME")
        assert "unisolated" in out and str(opted_out.directory / "gens") in out
    finally:
        monkeypatch.undo()
        bwrap_available.cache_clear()


@needs_bwrap
async def test_bash_cannot_leave_the_workspace_or_reach_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    ctx, ledger = _ctx(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-for-the-sandbox")
    sentinel = tmp_path / "outside.txt"
    sentinel.write_text("untouched")
    passwd = hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest()
    listener = socket.create_server(("127.0.0.1", 0))
    env = get_env(parse_env_config({"name": "shell_local"}), ctx, "run-5")
    await env.build()
    bash = _Bash(env, ledger)
    out = await bash("cd /; rm -rf x; touch /x 2>&1; cat ../../etc/passwd 2>&1; "
                     f"echo pwned > {sentinel} 2>&1; rm -f {sentinel} 2>&1; ls {tmp_path} 2>&1; "
                     "rm -rf /usr/bin/env 2>&1; ls /usr/bin/env; echo still-here")
    assert "touch: cannot touch '/x': Read-only file system" in out
    assert "cat: ../../etc/passwd: No such file or directory" in out
    assert "rm: cannot remove '/usr/bin/env': Read-only file system" in out
    assert "\n/usr/bin/env\n" in out and "still-here" in out  # the system is read-only
    out = await bash(f"(exec 3<>/dev/tcp/127.0.0.1/{listener.getsockname()[1]}) 2>&1 || echo no-host-port; "
                     "(exec 3<>/dev/tcp/192.0.2.1/80) 2>&1 || echo no-network; env; id -u")
    # Its own network namespace: the host's loopback port is not there, and there is no route anywhere.
    assert "Connection refused" in out and "no-host-port" in out
    assert "Network is unreachable" in out and "no-network" in out
    listener.setblocking(False)
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing ever connected
    assert "OPENAI_API_KEY" not in out and "sk-test" not in out and "HOME=/workspace" in out
    assert out.split("\n")[-2] != "0"  # not root
    listener.close()
    assert sentinel.read_text() == "untouched" and not Path("/x").exists()
    assert hashlib.sha256(Path("/etc/passwd").read_bytes()).hexdigest() == passwd
    assert os.path.exists("/usr/bin/env")


def _sandbox_processes(uid: int | None) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["uids"]):
        try:
            if uid is not None and p.info["uids"].real == uid:
                found.append(p)
        except (psutil.Error, TypeError):
            pass
    return found


@needs_bwrap
async def test_fork_bomb_endless_loop_memory_and_output_are_stopped_by_the_limits(tmp_path: Path) -> None:
    ctx, ledger = _ctx(tmp_path)
    env = get_env(parse_env_config({"name": "shell_local", "timeout_s": 3, "cpu_s": 1, "max_processes": 16,
                                    "memory_mb": 256, "max_output_bytes": 2000}), ctx, "run-6")
    await env.build()
    bash = _Bash(env, ledger)
    uid = env.sandbox_uid
    peak = 0
    stop = threading.Event()

    def watch() -> None:  # the host's view: how many processes the sandbox uid ever had at once
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, len(_sandbox_processes(uid)))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    bomb = await bash("bomb() { bomb | bomb & }; bomb; sleep 60")
    stop.set()
    watcher.join()
    assert "fork: retry: Resource temporarily unavailable" in bomb or "Resource temporarily unavailable" in bomb
    # cut short by the 3 s time limit (the sleep's 60 s never ran out); when the kill lands depends on the machine
    assert 3.0 <= _killed_by_the_time_limit_after(bomb) < 30, bomb[-300:]
    if uid is not None:  # root here: the sandbox has a uid of its own, so the host can count it
        assert 0 < peak <= 16 + 2, peak  # bwrap and setpriv before the drop are root's, not the sandbox's
    assert _sandbox_processes(uid) == []  # nothing of it is left on the host
    sleeper = await bash("sleep 30")
    assert _killed_by_the_time_limit_after(sleeper) >= 3.0, sleeper

    # The limits that are not the clock's, with a time limit no busy machine reaches: a loop's 1 s of CPU time
    # can take longer than 3 s of wall time when others share the CPU.
    (tmp_path / "patient").mkdir()
    patient_ctx, patient_ledger = _ctx(tmp_path / "patient")  # a ledger of its own: the calls' ids start again
    patient = get_env(parse_env_config({"name": "shell_local", "timeout_s": 120, "cpu_s": 1, "max_processes": 16,
                                        "memory_mb": 256, "max_output_bytes": 2000}), patient_ctx, "run-6-patient")
    await patient.build()
    patient_bash = _Bash(patient, patient_ledger)
    assert "[killed by SIGXCPU (CPU time limit)]" in await patient_bash("while :; do :; done")
    memory = await patient_bash("python3 -c 'x = bytearray(512 * 1024 * 1024)' 2>&1 | tail -1")
    assert "MemoryError" in memory
    flood = await patient_bash("yes | head -c 100000")
    assert "[output truncated to 2000 bytes]" in flood and len(flood) < 2300
    assert "[exit code 0]" in await bash("echo the sandbox still works")


def _killed_by_the_time_limit_after(output: str) -> float:
    """The seconds a command ran before the time limit killed it, as its output says (AssertionError if it was not)."""
    said = re.search(r"\[killed by the time limit after (\d+\.\d) s\]", output)
    assert said, f"not killed by the time limit: {output[-300:]}"
    return float(said.group(1))


# -- the browser, without Temporal -------------------------------------------------------------------------

FORM_PAGE = b"""<!doctype html><html><head><title>Greeter</title></head><body>
<h1>Greeter</h1>
<form action="/hello" method="get">
  <label for="name">Your name</label> <input id="name" name="name" placeholder="Ada">
  <button type="submit">Say hello</button>
</form></body></html>"""


class _Site(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/hello"):
            name = parse_qs(urlparse(self.path).query).get("name", ["nobody"])[0]
            body = (f"<!doctype html><html><head><title>Hello</title></head><body>"
                    f"<p id='result'>Hello, {name}! Your form was received.</p><a href='/'>Back</a></body></html>"
                    ).encode()
        else:
            body = FORM_PAGE
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Site)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def _no_browser() -> str | None:
    from agent.envs.browser_service import find_chromium

    try:
        import playwright  # noqa: F401
    except ImportError:
        return "Playwright's Python package is not installed"
    return None if find_chromium() else "no Chromium on PATH (apt-get install chromium)"


needs_browser = pytest.mark.skipif(_no_browser() is not None, reason=f"browser_local unavailable: {_no_browser()}")


@needs_browser
async def test_browser_lifecycle_reattach_rebuild_and_cleanup(tmp_path: Path, site: str) -> None:
    ctx, ledger = _ctx(tmp_path)
    config = parse_env_config({"name": "browser_local"})
    env = get_env(config, ctx, "run-7")
    record = await env.build()
    assert record.tool_names() == ["go_to_url", "click_element", "input_text", "get_page_text", "go_back"]
    assert "token" not in json.dumps(record.data)  # the access token stays in a 0600 file
    assert (env.directory / "token").stat().st_mode & 0o077 == 0
    tools = {t.name: t for t in env.get_tools()}
    tctx = ToolContext(workspace=env.directory, ledger=ledger, ident=ExecutionIdentity("wf", "r", "1", 1, "w"))
    assert "HTTP 200" in await run_tool(tools["go_to_url"], {"url": site}, tctx)
    state = await env.get_state()
    assert "Title: Greeter" in state and '[0] <input name="name" id="name" placeholder="Ada" label="Your name">' in state

    # Another worker (a new Env object) finds the same session and page.
    other = get_env(config, ctx, "run-7")
    assert (await other.attach(record)).startswith("re-attached to browser session")
    assert "Title: Greeter" in await other.get_state()

    # The service dies (the machine rebooted, say): attach starts a new session and reopens the page.
    pid = record.data["pid"]
    psutil.Process(pid).kill()
    await asyncio.sleep(0.2)
    third = get_env(config, ctx, "run-7")
    note = await third.attach(record)
    assert note.startswith("rebuilt: browser session") and f"reopened {site}" in note
    assert third.record.data["session"] != record.data["session"] and "Title: Greeter" in await third.get_state()
    new_pid = third.record.data["pid"]
    assert "closed browser session" in await third.cleanup()
    assert not psutil.pid_exists(new_pid) or psutil.Process(new_pid).status() == psutil.STATUS_ZOMBIE
    assert not env.directory.exists()


NO_ENGINE = "unix:///nonexistent/dah-no-engine.sock"  # DOCKER_HOST where no engine answers, on any machine


async def test_browser_docker_without_an_engine_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)
    ctx, _ = _ctx(tmp_path)
    env = get_env(parse_env_config({"name": "browser_docker", "image": "dah-browser"}), ctx, "run-8")
    with pytest.raises(EnvUnavailableError, match="browser_docker needs a Docker engine"):
        await env.build()


def bridge_gateway(client: Any, network: str = "bridge", wait_s: float = 10.0) -> str:
    """(The test site's host, for ``docker_site``.) The address at which a container on ``network`` (Docker's default bridge) reaches this host: the network's
    gateway. An engine started moments ago can list the bridge before its IPAM entry names a gateway (seen on a
    first start); this waits up to ``wait_s`` for it, then falls back to the first host address of the subnet,
    which is where Docker puts the gateway unless told otherwise. Raises DockerEngineUnavailable saying what the
    network held if neither is there."""
    import ipaddress

    from agent.envs.docker_engine import DockerEngineUnavailable

    deadline = time.monotonic() + wait_s
    while True:
        configs = (client.networks.get(network).attrs.get("IPAM") or {}).get("Config") or []
        gateways = [c["Gateway"] for c in configs if c.get("Gateway") and ":" not in c["Gateway"]]
        if gateways:
            return gateways[0].split("/")[0]
        if time.monotonic() > deadline:
            break
        time.sleep(0.2)
    subnets = [c["Subnet"] for c in configs if c.get("Subnet") and ":" not in c["Subnet"]]
    if subnets:
        return str(next(ipaddress.ip_network(subnets[0], strict=False).hosts()))
    raise DockerEngineUnavailable(f"the {network!r} network names no IPv4 gateway or subnet (IPAM config: {configs}); "
                                  f"check `docker network inspect {network}`")


@pytest.fixture(scope="module")
def docker_site(docker_engine) -> Iterator[str]:
    """The test site, served where a container on Docker's default bridge reaches this host: its gateway."""
    from agent.envs.docker_engine import connect

    client = connect()
    try:
        gateway = bridge_gateway(client)
    finally:
        client.close()
    server = HTTPServer((gateway, 0), _Site)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://{gateway}:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.mark.slow
async def test_browser_docker_scenario(tmp_path: Path, docker_site: str, docker_images) -> None:
    image = await asyncio.to_thread(docker_images, "browser")  # built from this machine's Chromium once, then cached
    ctx, ledger = _ctx(tmp_path)
    env = get_env(parse_env_config({"name": "browser_docker", "image": image}), ctx, "run-9")
    record = await env.build()
    try:
        assert record.data["backend"] == "docker" and record.tool_names()[0] == "go_to_url"
        tools = {t.name: t for t in env.get_tools()}
        tctx = ToolContext(workspace=env.directory, ledger=ledger, ident=ExecutionIdentity("wf", "r", "1", 1, "w"))
        assert "HTTP 200" in await run_tool(tools["go_to_url"], {"url": docker_site}, tctx)
        assert "Title: Greeter" in await env.get_state()  # numbers the page's elements, as before a model call
        await run_tool(tools["input_text"], {"index": 0, "text": "Ada"}, tctx)
        await run_tool(tools["click_element"], {"index": 1}, tctx)
        assert "Hello, Ada!" in await env.get_state()
    finally:
        note = await env.cleanup()
    assert f"container {record.data['container'][:12]} removed" in note


# -- the scripted scenarios on Temporal -----------------------------------------------------------------


def _config(model: str, env: dict, tools: list[str] | None = None) -> AgentConfig:
    cfg = AgentConfig(model=model, tools=tools or [], env=parse_env_config(env))
    cfg.tool.initial_interval_s = cfg.planning.initial_interval_s = 0.5
    return cfg


def _shape(runs) -> list[tuple[str, str]]:
    return [(a.summary.split("(")[0] if a.activity_type == "env_tool" else a.activity_type, a.outcome)
            for run in runs for a in run.activities]


@needs_bwrap
async def test_shell_scenario_creates_files_and_lists_them(stack: Stack) -> None:
    wid = f"shell-{uuid.uuid4().hex[:8]}"
    result, handle = await run_prompt(stack, _config("scripted:shell", {"name": "shell_local"}),
                                            "Create some notes and list them.", wid)
    assert "I created three files in my workspace (/workspace); listing them:" in result.reply
    assert "./README.txt\n./notes/one.txt\n./notes/two.txt\n1\n[exit code 0]" in result.reply
    runs = await fetch_chain(stack.client, wid, handle.result_run_id)
    assert _shape(runs) == [("env_build", "completed"), ("plan_next_action", "completed"), ("bash", "completed"),
                            ("plan_next_action", "completed"), ("bash", "completed"),
                            ("plan_next_action", "completed"), ("env_cleanup", "completed")]
    workspace = stack.settings.sandbox_root.parent / "envs" / f"{wid}-{handle.result_run_id[:8]}" / "workspace"
    assert (workspace / "notes" / "one.txt").read_text() == "first note\n"
    assert sorted(p.name for p in workspace.rglob("*") if p.is_file()) == ["README.txt", "one.txt", "two.txt"]
    summary = stack.ledger.summary(wid)
    assert (summary.effects_applied, summary.duplicated_effects, summary.pending_effects) == (2, 0, 0)


@needs_browser
async def test_browser_scenario_fills_a_form_and_reads_the_result(stack: Stack, site: str) -> None:
    wid = f"browser-{uuid.uuid4().hex[:8]}"
    prompt = f"Open {site}, type 'Ada Lovelace' into the form, submit it and tell me what the page says."
    result, handle = await run_prompt(stack, _config("scripted:browser", {"name": "browser_local"}), prompt, wid)
    assert result.reply == "I submitted the form. The page now says: Hello, Ada Lovelace! Your form was received."
    runs = await fetch_chain(stack.client, wid, handle.result_run_id)
    assert _shape(runs) == [("env_build", "completed"), ("plan_next_action", "completed"),
                            ("go_to_url", "completed"), ("plan_next_action", "completed"),
                            ("input_text", "completed"), ("plan_next_action", "completed"),
                            ("click_element", "completed"), ("plan_next_action", "completed"),
                            ("env_cleanup", "completed")]
    text = await transcript(stack.client, wid)
    print(f"\n--- browser scenario transcript ({wid}) ---\n{text}\n---")
    assert "Title: Greeter" in text and "MODEL calls input_text" in text and "Hello, Ada Lovelace!" in text
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if "agent.envs.browser_service" in " ".join(p.info["cmdline"] or []) and wid in " ".join(
                     p.info["cmdline"] or [])]
    assert leftovers == []  # env_cleanup closed the browser


@needs_bwrap
async def test_cancelled_run_cleans_up_its_environment(stack: Stack) -> None:
    wid = f"shell-cancel-{uuid.uuid4().hex[:8]}"
    cfg = _config("scripted:shell_slow", {"name": "shell_local", "keep_workspace": False})
    cfg.tool.heartbeat_s = 1.0  # the running command learns of the cancellation through a heartbeat
    handle = await start_prompt(stack, cfg, "Run the slow command 30.", wid)
    envs = stack.settings.sandbox_root.parent / "envs"
    async def command_running() -> bool:
        return bool(list(envs.glob(f"{wid}-*/gens/g000001")))

    await wait_for_async(command_running, "the slow command's generation", every_s=0.1)
    await handle.cancel()
    with pytest.raises(Exception):
        await handle.result()
    runs = await fetch_chain(stack.client, wid, handle.result_run_id)
    assert runs[0].status == "canceled"
    assert _shape(runs)[-1] == ("env_cleanup", "completed")
    assert list(envs.glob(f"{wid}-*")) == []  # keep_workspace: false removed it


async def test_an_environment_this_machine_cannot_build_fails_the_run_with_the_reason(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)  # the session's worker runs in this process
    wid = f"docker-{uuid.uuid4().hex[:8]}"
    handle = await start_prompt(stack, _config("scripted", {"name": "browser_docker", "image": "dah-browser"}),
                                      "hello", wid)
    with pytest.raises(Exception) as err:
        await handle.result()
    cause = err.value
    while getattr(cause, "cause", None) is not None:
        cause = cause.cause
    assert "browser_docker needs a Docker engine" in str(cause)
    runs = await fetch_chain(stack.client, wid, handle.result_run_id)
    assert [(a.activity_type, a.attempts, a.outcome) for a in runs[0].activities] == [("env_build", 1, "failed")]


@needs_bwrap
async def test_worker_sigkill_during_bash_then_the_run_completes_with_the_effect_applied_once(
        stack: Stack, tmp_path: Path) -> None:
    task_queue = f"envkill-{uuid.uuid4().hex[:8]}"
    wid = f"shell-kill-{uuid.uuid4().hex[:8]}"
    cfg = _config("scripted:shell_slow", {"name": "shell_local"})
    cfg.tool.heartbeat_s = 1.0
    # No sticky queue on the first worker: after the kill, the next workflow task does not wait 10 s for it.
    first = reference_worker(stack.server.address, task_queue, stack.model_server.url, state_dir=tmp_path,
                          identity_prefix="first", extra_args=("--max-cached-workflows", "0"))
    second = reference_worker(stack.server.address, task_queue, stack.model_server.url, state_dir=tmp_path,
                           identity_prefix="second")
    try:
        first.start()
        handle = await stack.client.start_workflow(AgentWorkflow.run, AgentInput(config=cfg, prompt="Run the slow "
                                                   "command 5."), id=wid, task_queue=task_queue)
        ledger = EffectLedger(tmp_path / "sandbox" / "ledger.sqlite3")
        log = tmp_path / "envs" / "none"

        async def started() -> bool:  # inside the command: 'start' is appended, the 5 s sleep is running
            nonlocal log
            if not [e for e in ledger.executions(wid) if e["tool"] == "bash"]:
                return False
            log = next((tmp_path / "envs").glob(f"{wid}-*")) / "gens" / "g000001" / "log.txt"
            return log.exists() and log.read_text() != ""

        await wait_for_async(started, "the command's first line ('start')", every_s=0.05)
        envdir = log.parents[2]
        assert log.read_text() == "start\n"
        first.kill()
        second.start()  # a new worker process picks the run up
        result = await asyncio.wait_for(handle.result(), HANG_S)
        assert result.reply.startswith("The command finished:")
        assert "start\ndone\n[exit code 0]" in result.reply  # one 'start': the killed attempt left nothing behind
        assert (envdir / "workspace" / "log.txt").read_text() == "start\ndone\n"
        bash_runs = [e for e in ledger.executions(wid) if e["tool"] == "bash"]
        assert [(e["attempt"], e["outcome"]) for e in bash_runs] == [(1, None), (2, "ok")]
        assert [a["tool"] for a in ledger.applications(wid)] == ["bash"]  # applied once
        assert ledger.summary(wid).duplicated_effects == 0
        runs = await fetch_chain(stack.client, wid, handle.result_run_id)
        bash = [a for a in runs[0].activities if a.activity_type == "env_tool"]
        assert [(a.attempts, a.outcome, a.worker.startswith("second")) for a in bash] == [(2, "completed", True)]
        note = await _env_note(stack, wid, bash[0].scheduled_event_id)
        assert note.startswith("re-attached to workspace"), note
        assert _sandbox_processes(get_env(cfg.env, EnvContext(tmp_path / "envs"), envdir.name).sandbox_uid) == []
        ledger.close()
    finally:
        first.stop()
        second.stop()


async def _env_note(stack: Stack, wid: str, scheduled_event_id: int) -> str:
    from temporalio.api.enums.v1 import EventType

    async for event in stack.client.get_workflow_handle(wid).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs = event.activity_task_completed_event_attributes
            if attrs.scheduled_event_id == scheduled_event_id:
                return json.loads(attrs.result.payloads[0].data)["env_note"]
    return ""


def test_the_bridge_gateway_is_read_from_ipam_or_from_the_subnet_when_the_engine_has_not_named_it_yet() -> None:
    from types import SimpleNamespace

    from agent.envs.docker_engine import DockerEngineUnavailable

    def client(*configs: dict[str, str]) -> Any:
        network = SimpleNamespace(attrs={"IPAM": {"Config": list(configs)}})
        return SimpleNamespace(networks=SimpleNamespace(get=lambda name: network))

    assert bridge_gateway(client({"Subnet": "172.17.0.0/16", "Gateway": "172.17.0.1"})) == "172.17.0.1"
    # seen on an engine's first start: the bridge listed before its gateway is
    assert bridge_gateway(client({"Subnet": "172.18.0.0/16"}), wait_s=0) == "172.18.0.1"
    assert bridge_gateway(client({"Subnet": "fd00::/64", "Gateway": "fd00::1"}, {"Subnet": "10.9.0.0/24"}),
                          wait_s=0) == "10.9.0.1"
    with pytest.raises(DockerEngineUnavailable, match="no IPv4 gateway"):
        bridge_gateway(client(), wait_s=0)
