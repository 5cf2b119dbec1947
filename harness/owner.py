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

The same value names the temporary directories a process makes for itself (``owned_tempdir``: a PostgreSQL
server's socket directory, a private harness path): whatever ends the process, they go with it. At its exit
(``harness.exit.before_exit``, so also on ``exit_now``) it removes them itself; after a SIGKILL or an ``os._exit``
its reaper (``testbed.processes.ensure_reaper``) does (``remove_owned_dirs(owner)``); and where no reaper ran,
the next process that makes one removes those whose owner, by pid and start time, is gone.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import select
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from harness.exit import before_exit

log = logging.getLogger(__name__)

ENV_OWNER = "DAH_OWNER"
OWNER_LABEL = "durable-agent-harness.owner"  # a container's owner, removed by that owner's reaper
_POLL_S = 0.5  # without pidfd_open: how often /proc is asked
#: a directory ``owned_tempdir`` made: dah-<what>-<pid>-<start>-<mkdtemp's eight characters>
_OWNED_DIR = re.compile(r"dah-[a-z]+(?:-[a-z]+)*-(\d+-\d+)-[a-z0-9_]{8}")


def _proc_stat(pid: int) -> tuple[bytes, int] | None:
    """The process's state (``R``, ``S``, ``Z``...) and start time (clock ticks since boot), or None if it does not
    exist (Linux ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read()
    except OSError:
        return None
    after_name = fields[fields.rindex(b")") + 2:].split()  # the name before ")" may hold spaces
    return after_name[0], int(after_name[19])  # fields 3 and 22


def _start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None if it does not exist (Linux ``/proc``)."""
    found = _proc_stat(pid)
    return found[1] if found else None


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
    """Whether the process ``value`` names still runs (a different process with its pid does not count, nor one
    that has exited and waits to be reaped)."""
    pid, start = parse_owner(value)
    found = _proc_stat(pid)
    return found is not None and found[0] not in (b"Z", b"X") and (start == 0 or found[1] == start)


def owned_tempdir(what: str) -> Path:
    """A new directory of this process's (mode 0700, ``tempfile.mkdtemp``) in the temporary directory, named after
    it, ``dah-<what>-<pid>-<start>-XXXXXXXX``, that does not outlive it (see the module docstring); ``what`` is
    lowercase words joined by ``-``."""
    global _swept
    if not _swept:  # once a process: what the dead left where no reaper removed it
        _swept = True
        remove_owned_dirs()
    path = Path(tempfile.mkdtemp(prefix=f"dah-{what}-{owner_value()}-"))
    before_exit(functools.partial(shutil.rmtree, path, True))
    return path


_swept = False


def remove_owned_dirs(owner: str | None = None) -> list[Path]:
    """Remove the directories ``owned_tempdir`` made for ``owner`` (None: for every owner no longer running, by
    pid and start time; never where ``/proc`` cannot tell): each a real directory of this user's, in the
    temporary directory, with that owner in its name. The paths removed."""
    if owner is None and _start_ticks(os.getpid()) is None:
        return []
    base = Path(tempfile.gettempdir())
    try:
        names = os.listdir(base)
    except OSError:
        return []
    removed = []
    for name in names:
        match = _OWNED_DIR.fullmatch(name)
        if not match or (match.group(1) != owner if owner is not None else owner_alive(match.group(1))):
            continue
        try:
            st = os.lstat(base / name)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():  # not a symlink, and ours
            shutil.rmtree(base / name, ignore_errors=True)
            removed.append(base / name)
    return removed


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
