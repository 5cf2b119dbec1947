"""Warm workers forked from a parent that already imported them (``testbed.forkserver``): a forked worker is a
process of its own, killed and stopped by its pid; a source change starts a new server without killing the
workers the old one forked; ``DAH_FORKSERVER=0`` starts workers the ordinary way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from testbed import forkserver
from testbed.stack import Stack
from testbed.worker_process import reference_worker
from tests.events import HANG_S, running, wait_for


def worker(stack: Stack, tmp_path: Path, name: str):
    return reference_worker(stack.server.address, f"fork-{name}", stack.model_server.url, state_dir=tmp_path,
                            identity_prefix=name, warm_line="WARM")


def test_a_forked_worker_is_its_own_process_killed_and_stopped_by_its_pid(stack: Stack, tmp_path: Path) -> None:
    server = forkserver.shared()  # the import happens here, once
    w = worker(stack, tmp_path, "fa")
    w.start()
    try:
        assert isinstance(w._proc, forkserver.ForkedProcess) and w.pid not in (os.getpid(), None)
        assert "READY worker identity=fa-1" in w.output() and "WARM" in w.output()
        # Warm: its own CPU time to poll (wall time on a busy machine is mostly waiting for a CPU) is a fraction of
        # what importing LiteLLM alone costs a worker started from scratch (~3 s of CPU).
        cpu = psutil.Process(w.pid).cpu_times()
        assert cpu.user + cpu.system < 1.5, f"a forked worker used {cpu.user + cpu.system:.1f} s of CPU to poll"
        w.kill()
        assert w.returncode == -signal.SIGKILL and not w.alive
        w.start()  # a new generation, a new pid
        assert w.identity == "fa-2" and w.alive
    finally:
        w.stop()
    assert w.returncode == 0  # SIGTERM: it drained (nothing in flight) and exited by itself
    assert "worker stopped" in w.output()
    assert server.alive


def test_a_source_change_starts_a_new_server_and_keeps_the_old_ones_workers(stack: Stack, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    old = forkserver.shared()
    first = worker(stack, tmp_path, "fb")
    first.start()
    try:
        stamp = old.stamp
        monkeypatch.setattr(forkserver, "source_stamp", lambda: stamp + 1.0)  # as if a file had just been saved
        second = worker(stack, tmp_path, "fc")
        second.start()
        try:
            assert forkserver.shared() is not old and old.alive and first.alive  # the old worker runs on
            assert isinstance(second._proc, forkserver.ForkedProcess) and second._proc.server is not old
        finally:
            second.stop()
            second._proc.server.stamp = stamp  # the files did not really change: later tests keep this server
    finally:
        first.stop()
    assert first.returncode == 0


def test_without_the_fork_server_a_worker_starts_from_scratch(stack: Stack, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DAH_FORKSERVER", "0")
    w = worker(stack, tmp_path, "fd")
    with w:
        assert isinstance(w._proc, subprocess.Popen) and "WARM" in w.output()


def test_the_private_bytecode_cache_is_the_users_own_and_refused_when_open_to_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    cache = forkserver.private_pycache()
    assert cache == tmp_path / f"dah-pycache-{os.geteuid()}" and (cache.stat().st_mode & 0o777) == 0o700
    cache.chmod(0o777)  # open to others: bytecode from it could be anyone's
    assert forkserver.private_pycache() is None
    cache.rmdir()
    cache.symlink_to(tmp_path)  # not a directory of its own
    assert forkserver.private_pycache() is None


CHILD = """
import os, sys, time
from pathlib import Path
from testbed import isolation
assert isolation.enter_private_network().network == "private"  # as dah-chaos run does, before anything starts
from testbed.engines.temporal.server import EmbeddedTemporal
from testbed.worker_process import reference_worker
with EmbeddedTemporal() as server:  # in the private network: the pytest process's loopback does not reach it
    w = reference_worker(server.address, "fork-child", sys.argv[1], state_dir=Path(sys.argv[2]), identity_prefix="fe",
                         warm_line="WARM")
    w.start()
    print(w.pid, w._proc.server.connect or "-", os.stat("/proc/self/ns/net").st_ino, flush=True)
    time.sleep(600)
"""


def _exported() -> forkserver.ForkServer:
    """A connection to the fork server this pytest process exported (the session's fixture): a test above may have
    replaced the process's own since."""
    forkserver.export()  # once is enough: this does nothing more
    path = os.environ[forkserver.SOCKET_ENV]
    assert (Path(path).parent.stat().st_mode & 0o777) == 0o700  # no other user reaches the socket
    return wait_for(lambda: _connect(path), "the exported fork server to listen")


def _connect(path: str) -> forkserver.ForkServer | None:
    try:
        return forkserver.ForkServer(connect=path).start()
    except forkserver.ForkServerError:
        return None


def test_a_harness_process_started_after_export_forks_its_workers_here_in_its_network_and_they_die_with_it(
        stack: Stack, tmp_path: Path) -> None:
    probe = _exported()
    probe.close()
    child = subprocess.Popen([sys.executable, "-c", CHILD, stack.model_server.url, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True, cwd=forkserver.ROOT)
    try:
        pid, connected, net = wait_for(lambda: child.stdout.readline().split(), "the child's worker", proc=child)
        worker = psutil.Process(int(pid))
        assert connected == os.environ[forkserver.SOCKET_ENV] and worker.ppid() == probe.pid  # forked here
        assert os.stat(f"/proc/{pid}/ns/net").st_ino == int(net) != os.stat("/proc/self/ns/net").st_ino
        log = next((tmp_path / "logs").iterdir()).read_text()
        assert "READY worker identity=fe-1" in log and "WARM" in log  # it reached the child's own server
        child.kill()  # SIGKILL: no atexit, no cleanup of its own; its connection closes
        wait_for(lambda: not running(worker), "the child's worker to die with it")
        assert psutil.pid_exists(probe.pid)  # the server serves on
    finally:
        child.kill()
        child.wait()


def test_a_client_running_other_code_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    probe = _exported()
    probe.close()
    stamp = probe.stamp
    monkeypatch.setattr(forkserver, "source_stamp", lambda: stamp + 1.0)  # as if a file had been saved since
    with pytest.raises(forkserver.ForkServerError, match="runs other code"):
        forkserver.ForkServer(connect=probe.connect).start()


def test_every_engines_worker_on_the_harnesss_interpreter_is_forked_and_a_targets_own_command_is_not() -> None:
    for engine in ((), ("--durability", "dbos"), ("--durability", "checkpoint"), ("--durability", "restate")):
        assert forkserver.can_fork([sys.executable, *forkserver.MODULE, *engine, "--task-queue", "q"]), engine
    assert not forkserver.can_fork(["/usr/bin/python3", *forkserver.MODULE, "--task-queue", "q"])
    assert not forkserver.can_fork([sys.executable, "-m", "my_agent.worker"])


USERNS_CHILD = """
import ctypes, os, sys
from testbed import forkserver
from testbed.isolation import CLONE_NEWUSER
assert ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWUSER) == 0, os.strerror(ctypes.get_errno())
try:
    forkserver.ForkServer(connect=sys.argv[1]).start()
    print("served")
except forkserver.ForkServerError as exc:
    print(exc)
"""


def test_a_client_in_a_user_namespace_of_its_own_is_refused() -> None:
    # A private network when not root is a user namespace with a network inside: a worker would have to join both
    # (not tried), so such a client starts a fork server of its own.
    probe = _exported()
    probe.close()
    out = subprocess.run([sys.executable, "-c", USERNS_CHILD, probe.connect], capture_output=True, text=True,
                         cwd=forkserver.ROOT, timeout=HANG_S)
    assert "runs in a user namespace of its own" in out.stdout, (out.stdout, out.stderr[-2000:])
