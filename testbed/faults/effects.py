"""The effects service's faults: what ``testbed.effects_service`` does to a note request while a fault is armed.

Contract
--------
* ``EffectFault("crash_after_effect", count=1, match=None)``: the next ``count`` effects (None: each one) whose
  text contains ``match`` are applied and logged, then the service asks its ``KillCaller`` (``kill_caller``: the
  stack's) to SIGKILL the worker process holding the connection *before* the response is sent, and drops the
  connection: an effect applied whose caller never learned it was. The kill is recorded as a nemesis
  ``kill_worker`` aimed ``after_effect`` (the same record ``testbed.faults.nemesis`` writes); a caller no started
  worker holds is not killed, the fault stays armed and the log says ``not_injected``. This is how a target with
  no harness code of its own gets the ``after_effect`` crash point (``harness.faults.CRASH_POINTS``).
* ``EffectFault("status", status=503, duration_s=5.0, count=None)``: note requests are answered ``status``,
  nothing applied, for ``duration_s`` from arming or ``count`` times (the nemesis ``effects_outage``).
* ``caller_pid``: which of the pids the harness started (or a descendant) holds the client end of a TCP
  connection, read from ``/proc/net/tcp(6)`` socket inodes and ``/proc/<pid>/fd``. Only a pid the harness started
  is ever answered, so only such a process is ever killed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from harness.operations import OK

FAULT_MODES = ("crash_after_effect", "status")

#: the harness's side of crash-after-effect: given the caller's TCP port, kill the worker process holding that
#: connection (only one the harness started) and say what was killed, or None if no such worker was found
KillCaller = Callable[[int], "dict[str, Any] | None"]


@dataclass
class EffectFault:
    """One fault of the effects service, as armed (``POST /admin/faults``, ``EffectsService(faults=...)``): see the
    module docstring for each mode's contract."""

    mode: str
    count: int | None = 1  # how many times it fires (None: every time it matches)
    match: str | None = None  # crash_after_effect: only effects whose text contains this
    status: int = 503  # status: the answer
    duration_s: float | None = None  # status: for this long after arming (None: until count runs out)

    def __post_init__(self) -> None:
        if self.mode not in FAULT_MODES:
            raise ValueError(f"effects fault mode {self.mode!r}: unknown; modes are {', '.join(FAULT_MODES)}")
        if self.count is not None and (isinstance(self.count, bool) or not isinstance(self.count, int)
                                       or self.count < 1):
            raise ValueError(f"effects fault count {self.count!r}: a positive integer or null (every time)")
        if self.match is not None and not isinstance(self.match, str):
            raise ValueError(f"effects fault match {self.match!r}: a string or null")
        if isinstance(self.status, bool) or not isinstance(self.status, int) or not 400 <= self.status <= 599:
            raise ValueError(f"effects fault status {self.status!r}: an HTTP error status, 400-599")
        if self.duration_s is not None and (isinstance(self.duration_s, bool)
                                            or not isinstance(self.duration_s, (int, float)) or self.duration_s <= 0):
            raise ValueError(f"effects fault duration_s {self.duration_s!r}: a positive number of seconds or null")

    @classmethod
    def from_dict(cls, data: Any) -> EffectFault:
        if not isinstance(data, dict):
            raise ValueError(f"an effects fault is a JSON object, got {type(data).__name__}")
        unknown = set(data) - {"mode", "count", "match", "status", "duration_s"}
        if unknown:
            raise ValueError(f"effects fault: unknown field(s) {', '.join(sorted(unknown))}; fields are mode, count, "
                             "match, status, duration_s")
        return cls(**data)


@dataclass
class Armed:
    """A fault as the service holds it: when it was armed and how often it fired."""

    fault: EffectFault
    armed_at: float
    fired: int = 0

    def active(self, now: float) -> bool:
        f = self.fault
        if f.count is not None and self.fired >= f.count:
            return False
        return f.duration_s is None or now - self.armed_at <= f.duration_s


# --------------------------------------------------------------------------- who is calling


def _tcp_inodes(peer_port: int, service_port: int) -> set[int]:
    """Inodes of the sockets whose local port is ``peer_port`` and remote port ``service_port`` (the client's end
    of a connection to this service), from ``/proc/net/tcp`` and ``/proc/net/tcp6``."""
    found: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)  # the header
                for line in f:
                    cols = line.split()
                    if len(cols) < 10:
                        continue
                    local, remote = cols[1].rpartition(":")[2], cols[2].rpartition(":")[2]
                    if int(local, 16) == peer_port and int(remote, 16) == service_port and cols[9] != "0":
                        found.add(int(cols[9]))
        except (OSError, ValueError):
            continue
    return found


def _children() -> dict[int, list[int]]:
    """Parent pid -> its children, for every process this user can see."""
    out: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
        if len(fields) >= 2 and fields[1].isdigit():
            out.setdefault(int(fields[1]), []).append(int(name))
    return out


def _holds(pid: int, inodes: set[int]) -> bool:
    wanted = {f"socket:[{i}]" for i in inodes}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                return True
        except OSError:
            continue
    return False


def caller_pid(peer_port: int, service_port: int, pids: Iterable[int]) -> int | None:
    """Which of ``pids`` holds, itself or through a descendant (a worker command that starts its agent as a
    child), the client end of the connection from ``peer_port`` to ``service_port``; None if none does. Only the
    given pids are ever answered: the caller kills what it started, never a process it did not."""
    roots = [p for p in pids if p]
    inodes = _tcp_inodes(peer_port, service_port)
    if not inodes or not roots:
        return None
    children = _children()
    for root in roots:
        stack, seen = [root], set()
        while stack:
            pid = stack.pop()
            if pid in seen:
                continue
            seen.add(pid)
            if _holds(pid, inodes):
                return root
            stack.extend(children.get(pid, ()))
    return None


def kill_caller(stack: Any, peer_port: int) -> dict[str, Any] | None:
    """Crash-after-effect: SIGKILL the worker process of ``stack`` (a ``testbed.stack.Stack``, which imports this
    module) holding the connection from ``peer_port`` to its effects service, recorded as a nemesis ``kill_worker``
    aimed ``after_effect``; None if no worker process of this stack holds it (only pids this stack started are ever
    killed). Called from the service's request thread, before it answers: the caller never sees the response."""
    assert stack.effects_service is not None
    by_pid = {w.process.pid: w for w in stack.workers if getattr(w.process, "pid", None)}
    pid = caller_pid(peer_port, stack.effects_service.port, list(by_pid))
    if pid is None:
        return None
    w = by_pid[pid]
    oplog = stack.spec.oplog
    op = oplog.invoke("nemesis", "kill_worker", {"when": "busy", "activity": None, "down_s": 0.0,
                                                   "at": "after_effect", "via": "effects_service"}) \
        if oplog else None
    with w.lock:
        if w.process.pid != pid:  # restarted meanwhile: that process is gone already
            return None
        identity = w.process.polling_identity  # as the server and the event history name it
        killed_at = time.time()
        w.process.kill()
    value = {"worker": w.name, "identity": identity, "pid": pid, "killed_at": killed_at, "peer_port": peer_port,
             "evidence": [{"effect_applied_unanswered": {"peer_port": peer_port}}],
             "aim": {"at": "after_effect", "via": "effects_service"}}
    if op is not None:
        oplog.complete(op, OK, value)
    return {k: value[k] for k in ("worker", "identity", "pid", "killed_at")}
