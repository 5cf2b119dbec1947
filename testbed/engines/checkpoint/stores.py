"""Durable-run stores: in memory, on the file system, and in SQLite (the embedded default).

Every store implements ``DurableRunStore`` and passes the same conformance
suite (``tests/test_checkpoint_stores.py``). Concurrency model: at most one
worker holds a run's lease at a time; another worker may take the run over
once the lease has expired, and the steps committed before stay.

Writes that change what a step or run *is* (begin, complete, fail, end) take
an optional ``worker_id``: with it the store refuses the write
(``LeaseHeldError``) unless that worker holds the lease, so a worker that
lost its lease (paused, partitioned) cannot commit over its successor.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import fcntl
import json
import os
import sqlite3
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.durable_files import connect_wal, write_atomic
from testbed.engines.checkpoint.records import (
    DEFAULT_LEASE_MS,
    STEP_KINDS,
    DurableRunManifest,
    EventRecord,
    InputMismatchError,
    LeaseHeldError,
    RunOutcome,
    RunRecord,
    StartResult,
    StepError,
    StepRecord,
    canonical_json,
    manifest_hash,
)


def iso(epoch_s: float) -> str:
    return dt.datetime.fromtimestamp(epoch_s, dt.timezone.utc).isoformat(timespec="milliseconds")


def epoch(text: str | None) -> float:
    return dt.datetime.fromisoformat(text).timestamp() if text else 0.0


class DurableRunStore(ABC):
    """The store contract (see the seed). All methods are coroutines; ``now`` can be overridden in tests."""

    def now(self) -> float:
        return time.time()

    @abstractmethod
    async def start_or_resume(self, run_id: str, manifest: DurableRunManifest, worker_id: str,
                              lease_ms: int = DEFAULT_LEASE_MS) -> StartResult: ...

    @abstractmethod
    async def renew_lease(self, run_id: str, worker_id: str, lease_ms: int = DEFAULT_LEASE_MS
                          ) -> tuple[bool, str | None]: ...

    @abstractmethod
    async def load_step(self, run_id: str, step_index: int) -> StepRecord | None: ...

    @abstractmethod
    async def begin_step(self, run_id: str, step_index: int, intent: str, kind: str, input_hash: str,
                         worker_id: str | None = None) -> StepRecord: ...

    @abstractmethod
    async def complete_step(self, run_id: str, step_index: int, result: Any, worker_id: str | None = None
                            ) -> StepRecord: ...

    @abstractmethod
    async def fail_step(self, run_id: str, step_index: int, error: StepError, worker_id: str | None = None
                        ) -> StepRecord: ...

    @abstractmethod
    async def end_run(self, run_id: str, worker_id: str, status: str, outcome: RunOutcome | None = None
                      ) -> RunRecord: ...

    @abstractmethod
    async def emit_event(self, run_id: str, key: str, payload: Any) -> tuple[bool, EventRecord]: ...

    @abstractmethod
    async def load_event(self, run_id: str, key: str) -> EventRecord | None: ...

    @abstractmethod
    async def close(self) -> None: ...


def _check_kind(kind: str) -> None:
    if kind not in STEP_KINDS:
        raise ValueError(f"step kind {kind!r}: must be one of {', '.join(STEP_KINDS)}")


def _check_end_status(status: str) -> None:
    if status not in ("completed", "failed"):
        raise ValueError(f"end_run status {status!r}: must be 'completed' or 'failed'")


def _lease_error(run_id: str, holder: str | None, expires: float, now: float) -> LeaseHeldError:
    return LeaseHeldError(f"run {run_id!r} is leased by {holder} for another {max(expires - now, 0):.1f} s")


# -- shared logic of the two stores that keep whole records (memory, files) ---------------------------------


class _RecordStore(DurableRunStore):
    """Run, steps, events as records; subclasses say how one run's records are loaded and saved."""

    @abstractmethod
    def _locked(self, run_id: str) -> contextlib.AbstractContextManager[None]: ...

    @abstractmethod
    def _read_run(self, run_id: str) -> RunRecord | None: ...

    @abstractmethod
    def _write_run(self, run: RunRecord) -> None: ...

    @abstractmethod
    def _read_steps(self, run_id: str) -> dict[int, StepRecord]: ...

    @abstractmethod
    def _write_step(self, step: StepRecord, durable: bool = True) -> None: ...

    @abstractmethod
    def _read_events(self, run_id: str) -> dict[str, EventRecord]: ...

    @abstractmethod
    def _write_event(self, event: EventRecord) -> None: ...

    def _require(self, run_id: str) -> RunRecord:
        run = self._read_run(run_id)
        if run is None:
            raise KeyError(f"no run {run_id!r} in this store; start it with start_or_resume")
        return run

    def _fence(self, run: RunRecord, worker_id: str | None) -> None:
        if worker_id is not None and run.lease_holder_id != worker_id:
            now = self.now()
            raise _lease_error(run.run_id, run.lease_holder_id, epoch(run.lease_expires_at), now)

    async def start_or_resume(self, run_id: str, manifest: DurableRunManifest, worker_id: str,
                              lease_ms: int = DEFAULT_LEASE_MS) -> StartResult:
        digest = manifest_hash(manifest)
        with self._locked(run_id):
            now = self.now()
            expires = iso(now + lease_ms / 1000)
            run = self._read_run(run_id)
            if run is None:
                run = RunRecord(run_id=run_id, manifest_hash=digest, project_id=manifest.project_id,
                                scenario_id=manifest.scenario_id, status="running", created_at=iso(now),
                                updated_at=iso(now), lease_holder_id=worker_id, lease_expires_at=expires)
            else:
                if run.manifest_hash != digest:
                    raise InputMismatchError(f"run {run_id!r} exists with manifest hash {run.manifest_hash[:12]}, "
                                             f"not {digest[:12]}: same run id, different inputs")
                held = run.lease_holder_id not in (None, worker_id) and epoch(run.lease_expires_at) > now
                if held:
                    raise _lease_error(run_id, run.lease_holder_id, epoch(run.lease_expires_at), now)
                run.lease_holder_id, run.lease_expires_at, run.updated_at = worker_id, expires, iso(now)
                if run.status in ("pending", "suspended", "failed"):
                    run.status = "running"
            self._write_run(run)
            steps = self._read_steps(run_id)
            run.step_count = max([run.step_count, *(i + 1 for i in steps)])
        completed = [s for _, s in sorted(steps.items()) if s.status == "completed"]
        return StartResult(run=copy.deepcopy(run), completed_steps=copy.deepcopy(completed), lease_expires_at=expires)

    async def renew_lease(self, run_id: str, worker_id: str, lease_ms: int = DEFAULT_LEASE_MS
                          ) -> tuple[bool, str | None]:
        with self._locked(run_id):
            run = self._read_run(run_id)
            if run is None or run.lease_holder_id != worker_id:
                return False, None
            now = self.now()
            run.lease_expires_at, run.updated_at = iso(now + lease_ms / 1000), iso(now)
            self._write_run(run)
            return True, run.lease_expires_at

    async def load_step(self, run_id: str, step_index: int) -> StepRecord | None:
        with self._locked(run_id):
            return copy.deepcopy(self._read_steps(run_id).get(step_index))

    async def begin_step(self, run_id: str, step_index: int, intent: str, kind: str, input_hash: str,
                         worker_id: str | None = None) -> StepRecord:
        _check_kind(kind)
        with self._locked(run_id):
            run = self._require(run_id)
            self._fence(run, worker_id)
            step = self._read_steps(run_id).get(step_index)
            now = iso(self.now())
            if step is None:
                step = StepRecord(run_id, step_index, intent, kind, input_hash, "running", 1, started_at=now)
            else:
                step.intent, step.kind, step.input_hash = intent, kind, input_hash
                step.status, step.attempts, step.started_at, step.error = "running", step.attempts + 1, now, None
            # Not forced to disk: a begin only counts an attempt; the step's completion (fsync'd) or the next
            # attempt's begin supersedes it. The run's step count is derived from the steps when read.
            self._write_step(step, durable=False)
            return copy.deepcopy(step)

    async def _finish(self, run_id: str, step_index: int, worker_id: str | None, **changes: Any) -> StepRecord:
        with self._locked(run_id):
            self._fence(self._require(run_id), worker_id)
            step = self._read_steps(run_id).get(step_index)
            if step is None:
                raise KeyError(f"run {run_id!r} has no step {step_index}; begin_step first")
            for name, value in changes.items():
                setattr(step, name, value)
            step.completed_at = iso(self.now())
            self._write_step(step)
            return copy.deepcopy(step)

    async def complete_step(self, run_id: str, step_index: int, result: Any, worker_id: str | None = None
                            ) -> StepRecord:
        canonical_json(result)  # refuse what could not be replayed
        return await self._finish(run_id, step_index, worker_id, status="completed", result=result, error=None)

    async def fail_step(self, run_id: str, step_index: int, error: StepError, worker_id: str | None = None
                        ) -> StepRecord:
        return await self._finish(run_id, step_index, worker_id, status="failed", error=error)

    async def end_run(self, run_id: str, worker_id: str, status: str, outcome: RunOutcome | None = None
                      ) -> RunRecord:
        _check_end_status(status)
        with self._locked(run_id):
            run = self._require(run_id)
            self._fence(run, worker_id)
            now = iso(self.now())
            run.status, run.outcome, run.updated_at, run.completed_at = status, outcome, now, now
            run.lease_holder_id = run.lease_expires_at = None
            run.step_count = max([run.step_count, *(i + 1 for i in self._read_steps(run_id))])
            self._write_run(run)
            return copy.deepcopy(run)

    async def emit_event(self, run_id: str, key: str, payload: Any) -> tuple[bool, EventRecord]:
        canonical_json(payload)
        with self._locked(run_id):
            existing = self._read_events(run_id).get(key)
            if existing is not None:
                return False, copy.deepcopy(existing)
            event = EventRecord(run_id, key, copy.deepcopy(payload), iso(self.now()))
            self._write_event(event)
            return True, copy.deepcopy(event)

    async def load_event(self, run_id: str, key: str) -> EventRecord | None:
        with self._locked(run_id):
            return copy.deepcopy(self._read_events(run_id).get(key))


class InMemoryStore(_RecordStore):
    """Single process, for development and tests. Leases are real (wall clock), like the other stores."""

    def __init__(self) -> None:
        self._runs: dict[str, RunRecord] = {}
        self._steps: dict[str, dict[int, StepRecord]] = {}
        self._events: dict[str, dict[str, EventRecord]] = {}

    @contextlib.contextmanager
    def _locked(self, run_id: str) -> Iterator[None]:
        yield  # one event loop, no awaits inside: already atomic

    def _read_run(self, run_id: str) -> RunRecord | None:
        return self._runs.get(run_id)

    def _write_run(self, run: RunRecord) -> None:
        self._runs[run.run_id] = run

    def _read_steps(self, run_id: str) -> dict[int, StepRecord]:
        return self._steps.setdefault(run_id, {})

    def _write_step(self, step: StepRecord, durable: bool = True) -> None:
        self._steps.setdefault(step.run_id, {})[step.step_index] = step

    def _read_events(self, run_id: str) -> dict[str, EventRecord]:
        return self._events.setdefault(run_id, {})

    def _write_event(self, event: EventRecord) -> None:
        self._events.setdefault(event.run_id, {})[event.key] = event

    async def close(self) -> None:
        pass


class FileSystemStore(_RecordStore):
    """One directory per run under ``root``:

    - ``run.json`` (the run record) and ``lease.json`` (holder and deadline), each replaced atomically
      (write a temporary file, fsync, rename, fsync the directory);
    - ``steps.jsonl`` and ``events.jsonl``, append-only, one record per line; completions, failures and
      events are fsync'd, a step's begin is not (it only counts an attempt); the last line for a step
      index wins when read;
    - ``lock``: an ``flock`` held for each operation, so several processes can share the root.
    """

    def __init__(self, root: str | Path, *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        # run id -> (bytes of steps.jsonl already parsed, the steps so far): each operation reads only what
        # was appended since (by this process or another), not the whole file again.
        self._steps_seen: dict[str, tuple[int, dict[int, StepRecord]]] = {}

    def _dir(self, run_id: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in run_id)[:150]
        return self.root / f"{safe}-{_short_hash(run_id)}"

    @contextlib.contextmanager
    def _locked(self, run_id: str) -> Iterator[None]:
        d = self._dir(run_id)
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(d / "lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _replace(self, path: Path, data: dict[str, Any]) -> None:
        write_atomic(path, json.dumps(data).encode(), fsync=self.fsync)

    def _append(self, path: Path, data: dict[str, Any], durable: bool = True) -> None:
        with open(path, "a+b") as f:
            if f.seek(0, os.SEEK_END) > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.write(b"\n")  # a torn line from a crash mid-append stays on its own (and is skipped)
            f.write(json.dumps(data).encode() + b"\n")
            f.flush()
            if self.fsync and durable:
                os.fsync(f.fileno())

    @staticmethod
    def _lines(path: Path) -> Iterator[dict[str, Any]]:
        if not path.exists():
            return
        for line in path.read_text().splitlines():
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line from a crash mid-append: it was never acknowledged

    def _read_run(self, run_id: str) -> RunRecord | None:
        path = self._dir(run_id) / "run.json"
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        lease = self._dir(run_id) / "lease.json"
        if lease.exists():
            data.update(json.loads(lease.read_text()))
        outcome = data.pop("outcome", None)
        return RunRecord(**data, outcome=RunOutcome(**outcome) if outcome else None)

    def _write_run(self, run: RunRecord) -> None:
        data = asdict(run)
        lease = {"lease_holder_id": data.pop("lease_holder_id"), "lease_expires_at": data.pop("lease_expires_at")}
        self._replace(self._dir(run.run_id) / "lease.json", lease)
        self._replace(self._dir(run.run_id) / "run.json", data)

    def _read_steps(self, run_id: str) -> dict[int, StepRecord]:
        path = self._dir(run_id) / "steps.jsonl"
        offset, steps = self._steps_seen.get(run_id, (0, {}))
        if not path.exists():
            return steps
        with open(path, "rb") as f:
            f.seek(offset)
            tail = f.read()
        complete = tail[:tail.rfind(b"\n") + 1]  # a line still being written is read next time
        for line in complete.splitlines():
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line from a crash mid-append: it was never acknowledged
            steps[d["step_index"]] = StepRecord.from_json(d)  # the last line for a step wins
        self._steps_seen[run_id] = (offset + len(complete), steps)
        return steps

    def _write_step(self, step: StepRecord, durable: bool = True) -> None:
        self._append(self._dir(step.run_id) / "steps.jsonl", step.to_json(), durable=durable)

    def _read_events(self, run_id: str) -> dict[str, EventRecord]:
        events: dict[str, EventRecord] = {}
        for d in self._lines(self._dir(run_id) / "events.jsonl"):
            events.setdefault(d["key"], EventRecord(**d))  # the first line for a key wins
        return events

    def _write_event(self, event: EventRecord) -> None:
        self._append(self._dir(event.run_id) / "events.jsonl", asdict(event))

    async def close(self) -> None:
        pass


def _short_hash(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:10]


SQLITE_SCHEMA_VERSION = 1
_SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS durable_schema_info (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS durable_runs (
    run_id TEXT PRIMARY KEY,
    manifest_hash TEXT NOT NULL,
    project_id TEXT NOT NULL,
    scenario_id TEXT,
    status TEXT NOT NULL,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    completed_at TEXT,
    lease_holder_id TEXT,
    lease_expires_at REAL,
    outcome TEXT,
    step_count INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS durable_steps (
    run_id TEXT NOT NULL,
    step_index INTEGER NOT NULL,
    intent TEXT NOT NULL,
    kind TEXT NOT NULL,
    input_hash TEXT NOT NULL,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    result TEXT,
    error TEXT,
    started_at TEXT,
    completed_at TEXT,
    PRIMARY KEY (run_id, step_index)
);
CREATE TABLE IF NOT EXISTS durable_events (
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    payload TEXT NOT NULL,
    emitted_at TEXT NOT NULL,
    PRIMARY KEY (run_id, key)
);
"""


class SqliteStore(DurableRunStore):
    """The embedded default: one SQLite file in WAL mode, shared safely by several processes.

    Leases are taken with a conditional UPDATE inside ``BEGIN IMMEDIATE``, so of two processes racing
    for one run exactly one gets it. Durability: a step's completion, a run's end and an event are
    committed with ``synchronous=FULL`` (fsync'd, they survive power loss); a step's *begin* (an
    attempt counter, rewritten by the next attempt anyway) with ``NORMAL``: it survives a process
    crash and is made durable by the next FULL commit. That makes one step cost one fsync.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._db = connect_wal(self.path)
        self._sync = ""
        self._synchronous("FULL")
        self._db.executescript(_SQLITE_SCHEMA)
        with self._tx():
            row = self._db.execute("SELECT version FROM durable_schema_info").fetchone()
            if row is None:
                self._db.execute("INSERT INTO durable_schema_info (version) VALUES (?)", (SQLITE_SCHEMA_VERSION,))
            elif row[0] != SQLITE_SCHEMA_VERSION:
                raise RuntimeError(f"{self.path}: durable-run schema version {row[0]}, this code expects "
                                   f"{SQLITE_SCHEMA_VERSION}; use a new database file")

    def durability(self) -> dict[str, str]:
        sync = ("OFF", "NORMAL", "FULL", "EXTRA")[self._db.execute("PRAGMA synchronous").fetchone()[0]]
        return {"journal_mode": self._db.execute("PRAGMA journal_mode").fetchone()[0], "synchronous": sync}

    def _synchronous(self, level: str) -> None:
        if self._sync != level:
            self._db.execute(f"PRAGMA synchronous={level}")
            self._sync = level

    @contextlib.contextmanager
    def _tx(self, durable: bool = True) -> Iterator[sqlite3.Connection]:
        self._synchronous("FULL" if durable else "NORMAL")
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _run(self, row: sqlite3.Row) -> RunRecord:
        d = dict(row)
        raw = d.pop("outcome")
        outcome = json.loads(raw) if raw else None
        expires = d.pop("lease_expires_at")
        return RunRecord(**d, lease_expires_at=iso(expires) if expires else None,
                         outcome=RunOutcome(**outcome) if outcome else None)

    @staticmethod
    def _step(row: sqlite3.Row) -> StepRecord:
        d = dict(row)
        d["result"] = json.loads(d["result"]) if d["result"] is not None else None
        d["error"] = StepError(**json.loads(d["error"])) if d["error"] else None
        return StepRecord(**d)

    @staticmethod
    def _step_count(db: sqlite3.Connection, run: RunRecord) -> int:
        """Positions begun so far (begin_step does not touch the run row, to stay one statement)."""
        row = db.execute("SELECT COALESCE(MAX(step_index) + 1, 0) FROM durable_steps WHERE run_id = ?",
                         (run.run_id,)).fetchone()
        return max(run.step_count, int(row[0]))

    def _fence(self, db: sqlite3.Connection, run_id: str, worker_id: str | None) -> None:
        holds = db.execute(f"SELECT {self._HOLDS}", (run_id, worker_id, worker_id)).fetchone()[0]
        if not holds:
            raise self._refused(run_id, worker_id, f"no run {run_id!r} in this store; start it with start_or_resume")

    async def start_or_resume(self, run_id: str, manifest: DurableRunManifest, worker_id: str,
                              lease_ms: int = DEFAULT_LEASE_MS) -> StartResult:
        digest = manifest_hash(manifest)
        now = self.now()
        expires = now + lease_ms / 1000
        with self._tx() as db:
            db.execute(
                "INSERT OR IGNORE INTO durable_runs (run_id, manifest_hash, project_id, scenario_id, status,"
                " created_at, updated_at, lease_holder_id, lease_expires_at) VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?)",
                (run_id, digest, manifest.project_id, manifest.scenario_id, iso(now), iso(now), worker_id, expires))
            row = db.execute("SELECT * FROM durable_runs WHERE run_id = ?", (run_id,)).fetchone()
            if row["manifest_hash"] != digest:
                raise InputMismatchError(f"run {run_id!r} exists with manifest hash {row['manifest_hash'][:12]}, "
                                         f"not {digest[:12]}: same run id, different inputs")
            # The lease: taken only if free, expired, or already ours (one statement, inside the write lock).
            taken = db.execute(
                "UPDATE durable_runs SET lease_holder_id = ?, lease_expires_at = ?, updated_at = ?,"
                " status = CASE WHEN status IN ('pending', 'suspended', 'failed') THEN 'running' ELSE status END"
                " WHERE run_id = ? AND (lease_holder_id IS NULL OR lease_holder_id = ? OR lease_expires_at <= ?)",
                (worker_id, expires, iso(now), run_id, worker_id, now)).rowcount
            if not taken:
                raise _lease_error(run_id, row["lease_holder_id"], row["lease_expires_at"] or 0.0, now)
            run = self._run(db.execute("SELECT * FROM durable_runs WHERE run_id = ?", (run_id,)).fetchone())
            run.step_count = self._step_count(db, run)
            steps = [self._step(r) for r in db.execute(
                "SELECT * FROM durable_steps WHERE run_id = ? AND status = 'completed' ORDER BY step_index", (run_id,))]
        return StartResult(run=run, completed_steps=steps, lease_expires_at=iso(expires))

    async def renew_lease(self, run_id: str, worker_id: str, lease_ms: int = DEFAULT_LEASE_MS
                          ) -> tuple[bool, str | None]:
        now = self.now()
        expires = now + lease_ms / 1000
        with self._tx(durable=False) as db:  # a lost renewal only shortens the lease
            ok = db.execute("UPDATE durable_runs SET lease_expires_at = ?, updated_at = ? WHERE run_id = ? AND"
                            " lease_holder_id = ?", (expires, iso(now), run_id, worker_id)).rowcount == 1
        return (True, iso(expires)) if ok else (False, None)

    async def load_step(self, run_id: str, step_index: int) -> StepRecord | None:
        row = self._db.execute("SELECT * FROM durable_steps WHERE run_id = ? AND step_index = ?",
                               (run_id, step_index)).fetchone()
        return self._step(row) if row else None

    _HOLDS = ("EXISTS (SELECT 1 FROM durable_runs WHERE run_id = ? AND (? IS NULL OR lease_holder_id = ?))")

    def _refused(self, run_id: str, worker_id: str | None, what: str) -> Exception:
        """Why a fenced write changed nothing: no such run, no such step, or another worker's lease."""
        row = self._db.execute("SELECT lease_holder_id, lease_expires_at FROM durable_runs WHERE run_id = ?",
                               (run_id,)).fetchone()
        if row is None:
            return KeyError(f"no run {run_id!r} in this store; start it with start_or_resume")
        if worker_id is not None and row[0] != worker_id:
            return _lease_error(run_id, row[0], row[1] or 0.0, self.now())
        return KeyError(what)

    async def begin_step(self, run_id: str, step_index: int, intent: str, kind: str, input_hash: str,
                         worker_id: str | None = None) -> StepRecord:
        _check_kind(kind)
        # One statement, fenced on the lease, not forced to disk (it only counts an attempt; the completion's
        # fsync makes it durable): autocommit, synchronous=NORMAL.
        self._synchronous("NORMAL")
        rows = self._db.execute(
            "INSERT INTO durable_steps (run_id, step_index, intent, kind, input_hash, status, attempts, started_at)"
            f" SELECT ?, ?, ?, ?, ?, 'running', 1, ? WHERE {self._HOLDS}"
            " ON CONFLICT (run_id, step_index) DO UPDATE SET intent = excluded.intent, kind = excluded.kind,"
            " input_hash = excluded.input_hash, status = 'running', attempts = attempts + 1,"
            " started_at = excluded.started_at, error = NULL RETURNING *",
            (run_id, step_index, intent, kind, input_hash, iso(self.now()), run_id, worker_id, worker_id)).fetchall()
        if not rows:
            raise self._refused(run_id, worker_id, f"run {run_id!r}: step {step_index} could not begin")
        return self._step(rows[0])

    async def _finish(self, run_id: str, step_index: int, worker_id: str | None, status: str, result: str | None,
                      error: str | None) -> StepRecord:
        self._synchronous("FULL")  # the commit point of a step: fsync'd
        rows = self._db.execute(
            "UPDATE durable_steps SET status = ?, result = ?, error = ?, completed_at = ? WHERE run_id = ? AND"
            f" step_index = ? AND {self._HOLDS} RETURNING *",
            (status, result, error, iso(self.now()), run_id, step_index, run_id, worker_id, worker_id)).fetchall()
        if not rows:
            raise self._refused(run_id, worker_id, f"run {run_id!r} has no step {step_index}; begin_step first")
        return self._step(rows[0])

    async def complete_step(self, run_id: str, step_index: int, result: Any, worker_id: str | None = None
                            ) -> StepRecord:
        return await self._finish(run_id, step_index, worker_id, "completed", canonical_json(result), None)

    async def fail_step(self, run_id: str, step_index: int, error: StepError, worker_id: str | None = None
                        ) -> StepRecord:
        return await self._finish(run_id, step_index, worker_id, "failed", None, json.dumps(asdict(error)))

    async def end_run(self, run_id: str, worker_id: str, status: str, outcome: RunOutcome | None = None
                      ) -> RunRecord:
        _check_end_status(status)
        now = iso(self.now())
        with self._tx() as db:
            self._fence(db, run_id, worker_id)
            db.execute("UPDATE durable_runs SET status = ?, outcome = ?, updated_at = ?, completed_at = ?,"
                       " lease_holder_id = NULL, lease_expires_at = NULL WHERE run_id = ?",
                       (status, json.dumps(asdict(outcome)) if outcome else None, now, now, run_id))
            run = self._run(db.execute("SELECT * FROM durable_runs WHERE run_id = ?", (run_id,)).fetchone())
            run.step_count = self._step_count(db, run)
            db.execute("UPDATE durable_runs SET step_count = ? WHERE run_id = ?", (run.step_count, run_id))
            return run

    async def emit_event(self, run_id: str, key: str, payload: Any) -> tuple[bool, EventRecord]:
        data = canonical_json(payload)
        with self._tx() as db:
            accepted = db.execute("INSERT OR IGNORE INTO durable_events (run_id, key, payload, emitted_at)"
                                  " VALUES (?, ?, ?, ?)", (run_id, key, data, iso(self.now()))).rowcount == 1
            row = db.execute("SELECT * FROM durable_events WHERE run_id = ? AND key = ?", (run_id, key)).fetchone()
        return accepted, EventRecord(run_id, key, json.loads(row["payload"]), row["emitted_at"])

    async def load_event(self, run_id: str, key: str) -> EventRecord | None:
        row = self._db.execute("SELECT * FROM durable_events WHERE run_id = ? AND key = ?", (run_id, key)).fetchone()
        return EventRecord(run_id, key, json.loads(row["payload"]), row["emitted_at"]) if row else None

    async def close(self) -> None:
        with contextlib.suppress(sqlite3.ProgrammingError):
            self._db.close()
