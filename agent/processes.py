"""Child processes that cannot outlive us.

Every process the harness starts goes through ``spawn``: it gets its own
session (so a terminal's Ctrl-C reaches us first and we stop children in
order) and a parent-death signal (so even if we are SIGKILLed, the kernel
kills it). ``stop`` terminates by the pid we started, never by name.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def spawn(args: Sequence[str], **kwargs: object) -> subprocess.Popen:
    """Start a child in its own session that the kernel kills if we die."""
    return subprocess.Popen(list(args), start_new_session=True, preexec_fn=_die_with_parent, **kwargs)  # type: ignore[call-overload]


def stop(proc: subprocess.Popen, *, grace_s: float = 10.0) -> int | None:
    """SIGTERM the child we started, wait, then SIGKILL it. Idempotent."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning("pid %s ignored SIGTERM for %.0f s; killing it", proc.pid, grace_s)
            proc.kill()
            proc.wait()
        except ProcessLookupError:
            pass
    return proc.returncode


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the caller binds it soon after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def python_module_command(module: str, *args: str) -> list[str]:
    """Run a module of this project with the current interpreter."""
    return [sys.executable, "-m", module, *args]


def env_without(*names: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in names}
