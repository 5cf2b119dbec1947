"""The run directory: what every chaos run, benchmark run and migration-fuzz run leaves behind.

This module owns its layout; everything else asks it for paths. The contract
is ``RUN_DIRECTORY.md`` (every file and field, versioned by ``SCHEMA``) and
its machine-readable twin ``harness/run_directory.schema.json``; a test fails
when a writer and the schema disagree. A run directory copied to another
machine is re-checked (``python -m chaos check DIR``) and reported
(``python -m reports``) there from these files alone.

    <out>/<name>/<UTC stamp>/       e.g. runs/kill_mid_turn/20261122T201530Z (a clash in one second: ...Z-2)
        run.json                    what ran: kind, status, command, reproduce, machine, configuration, ...
        verdict.json                what the checkers concluded (chaos runs; rewritten by a re-check)
        operations.jsonl            the operation log, written as it happens (harness.operations)
        effects_service.jsonl       what the external effects service received and applied (Temporal chaos runs)
        conversations.json          the driver's final reads (chaos runs)
        event_histories/<workflow id>/<nn>-<run id>.json    Temporal event histories (harness.event_history)
        logs/                       every process's output
        state/                      the workers' state: the effect ledger, workspaces, the server's database
        <section>.json              benchmark results; results.json + table.txt (migration fuzz)
    <out>/<name>/latest -> <UTC stamp>     only ever a *complete* run

Guarantees:

* Names are UTC (``%Y%m%dT%H%M%SZ``) and unique: the directory is created
  exclusively, and a second run in the same second gets ``-2``, ``-3``, ...
* ``<out>`` is the invoking user's alone, and so are ``<name>`` and the run's
  folder, made mode 0755 and never through a symlink (``harness.private.own_folder``);
  else ``UnsafeFolder`` and nothing is written. ``latest`` is replaced, never followed.
* JSON files are replaced atomically (write, fsync, rename; ``write_atomic``): a
  reader sees the old content or the new, never half of it; an interrupted run
  keeps what it wrote.
* What a run's data names is read only below the run directory
  (``harness.run_files``: no ``..``, no absolute path, no symlink, bounded).
* ``run.json`` has ``status`` ``running`` from the first moment, then
  ``complete``, ``interrupted`` (Ctrl-C), ``terminated`` (SIGTERM, once
  ``stop_on_sigterm`` is installed) or ``failed`` (with ``error``), whatever
  ends the run, and ``stopped_during`` (what it was doing) if it did not
  complete; ``latest`` moves only to a run that completed.
  A run lives this way through ``RunDir.recording`` (chaos, benchmark and migration-fuzz runs
  alike); however it ends other than complete, ``RunDir.end_with`` records it, in one place (a failed
  run's traceback in ``logs/runner-error.txt``).
* Schema 1 (before this module: ``journal.json``, ``history.jsonl``,
  ``histories/``, checks inside the journal) is still read: ``_V1`` and
  ``read_run``/``read_verdict``'s schema-1 branches are readers of older run
  directories, kept so that saved runs keep re-checking.
* A run directory is data: every JSON file is read by ``parse_json`` (strict
  UTF-8, nesting bounded before parsing, no NaN or Infinity) and the fields
  its readers use are type-checked; anything else is a ``RunDirError`` naming
  the file, the field and what was expected, the one line a command prints.

Standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import operator
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from harness import run_files, signing
from harness.durable_files import link_atomic, write_atomic
from harness.private import own_folder, own_subfolder

SCHEMA = 2
RUN_JSON, VERDICT_JSON = "run.json", "verdict.json"
OPERATIONS, CONVERSATIONS = "operations.jsonl", "conversations.json"
EFFECTS_SERVICE = "effects_service.jsonl"
#: what an engine saves of its own records at the end of a run: DBOS's runs and recorded steps, Restate's journal
DBOS_STEPS, RESTATE_JOURNAL = "dbos_steps.json", "restate_journal.json"
#: the checks, by name, in the order they run and are shown (verdict.json's ``checks``; a target's ``checkers``)
CHECKS = ("lost", "late", "replies", "context", "temporal_history", "workflow_tasks", "effects", "replay", "injection_evidence",
          "stats", "drain",
          "dbos_steps", "restate_journal")
EVENT_HISTORIES, LOGS, STATE = "event_histories", "logs", "state"
LATEST = "latest"
#: in a failed run's logs/: the harness's traceback of the error that ended it
RUNNER_ERROR = "runner-error.txt"
KINDS = ("chaos", "bench", "migration_fuzz", "soak")
STATUSES = ("running", "complete", "interrupted", "terminated", "failed")
#: the statuses of a run stopped from outside: Ctrl-C (SIGINT) or SIGTERM (``kill PID``, a CI job's timeout)
STOPPED = ("interrupted", "terminated")
#: schema 1's names for the files that were renamed (a reader of older run directories)
_V1 = {RUN_JSON: "journal.json", OPERATIONS: "history.jsonl", EVENT_HISTORIES: "histories"}
STAMP_FORMAT = "%Y%m%dT%H%M%SZ"


#: the signal stopping this process, once ``stop_on_sigterm``'s handler has run
_stopping: dict[str, int] = {}


def stop_on_sigterm() -> None:
    """SIGTERM (``kill PID``, a CI job's timeout) stops this process as Ctrl-C does, and the runs it stops end
    ``terminated`` rather than ``interrupted``. Call it before ``asyncio.run``. Main thread only.

    Inside ``asyncio.run`` the handler does what Ctrl-C does there: it cancels the main task, so every ``async
    with`` stops what it started and ``asyncio.run`` then raises ``KeyboardInterrupt``. (A ``KeyboardInterrupt``
    raised into the event loop instead leaves ``asyncio.run`` waiting forever on tasks it cancels, such as a
    Temporal worker's.) Elsewhere it raises ``KeyboardInterrupt``. A second SIGTERM while it cleans up is ignored
    (a CI runner follows with SIGKILL if it must). A background job of a non-interactive shell starts with
    SIGINT ignored, and ``asyncio.run`` then has no Ctrl-C handler to call: SIGINT gets Python's default back."""
    def stop(signum: int, frame: Any) -> None:
        if _stopping:
            return
        _stopping["signal"] = signum
        on_sigint = signal.getsignal(signal.SIGINT)
        if _loop_running() and callable(on_sigint) and on_sigint is not signal.default_int_handler:
            on_sigint(signal.SIGINT, frame)  # asyncio.run's Ctrl-C handler
            return
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, stop)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def stopped_status() -> str:
    """The status of a run this process stops: ``terminated`` after SIGTERM, else ``interrupted``."""
    return "terminated" if _stopping.get("signal") == signal.SIGTERM else "interrupted"


def stopped_exit_code() -> int:
    """The shell's exit status for this stop: 143 (128 + SIGTERM) after SIGTERM, else 130 (128 + SIGINT)."""
    return 128 + _stopping.get("signal", signal.SIGINT)


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def write_json(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` as JSON, atomically."""
    write_atomic(path, _json_bytes(data))


def _json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=1, default=str) + "\n").encode()


def read_json(path: Path, *, allow_nan: bool = False) -> Any:
    """A run directory's JSON file, parsed by ``parse_json`` (``RunDirError`` naming it if it is malformed)."""
    return parse_json(read_bytes(path), path, allow_nan=allow_nan)


def read_bytes(path: Path) -> bytes:
    """A run directory's file, whole: the one place its bytes are read, by ``harness.run_files``' rules (its
    directory as given; the file itself a regular file, not a symlink, at most ``JSON_LIMIT`` bytes; else
    RefusedPath)."""
    return run_files.read_bytes(path.parent, path.name, run_files.JSON_LIMIT)


# -- malformed input ---------------------------------------------------------------------------------------------

#: how deep a run directory's JSON may nest: far deeper than anything the harness writes, far shallower than the
#: interpreter's recursion limit (``json.loads`` recurses once per level)
MAX_JSON_DEPTH = 200


class RunDirError(ValueError):
    """A run directory's file is not what RUN_DIRECTORY.md says. ``str()`` is the one line a command prints:
    ``runs/x/run.json: field 'target': expected an object, got 5``. ``file`` (with ``:N`` for a line of a
    ``.jsonl``), ``field`` (a dotted path; None: the file as a whole), ``expected``, ``got``."""

    def __init__(self, file: Path | str, expected: str, got: str, field: str | None = None) -> None:
        self.file, self.expected, self.got, self.field = str(file), expected, got, field
        where = f"field {_shorten(field, 80)!r}: " if field else ""
        super().__init__(f"{self.file}: {where}expected {expected}, got {got}")


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def describe(value: Any) -> str:
    """A JSON value as an error message shows it: short, and with control characters escaped."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)  # NaN, Infinity, -Infinity
    if isinstance(value, str):
        return repr(_shorten(value, 40))
    return _shorten(repr(value), 40)


#: deletes all but brackets and quotes; then each kept byte's step (an opening bracket 2, a closing one 0, a quote
#: 1: the running sum of the steps minus the count is the depth) and whether it is a quote
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b'[]{}"')
_STEP = bytes.maketrans(b'[{]}"', b"\x02\x02\x00\x00\x01")
_QUOTE = bytes.maketrans(b'[{]}"', b"\x00\x00\x00\x00\x01")


def json_depth(data: bytes) -> int:
    """How deep ``data``'s JSON nests (or, when it has too few brackets to pass ``MAX_JSON_DEPTH``, a bound),
    found without recursing, at C speed and in memory the size of its brackets (a 1 GB line costs seconds)."""
    opens = data.count(b"[") + data.count(b"{")
    if opens <= MAX_JSON_DEPTH:
        return opens
    if b"\\" in data:  # escaped backslashes and quotes end no string (left to right, as JSON reads them)
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = data.translate(None, _NOT_BRACKETS)
    steps, quotes = kept.translate(_STEP), kept.translate(_QUOTE)
    in_string = map(operator.and_, itertools.accumulate(quotes), itertools.repeat(1))
    # a bracket inside a string nests nothing: its step becomes 1
    nesting = map(operator.sub, steps, map(operator.mul, in_string, map(operator.sub, steps, itertools.repeat(1))))
    return max(map(operator.sub, itertools.accumulate(nesting), itertools.count(1)), default=0)


def parse_json(data: bytes, file: Path | str, *, allow_nan: bool = False) -> Any:
    """``data`` as JSON, or ``RunDirError`` naming ``file``: strict UTF-8, nested at most ``MAX_JSON_DEPTH``
    deep (checked before parsing, so a deep file never reaches the recursion limit), and no NaN or Infinity
    anywhere unless ``allow_nan`` (benchmark statistics of an empty sample are NaN)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunDirError(file, "UTF-8 text", f"byte 0x{data[exc.start]:02x} at offset {exc.start}") from None
    depth = json_depth(data)
    if depth > MAX_JSON_DEPTH:
        raise RunDirError(file, f"JSON nested at most {MAX_JSON_DEPTH} deep", f"{depth} levels")
    try:
        return json.loads(text) if allow_nan else json.loads(text, parse_constant=_refuse, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise RunDirError(file, "JSON", f"a syntax error at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except _NonFinite:
        _name_non_finite(json.loads(text), file)  # the slow way, only now: which field
        raise RunDirError(file, "finite numbers", "NaN or Infinity") from None
    except ValueError as exc:  # an integer longer than int's digit limit
        raise RunDirError(file, "JSON", _shorten(str(exc), 80)) from None


class _NonFinite(Exception):
    pass


def _refuse(constant: str) -> float:
    raise _NonFinite(constant)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999
        raise _NonFinite(text)
    return value


def _name_non_finite(value: Any, file: Path | str) -> None:
    """``RunDirError`` naming the first field of ``value`` (parsed) that holds NaN or an infinity."""
    todo: list[tuple[Any, str]] = [(value, "")]
    while todo:
        v, field = todo.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise RunDirError(file, "a finite number", describe(v), field or None)
        if isinstance(v, dict):
            todo += [(x, f"{field}.{k}" if field else str(k)) for k, x in v.items()]
        elif isinstance(v, list):
            todo += [(x, f"{field}[{i}]") for i, x in enumerate(v)]


_KINDS: dict[str, Callable[[Any], bool]] = {
    "an object": lambda v: isinstance(v, dict), "a list": lambda v: isinstance(v, list),
    "a string": lambda v: isinstance(v, str), "a boolean": lambda v: isinstance(v, bool),
    "an integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "a number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "null": lambda v: v is None}


def expect(value: Any, kinds: str, file: Path | str, field: str | None = None) -> Any:
    """``value`` if it is of ``kinds`` (``"an object"``, ``"a string or null"``, ...: ``_KINDS`` joined by
    " or "), else ``RunDirError`` naming ``file`` and ``field``."""
    if not any(_KINDS[k](value) for k in kinds.split(" or ")):
        raise RunDirError(file, kinds, describe(value), field)
    return value


def expect_fields(doc: dict[str, Any], fields: dict[str, str], file: Path | str, prefix: str = "") -> None:
    """Each of ``fields`` that ``doc`` has is of its kinds (``expect``); absent ones are left to the reader."""
    for name, kinds in fields.items():
        if name in doc:
            expect(doc[name], kinds, file, prefix + name)


_STR = "a string or null"
#: run.json's fields that its readers use, as they use them (RUN_DIRECTORY.md)
RUN_FIELDS = {"schema": "an integer", "kind": "a string", "name": "a string or null", "status": "a string or null",
              "error": _STR, "stopped_during": _STR, "started": _STR, "ended": _STR, "wall_s": "a number or null",
              "seed": "an integer", "seeds": "a list", "reproduce": _STR, "machine": "an object or null",
              "scenario": "an object or null", "schedule": "a list or null", "backend": "an object or null",
              "target": "an object or null", "checkers": "a list or null", "phases": "an object or null",
              "model_server": "an object or null", "supervisor_restarts": "an object or null",
              "effects_service": "an object or null"}
TARGET_FIELDS = {"name": _STR, "python": _STR, "worker": "a list or a string or null", "ready_line": _STR,
                 "warm_line": _STR, "task_queue": _STR, "driver": _STR, "workflow": _STR, "model_activity": _STR,
                 "ledger": _STR, "workspace": _STR, "checkers": "a list or null", "cwd": _STR,
                 "env": "an object or null", "source": _STR, "replay_plugins": "a list or null",
                 "data_converter": _STR, "workflow_runner": _STR,
                 "effects": _STR, "effects_reason": _STR}
BACKEND_FIELDS = {"name": _STR, "not_applicable": "an object or null", "workers": _STR, "image": _STR,
                  "target_file": _STR}
SCENARIO_FIELDS = {"name": _STR, "events": "a list or null", "cluster": "an object or null",
                   "workload": "an object or null", "recovery_within_s": "a number or null"}


def check_run_record(record: Any, file: Path | str) -> dict[str, Any]:
    """``run.json`` as its readers need it (``RUN_FIELDS`` and the target's, backend's and scenario's fields they
    use), or ``RunDirError``."""
    expect(record, "an object", file)
    expect_fields(record, RUN_FIELDS, file)
    for name, fields in (("target", TARGET_FIELDS), ("backend", BACKEND_FIELDS), ("scenario", SCENARIO_FIELDS)):
        if isinstance(record.get(name), dict):
            expect_fields(record[name], fields, file, f"{name}.")
    for name in ("checkers",):
        for i, c in enumerate((record.get("target") or {}).get(name) or []):
            expect(c, "a string", file, f"target.{name}[{i}]")
    return record


def check_conversations(doc: Any, file: Path | str) -> dict[str, Any]:
    """``conversations.json`` as the checkers read it (RUN_DIRECTORY.md), or ``RunDirError``."""
    expect(doc, "an object", file)
    for i, c in enumerate(expect(doc.get("conversations"), "a list", file, "conversations")):
        where = f"conversations[{i}]"
        expect(c, "an object", file, where)
        expect(c.get("workflow_id"), "a string", file, f"{where}.workflow_id")
        expect_fields(c, {"final_status": _STR, "final_history": "a list or null", "ends": "a boolean"}, file,
                      f"{where}.")
        for j, m in enumerate(c.get("final_history") or []):
            expect(m, "an object", file, f"{where}.final_history[{j}]")
            expect(m.get("role"), "a string", file, f"{where}.final_history[{j}].role")
        for j, planned in enumerate(expect(c.get("planned"), "a list", file, f"{where}.planned")):
            expect(planned, "an object", file, f"{where}.planned[{j}]")
            for name in ("text", "expect", "kind"):
                expect(planned.get(name), "a string", file, f"{where}.planned[{j}].{name}")
            expect_fields(planned, {"path": _STR, "content": _STR, "match": "a string"}, file, f"{where}.planned[{j}].")
    return doc


def check_verdict_record(doc: Any, file: Path | str) -> dict[str, Any]:
    """``verdict.json`` as its readers need it, or ``RunDirError`` (a damaged check inside reads as unknown)."""
    expect(doc, "an object", file)
    expect_fields(doc, {"verdict": _STR, "checks": "a list or null", "summary": "an object or null",
                        "checkers_not_run": "a list or null"}, file)
    return doc


@dataclass
class RunDir:
    """One run's directory. ``create`` makes a new one; ``RunDir(path)`` opens an existing one (any schema)."""

    path: Path

    def __post_init__(self) -> None:
        self.path = Path(self.path)

    # -- making one ------------------------------------------------------------------------------------------

    @classmethod
    def create(cls, parent: Path) -> RunDir:
        """``parent/<UTC stamp>``, created exclusively (``-2``, ``-3``, ... on a clash). ``parent`` is a folder
        in the runs root (``<out>/<scenario>``): the root must be the invoking user's alone
        (``harness.private.own_folder``: made if missing), and ``parent`` is made in it without following a
        symlink (``own_subfolder``); else ``UnsafeFolder``, and nothing is written."""
        parent = Path(parent)
        folder = own_subfolder(own_folder(parent.parent), parent.name)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            stamp = datetime.now(timezone.utc).strftime(STAMP_FORMAT)
            for n in range(1, 1000):
                name = stamp if n == 1 else f"{stamp}-{n}"
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    continue
                return cls(folder / name)
        finally:
            os.close(fd)
        raise RuntimeError(f"could not create a run directory under {parent} (999 runs in one second?)")

    def begin(self, kind: str, name: str, **fields: Any) -> dict[str, Any]:
        """Write ``run.json`` with status ``running``; returns the dict (``update`` writes changes)."""
        assert kind in KINDS, kind
        self._run = {"schema": SCHEMA, "kind": kind, "name": name, "status": "running", "started": utc_now(),
                     "ended": None, "wall_s": None, **fields}
        self.save()
        return self._run

    @property
    def run(self) -> dict[str, Any]:
        """``run.json`` as last written by this object, or read from disk."""
        if not hasattr(self, "_run"):
            self._run = self.read_run()
        return self._run

    def update(self, **fields: Any) -> None:
        self.run.update(fields)
        self.save()

    def save(self) -> None:
        """Write ``run.json``, and ``run.sig`` beside it: this user's signature of those bytes
        (``harness.signing``), which is what later lets ``check`` and ``rerun`` use the target it names."""
        data = _json_bytes(self.run)
        write_atomic(self.path / RUN_JSON, data)
        signing.sign(self.path / RUN_JSON, data)

    def finish(self, status: str, wall_s: float, error: str | None = None, stopped_during: str | None = None) -> None:
        """The run ended: ``complete`` moves ``latest`` here; ``interrupted`` / ``terminated`` / ``failed`` never
        do. ``stopped_during``: what a run that did not complete was doing (a phase, a section, a seed)."""
        assert status in STATUSES[1:], status
        self.run.update(status=status, ended=utc_now(), wall_s=round(wall_s, 1))
        if error:
            self.run["error"] = error
        if stopped_during and status != "complete":
            self.run["stopped_during"] = stopped_during
        self.save()
        if status == "complete":
            self.link_latest()

    @contextlib.contextmanager
    def recording(self, kind: str, name: str, *, started: float | None = None, **fields: Any) -> Iterator[Recording]:
        """A run's life in this directory, the same for a chaos run, a benchmark run and a migration-fuzz run:
        ``run.json`` says ``running`` from the first moment (``begin(kind, name, **fields)``), ``complete`` when
        the body returns (``latest`` moves here), and whatever else ends it is recorded by ``end_with``, after
        the body's ``Recording.before_ending`` (e.g. close the operation log), with ``stopped_during`` what
        ``Recording.doing`` says. Ctrl-C, SIGTERM and cancellation propagate; an error propagates unchanged."""
        rec = Recording(time.monotonic() if started is None else started)
        try:
            self.begin(kind, name, **fields)
            yield rec
        except BaseException as exc:
            with contextlib.suppress(Exception):  # ending the log must not hide why the run ended
                rec.before_ending()
            replacement = self.end_with(exc, time.monotonic() - rec.started, rec.doing)
            if replacement is not None:
                raise replacement from exc
            raise
        self.finish("complete", time.monotonic() - rec.started)

    def end_with(self, exc: BaseException, wall_s: float, stopped_during: str | None = None) -> BaseException | None:
        """The one place a run that raised or was stopped is recorded: ``run.json`` ends ``interrupted`` (Ctrl-C,
        cancellation), ``terminated`` (SIGTERM, ``stop_on_sigterm``) or ``failed`` (anything else: ``error`` its
        one line, ``logs/runner-error.txt`` its traceback), with ``stopped_during``. A run already ended keeps
        its end. Recording never raises (a full disk must not hide the error). Returns what the caller raises
        instead of ``exc``: ``CancelledError`` for a client library's own error raised by a cancellation (so the
        stop reaches ``asyncio.run``), else None (raise ``exc``)."""
        status = ending_status(exc)
        with contextlib.suppress(Exception):
            if self.run.get("status") in (None, "running"):
                self.finish(status, wall_s, f"{type(exc).__name__}: {exc}" if status == "failed" else None,
                            stopped_during or "setup")
        if status == "failed":
            with contextlib.suppress(Exception):
                self.logs.mkdir(parents=True, exist_ok=True)
                (self.logs / RUNNER_ERROR).write_text("".join(traceback.format_exception(exc)))
            return None
        return asyncio.CancelledError() if not isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)) else None

    def link_latest(self) -> None:
        """``latest`` in this run's folder points here (``link_atomic``: never through a link planted there)."""
        link_atomic(self.path.parent, LATEST, self.path.name)

    # -- reading one -----------------------------------------------------------------------------------------

    @property
    def schema(self) -> int:
        """2 for this layout; 1 for a run written before it (``journal.json``)."""
        if (self.path / RUN_JSON).exists() or (self.path / OPERATIONS).exists():
            return SCHEMA
        return 1 if any((self.path / old).exists() for old in _V1.values()) else SCHEMA

    def file(self, name: str) -> Path:
        """A file or directory of the layout, under its schema-1 name in a schema-1 run."""
        return self.path / (_V1.get(name, name) if self.schema == 1 else name)

    def read_run(self) -> dict[str, Any]:
        """``run.json`` (or a schema-1 ``journal.json``, its fields mapped); ``{}`` if there is none."""
        path = self.file(RUN_JSON)
        if not os.path.lexists(path):
            return {}
        data = read_json(path)
        if self.schema == 1:
            expect(data, "an object", path)
            expect(data.get("scenario"), "an object or null", path, "scenario")
            data = {"schema": 1, **data}
            data.setdefault("kind", "bench" if data.get("kind") == "bench" else "chaos")
            if data["kind"] == "chaos":
                data.setdefault("name", (data.get("scenario") or {}).get("name", self.path.parent.name))
                # A schema-1 chaos run that got as far as its checks had finished; one without had not.
                data.setdefault("status", "complete" if data.get("checks") else "interrupted")
                if not isinstance(data.get("backend"), dict):
                    # Schema 1 named its durability backend, the checkpoint one by its old name "journal" (read
                    # here only, for older run directories); on it the checks of Temporal's event histories could
                    # not apply.
                    name = data.get("backend") or "temporal"
                    na = "reads Temporal event histories; the checkpoint backend has none"
                    data["backend"] = {"name": name, "not_applicable": {c: na for c in ("temporal_history", "replay")}
                                       if name in ("journal", "checkpoint") else {}}
        return check_run_record(data, path)

    def unsigned_reason(self) -> str | None:
        """None if this user's harness wrote ``run.json`` exactly as it is now (``harness.signing``: its
        ``run.sig`` verifies with this user's run key); else why not, a clause. Only then may what run.json
        records as given on the command line (a target file) be used again."""
        path = self.path / RUN_JSON
        try:
            data = read_bytes(path)
        except FileNotFoundError:
            return "it has no run.json"
        except (OSError, run_files.RefusedPath) as exc:
            return f"its run.json cannot be read ({str(exc)[:200]})"
        return signing.unsigned_reason(path, data)

    def read_verdict(self) -> dict[str, Any] | None:
        """``verdict.json`` (schema 1: the checks inside the journal); None if the run was never checked."""
        if self.schema == 1:
            run = self.read_run()
            if not run.get("checks"):
                return None
            return {k: run.get(k) for k in ("verdict", "checks", "checkers_not_run", "summary")}
        path = self.path / VERDICT_JSON
        return check_verdict_record(read_json(path), path) if os.path.lexists(path) else None

    @property
    def operations(self) -> Path:
        return self.file(OPERATIONS)

    @property
    def conversations(self) -> Path:
        return self.path / CONVERSATIONS

    @property
    def event_histories(self) -> Path:
        return self.file(EVENT_HISTORIES)

    @property
    def effects_service(self) -> Path:
        return self.path / EFFECTS_SERVICE

    @property
    def logs(self) -> Path:
        return self.path / LOGS

    @property
    def state(self) -> Path:
        return self.path / STATE

    def write_json(self, name: str, data: Any) -> None:
        write_json(self.path / name, data)


@dataclass
class Recording:
    """What a run under ``RunDir.recording`` says of itself as it goes: when it started (``time.monotonic()``),
    what it is doing (``stopped_during`` if it is stopped: a phase, a section, a seed) and what to do before
    its end is recorded (e.g. close its operation log)."""

    started: float
    doing: str = "setup"
    before_ending: Callable[[], None] = lambda: None


def ending_status(exc: BaseException) -> str:
    """How ``exc`` ends a run: ``interrupted`` (Ctrl-C, cancellation, or any error raised while this task is
    being cancelled: a cancelled client call may raise its own), ``terminated`` (the same after SIGTERM, once
    ``stop_on_sigterm`` is installed) or ``failed``."""
    task = _current_task()
    stopped = isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)) or (
        task is not None and task.cancelling() > 0)
    return stopped_status() if stopped else "failed"


def _current_task() -> asyncio.Task | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no event loop: not an async caller
        return None


def machine_info(temporal_binary: str | None = None) -> dict[str, Any]:
    """Cores, memory, CPU, platform, Python, temporalio and the Temporal CLI's version (``temporal_binary``;
    each "unknown" where it cannot be told)."""
    info: dict[str, Any] = {"cores": os.cpu_count(), "platform": platform.platform(),
                            "python": sys.version.split()[0]}
    try:
        info["memory_gb"] = round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        info["memory_gb"] = None
    cpu = platform.processor()
    if not cpu:
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
        except OSError:
            cpu = ""
    info["cpu"] = cpu or "unknown"
    try:
        import temporalio

        info["temporalio"] = temporalio.__version__
    except ImportError:
        info["temporalio"] = "not installed"
    info["temporal_cli"] = "unknown (no binary given)"
    if temporal_binary:
        try:
            out = subprocess.run([temporal_binary, "--version"], capture_output=True, text=True, timeout=20)
            info["temporal_cli"] = out.stdout.strip() or "unknown"
        except (OSError, subprocess.SubprocessError) as exc:  # recorded, not fatal
            info["temporal_cli"] = f"unknown ({exc})"
    return info


def command_line(prog: str, options: dict[str, Any], positional: list[str] | None = None) -> str:
    """A shell command from options (``None``/``False`` left out, ``True`` a bare flag, lists repeated)."""
    parts = [*shlex.split(prog), *(positional or [])]
    for flag, value in options.items():
        if value is None or value is False:
            continue
        if value is True:
            parts.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                parts += [flag, str(v)]
        else:
            parts += [flag, str(value)]
    return shlex.join(parts)
