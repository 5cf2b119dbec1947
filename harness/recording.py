"""The effect ledger: what side-effecting tools physically did, and how often.

Two things are counted separately, because durable execution promises only
one of them:

- *executions*: every physical run of a tool or model-call activity, with
  its workflow id, run id, activity id, attempt and worker. A retried or
  re-dispatched activity legitimately executes more than once.
- *effects*: every effect the tool applied, keyed by an idempotency key
  (stable across retries of one activity: one logical effect). A
  side-effecting tool calls ``apply_once`` so that a retry finds the effect
  recorded and does not apply it again. Every physical application is also
  logged (``applications``); a logical effect applied more than once is a
  duplicated effect: the thing a durable agent must never do.

The ledger is one SQLite file in WAL mode shared by all worker processes
(so chaos runs can kill workers and still read one ledger). Crash windows are
recorded honestly: an effect whose apply was interrupted stays ``pending``;
the next attempt checks whether the effect is already present before applying
it again.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS executions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    activity_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    tool TEXT NOT NULL,
    worker TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL,
    outcome TEXT
);
CREATE INDEX IF NOT EXISTS executions_by_workflow ON executions (workflow_id);
CREATE TABLE IF NOT EXISTS effects (
    idempotency_key TEXT PRIMARY KEY,
    workflow_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    target TEXT NOT NULL,
    digest TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'applied')),
    apply_count INTEGER NOT NULL DEFAULT 0,
    result TEXT,
    first_attempt INTEGER NOT NULL,
    applied_attempt INTEGER,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS effects_by_workflow ON effects (workflow_id);
CREATE TABLE IF NOT EXISTS applications (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    target TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    worker TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS applications_by_key ON applications (idempotency_key);
"""


@dataclass(frozen=True)
class ExecutionIdentity:
    """Which physical attempt of which activity is running."""

    workflow_id: str
    run_id: str
    activity_id: str
    attempt: int
    worker: str

    @property
    def idempotency_key(self) -> str:
        # Stable across retries and re-dispatches of one activity, unique per activity.
        return f"{self.workflow_id}/{self.run_id}/{self.activity_id}"


@dataclass(frozen=True)
class LedgerSummary:
    executions: int
    activities_executed_more_than_once: int
    effects_applied: int
    duplicated_effects: int
    pending_effects: int

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class EffectLedger:
    """Append-mostly record of side-effecting executions and applied effects."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")  # the ledger is the witness: it must survive a crash
        self._conn.execute("PRAGMA busy_timeout=30000")
        self._conn.executescript(_SCHEMA)
        self._conn.execute(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
        )
        version = int(self._conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])
        if version != SCHEMA_VERSION:
            raise RuntimeError(
                f"effect ledger {self.path} has schema version {version}, this code expects {SCHEMA_VERSION}; "
                "use a new ledger file"
            )

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> EffectLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- executions ---------------------------------------------------------

    def begin_execution(self, ident: ExecutionIdentity, tool: str) -> int:
        cur = self._conn.execute(
            "INSERT INTO executions (idempotency_key, workflow_id, run_id, activity_id, attempt, tool, worker, started_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (ident.idempotency_key, ident.workflow_id, ident.run_id, ident.activity_id, ident.attempt, tool,
             ident.worker, time.time()),
        )
        return int(cur.lastrowid)

    def end_execution(self, execution_id: int, outcome: str) -> None:
        self._conn.execute(
            "UPDATE executions SET finished_at = ?, outcome = ? WHERE id = ?", (time.time(), outcome, execution_id)
        )

    # -- effects ------------------------------------------------------------

    def apply_once(
        self,
        ident: ExecutionIdentity,
        tool: str,
        target: str,
        digest: str,
        apply: Callable[[], Any],
        already_present: Callable[[], bool],
    ) -> tuple[Any, bool]:
        """Apply an effect at most once per idempotency key.

        Returns ``(result, applied_now)``. ``apply`` performs the effect and
        returns a JSON-serialisable result; ``already_present`` tells whether
        an interrupted earlier attempt already made the effect visible (only
        asked when a pending record exists), so recovery does not re-apply it.
        """
        result, step = self._claim(ident, tool, target, digest, already_present)
        if step == "apply":
            result = apply()
        return result if step == "done" else self._settle(ident, tool, target, result, step == "apply")

    async def apply_once_async(
        self,
        ident: ExecutionIdentity,
        tool: str,
        target: str,
        digest: str,
        apply: Callable[[], Awaitable[Any]],
        already_present: Callable[[], bool],
    ) -> tuple[Any, bool]:
        """``apply_once`` for an effect that is awaited (a shell command)."""
        result, step = self._claim(ident, tool, target, digest, already_present)
        if step == "apply":
            result = await apply()
        return result if step == "done" else self._settle(ident, tool, target, result, step == "apply")

    def _claim(self, ident: ExecutionIdentity, tool: str, target: str, digest: str,
               already_present: Callable[[], bool]) -> tuple[Any, str]:
        """Where this attempt stands: ((result, False), "done") if the effect is recorded as applied;
        (recovery result, "recovered") if an interrupted earlier attempt already made it visible;
        (None, "apply") if this attempt must apply it."""
        key = ident.idempotency_key
        row = self._conn.execute("SELECT * FROM effects WHERE idempotency_key = ?", (key,)).fetchone()
        if row is not None and row["state"] == "applied":
            return (json.loads(row["result"]), False), "done"
        if row is None:
            # The insert is the claim: of two concurrent first attempts only one creates the row.
            cur = self._conn.execute(
                "INSERT OR IGNORE INTO effects (idempotency_key, workflow_id, tool, target, digest, state, apply_count,"
                " first_attempt, updated_at) VALUES (?, ?, ?, ?, ?, 'pending', 0, ?, ?)",
                (key, ident.workflow_id, tool, target, digest, ident.attempt, time.time()),
            )
            recovering = cur.rowcount == 0
        else:
            recovering = True
        if recovering:
            row = self._conn.execute("SELECT * FROM effects WHERE idempotency_key = ?", (key,)).fetchone()
            if row["state"] == "applied":
                return (json.loads(row["result"]), False), "done"
            if already_present():
                return {"recovered": True, "target": target}, "recovered"
        return None, "apply"

    def _settle(self, ident: ExecutionIdentity, tool: str, target: str, result: Any, applied_now: bool
                ) -> tuple[Any, bool]:
        key = ident.idempotency_key
        if applied_now:
            self.record_application(ident, tool, target)
            self._conn.execute(
                "UPDATE effects SET apply_count = apply_count + 1, updated_at = ? WHERE idempotency_key = ?",
                (time.time(), key),
            )
        self._conn.execute(
            "UPDATE effects SET state = 'applied', result = ?, applied_attempt = ?, updated_at = ?"
            " WHERE idempotency_key = ?",
            (json.dumps(result), ident.attempt, time.time(), key),
        )
        return result, applied_now

    def record_application(self, ident: ExecutionIdentity, tool: str, target: str) -> None:
        """Log one physical application of a logical effect (``apply_once`` does it for keyed tools)."""
        self._conn.execute(
            "INSERT INTO applications (idempotency_key, workflow_id, tool, target, attempt, worker, at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (ident.idempotency_key, ident.workflow_id, tool, target, ident.attempt, ident.worker, time.time()),
        )

    # -- reading ------------------------------------------------------------

    def applications(self, workflow_id: str | None = None) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM applications", ()
        if workflow_id is not None:
            sql, args = sql + " WHERE workflow_id = ?", (workflow_id,)
        return [dict(r) for r in self._conn.execute(sql + " ORDER BY id", args)]

    def executions(self, workflow_id: str | None = None) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM executions", ()
        if workflow_id is not None:
            sql, args = sql + " WHERE workflow_id = ?", (workflow_id,)
        return [dict(r) for r in self._conn.execute(sql + " ORDER BY id", args)]

    def effects(self, workflow_id: str | None = None) -> list[dict[str, Any]]:
        sql, args = "SELECT * FROM effects", ()
        if workflow_id is not None:
            sql, args = sql + " WHERE workflow_id = ?", (workflow_id,)
        return [dict(r) for r in self._conn.execute(sql + " ORDER BY updated_at", args)]

    def summary(self, workflow_id: str | None = None) -> LedgerSummary:
        execs = self.executions(workflow_id)
        per_key: dict[str, int] = {}
        for e in execs:
            per_key[e["idempotency_key"]] = per_key.get(e["idempotency_key"], 0) + 1
        effects = self.effects(workflow_id)
        applied: dict[str, int] = {}
        for a in self.applications(workflow_id):
            applied[a["idempotency_key"]] = applied.get(a["idempotency_key"], 0) + 1
        return LedgerSummary(
            executions=len(execs),
            activities_executed_more_than_once=sum(1 for n in per_key.values() if n > 1),
            effects_applied=len(applied),
            duplicated_effects=sum(1 for n in applied.values() if n > 1),
            pending_effects=sum(1 for e in effects if e["state"] == "pending"),
        )
