"""Shared fixtures: one real embedded Temporal dev server, scripted model
server and in-process worker per test process (started once: ~1 s for the
server, ~5 s to import LiteLLM; ``make test`` runs several pytest-xdist
workers, each with its own), the Docker engine and its images, and how the
tests are grouped and ordered across the workers."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from agent.worker import WorkerSettings
from testbed.engines.temporal.cluster import TemporalCluster
from testbed.stack import Stack, StackSpec, stack as start_stack

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="session")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    state_dir = tmp_path_factory.mktemp("dah-state")
    settings = WorkerSettings.in_state_dir(state_dir, task_queue=f"test-{uuid.uuid4().hex[:8]}")
    async with start_stack(StackSpec(state_dir=state_dir, engine=TemporalCluster(worker_settings=[settings]))) as s:
        yield s


@pytest.fixture(scope="session", autouse=True)
def shared_fork_server() -> None:
    """The chaos runs the tests start as commands (``python -m chaos run ...``) fork their reference workers from
    this pytest process's fork server instead of importing a server of their own (testbed.forkserver.export)."""
    from testbed import forkserver

    forkserver.export()


@pytest.fixture
def model_faults(stack: Stack):
    """Install scripted-model fault rules for one test; cleared afterwards whatever happens."""
    yield stack.model_server.set_faults
    stack.model_server.set_faults([])


def restate_server_installed() -> bool:
    """Whether ``restate-server`` is found as the harness finds it (tests skip without it: make restate-server)."""
    from testbed.engines.restate.server import RestateServerError, find_restate_server

    try:
        find_restate_server()
    except RestateServerError:
        return False
    return True


@pytest.fixture(scope="session")
def docker_engine():
    """The Docker engine: the running one, or the installed dockerd started now and stopped when this pytest
    exits; the test is skipped where none can run. Every test that uses it runs on one pytest-xdist worker (the
    "docker" group, pytest_collection_modifyitems): one dockerd at a time, stopped only after its last test."""
    from testbed.dockerd import ensure_engine

    engine = ensure_engine()
    if not engine.available:
        pytest.skip(f"no Docker engine: {engine.reason}")
    return engine


_image_builds: dict[str, object] = {}  # which -> the Future of its tag


@pytest.fixture(scope="session")
def docker_images(docker_engine):
    """``docker_images("worker")``: the tag of a test-bed image, built once (cold: ~20-40 s from this machine's
    files; cached: ~2 s to check). The first call queues every image's build, one at a time (two at once would
    both import the shared runtime), so the second image builds while the first one's tests run."""
    import concurrent.futures

    from testbed.images import BUILDERS

    if not _image_builds:
        builds = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="image-build")
        _image_builds.update({which: builds.submit(build) for which, build in BUILDERS.items()})
        builds.shutdown(wait=False)
    return lambda which: _image_builds[which].result()


def temporal_server_pids() -> set[int]:
    """Pids of running `temporal server start-dev` processes that this test process could have left behind:
    its descendants and orphans (to prove none are left behind). A server another program on the machine is
    running right now (a chaos soak, a second test run), whose parent is that program, is not counted."""
    me = os.getpid()
    pids = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if not (len(cmd) >= 3 and Path(cmd[0]).name == "temporal" and cmd[1:3] == ["server", "start-dev"]):
            continue
        try:
            ancestors = [a.pid for a in p.parents()]
            parent = p.parent()
            orphan = parent is None or parent.pid == 1 or "python" not in Path((parent.cmdline() or [""])[0]).name
        except psutil.Error:
            continue
        if me in ancestors or orphan:
            pids.add(p.info["pid"])
    return pids


#: the pytest-xdist group of the tests that use the Docker engine (make test runs --dist loadgroup)
DOCKER_GROUP = "docker"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the Docker engine (the docker_engine fixture, or it starts one itself: marked with the
    group) runs on the worker that runs the others: the engine one of them starts stops when its worker exits.
    The tests marked ``slow`` come first (in their order), so that under ``make test`` none of them starts last
    and keeps one worker busy after the others are done (pytest-xdist hands out its groups before them, the
    largest first)."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        if "docker_engine" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(DOCKER_GROUP))
        elif _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


_UNGROUPED = pytest.StashKey[str]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """On a pytest-xdist worker under ``--dist loadgroup``: fail every grouped test, saying why, if its group did
    not reach the scheduler. pytest-xdist passes a test's group as a suffix of its node id; from pytest 9.2 that
    suffix no longer takes (pytest-xdist#1386) and the groups are silently ignored: every worker then built each
    module's shared chaos run itself (measured: test_diagnosis's 80 s run made 4 times instead of once) and the
    Docker tests ran on several workers at once. pyproject.toml keeps pytest below 9.2 for this."""
    if not (os.environ.get("PYTEST_XDIST_WORKER") and session.config.getvalue("loadgroup")):
        return
    import xdist

    for item in session.items:
        mark = item.get_closest_marker("xdist_group")
        if mark and not item.nodeid.endswith("@" + str(mark.args[0] if mark.args else mark.kwargs.get("name"))):
            item.stash[_UNGROUPED] = (
                f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__}: --dist loadgroup ignored this "
                f"test's group (pytest-xdist#1386); install the versions pyproject.toml allows: make venv")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _UNGROUPED in item.stash:
        pytest.fail(item.stash[_UNGROUPED], pytrace=False)


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    """Whether ``item`` uses a fixture of its own module's that lives as long as the module (a chaos run its tests
    read, say): its tests then run on one worker, which makes it once, not once per worker they were spread over."""
    info = getattr(item, "_fixtureinfo", None)
    module = getattr(item, "module", None)
    if info is None or module is None:
        return False
    return any(d.scope in ("module", "class") and getattr(d.func, "__module__", None) == module.__name__
               for defs in info.name2fixturedefs.values() for d in defs)
