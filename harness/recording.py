"""Recording what an agent physically did: the effect ledger the checkers read.

The public recording API for any agent under test, ours or yours. Two
things are counted separately, because durable execution promises only one
of them:

- *executions*: every physical run of a tool or model-call activity, with
  its workflow id, run id, activity id, attempt and worker. A retried or
  re-dispatched activity legitimately executes more than once.
- *effects*: every effect a tool applied, keyed by an idempotency key
  (stable across retries of one activity: one logical effect). A
  side-effecting tool calls ``apply_once`` so that a retry finds the effect
  recorded and does not apply it again. Every physical application is also
  logged (``applications``); a logical effect applied more than once is a
  duplicated effect: the thing a durable agent must never do.

Use from an activity (any Temporal SDK worker; ``ExecutionIdentity.current``
reads the running activity's identity)::

    ledger = EffectLedger.from_environment()      # the file the harness named in $DAH_LEDGER
    ident = ExecutionIdentity.current(worker="my-worker-1")
    execution = ledger.begin_execution(ident, "call_model", model_call=True)
    try:
        reply = call_the_model(...)
    finally:
        ledger.end_execution(execution, "ok")      # or the failure's class
    result, applied_now = ledger.apply_once(ident, "append_note", "notes.txt", digest,
                                            apply=lambda: write_it(), already_present=lambda: check_it())

The ledger is one SQLite file in WAL mode shared by all worker processes
(so chaos runs can kill workers and still read one ledger). Crash windows are
recorded honestly: an effect whose apply was interrupted stays ``pending``;
the next attempt checks whether the effect is already present before applying
it again.

These calls are also where the harness's in-agent faults act
(``harness.faults``: a crash right after a model call or an effect, a tool
with a logic bug, a build that ignores idempotency keys), so an agent that
records through this module can be attacked at those points without any
code of ours inside it. With no fault asked for, they do nothing. A mutated
path that ran is recorded (table ``mutations``): a declared mutation that
never ran is a bug that was not exercised, and the run proves nothing.

Standard library only: this module is imported in a target agent's own Python.
The schema (version ``SCHEMA_VERSION``) is part of the run directory's
contract (``RUN_DIRECTORY.md``).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from harness import run_files
from harness.durable_files import connect_wal
from harness.faults import AgentFaults
from harness.rundir import RunDirError

SCHEMA_VERSION = 4  # 4: executions.scheduled_at (the server's schedule time of the attempt)
ENV_LEDGER = "DAH_LEDGER"  # the harness names the ledger file of a target's workers here
MODEL_CALL, TOOL_CALL = "model", "tool"  # the kinds of execution


def workspace_name(workflow_id: str) -> str:
    """A workflow id as one file name: characters outside ``A-Za-z0-9._-`` become ``_``, at most 200 of them.

    An agent that keeps each workflow's files in a directory named this way declares it to the harness as
    ``workspace = "<dir>/{workflow_id}"`` (relative to its state directory), and the checkers find them."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", workflow_id)[:200] or "_"

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
    kind TEXT NOT NULL DEFAULT 'tool' CHECK (kind IN ('model', 'tool')),
    worker TEXT NOT NULL,
    started_at REAL NOT NULL,
    finished_at REAL,
    outcome TEXT,
    scheduled_at REAL
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
CREATE TABLE IF NOT EXISTS crash_points (
    point TEXT PRIMARY KEY,
    worker TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS mutations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    mutation TEXT NOT NULL,
    worker TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    tool TEXT NOT NULL,
    at REAL NOT NULL
);
"""


@dataclass(frozen=True)
class ExecutionIdentity:
    """Which physical attempt of which activity is running."""

    workflow_id: str
    run_id: str
    activity_id: str
    attempt: int
    worker: str
    #: when the server scheduled this attempt (its clock, seconds since the epoch): retry spacing is checked on it
    scheduled_at: float | None = None

    @property
    def idempotency_key(self) -> str:
        # Stable across retries and re-dispatches of one activity, unique per activity.
        return f"{self.workflow_id}/{self.run_id}/{self.activity_id}"

    @classmethod
    def current(cls, worker: str) -> ExecutionIdentity:
        """The Temporal activity running now (call it inside an activity)."""
        from temporalio import activity

        info = activity.info()
        scheduled = info.current_attempt_scheduled_time
        return cls(info.workflow_id, info.workflow_run_id, info.activity_id, info.attempt, worker,
                   scheduled.timestamp() if scheduled is not None else None)


@dataclass(frozen=True)
class _AttemptKeyed(ExecutionIdentity):
    """The mutation ``attempt_keyed_effects``: a key that changes with every retry (so it deduplicates nothing)."""

    @property
    def idempotency_key(self) -> str:
        return f"{self.workflow_id}/{self.run_id}/{self.activity_id}#attempt-{self.attempt}"


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

    def __init__(self, path: str | Path, faults: AgentFaults | None = None) -> None:
        """``faults``: what this worker carries (default: what the environment asks for, usually nothing)."""
        self.path = Path(path)
        self.faults = AgentFaults.from_environment() if faults is None else faults
        self._conn = connect_wal(self.path)  # shared by every worker process
        # The ledger is the witness: it must survive every fault the harness injects. In WAL mode a committed
        # transaction is in the OS's hands before the commit returns, so it survives a SIGKILL of any process (or
        # container) at any instant; only a power loss could roll the last ones back, and no fault here is one.
        # An fsync per record (synchronous=FULL) cost 1.2 ms per execution here, on every model call and tool.
        self._conn.execute("PRAGMA synchronous=NORMAL")
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

    @classmethod
    def from_environment(cls, default: str | Path | None = None) -> EffectLedger:
        """The ledger file the harness named in ``$DAH_LEDGER`` (else ``default``)."""
        path = os.environ.get(ENV_LEDGER) or default
        if not path:
            raise RuntimeError(f"no effect ledger: set ${ENV_LEDGER} to its file (the harness does, for the "
                               "workers of a target that declares a ledger)")
        return cls(path)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> EffectLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- executions ---------------------------------------------------------

    def begin_execution(self, ident: ExecutionIdentity, tool: str, *, model_call: bool = False) -> int:
        """Record that an attempt of ``tool`` (a model call when ``model_call``) starts now; its id for
        ``end_execution``. A worker built with a logic bug in ``tool`` raises ``InjectedBug`` here."""
        cur = self._conn.execute(
            "INSERT INTO executions (idempotency_key, workflow_id, run_id, activity_id, attempt, tool, kind, worker,"
            " started_at, scheduled_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (ident.idempotency_key, ident.workflow_id, ident.run_id, ident.activity_id, ident.attempt, tool,
             MODEL_CALL if model_call else TOOL_CALL, ident.worker, time.time(), ident.scheduled_at),
        )
        execution_id = int(cur.lastrowid)
        if self.faults.bugs:
            try:
                self.faults.raise_if_buggy(tool)
            except Exception:
                self.end_execution(execution_id, "error")
                raise
        return execution_id

    def end_execution(self, execution_id: int, outcome: str) -> None:
        """Record how the attempt ended (``ok`` or the failure's class)."""
        self._conn.execute(
            "UPDATE executions SET finished_at = ?, outcome = ? WHERE id = ?", (time.time(), outcome, execution_id)
        )
        if outcome == "ok" and self.faults.wants_crash("after_model_call"):
            row = self._conn.execute("SELECT * FROM executions WHERE id = ?", (execution_id,)).fetchone()
            if row is not None and row["kind"] == MODEL_CALL:
                self._crash_point("after_model_call", row["worker"], row["workflow_id"], row["tool"])

    def _crash_point(self, point: str, worker: str, workflow_id: str, tool: str) -> None:
        """SIGKILL this worker at ``point`` unless some worker already crashed there (once per ledger)."""
        first = self._conn.execute(
            "INSERT OR IGNORE INTO crash_points (point, worker, workflow_id, tool, at) VALUES (?, ?, ?, ?, ?)",
            (point, worker, workflow_id, tool, time.time())).rowcount == 1
        if first:
            self.faults.crash(point, worker)

    def record_mutation(self, mutation: str, ident: ExecutionIdentity, tool: str) -> None:
        """Record that a mutated code path (``harness.faults.MUTATIONS``) ran just now, in this attempt of ``tool``.

        The injection evidence of a mutation: a run that declared one whose path never ran proved nothing about
        the checker it targets (``injection_evidence`` says ``unknown``). ``apply_once`` records its own
        (``unkeyed_effects``); an agent with a mutated path of its own calls this where that path is taken."""
        self._conn.execute(
            "INSERT INTO mutations (mutation, worker, workflow_id, tool, at) VALUES (?, ?, ?, ?, ?)",
            (mutation, ident.worker, ident.workflow_id, tool, time.time()),
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
        ident = self._keyed(ident, tool)
        if self.faults.mutated("unkeyed_effects"):
            self.record_mutation("unkeyed_effects", ident, tool)
            result = apply()
            self.record_application(ident, tool, target)
            return self._after_effect(ident, tool, (result, True))
        result, step = self._claim(ident, tool, target, digest, already_present)
        if step == "apply":
            result = apply()
        return self._after_effect(ident, tool, result if step == "done" else
                                  self._settle(ident, tool, target, result, step == "apply"))

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
        ident = self._keyed(ident, tool)
        if self.faults.mutated("unkeyed_effects"):
            self.record_mutation("unkeyed_effects", ident, tool)
            result = await apply()
            self.record_application(ident, tool, target)
            return self._after_effect(ident, tool, (result, True))
        result, step = self._claim(ident, tool, target, digest, already_present)
        if step == "apply":
            result = await apply()
        return self._after_effect(ident, tool, result if step == "done" else
                                  self._settle(ident, tool, target, result, step == "apply"))

    def _keyed(self, ident: ExecutionIdentity, tool: str) -> ExecutionIdentity:
        """The identity whose key the effect is recorded under (a build mutated to key by attempt: a wrong one)."""
        if not self.faults.mutated("attempt_keyed_effects"):
            return ident
        self.record_mutation("attempt_keyed_effects", ident, tool)
        return _AttemptKeyed(ident.workflow_id, ident.run_id, ident.activity_id, ident.attempt, ident.worker,
                             ident.scheduled_at)

    def _after_effect(self, ident: ExecutionIdentity, tool: str, outcome: tuple[Any, bool]) -> tuple[Any, bool]:
        if self.faults.wants_crash("after_effect"):
            self._crash_point("after_effect", ident.worker, ident.workflow_id, tool)
        return outcome

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

    def _rows(self, table: str, workflow_id: str | None, order: str) -> list[dict[str, Any]]:
        """Every row of ``table`` (of one workflow, if given), in ``order``."""
        where, args = ("", ()) if workflow_id is None else (" WHERE workflow_id = ?", (workflow_id,))
        return [dict(r) for r in self._conn.execute(f"SELECT * FROM {table}{where} ORDER BY {order}", args)]

    def applications(self, workflow_id: str | None = None) -> list[dict[str, Any]]:
        return self._rows("applications", workflow_id, "id")

    def executions(self, workflow_id: str | None = None) -> list[dict[str, Any]]:
        return self._rows("executions", workflow_id, "id")

    def effects(self, workflow_id: str | None = None) -> list[dict[str, Any]]:
        return self._rows("effects", workflow_id, "updated_at")

    def crash_points(self) -> list[dict[str, Any]]:
        """The crash points that fired (each at most once per ledger)."""
        return [dict(r) for r in self._conn.execute("SELECT * FROM crash_points ORDER BY at")]

    def mutations(self) -> list[dict[str, Any]]:
        """Every time a mutated code path ran (``record_mutation``), in order."""
        return [dict(r) for r in self._conn.execute("SELECT * FROM mutations ORDER BY id")]

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


# -- reading a ledger from outside the agent ---------------------------------------------------------------------

#: the ledger's tables, each in the order its rows were written
LEDGER_TABLES = ("executions", "effects", "applications", "crash_points", "mutations", "meta")
#: what the schema gained after version 1, by the version that added it: a ledger of an older version lacks it
_TABLES_SINCE = {"applications": 2, "crash_points": 3, "mutations": 3}
_COLUMNS_SINCE = {("executions", "kind"): 3, ("executions", "scheduled_at"): 4}


@lru_cache(maxsize=None)
def _columns_now() -> dict[str, tuple[str, ...]]:
    """Each table's columns as ``_SCHEMA`` (this version) makes them."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(_SCHEMA)
        return {t: tuple(r[1] for r in conn.execute(f"PRAGMA table_info({t})")) for t in LEDGER_TABLES}
    finally:
        conn.close()


def _expect_ledger(conn: sqlite3.Connection, path: Path, table: str) -> bool:
    """Whether the ledger has ``table`` (False: its schema version is older than the table); RunDirError naming the
    file and what is wrong if it is not an effect ledger: not SQLite, no schema version, or a table its version
    has that is missing or lacks a column."""
    what = "an effect ledger (harness/recording.py)"
    try:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "meta" not in tables:
            raise RunDirError(path, what, f"an SQLite database without its meta table (tables: "
                                          f"{', '.join(sorted(tables)) or 'none'})")
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None or not str(row[0]).isdigit():
            raise RunDirError(path, what, "no schema_version in its meta table", "meta")
        version = int(row[0])
        if table not in tables:
            if version < _TABLES_SINCE.get(table, 1):
                return False
            raise RunDirError(path, f"a table {table!r} (schema version {version})", "none", table)
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}  # noqa: S608 - a name of LEDGER_TABLES
    except sqlite3.DatabaseError as exc:  # not SQLite, or damaged
        raise RunDirError(path, what, f"a file SQLite cannot read ({exc})") from None
    needed = [c for c in _columns_now()[table] if _COLUMNS_SINCE.get((table, c), 1) <= version]
    missing = [c for c in needed if c not in have]
    if missing:
        raise RunDirError(path, f"the columns {', '.join(needed)}",
                          f"columns {', '.join(sorted(have)) or 'none'} (no {', '.join(missing)})", table)
    return True


def read_ledger(path: str | Path, table: str, *, root: str | Path | None = None, workflow_id: str | None = None,
                timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """A ledger table's rows in insertion order, read-only and with no fault seam: how the checkers, the
    benchmarks and the harness read a ledger that workers may still be writing. ``[]`` if the ledger does not
    exist, or is of a schema version older than the table. A file that is not an effect ledger (not SQLite, no
    schema version, a table of its version missing or lacking a column) is never read as an empty one: RunDirError
    naming the file and what is wrong. ``root``: the run directory the ledger lies in, which the read must not
    leave (opened by ``harness.run_files.sqlite_readonly``'s rules: RefusedPath for a symlink or a file that is
    not regular); ``workflow_id``: only that workflow's rows (tables that have the column)."""
    if table not in LEDGER_TABLES:
        raise ValueError(f"ledger table {table!r}: unknown; tables are {', '.join(LEDGER_TABLES)}")
    path = Path(path)
    if not os.path.lexists(path):
        return []
    if root is not None:
        conn = run_files.sqlite_readonly(Path(root), path.relative_to(root))
    else:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=timeout_s)
        conn.row_factory = sqlite3.Row
    try:
        if not _expect_ledger(conn, path, table):
            return []
        sql, args = f"SELECT * FROM {table}", ()  # noqa: S608 - a name of LEDGER_TABLES
        if workflow_id is not None:
            sql, args = sql + " WHERE workflow_id = ?", (workflow_id,)
        return [dict(r) for r in conn.execute(sql + " ORDER BY rowid", args)]
    finally:
        conn.close()


def write_ledger_rows(path: str | Path, table: str, rows: list[dict[str, Any]]) -> None:
    """``rows`` written as given into a ledger's ``table`` (the ledger created if new), with no clock and no fault
    seam, then checkpointed into the one file: for synthetic run directories (benchmark and test fixtures), never
    for an agent's own recording, which goes through ``EffectLedger``."""
    if table not in LEDGER_TABLES:
        raise ValueError(f"ledger table {table!r}: unknown; tables are {', '.join(LEDGER_TABLES)}")
    if not rows:
        return
    columns = list(rows[0])
    with EffectLedger(path, faults=AgentFaults()) as ledger:
        conn = ledger._conn
        conn.execute("BEGIN")
        conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                         [tuple(r[c] for c in columns) for r in rows])
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def executions_in_flight(path: Path, workers: tuple[str, ...] = ()) -> list[dict[str, Any]] | None:
    """Executions the ledger at ``path`` has begun and not finished, read without opening it for writing: what
    workers run right now, by their own record (written before the work starts, so even a tool call of a few
    milliseconds is seen): ``workflow_id``, ``activity`` (the tool), ``attempt``, ``worker``, ``kind``,
    ``execution``. With ``workers`` (the live workers' identities): None if the ledger names none of them (a
    target that records another identity than ``{identity}``: its ledger cannot say who runs what)."""
    if not path.exists():
        return None if workers else []
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)
    try:
        rows = db.execute("SELECT id, worker, workflow_id, tool, kind, attempt FROM executions "
                          "WHERE finished_at IS NULL").fetchall()
        if workers and not any(r[1] in workers for r in rows) and not db.execute(
                f"SELECT 1 FROM executions WHERE worker IN ({','.join('?' * len(workers))}) LIMIT 1",
                workers).fetchone():
            return None
    except sqlite3.Error:  # not created yet, or busy: nothing observable this time
        return None if workers else []
    finally:
        db.close()
    return [{"workflow_id": wid, "activity": tool, "attempt": attempt, "worker": worker, "kind": kind,
             "execution": eid} for eid, worker, wid, tool, kind, attempt in rows]
