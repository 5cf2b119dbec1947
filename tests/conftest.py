"""Shared fixtures: one real embedded Temporal dev server, scripted model
server and in-process worker for the whole session (started once: ~1 s for
the server, ~5 s to import LiteLLM)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
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


_image_builds = None  # one build at a time: two at once would both import the shared runtime


def build_image_in_background(which: str):  # -> concurrent.futures.Future[str]
    """Start building a test-bed image ("worker", "browser"; queued behind any other) and return the future of its
    tag: tests start their images' builds when they are collected, so the builds overlap the tests before them."""
    global _image_builds
    import concurrent.futures

    from testbed.images import BUILDERS

    if _image_builds is None:
        _image_builds = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="image-build")
    return _image_builds.submit(BUILDERS[which])


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
        if (me in ancestors and not _BACKGROUND_PIDS & set(ancestors)) or orphan:
            pids.add(p.info["pid"])
    return pids


# -- tests that mostly wait, run alongside the others ----------------------------------------------------------------

#: set in the child pytest that runs the background tests (it must not start a child of its own)
BACKGROUND_CHILD_ENV = "DAH_PYTEST_BACKGROUND_CHILD"
#: the child appends "start|end <node id> <time>" lines here as its tests run: the parent's progress lines read it
BACKGROUND_PROGRESS_ENV = "DAH_PYTEST_BACKGROUND_PROGRESS"
BACKGROUND_PROGRESS_EVERY_S = 15.0  # while the parent waits for the child: a line saying what still runs
# The child is stopped once none of its tests has started or ended for this long while the session waits for it
# (a hang): not a budget for the whole group, whose length depends on how little else the session runs.
BACKGROUND_TIMEOUT_S = 240.0
_BACKGROUND_PIDS: set[int] = set()  # the child pytest: its servers are its own, not leaks of this process


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "background: a long test that mostly waits on other processes (kills, partitions, timeouts, "
                   "whole benchmark or CLI runs). In a run with other tests, the background tests run one after "
                   "another in one child pytest started at collection, alongside the others (the two share the "
                   "machine's cores: make test's wall time is the longer of the two); their items, moved to the "
                   "end, report the child's result for each (with the child's output on failure). Run on their "
                   "own, they run here.")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """A Docker engine a test module started at collection said so under pytest's capture, unseen: say it again
    here, so the "stopped the Docker engine this run started" line at exit has its "started" above it."""
    from testbed.dockerd import started_engines

    for engine in started_engines():
        terminalreporter.write_line(f"started the Docker engine at collection (dockerd's supervisor pid "
                                    f"{engine.process.pid}, log {engine.log_path}); it stops when pytest exits")


def _background_mark(event: str, nodeid: str) -> None:
    """In the background child: note that a test started or ended, for the parent's progress lines."""
    path = os.environ.get(BACKGROUND_PROGRESS_ENV)
    if path and os.environ.get(BACKGROUND_CHILD_ENV):
        with open(path, "a") as f:
            f.write(f"{event} {time.time():.3f} {nodeid}\n")


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _background_mark("start", nodeid)


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    _background_mark("end", nodeid)


def last_background_event(progress: Path) -> float | None:
    """When the child last started or ended a test (wall clock, from its progress file); None: not yet."""
    last = None
    with contextlib.suppress(OSError, ValueError):
        for line in progress.read_text().splitlines():
            at = float(line.split(" ", 2)[1])
            last = at if last is None else max(last, at)
    return last


def background_progress(progress: Path, total: int, waited_s: float, now: float | None = None) -> str:
    """The parent's line while it waits for the background child: how many of its tests ended, which one runs and
    for how long (from the child's progress file)."""
    now = time.time() if now is None else now
    started: dict[str, float] = {}
    ended: set[str] = set()
    with contextlib.suppress(OSError):
        for line in progress.read_text().splitlines():
            event, at, nodeid = (line.split(" ", 2) + ["", ""])[:3]
            if event == "start":
                started[nodeid] = float(at)
            elif event == "end":
                ended.add(nodeid)
    running = [f"{nodeid} ({now - at:.0f} s)" for nodeid, at in started.items() if nodeid not in ended]
    doing = ", ".join(running) or ("(finishing: the child pytest's teardown)" if len(ended) >= total else
                                   "(starting up)")
    return f"background tests: {len(ended)}/{total} done, waited {waited_s:.0f} s; running: {doing}"


@pytest.hookimpl(trylast=True)  # after -m / -k deselection: what is left decides whether a child is needed
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(BACKGROUND_CHILD_ENV) or config.getoption("collectonly"):
        return
    background = [item for item in items if item.get_closest_marker("background")]
    if not background or len(background) == len(items):
        return
    for item in background:
        items.remove(item)
    items.extend(background)
    _run_in_background(config, background)


def _run_in_background(config: pytest.Config, items: list[pytest.Item]) -> None:
    import xml.etree.ElementTree as ET

    workdir = Path(tempfile.mkdtemp(prefix="dah-background-"))
    log, junit, progress = workdir / "output.log", workdir / "junit.xml", workdir / "progress.txt"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                                 *(item.nodeid for item in items)], cwd=config.rootpath,
                                env={**os.environ, BACKGROUND_CHILD_ENV: "1", BACKGROUND_PROGRESS_ENV: str(progress)},
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    _BACKGROUND_PIDS.add(proc.pid)

    said: list[str] = []

    def say(line: str) -> None:
        """A line on the terminal past pytest's capture (as its live logging writes), or nowhere under -p no:terminal."""
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        capture = config.pluginmanager.get_plugin("capturemanager")
        if reporter is None:
            return
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            if not said:  # the -q progress dots end without a newline
                reporter.write("\n")
            said.append(line)
            reporter.write_line(line)

    def wait() -> bool:
        """Wait for the child, saying every BACKGROUND_PROGRESS_EVERY_S which of its tests runs; False if none of
        them started or ended for BACKGROUND_TIMEOUT_S while this waited (it hangs)."""
        began, began_wall = time.monotonic(), time.time()
        while proc.poll() is None:
            left = BACKGROUND_TIMEOUT_S - (time.time() - max(began_wall, last_background_event(progress) or 0.0))
            if left <= 0:
                return False
            try:
                proc.wait(timeout=min(left, BACKGROUND_PROGRESS_EVERY_S))
            except subprocess.TimeoutExpired:
                say(background_progress(progress, len(items), time.monotonic() - began))
        return True

    def outcome(item: pytest.Item) -> tuple[str, str]:
        """(passed | failed | skipped | missing, detail) of ``item`` in the child's JUnit file."""
        if proc.poll() is None and not wait():
            stop()
            return "failed", (f"no test of the background pytest started or ended for {BACKGROUND_TIMEOUT_S:g} s "
                              "while this session waited for it; it was stopped")
        if not junit.exists():
            return "failed", f"the background pytest exited {proc.returncode} without a JUnit file"
        module, _, name = item.nodeid.partition("::")
        classname = module.removesuffix(".py").replace("/", ".")
        for case in ET.parse(junit).iter("testcase"):
            if case.get("classname") == classname and case.get("name") == name:
                bad = case.find("failure") if case.find("failure") is not None else case.find("error")
                if bad is not None:
                    return "failed", f"{bad.get('message', '')}\n{bad.text or ''}"
                skipped = case.find("skipped")
                return ("skipped", skipped.get("message", "")) if skipped is not None else ("passed", "")
        return "missing", ""

    def report(item: pytest.Item) -> None:
        status, detail = outcome(item)
        if status == "skipped":
            pytest.skip(f"(in the background pytest) {detail}")
        if status != "passed":
            output = log.read_text(errors="replace")
            pytest.fail(f"{item.nodeid}: {status} in the background pytest (exit {proc.returncode}; output "
                        f"{log}):\n{detail[-6000:] or output[-6000:]}", pytrace=False)

    def stop() -> None:
        """Ctrl-C first (pytest then stops the clusters its tests started), the whole group if that hangs."""
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    for item in items:
        item.setup = lambda: None  # type: ignore[method-assign]  # its fixtures are the child's
        item.runtest = (lambda i=item: report(i))  # type: ignore[method-assign]
    config.add_cleanup(stop)
