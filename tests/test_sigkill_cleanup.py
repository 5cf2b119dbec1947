"""Nothing the harness starts outlives it: a chaos run SIGKILLed mid-run leaves none of its processes and none of
the temporary directories it made for itself, and the PostgreSQL server it starts admits only the harness.

Each test starts ``python -m chaos run kill_mid_turn --durability X`` as a plain child, with a temporary directory
of its own (``TMPDIR``), collects every process of the run while it runs (the harness's descendants, and any
process whose command line or working directory names the run's out dir), SIGKILLs only the harness's pid once the
nemesis has acted, and then expects every collected process gone, and no ``dah-pg-*`` (a PostgreSQL socket
directory) or ``dah-harness-path-*`` directory left in its temporary directory but the shared one every run
reuses. What is left gets ``GONE_WITHIN_S`` to go: far less than the minutes a run's processes would live on
(a worker waits for work, a server serves) and far more than a busy machine needs to reap them. Survivors are
killed by pid at teardown so a failing test leaks nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from agent.envs.docker_engine import DockerEngineUnavailable, connect, docker_engine_available
from testbed.containers import OWNER_LABEL
from testbed.dockerd import _cannot_start, ensure_engine
from testbed.engines.dbos.postgres import PostgresServer, find_bin
from tests.conftest import restate_server_installed
from tests.events import running, wait_for

ROOT = Path(__file__).resolve().parent.parent
#: what is left of a SIGKILLed harness dies with it (parent-death signals, the reaper) at once; on a busy machine
#: reaping takes seconds, and a leak would live on for the minutes a worker or server waits
GONE_WITHIN_S = 60.0


def _postgres_installed() -> bool:
    try:
        find_bin("initdb")
        return True
    except Exception:  # noqa: BLE001 - PostgresError: not installed
        return False


def _run_containers(harness: int) -> list[str]:
    """The ids of the containers the harness started (its owner label), on the engine that answers (if any)."""
    try:
        client = connect(timeout_s=5.0)
    except DockerEngineUnavailable:
        return []
    try:
        return [c.id for c in client.containers.list(all=True, filters={"label": OWNER_LABEL})
                if c.labels[OWNER_LABEL].startswith(f"{harness}-")]
    except Exception:  # noqa: BLE001 - the engine stopping as we ask: none found now
        return []
    finally:
        client.close()


def _run_processes(harness: int, out: Path, containers: set[str] = frozenset()) -> set[psutil.Process]:
    """The harness's descendants, processes whose command line or working directory names ``out``, and the
    containers' shims (which name the container's id) with everything under them."""
    found: set[psutil.Process] = set()
    try:
        found.update(psutil.Process(harness).children(recursive=True))
    except psutil.NoSuchProcess:
        pass
    for p in psutil.process_iter(["cmdline", "cwd"]):
        cmdline = " ".join(p.info["cmdline"] or [])
        if p.pid != harness and (str(out) in cmdline or str(p.info["cwd"] or "").startswith(str(out))
                                 or any(cid in cmdline for cid in containers)):
            found.add(p)
            try:
                found.update(p.children(recursive=True))
            except psutil.NoSuchProcess:
                pass
    return found


def _mid_run(out: Path) -> bool:
    """The nemesis has killed a worker (the run has its full cast of processes, and a restarted one)."""
    return any('"kill' in line and '"nemesis"' in line
               for log in out.glob("*/*/operations.jsonl") for line in log.read_text(errors="replace").splitlines())


@pytest.fixture
def out_dir() -> Iterator[Path]:
    # Not under pytest's 0700 root: PostgreSQL's account must enter the state dir (the documented exception).
    out = Path(tempfile.mkdtemp(prefix="dah-sigkill-"))
    os.chmod(out, 0o755)
    yield out
    shutil.rmtree(out, ignore_errors=True)


#: the temporary directories a harness makes for itself: a PostgreSQL server's socket directory, a harness path
OWN_TEMP_DIRS = ("dah-pg-", "dah-harness-path-")


def _own_temp_dirs(tmp: Path) -> set[str]:
    """The harness's temporary directories in ``tmp``, but the shared harness path every run reuses (one per user and
    checkout: ``dah-harness-path-<uid>-<digest>``, holding one symlink)."""
    shared = f"dah-harness-path-{os.geteuid()}-"
    return {p.name for p in tmp.iterdir() if p.name.startswith(OWN_TEMP_DIRS)
            and not (p.name.startswith(shared) and len(p.name) == len(shared) + 12)}


def _sigkill_mid_run(durability: str, out: Path, *extra: str, docker: bool = False) -> None:
    log = out / "harness.log"
    tmp = out / "tmp"  # the harness's own temporary directory: what it leaves there is what this test sees
    tmp.mkdir()
    os.chmod(tmp, 0o755)  # PostgreSQL's account passes through it to its socket directory
    with open(log, "wb") as f:
        harness = subprocess.Popen([sys.executable, "-m", "chaos", "run", "kill_mid_turn", "--durability", durability,
                                    "--seed", "1", "--out", str(out), *extra],
                                   stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                                   env={**os.environ, "TMPDIR": str(tmp)})
    seen: set[psutil.Process] = set()
    containers: set[str] = set()
    made: set[str] = set()

    def collect() -> None:
        if docker:
            containers.update(_run_containers(harness.pid))
        seen.update(_run_processes(harness.pid, out, containers))
        made.update(_own_temp_dirs(tmp))

    try:
        def nemesis_killed() -> bool:  # the run's processes are collected as they come
            collect()
            return _mid_run(out)

        wait_for(nemesis_killed, "the nemesis's first worker kill", proc=harness, log=log, every_s=0.2)
        time.sleep(1.0)  # the supervisor restarts the killed worker
        collect()
        assert seen, "no process of the run was found"
        assert containers or not docker, "no container of the run was found"
        harness.kill()
        harness.wait()
        deadline = time.monotonic() + GONE_WITHIN_S
        while True:
            left = {p for p in seen | _run_processes(harness.pid, out, containers) if running(p)}
            kept = _run_containers(harness.pid) if docker else []
            dirs = _own_temp_dirs(tmp)
            if not (left or kept or dirs) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        described = [f"{p.pid} {' '.join(p.cmdline())[:160]}" for p in left if p.is_running()]
        assert not left, (f"{len(left)} of the run's {len(seen)} processes outlived the SIGKILLed harness by "
                          f"{GONE_WITHIN_S:g} s:\n" + "\n".join(described))
        assert not kept, f"containers {kept} of the SIGKILLed harness still exist after {GONE_WITHIN_S:g} s"
        assert durability != "dbos-postgres" or any(d.startswith("dah-pg-") for d in made), \
            f"the run made no PostgreSQL socket directory in {tmp}: {sorted(made)}"
        assert not dirs, f"the SIGKILLed harness left {sorted(dirs)} in {tmp} after {GONE_WITHIN_S:g} s"
        print(f"\nSIGKILLed the harness with {len(seen)} of the run's processes, {len(containers)} container(s) and "
              f"{len(made)} temporary directories of its own; left after {GONE_WITHIN_S:g} s: {len(left)} "
              f"process(es), {len(kept)} container(s), {len(dirs)} directories")
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
        for p in seen | _run_processes(harness.pid, out, containers):
            try:
                p.kill()  # psutil checks the pid still names the process it saw
            except psutil.Error:
                pass


@pytest.mark.parametrize("durability", ["temporal", "checkpoint", "dbos", "dbos-postgres", "restate"])
@pytest.mark.slow
def test_a_sigkilled_harness_leaves_no_process_behind(durability: str, out_dir: Path) -> None:
    if durability == "dbos-postgres" and not _postgres_installed():
        pytest.skip("PostgreSQL is not installed (make system-deps)")
    if durability == "restate" and not restate_server_installed():
        pytest.skip("Restate's server is not installed (make restate-server)")
    _sigkill_mid_run(durability, out_dir)


@pytest.mark.xdist_group("docker")  # the Docker engine's tests run on one worker (tests/conftest.py)
@pytest.mark.parametrize("engine", ["started by the run", "already running"])
@pytest.mark.slow
def test_a_sigkilled_harness_leaves_no_container_behind(engine: str, out_dir: Path) -> None:
    """Workers in containers: removed at once (by the reaper, or by the supervisor of a dockerd the run started,
    which then stops that dockerd with one SIGTERM); an engine that was already running is left running."""
    ok, reason = docker_engine_available()
    if not ok and _cannot_start(reason):
        pytest.skip(f"no Docker engine: {_cannot_start(reason)}")
    # Cached; built first so the run reaches its nemesis in time (in a process of its own, which stops any engine
    # it started)
    subprocess.run([sys.executable, "-m", "testbed.images", "build", "worker"], check=True, capture_output=True,
                   cwd=ROOT, timeout=300)
    ours = ensure_engine() if engine == "already running" else None
    try:
        _sigkill_mid_run("temporal", out_dir, "--placement", "docker", docker=True)
        if ours is not None:
            assert docker_engine_available()[0], "the engine the run found running was stopped"
    finally:
        if ours is not None:
            ours.stop()


#: a process that makes a private harness path of its own (the shared one is not private here: it is the user's
#: alone no more), after starting its reaper if told, prints it, then ends as told
_OWN_PATH = """
import os, sys, time
import harness
if sys.argv[1] == "reaper":
    from testbed.processes import ensure_reaper
    ensure_reaper()
print(harness.pythonpath_for_targets(), flush=True)
if sys.argv[2] == "os._exit":
    os._exit(0)
if sys.argv[2] == "wait":
    time.sleep(600)
"""


def _own_path(tmp: Path, reaper: str, ending: str) -> tuple[subprocess.Popen, Path]:
    """A child making its own harness path in ``tmp``, and that path once it said it."""
    proc = subprocess.Popen([sys.executable, "-c", _OWN_PATH, reaper, ending], stdout=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "TMPDIR": str(tmp)})
    path = Path(proc.stdout.readline().strip())  # type: ignore[union-attr]
    assert path.parent == tmp and path.name.startswith("dah-harness-path-"), path
    return proc, path


@pytest.fixture
def open_shared_path(tmp_path: Path) -> Path:
    """A temporary directory whose shared harness path is open to everyone: every process makes its own instead."""
    import hashlib

    import harness

    tmp = tmp_path / "tmp"
    shared = tmp / f"dah-harness-path-{os.geteuid()}-{hashlib.sha256(str(harness.PACKAGE).encode()).hexdigest()[:12]}"
    shared.mkdir(parents=True)
    os.chmod(shared, 0o777)
    return tmp


@pytest.mark.parametrize("ending", ["SIGKILL", "os._exit"])
def test_a_private_harness_path_goes_with_its_process_however_it_ends(ending: str, open_shared_path: Path) -> None:
    """A process with a reaper (every chaos run has one): its reaper removes what it made for itself."""
    proc, path = _own_path(open_shared_path, "reaper", "wait" if ending == "SIGKILL" else ending)
    try:
        if ending == "SIGKILL":
            proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + GONE_WITHIN_S
        while path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not path.exists(), f"{path} outlived its process ({ending}) by {GONE_WITHIN_S:g} s"
        assert _own_temp_dirs(open_shared_path) == set()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_without_a_reaper_the_next_process_removes_what_a_dead_one_left_and_only_that(open_shared_path: Path) -> None:
    """A process with no reaper (``chaos check`` replaying a target): what it leaves at an ``os._exit`` goes when the
    next process makes a directory of its own; a live process's stays."""
    alive, alive_path = _own_path(open_shared_path, "no reaper", "wait")
    try:
        dead, dead_path = _own_path(open_shared_path, "no reaper", "os._exit")
        dead.wait(timeout=30)
        assert dead_path.is_dir()  # nothing ran at its end
        nxt, next_path = _own_path(open_shared_path, "no reaper", "exit")
        nxt.wait(timeout=30)
        assert not dead_path.exists() and alive_path.is_dir() and not next_path.exists()
    finally:
        alive.kill()
        alive.wait()


def test_postgres_admits_only_the_harness(out_dir: Path) -> None:
    """Another local user reaches neither the TCP port (no password) nor the unix socket (a private dir)."""
    if not _postgres_installed():
        pytest.skip("PostgreSQL is not installed (make system-deps)")
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another local user (setpriv)")
    import psycopg

    with PostgresServer(out_dir / "postgres") as pg:
        with psycopg.connect(pg.url) as conn:  # the harness: the password from its 0600 file
            assert conn.execute("select current_user").fetchone() == ("postgres",)
        assert "password" not in pg.url and oct(pg.passfile.stat().st_mode & 0o777) == "0o600"
        psql = find_bin("psql")
        as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]
        for host, env in ((pg.host, {}), (pg.host, {"PGPASSWORD": "postgres"}), (str(pg.socket_dir), {})):
            out = subprocess.run([*as_nobody, psql, "-h", host, "-p", str(pg.port), "-U", "postgres", "-w",
                                  "-d", "postgres", "-c", "select 1"], capture_output=True, text=True, timeout=30,
                                 env={"PATH": os.environ.get("PATH", ""), **env}, cwd="/")
            assert out.returncode != 0, f"nobody connected through {host}: {out.stdout}"
            assert ("password" in out.stderr or "Permission denied" in out.stderr), out.stderr


# -- the browser a worker leaves running on purpose ---------------------------------------------------------------

#: the harness: starts one worker process as every harness does (testbed.worker_process), then waits
_HARNESS = """
import sys, time
from pathlib import Path
from testbed.worker_process import WorkerProcess
out = Path(sys.argv[1])
WorkerProcess((sys.executable, "-c", sys.argv[2], sys.argv[1], sys.argv[3]), {}, log_dir=out / "logs").start()
time.sleep(600)
"""
#: the worker: builds the browser environment, prints its record, waits
_WORKER = """
import asyncio, json, sys
from pathlib import Path
from agent.envs.base import EnvContext
from agent.envs.registry import get_env, parse_env_config
from harness.recording import EffectLedger
out = Path(sys.argv[1])
ctx = EnvContext(root=out / "envs", ledger=EffectLedger(out / "ledger.sqlite3"))
env = get_env(parse_env_config(json.loads(sys.argv[2])), ctx, "sigkill")
record = asyncio.run(env.build())
print("RECORD " + json.dumps(record.data), flush=True)
print("READY", flush=True)
import time; time.sleep(600)
"""


def _browser_survives_its_worker_not_its_harness(out: Path, env: dict) -> tuple[dict, set[psutil.Process]]:
    """Harness -> worker -> browser: SIGKILL the worker (the browser still answers), then the harness; returns
    the browser's record and, for a local one, its processes (the caller checks the browser is gone)."""
    import json
    import urllib.request

    log = out / "harness.log"
    with open(log, "wb") as f:
        harness = subprocess.Popen([sys.executable, "-c", _HARNESS, str(out), _WORKER, json.dumps(env)],
                                   stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT)
    worker_log = out / "logs" / "worker-1.log"
    try:
        wait_for(lambda: "READY" in (worker_log.read_text() if worker_log.exists() else ""),
                 "the worker's browser (READY)", proc=harness, log=worker_log, every_s=0.2)
        line = next(x for x in worker_log.read_text().splitlines() if x.startswith("RECORD "))
        record = json.loads(line.removeprefix("RECORD "))
        [worker] = [p for p in psutil.Process(harness.pid).children() if " -c " in _cmdline(p)]  # not the reaper
        worker.kill()  # a zombie until the harness reaps it: dead all the same
        time.sleep(2.0)  # long enough for a browser tied to its worker to have died
        with urllib.request.urlopen(record["url"] + "/health", timeout=5) as response:
            assert json.loads(response.read())["session"] == record["session"], "the browser died with its worker"
        tree: set[psutil.Process] = set()
        if "pid" in record:
            service = psutil.Process(record["pid"])
            tree = {service, *service.children(recursive=True)}  # the Playwright driver and Chromium
        harness.kill()
        harness.wait()
        return record, tree
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()


def _cmdline(p: psutil.Process) -> str:
    """Its command line, or "" once it has exited (Chromium's helpers come and go)."""
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _skip_without_a_browser() -> None:
    from agent.envs.browser_service import find_chromium

    try:
        import playwright  # noqa: F401
    except ImportError:
        pytest.skip("Playwright's Python package is not installed")
    if find_chromium() is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium)")


def _expect_gone(tree: set[psutil.Process], killed: str) -> None:
    """Every process of the browser's tree gone within GONE_WITHIN_S; survivors are killed by pid either way."""
    try:
        gone, left = psutil.wait_procs(tree, timeout=GONE_WITHIN_S)
        described = [f"{p.pid} {_cmdline(p)[:160]}" for p in left if running(p)]
        assert not described, f"the browser outlived {killed} by {GONE_WITHIN_S:g} s:\n" + "\n".join(described)
    finally:
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.kill()


def test_a_browser_service_outlives_its_worker_but_not_its_harness(out_dir: Path) -> None:
    _skip_without_a_browser()
    _, tree = _browser_survives_its_worker_not_its_harness(out_dir, {"name": "browser_local"})
    _expect_gone(tree, "the SIGKILLed harness")


@pytest.mark.xdist_group("docker")
def test_a_browser_container_outlives_its_worker_but_not_its_harness(out_dir: Path) -> None:
    """The container carries the harness's owner label; the reaper the harness started with its worker removes it."""
    ok, reason = docker_engine_available()
    if not ok and _cannot_start(reason):
        pytest.skip(f"no Docker engine: {_cannot_start(reason)}")
    image = subprocess.run([sys.executable, "-m", "testbed.images", "build", "browser"], check=True,
                           capture_output=True, text=True, cwd=ROOT, timeout=300).stdout.split()[-1]  # then cached
    engine = ensure_engine()
    try:
        record, _ = _browser_survives_its_worker_not_its_harness(out_dir, {"name": "browser_docker", "image": image})
        from docker import errors as docker_errors

        client = connect(timeout_s=10.0)
        try:
            deadline = time.monotonic() + GONE_WITHIN_S
            # The low-level list: the high-level one inspects each container it lists, and the one being removed
            # as it lists is gone by then (404)
            while (kept := client.api.containers(all=True, filters={"id": record["container"]})) \
                    and time.monotonic() < deadline:
                time.sleep(0.2)
            for container in kept:  # a failing test leaks nothing
                with contextlib.suppress(docker_errors.NotFound):
                    client.api.remove_container(container["Id"], force=True)
            assert not kept, f"the browser container outlived the SIGKILLed harness by {GONE_WITHIN_S:g} s"
        finally:
            client.close()
    finally:
        engine.stop()


def test_a_browser_of_an_in_process_worker_ends_with_dah_run(out_dir: Path) -> None:
    """``dah run`` runs its worker in its own process on its own Temporal: nothing can re-attach once it is gone."""
    _skip_without_a_browser()
    import socket

    with socket.socket() as silent:  # a site that never answers: the run waits on the browser until we kill it
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
        with open(out_dir / "harness.log", "wb") as f:
            harness = subprocess.Popen([sys.executable, "-m", "testbed", "run", "--env", "browser_local", "--model",
                                        "scripted:browser", "--state-dir", str(out_dir), f"Open {url} and read it."],
                                       stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT)
        tree: set[psutil.Process] = set()
        try:
            def browser_started() -> bool:  # the service has started its browser
                for p in psutil.Process(harness.pid).children():
                    if "agent.envs.browser_service" in _cmdline(p):
                        with contextlib.suppress(psutil.Error):
                            tree.update({p, *p.children(recursive=True)})
                return any("chromium" in _cmdline(p) for p in tree)

            wait_for(browser_started, "the browser service's Chromium", proc=harness, log=out_dir / "harness.log",
                     every_s=0.2)
        finally:
            harness.kill()
            harness.wait()
            _expect_gone(tree, "the SIGKILLed dah run")
