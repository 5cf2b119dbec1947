"""The operation log: every client and nemesis operation, as plain data, on disk first.

Jepsen's model. A client operation is recorded as ``invoke`` when it starts
and completed by ``ok`` (it happened), ``fail`` (it certainly did not) or
``info`` (unknown: a timeout, a lost connection; it may or may not have
happened). Nemesis and supervisor operations are recorded the same way, with
their start and end. Each line of ``operations.jsonl`` is written and flushed
as the operation happens, so a crashed orchestrator still leaves the log
behind, and checkers read only this file (and the other saved artefacts).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness import run_files
from harness.rundir import RunDirError, expect, expect_fields, parse_json

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"


@dataclass
class Op:
    index: int
    process: str  # "client-3", "nemesis", "supervisor"
    type: str  # invoke | ok | fail | info
    f: str  # the operation: send_message, kill_worker, ...
    value: Any = None
    time: float = 0.0  # seconds since the run started (monotonic clock)
    wall: float = 0.0  # unix time, to line up with Temporal's event timestamps
    error: str | None = None
    invoke_index: int | None = None  # for completions: the invoke they complete

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class OperationLog:
    """Thread-safe, append-only, flushed per operation."""

    path: Path
    _t0: float = field(default_factory=time.monotonic, init=False)
    _ops: list[Op] = field(default_factory=list, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def now(self) -> float:
        return time.monotonic() - self._t0

    def _append(self, op: Op) -> Op:
        with self._lock:
            op.index = len(self._ops)
            self._ops.append(op)
            self._file.write(json.dumps(op.as_dict(), default=str) + "\n")
            self._file.flush()
        return op

    def invoke(self, process: str, f: str, value: Any = None) -> Op:
        return self._append(Op(0, process, INVOKE, f, value, self.now(), time.time()))

    def complete(self, invoked: Op, type_: str, value: Any = None, error: str | None = None) -> Op:
        assert type_ in (OK, FAIL, INFO), type_
        return self._append(Op(0, invoked.process, type_, invoked.f, value, self.now(), time.time(), error,
                               invoked.index))

    def event(self, process: str, f: str, value: Any = None) -> Op:
        """A point-in-time record (a phase change, a supervisor restart): an invoke and its ok together."""
        op = self.invoke(process, f, value)
        self.complete(op, OK, value)
        return op

    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()
                import os

                os.fsync(self._file.fileno())
                self._file.close()


#: each field of an operation line, as ``Op`` holds it (RUN_DIRECTORY.md)
OP_FIELDS = {"index": "an integer", "process": "a string", "type": "a string", "f": "a string",
             "time": "a number", "wall": "a number", "error": "a string or null", "invoke_index": "an integer or null"}


def load(path: Path) -> list[Op]:
    """The operation log, read as a stream by ``harness.run_files``' rules (a regular file, not a symlink, at most
    ``OPERATIONS_LIMIT`` bytes; else RefusedPath); ``RunDirError`` (a ``ValueError``) naming the first damaged line
    and what is wrong."""
    with run_files.open_binary(path.parent, path.name, run_files.OPERATIONS_LIMIT) as f:  # line by line
        return [parse_op(line, f"{path}:{n}") for n, line in enumerate(f, 1) if line.strip()]


def parse_op(line: bytes, where: str) -> Op:
    """One line of the log as an ``Op``, or ``RunDirError`` naming ``where`` (``file:line``)."""
    d = expect(parse_json(line, where), "an object", where)
    unknown = [k for k in d if k not in OP_FIELDS and k != "value"]
    if unknown:
        raise RunDirError(where, f"only the fields {', '.join([*OP_FIELDS, 'value'])}", repr(unknown[0][:40]))
    missing = [k for k in ("index", "process", "type", "f") if k not in d]
    if missing:
        raise RunDirError(where, "an operation", f"no {missing[0]!r}")
    expect_fields(d, OP_FIELDS, where)
    return Op(**d)


def pairs(ops: list[Op]) -> list[tuple[Op, Op | None]]:
    """Each invoke with its completion (None: never completed, which counts as info)."""
    done = {op.invoke_index: op for op in ops if op.type != INVOKE and op.invoke_index is not None}
    return [(op, done.get(op.index)) for op in ops if op.type == INVOKE]
