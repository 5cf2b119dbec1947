"""Warm workers forked from a parent that already imported them (``testbed.forkserver``): a forked worker is a
process of its own, killed and stopped by its pid; a source change starts a new server without killing the
workers the old one forked; ``DAH_FORKSERVER=0`` starts workers the ordinary way."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from testbed import forkserver
from testbed.stack import Stack
from testbed.worker_process import reference_worker


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
