"""The one lifecycle of every process we start (``testbed.processes.ServerProcess``), on real child processes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from testbed.processes import ServerProcess, free_port, port_open


class Echo(ServerProcess):
    """A Python one-liner that prints, optionally exits, and otherwise listens on a port."""

    name = "echo server"

    def __init__(self, log: Path, code: str) -> None:
        self.log, self.code, self.port = log, code, free_port()
        self.startup_timeout_s = 10.0

    def argv(self) -> list[str]:
        return [sys.executable, "-c", self.code.replace("PORT", str(self.port))]

    def ready(self) -> bool:
        return port_open("127.0.0.1", self.port)

    def log_path(self) -> Path:
        return self.log

    def awaited(self) -> str:
        return f"on port {self.port}"


LISTEN = ("import socket, time; s = socket.socket(); s.bind(('127.0.0.1', PORT)); s.listen(); print('up', flush=True);"
          " time.sleep(60)")


def test_start_answers_then_stop_ends_the_process_by_its_pid(tmp_path: Path) -> None:
    with Echo(tmp_path / "echo.log", LISTEN) as server:
        pid = server.pid
        assert server.alive and pid is not None and port_open("127.0.0.1", server.port)
        assert server.start() is server and server.pid == pid  # running: start is a no-op
    assert server.pid is None and not port_open("127.0.0.1", server.port)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_process_that_exits_during_start_up_raises_with_its_log(tmp_path: Path) -> None:
    server = Echo(tmp_path / "echo.log", "print('no config here'); raise SystemExit(3)")
    with pytest.raises(RuntimeError, match=r"^echo server exited with code 3 during start-up \(log .*echo\.log\):\n"
                                           r"no config here\n$"):
        server.start()
    assert server.pid is None


def test_a_silent_process_is_stopped_at_the_deadline(tmp_path: Path) -> None:
    server = Echo(tmp_path / "echo.log", "import time; time.sleep(60)")
    server.startup_timeout_s = 0.5
    with pytest.raises(RuntimeError, match=r"^echo server did not answer on port \d+ within 0.5 s \(log "):
        server.start()
    assert server.pid is None


def test_kill_then_start_again(tmp_path: Path) -> None:
    with Echo(tmp_path / "echo.log", LISTEN) as server:
        first = server.pid
        server.kill()
        assert server.pid is None
        server.start()
        assert server.pid not in (None, first) and server.ready()
    assert (tmp_path / "echo.log").read_text() == "up\nup\n"
