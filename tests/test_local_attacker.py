"""No other local user can change a verdict (issue 40, item 4).

During a live ``dah-chaos run`` on each engine, another local user (uid 65534) connects to every port the run
listens on, and on each tries a forged effects POST (twice: the probe's attack that turned a reference run into
fail), a direct model request, and a Temporal client's signal and update to the run's workflows
(``tests/local_attacker.py``). In the run's private network it reaches none of them, and the run passes. With
``--network shared`` the harness's own servers (the scripted model, the effects service, the fault proxies)
still close its connections unread; Temporal's port is open then, as the run's ``network`` record says.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import restate_server_installed

ROOT = Path(__file__).resolve().parent.parent
NOBODY = 65534
ATTACKER = ROOT / "tests" / "local_attacker.py"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv to act as another local user (uid 65534)")


def _postgres() -> bool:
    return shutil.which("initdb") is not None or bool(list(Path("/usr/lib/postgresql").glob("*/bin/initdb")))


ENGINES = [
    pytest.param("temporal", id="temporal"),
    pytest.param("checkpoint", id="checkpoint"),
    pytest.param("dbos", id="dbos"),
    pytest.param("dbos-postgres", id="dbos-postgres",
                 marks=pytest.mark.skipif(not _postgres(), reason="PostgreSQL is not installed (make system-deps)")),
    pytest.param("restate", id="restate",
                 marks=pytest.mark.skipif(not restate_server_installed(), reason="no restate-server (make restate-server)")),
]


def listening_ports(pid: int) -> dict[int, int]:
    """The TCP ports the process ``pid`` and its descendants listen on, as seen in its own network namespace:
    port -> the pid listening."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    inodes: dict[str, int] = {}
    for p in procs:
        try:
            for fd in os.listdir(f"/proc/{p.pid}/fd"):
                link = os.readlink(f"/proc/{p.pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes[link[8:-1]] = p.pid
        except OSError:
            continue
    ports = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if parts[3] == "0A" and parts[9] in inodes:  # LISTEN
                ports[int(parts[1].rsplit(":", 1)[1], 16)] = inodes[parts[9]]
    return ports


def shared_listeners() -> set[int]:
    """The ports something listens on in this (the machine's) network namespace."""
    ports = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/self/net/{table}").read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] == "0A":
                ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def live_run(out: Path, timeout_s: float = 240.0) -> tuple[Path, list[str]]:
    """Once the run's conversations have started: its directory and workflow ids."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for ops in out.glob("*/*/operations.jsonl"):
            ops_ = [json.loads(line) for line in ops.read_text().splitlines() if '"conversation"' in line]
            wids = list(dict.fromkeys(op["value"]["conversation"] for op in ops_ if op["type"] == "invoke"))
            if wids:  # a conversation started (or, on a one-shot engine, its first message was sent)
                return ops.parent, wids
        time.sleep(0.2)
    raise AssertionError(f"no conversation started under {out} within {timeout_s:.0f} s")


def attack(ports: set[int], workflows: list[str]) -> dict[str, dict]:
    spec = json.dumps({"ports": sorted(ports), "workflows": workflows, "namespace": "default"})
    out = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
                          sys.executable, str(ATTACKER), spec], capture_output=True, text=True, timeout=600,
                         cwd="/")
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def start(tmp_path: Path, durability: str, *extra: str) -> subprocess.Popen[str]:
    out = tmp_path / "runs"
    if durability == "dbos-postgres":  # not under pytest's 0700 root: PostgreSQL's user must enter its data dir
        shared = Path(tempfile.mkdtemp(prefix="dah-attacker-pg-"))
        os.chmod(shared, 0o755)
        out.symlink_to(shared)
    log = open(tmp_path / "chaos.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([sys.executable, "-m", "chaos", "run", "kill_mid_turn", "--durability", durability,
                             "--out", str(out), *extra], stdout=log, stderr=subprocess.STDOUT, text=True, cwd=ROOT)


def finish(proc: subprocess.Popen[str], tmp_path: Path) -> str:
    try:
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    return (tmp_path / "chaos.log").read_text()


@pytest.fixture(autouse=True)
def _remove_shared_runs(tmp_path: Path):  # the runs folder start() put under /tmp directly, if any
    yield
    runs = tmp_path / "runs"
    if runs.is_symlink():
        shutil.rmtree(os.path.realpath(runs), ignore_errors=True)


@pytest.mark.parametrize("durability", ENGINES)
@pytest.mark.slow
def test_another_local_user_reaches_nothing_of_a_live_run(tmp_path: Path, durability: str) -> None:
    proc = start(tmp_path, durability)
    try:
        run_dir, workflows = live_run(tmp_path / "runs")
        ports = set(listening_ports(proc.pid))
        assert ports, "nothing found listening: not the run's servers?"
        elsewhere = shared_listeners()  # the same number in the machine's namespace is someone else's server
        results = attack(ports - elsewhere, workflows)
    finally:
        log = finish(proc, tmp_path)
    assert "network: private" in log, log[-3000:]
    reached = {port: r for port, r in results.items() if r["connected"] or r["temporal"].get("connect") == "ok"
               or any(a.startswith("http") for a in (*r["effects_post"], r["model_request"]))}
    assert reached == {}, json.dumps(reached, indent=1)
    assert results, (sorted(ports), sorted(elsewhere))
    assert proc.returncode == 0, log[-3000:]  # the verdict: pass
    record = json.loads((run_dir / "run.json").read_text())
    assert record["network"] == {"isolation": "private", "why": None, "open_to_local_users": []}
    verdict = json.loads((run_dir / "verdict.json").read_text())
    assert verdict["verdict"] == "pass", verdict


@pytest.mark.slow
def test_in_a_shared_network_the_harness_servers_admit_only_the_run(tmp_path: Path) -> None:
    """--network shared: the model server, effects service and fault proxies close another user's connections
    unread (a forged effects POST, a model request: no answer); Temporal's own port is open, and run.json says so."""
    proc = start(tmp_path, "temporal", "--network", "shared")
    try:
        run_dir, _ = live_run(tmp_path / "runs")
        # the harness's own servers listen in its own process: the model server, effects service, fault proxies
        ours = {port for port, pid in listening_ports(proc.pid).items() if pid == proc.pid}
        assert len(ours) >= 4, ours
        results = attack(ours, [])  # no Temporal calls: in a shared network Temporal's port is open (documented)
        record = json.loads((run_dir / "run.json").read_text())
    finally:
        log = finish(proc, tmp_path)
    assert "network: shared (--network shared)" in log, log[-3000:]
    for port, r in results.items():
        assert not r["connected"], (port, r)
        assert all(a.startswith("no answer") for a in (*r["effects_post"], r["model_request"])), (port, r)
        assert r["temporal"].get("connect") != "ok", (port, r)
    assert record["network"]["isolation"] == "shared" and record["network"]["open_to_local_users"]
    assert proc.returncode == 0, log[-3000:]


@pytest.mark.slow
def test_the_web_ui_of_a_private_run_is_reached_through_a_bridge_that_admits_only_you(tmp_path: Path) -> None:
    """--ui in a private network: the UI listens inside; a bridge in the shared network forwards this user's
    connections to it and closes another user's unread."""
    import re
    import urllib.request

    proc = start(tmp_path, "temporal", "--ui")
    try:
        deadline, url = time.monotonic() + 240, None
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            found = re.search(r"Web UI at (http://127\.0\.0\.1:\d+)", (tmp_path / "chaos.log").read_text())
            url = found.group(1) if found else time.sleep(0.2)
        assert url, (tmp_path / "chaos.log").read_text()[-2000:]
        with urllib.request.urlopen(f"{url}/namespaces/default/workflows", timeout=10) as answer:
            assert answer.status == 200
        theirs = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
                                 sys.executable, "-c", f"import urllib.request as u; u.urlopen({url!r}, timeout=5)"],
                                capture_output=True, text=True, timeout=60, cwd="/")
        assert theirs.returncode != 0 and "200" not in theirs.stdout, theirs
    finally:
        log = finish(proc, tmp_path)
    assert "network: private" in log and proc.returncode == 0, log[-3000:]
