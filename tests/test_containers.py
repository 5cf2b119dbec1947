"""DockerWorker / ContainerPool: the worker fault surface, applied to containers; the locally built images.

The tests that take the ``image`` fixture run real containers in the harness's
worker image (``testbed.images``, built from this checkout and this machine's
files once per session, cached by a hash of its inputs), on the Docker engine of
the ``docker_engine`` fixture (an installed ``dockerd`` that is not running is
started, and stopped when pytest exits); where no engine can run they skip with
the reason. The rest need neither the engine nor, for the availability checks,
the SDK.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

from testbed.worker_process import WorkerStartError
from agent.envs.docker_engine import DockerEngineUnavailable, docker_engine_available
from testbed import images
from testbed.containers import OWNER, IDENTITY_LABEL, LABEL, OWNER_LABEL, ContainerPool, DockerWorker
from testbed.dockerd import ensure_engine
from tests.events import wait_for

IMAGE = "dah-worker:never-built"  # for the tests that never reach an engine
# PID 1 ignores SIGTERM unless it installs a handler; the dict literal checks braces survive formatting.
READY_SCRIPT = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
    "print('READY', {'identity': sys.argv[1], 'task_queue': sys.argv[2],"
    " 'env': os.environ['DAH_WORKER_IDENTITY']}, flush=True)\n"
    "time.sleep(600)\n"
)
READY_COMMAND = ["python", "-u", "-c", READY_SCRIPT, "{identity}", "{task_queue}"]


# --- without an engine -------------------------------------------------------


def test_engine_check_here_returns_a_reason_and_never_raises() -> None:
    available, reason = docker_engine_available()
    assert isinstance(available, bool) and reason
    if not available:
        assert "docker" in reason.lower() or "engine" in reason


def test_engine_check_names_the_unreachable_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/dah-test-docker.sock")
    available, reason = docker_engine_available()
    assert not available
    assert "unix:///nonexistent/dah-test-docker.sock" in reason or "docker SDK not installed" in reason


def test_engine_check_names_the_missing_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "docker", None)  # makes `import docker` raise ImportError
    available, reason = docker_engine_available()
    assert not available
    assert "docker SDK not installed" in reason and "pip install 'docker>=7'" in reason


def test_container_spec_formats_identity_task_queue_env_and_labels() -> None:
    w = DockerWorker(
        image="agent:dev",
        command=["python", "-c", "print({'a': 1})", "--identity", "{identity}", "--task-queue", "{task_queue}"],
        task_queue="q-7",
        network="dah-net",
        identity_prefix="dw",
        environment={"MODEL_URL": "http://model:8000", "DAH_WORKER_IDENTITY": "overridden"},
        labels={"team": "chaos"},
    )
    assert w.generation == 0 and w.identity == "dw-0"
    w.generation = 3
    spec = w.container_spec()
    assert spec["image"] == "agent:dev"
    assert spec["command"] == ["python", "-c", "print({'a': 1})", "--identity", "dw-3", "--task-queue", "q-7"]
    assert spec["detach"] is True
    assert spec["network"] == "dah-net"
    assert spec["environment"] == {"MODEL_URL": "http://model:8000", "DAH_WORKER_IDENTITY": "dw-3", "DAH_TASK_QUEUE": "q-7"}
    assert spec["labels"] == {LABEL: "worker", "team": "chaos", IDENTITY_LABEL: "dw-3", OWNER_LABEL: OWNER}
    assert spec["name"].startswith("dah-dw-3-") and len(spec["name"]) == len("dah-dw-3-") + 6
    assert w.container_spec()["name"] != spec["name"]  # two runs never collide on a name


def test_container_spec_without_placeholder_or_network_adds_nothing() -> None:
    w = DockerWorker(image="agent:dev", command=["run-worker"], task_queue="q")
    spec = w.container_spec()
    assert spec["command"] == ["run-worker"]  # the identity travels in the environment only
    assert spec["environment"]["DAH_WORKER_IDENTITY"] == "worker-0"
    assert "network" not in spec
    assert spec["labels"][LABEL] == "worker"


def test_invalid_identity_prefix_is_named() -> None:
    w = DockerWorker(image="agent:dev", command=["x"], task_queue="q", identity_prefix="bad prefix/")
    with pytest.raises(ValueError, match="bad prefix/"):
        w.container_spec()


def test_unstarted_worker_faults_are_noops_without_an_engine() -> None:
    w = DockerWorker(image="agent:dev", command=["x"], task_queue="q")
    assert not w.alive and w.container_id is None and w.status is None and w.output() == ""
    w.kill()
    w.pause()
    w.resume()
    w.stop()
    w.stop()
    with pytest.raises(ValueError, match="no network"):
        w.disconnect_network()


def test_backend_is_lazy_and_names_the_engine_it_cannot_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/dah-test-docker.sock")
    with ContainerPool() as backend:  # constructing and cleaning up an unused backend touch no engine
        assert backend.cleanup() == 0
        with pytest.raises(DockerEngineUnavailable, match="dah-test-docker.sock|docker SDK not installed"):
            backend.worker(image=IMAGE, command=READY_COMMAND, task_queue="q")


def test_ensure_engine_starts_nothing_for_another_engine_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/dah-test-docker.sock")
    engine = ensure_engine()
    assert not engine.available and not engine.started_here
    assert "dah-test-docker.sock" in engine.reason or "docker SDK not installed" in engine.reason


# --- the images' inputs (no engine) ---------------------------------------------


def test_an_image_digest_changes_with_its_files_and_only_then(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("A = 1\n")
    (tmp_path / "pkg" / "__pycache__").mkdir()

    def digest() -> str:
        rootfs = images.Rootfs()
        rootfs.add_tree(tmp_path / "pkg", "pkg", skip=lambda d, n: n == "__pycache__")
        return rootfs.digest()

    first = digest()
    assert digest() == first
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"cache")  # skipped: no change
    assert digest() == first
    (tmp_path / "pkg" / "a.py").write_text("A = 2\n")
    os.utime(tmp_path / "pkg" / "a.py", ns=(1, 1))
    second = digest()
    assert second != first
    (tmp_path / "pkg" / "b.py").write_text("")
    assert digest() not in (first, second)
    assert images.Rootfs({"x": b"1"}).digest() != images.Rootfs({"x": b"2"}).digest()


def test_package_closure_follows_depends_alternatives_and_provides_and_skips() -> None:
    packages = {
        "app": {"depends": "libc6 (>= 2.35), missing-lib | libalt, virtual-thing, gpu-drivers", "provides": ""},
        "libc6": {"depends": "", "provides": ""},
        "libalt": {"depends": "libc6", "provides": ""},
        "real-thing": {"depends": "", "provides": "virtual-thing (= 1)"},
        "gpu-drivers": {"depends": "llvm", "provides": ""},
        "llvm": {"depends": "", "provides": ""},
        "unrelated": {"depends": "", "provides": ""},
    }
    assert images.package_closure(["app"], packages) == ["app", "gpu-drivers", "libalt", "libc6", "llvm",
                                                         "real-thing"]
    import re

    assert images.package_closure(["app"], packages, skip=re.compile("gpu-drivers")) == [
        "app", "libalt", "libc6", "real-thing"]
    with pytest.raises(images.ImageBuildError, match="not-installed.*apt-get install not-installed"):
        images.package_closure(["not-installed"], packages)


def test_the_app_layer_holds_the_sources_without_caches() -> None:
    app = images.app_rootfs()
    assert "testbed/images.py" in app.files and "agent/workflow.py" in app.files
    assert "cli/dah.py" in app.files  # python -m testbed worker, what a container runs, is dah's command line
    assert not [rel for rel in app.files if "__pycache__" in rel or rel.endswith(".pyc")]
    assert not [rel for rel in app.files if rel.startswith("tests/")]


# --- with an engine ------------------------------------------------------------


@pytest.fixture(scope="module")
def image(docker_images) -> str:
    """The worker image for these sources: built once (cached by its inputs' hash across sessions)."""
    return docker_images("worker")


@pytest.mark.slow
def test_the_worker_image_is_cached_and_holds_the_harness(image: str) -> None:
    from agent.envs.docker_engine import connect

    client = connect()
    try:
        runtime = client.images.get("dah-runtime:latest").id
        assert images.worker_image() == image  # inputs unchanged: same tag
        assert client.images.get("dah-runtime:latest").id == runtime  # and nothing was rebuilt
        assert client.images.get(image).id == client.images.get("dah-worker:latest").id
        # The worker's model client loads whole (what its preload thread imports, ~5 s): a distribution missing
        # from the image (one a requirement's extra brings, as pyjwt[crypto] brings cryptography) would make each
        # container's first model call import on the event loop, starving its heartbeats.
        out = client.containers.run(image, ["python", "-c", "import sys, temporalio.worker, agent.workflow, "
                                            "testbed.worker_process; from agent import llm; llm.preload(); "
                                            "print(sys.version_info[:2])"], remove=True)
        assert out.decode().strip() == str(sys.version_info[:2])  # the harness's own interpreter
        assert client.containers.run(image, ["sh", "-c", "echo shell ok"], remove=True) == b"shell ok\n"
    finally:
        client.close()


@pytest.fixture
def backend():
    with ContainerPool() as b:
        yield b


@pytest.fixture
def network(backend: ContainerPool):
    net = backend.client.networks.create(f"dah-test-{uuid.uuid4().hex[:8]}", labels={LABEL: "test"})
    yield net.name
    backend.cleanup()  # a network with containers attached cannot be removed
    net.remove()


def _exists(backend: ContainerPool, container_id: str) -> bool:
    from docker.errors import NotFound

    try:
        backend.client.containers.get(container_id)
        return True
    except NotFound:
        return False


@pytest.mark.slow
def test_start_passes_identity_and_restart_is_a_new_generation(backend: ContainerPool, image: str) -> None:
    w = backend.worker(image=image, command=READY_COMMAND, task_queue="q-start")
    with w:
        assert w.alive and w.status == "running"
        assert "'identity': 'worker-1', 'task_queue': 'q-start', 'env': 'worker-1'" in w.output()
        first = w.container_id
        w.kill()
        w.start()
        assert w.identity == "worker-2" and "'identity': 'worker-2'" in w.output()
        assert not _exists(backend, first)  # the killed generation's container was removed on restart
    assert w.container_ids[0] == first and len(w.container_ids) == 2


@pytest.mark.slow
def test_kill_leaves_a_dead_container(backend: ContainerPool, image: str) -> None:
    with backend.worker(image=image, command=READY_COMMAND, task_queue="q") as w:
        w.kill()
        assert not w.alive and w.status == "exited"
        assert "READY" in w.output()  # a killed worker's logs stay readable
        w.kill()  # killing the dead is a no-op


@pytest.mark.slow
def test_terminate_is_a_graceful_stop_the_worker_exits_by_itself(backend: ContainerPool, image: str) -> None:
    with backend.worker(image=image, command=READY_COMMAND, task_queue="q") as w:
        w.terminate()  # the drain nemesis's SIGTERM: the process's own handler exits 0
        wait_for(lambda: not w.alive, "the worker's exit after SIGTERM", every_s=0.05)
        assert w.status == "exited"
        w._container.reload()
        assert w._container.attrs["State"]["ExitCode"] == 0
        w.terminate()  # no longer running: a no-op


@pytest.mark.slow
def test_pause_and_resume(backend: ContainerPool, image: str) -> None:
    import psutil

    with backend.worker(image=image, command=READY_COMMAND, task_queue="q") as w:
        w.pause()
        assert w.frozen and w.alive
        if os.geteuid() == 0:  # a local engine and root: SIGSTOP from here, at once, as a process worker's
            assert w._stopped and all(psutil.Process(p).status() == psutil.STATUS_STOPPED for p in w._stopped)
        else:
            assert w.status == "paused"
        w.resume()
        assert not w.frozen and w.status == "running"
        w.resume()  # not paused: a no-op
        w.pause()
        w.kill()  # a paused worker can be killed
        assert not w.alive
    with backend.worker(image=image, command=READY_COMMAND, task_queue="q") as w:
        w._host_processes = lambda: []  # a remote or rootless engine: its cgroup freezer
        w.pause()
        assert w.status == "paused" and w.frozen and w.alive
        w.resume()
        assert w.status == "running" and not w.frozen


@pytest.mark.slow
def test_network_partition_and_heal(backend: ContainerPool, network: str, image: str) -> None:
    def interfaces(w: DockerWorker) -> set[str]:
        code, out = backend.client.containers.get(w.container_id).exec_run(["ls", "/sys/class/net"])
        assert code == 0
        return set(out.decode().split())

    def networks(w: DockerWorker) -> set[str]:
        return set(backend.client.containers.get(w.container_id).attrs["NetworkSettings"]["Networks"])

    with backend.worker(image=image, command=READY_COMMAND, task_queue="q", network=network) as w:
        assert networks(w) == {network} and interfaces(w) - {"lo"}
        w.disconnect_network()
        assert w.partitioned and networks(w) == set() and interfaces(w) == {"lo"}
        w.disconnect_network()  # already partitioned: a no-op
        w.connect_network()
        assert not w.partitioned and networks(w) == {network} and interfaces(w) - {"lo"}


@pytest.mark.slow
def test_stop_removes_the_container_and_is_idempotent(backend: ContainerPool, image: str) -> None:
    w = backend.worker(image=image, command=READY_COMMAND, task_queue="q").start()
    cid = w.container_id
    w.pause()  # stop must thaw it to deliver SIGTERM
    w.stop()
    assert not _exists(backend, cid) and not w.alive and w.container_id is None
    assert "READY" in w.output()  # kept from before removal
    w.stop()


@pytest.mark.slow
def test_cleanup_removes_only_what_this_backend_started(backend: ContainerPool, image: str) -> None:
    a = backend.worker(image=image, command=READY_COMMAND, task_queue="q", identity_prefix="a").start()
    b = backend.worker(image=image, command=READY_COMMAND, task_queue="q", identity_prefix="b").start()
    b.kill()
    ours = [a.container_id, b.container_id]
    foreign = backend.client.containers.run(image, ["sleep", "600"], detach=True, labels={LABEL: "worker"})
    try:
        assert backend.cleanup() == 2
        assert not any(_exists(backend, cid) for cid in ours)
        assert _exists(backend, foreign.id)  # same label, not ours: left alone
        assert backend.cleanup() == 0
        assert not a.alive and a.container_id is None
    finally:
        foreign.remove(force=True)


@pytest.mark.slow
def test_user_errors_name_the_image_and_the_network(backend: ContainerPool, image: str) -> None:
    missing_net = f"dah-no-such-network-{uuid.uuid4().hex[:6]}"
    with pytest.raises(WorkerStartError, match=f"{missing_net}.*docker network create"):
        backend.worker(image=image, command=READY_COMMAND, task_queue="q", network=missing_net).start()
    missing_image = f"dah-no-such-image-{uuid.uuid4().hex[:6]}:never"
    with pytest.raises(WorkerStartError, match=f"{missing_image}.*nothing is pulled.*python -m testbed.images build"):
        backend.worker(image=missing_image, command=READY_COMMAND, task_queue="q").start()


@pytest.mark.slow
def test_a_worker_that_exits_before_ready_raises_with_its_log_tail(backend: ContainerPool, image: str) -> None:
    w = backend.worker(image=image, command=["python", "-c", "print('boom'); raise SystemExit(3)"], task_queue="q")
    with pytest.raises(WorkerStartError, match=r"exited with 3: boom"):
        w.start()
    assert not _exists(backend, w.container_ids[-1])  # a failed start leaves nothing behind


def test_chaos_refuses_the_docker_backend_clearly_without_an_engine() -> None:
    import subprocess

    no_engine = "unix:///nonexistent/dah-test-docker.sock"  # another address: nothing is started for it
    out = subprocess.run([sys.executable, "-m", "chaos", "run", "kill_mid_turn", "--placement", "docker"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "DOCKER_HOST": no_engine})
    assert out.returncode == 2
    assert "--placement docker:" in out.stderr and "--placement process (the default) needs no engine" in out.stderr
    assert no_engine in out.stderr and "started the Docker engine" not in out.stderr
