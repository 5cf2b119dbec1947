"""Who owns a worker: the harness process whose death ends everything the worker left running on purpose.

A worker's browser service (and browser container) outlives the worker, so the
next worker re-attaches after a crash; it must not outlive the harness that
started the worker. The harness names itself to its worker processes in
``DAH_OWNER`` (``owner_environment``); the service watches that process
(``watch_owner``) and a container carries the value as its ``OWNER_LABEL``,
which the harness's reaper removes (``testbed.containers``). Without the
variable (a worker a user started) nothing watches: the idle timeout applies.

The value is ``<pid>-<start>``: the pid and its start time in clock ticks since
boot (``/proc/<pid>/stat``), so a reused pid is never taken for the owner.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

ENV_OWNER = "DAH_OWNER"
OWNER_LABEL = "durable-agent-harness.owner"  # a container's owner, removed by that owner's reaper
_POLL_S = 0.5  # without pidfd_open: how often /proc is asked


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None if it does not exist (Linux ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[19])  # field 22; the name before ")" may hold spaces


def owner_value(pid: int | None = None) -> str:
    """``<pid>-<start>`` of this process (or ``pid``); ``<pid>-0`` where there is no ``/proc``."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{_start_ticks(pid) or 0}"


def owner_environment() -> dict[str, str]:
    """What a worker process's environment adds so that what it leaves running ends with this process."""
    return {ENV_OWNER: owner_value()}


def parse_owner(value: str) -> tuple[int, int]:
    """``<pid>-<start>`` -> (pid, start); a one-line ValueError naming the value otherwise."""
    pid, _, start = value.partition("-")
    if not (pid.isdigit() and start.isdigit()):
        raise ValueError(f"{ENV_OWNER}={value!r}: expected <pid>-<start ticks>, as the harness sets it; "
                         f"unset it to run without an owner")
    return int(pid), int(start)


def owner_alive(value: str) -> bool:
    """Whether the process ``value`` names still runs (a different process with its pid does not count)."""
    pid, start = parse_owner(value)
    ticks = _start_ticks(pid)
    return ticks is not None and (start == 0 or ticks == start)


def watch_owner(value: str, on_exit: Callable[[], None]) -> threading.Thread:
    """Call ``on_exit`` (on a daemon thread) once the owner ``value`` names has exited, however it ended.

    On Linux a pidfd is waited on (no polling); opened first and checked against the start time after, so a
    pid reused in between is seen as the owner gone. Elsewhere, or without pidfd_open, ``/proc`` is polled."""
    pid, _ = parse_owner(value)

    def wait() -> None:
        fd = None
        try:
            fd = os.pidfd_open(pid)  # type: ignore[attr-defined]  # Linux, Python 3.9+
        except (AttributeError, OSError):
            pass
        try:
            if fd is not None and owner_alive(value):
                select.select([fd], [], [])  # readable once the process has exited
            else:
                while owner_alive(value):
                    time.sleep(_POLL_S)
        finally:
            if fd is not None:
                os.close(fd)
        log.info("owner %s exited", value)
        on_exit()

    thread = threading.Thread(target=wait, name=f"owner-{value}", daemon=True)
    thread.start()
    return thread
