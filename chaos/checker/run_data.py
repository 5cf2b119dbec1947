"""A saved run as the checkers see it: files in, nothing else.

``RunData`` reads a run directory (``harness.rundir``, any schema) lazily:
the operation log, the driver's final reads, the saved event histories, the
effect ledger, the external effects service's log and the target's declaration in ``run.json`` (its model
activity, where its ledger and workspaces are). It imports nothing of the
agent under test, so a check means the same thing for any agent, and a run
directory copied elsewhere is re-checked there.

A run directory is data: nothing it names is executed. The one check that runs
code, ``replay``, runs only what the caller decided from what the user controls
(``ReplayTarget``, made by ``testbed.engines.byo.target.replay_target``), never run.json's
``python``, ``cwd``, ``env`` or declarations.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Any

from harness import operations, run_files
from harness.event_history import RunRecord, load_saved_records
from harness.model_record import MODEL_RECORD, RECORD_LIMIT
from harness.recording import MODEL_CALL, read_ledger, workspace_name
from harness.rundir import EFFECTS_SERVICE, STATE, RunDir, RunDirError, check_conversations, expect, expect_fields, \
    parse_json, read_json

#: schema-1 runs recorded only the reference agent, whose declaration was implicit
_V1_TARGET = {"model_activity": "plan_next_action", "ledger": "sandbox/ledger.sqlite3",
              "workspace": "sandbox/{workflow_id}", "workflow": "agent.workflow:AgentWorkflow"}


def running_at(executions: list[dict[str, Any]], at: float, worker: str | None = None) -> list[dict[str, Any]]:
    """The ledger executions begun by ``at`` (wall seconds) and not finished by then (on ``worker``, if given)."""
    return [e for e in executions if (worker is None or e["worker"] == worker)
            and e["started_at"] <= at and (e["finished_at"] is None or e["finished_at"] > at)]


def run_again(executions: list[dict[str, Any]], e: dict[str, Any], after: float) -> list[dict[str, Any]]:
    """Executions of ``e``'s activity other than ``e`` that began after ``after``: a later attempt, or (a local
    activity, re-run by the next workflow task from attempt 1) the same activity id again."""
    return [x for x in executions if x is not e and x["workflow_id"] == e["workflow_id"]
            and x["run_id"] == e["run_id"] and x["activity_id"] == e["activity_id"] and x["started_at"] > after]


def client_sends(ops: list[operations.Op]) -> list[tuple[operations.Op, operations.Op | None]]:
    """Every ``send_message`` a client invoked, with its completion (None: it never completed)."""
    return [(i, d) for i, d in operations.pairs(ops) if i.process.startswith("client") and i.f == "send_message"]


def reply_matches(reply: Any, expect: str, how: str = "exact") -> bool:
    """Whether a reply is the expected answer: equal to ``expect``, or (``how`` "prefix") starting with it, or
    (``how`` "contains": a task's reply, which an agent may wrap, e.g. "Agent: ...") holding it."""
    if not isinstance(reply, str):
        return False
    return reply.startswith(expect) if how == "prefix" else expect in reply if how == "contains" else reply == expect


def answered(inv: operations.Op, done: operations.Op | None) -> bool:
    """Whether a send was acknowledged with its correct answer. A send that carries its ``expect`` (and ``match``)
    counts only if the reply matches: a refusal ("[Agent is busy processing another message]") or a wrong answer
    is a reply, not a recovery. One that carries no ``expect`` (a driver that plans none) counts when ok."""
    if done is None or done.type != operations.OK:
        return False
    value = inv.value if isinstance(inv.value, dict) else {}
    if not isinstance(value.get("expect"), str):
        return True
    reply = done.value.get("reply") if isinstance(done.value, dict) else None
    return reply_matches(reply, value["expect"], str(value.get("match") or "exact"))


#: the fields of ``effects_service.jsonl``'s lines the checkers use, as they use them (RUN_DIRECTORY.md)
EFFECTS_LOG_FIELDS = {"event": "a string", "time": "a number", "method": "a string", "path": "a string",
                      "key": "a string or null", "conversation": "a string or null", "peer_port": "an integer",
                      "status": "an integer or null", "note_id": "a string",
                      "kind": "a string", "identity": "a string", "text": "a string", "outcome": "a string"}


@dataclass(frozen=True)
class EffectsLog:
    """The external effects service's log (``testbed.effects_service``), line by line."""

    records: list[dict[str, Any]]
    torn_last_line: bool = False  # the writer was killed mid-line: that line is not read

    def of(self, event: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["event"] == event]


@dataclass
class ModelRecord:
    """The scripted model's record (``harness.model_record``): one entry per recorded request, in order."""

    entries: list[dict[str, Any]]
    torn_last_line: bool = False
    truncated: bool = False  # it reached its bound: later requests were not recorded

    def finals(self) -> dict[str, set[str]]:
        """Token -> the marks of the final answers the model gave it (one, since the model is a pure function)."""
        out: dict[str, set[str]] = {}
        for e in self.entries:
            if e.get("final") and e.get("token") and e.get("mark"):
                out.setdefault(e["token"], set()).add(e["mark"])
        return out


@dataclass(frozen=True)
class ReplayTarget:
    """What the replay checker runs the histories with: the reference agent's own code in this interpreter, or a
    target file the user controls (``testbed.engines.byo.target.replay_target`` decides; never from run.json alone)."""

    workflow: str | None  # MODULE:NAME (None: replayed by ``command`` alone)
    source: str  # where it comes from, for the details: the reference agent, or which target file and why trusted
    python: str = sys.executable
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    replay_plugins: tuple[str, ...] = ()
    data_converter: str | None = None
    workflow_runner: str | None = None
    #: compare each scheduled activity's / child workflow's type and input with the history's
    #: (``harness.strict_replay``); False only where the target declares ``strict_replay = false``
    strict_replay: bool = True
    #: JSON paths left out of every compared input (``$.messages[*].timestamp``): values the target's framework
    #: computes afresh on every replay (a target's ``strict_replay_ignore``); listed in the check's summary
    strict_replay_ignore: tuple[str, ...] = ()
    #: the target's own replayer (``replay_command``), run per workflow in ``cwd`` with ``env``: ``{history}`` a
    #: folder of that workflow's saved runs, ``{workflow_id}``; exit 0 replays, 1 does not, else unknown.
    #: Empty: the Python replayer (``harness.replayer``) on ``workflow``
    command: tuple[str, ...] = ()


@dataclass
class RunData:
    """A saved run, read lazily from its directory."""

    run_dir: Path
    #: what replay may run (None: nothing was decided; a string: why nothing may run, with the command to give)
    replay_target: ReplayTarget | str | None = None

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self.dir = RunDir(self.run_dir)

    @cached_property
    def ops(self) -> list[operations.Op]:
        return operations.load(self.dir.operations)

    @cached_property
    def conversations(self) -> dict[str, Any]:
        return check_conversations(read_json(self.dir.conversations), self.dir.conversations)

    @cached_property
    def run(self) -> dict[str, Any]:
        """``run.json``: what ran (``{}`` if missing)."""
        return self.dir.read_run()

    @property
    def target(self) -> dict[str, Any]:
        """What the run declared about the agent under test (data: read, never run)."""
        target = self.run.get("target") or {}
        return {**_V1_TARGET, **target} if self.dir.schema == 1 else target

    @property
    def model_activity(self) -> str | None:
        return self.target.get("model_activity")

    @cached_property
    def event_histories(self) -> dict[str, list[RunRecord]]:
        """workflow id -> its chain of parsed runs, in order (``{}`` if none were saved)."""
        return load_saved_records(self.dir.event_histories)

    @property
    def ledger_path(self) -> Path | None:
        """The effect ledger the target declared (relative to the state dir), or None if it declared none;
        RefusedPath if the declaration leaves the run directory."""
        ledger = self.target.get("ledger")
        return self.run_dir / run_files.below(STATE, ledger, what="the target's ledger") if ledger else None

    @cached_property
    def effects_log(self) -> EffectsLog | None:
        """``effects_service.jsonl`` (None: the run has none), read as a stream by ``harness.run_files``' rules
        (RefusedPath: a symlink, not a regular file, over ``EFFECTS_LOG_LIMIT``); RunDirError names a damaged line.
        A last line with no newline that does not parse was cut by a kill mid-write: left out, and said."""
        path = self.dir.effects_service
        if not os.path.lexists(path):
            return None
        records, torn = self._jsonl(EFFECTS_SERVICE, run_files.EFFECTS_LOG_LIMIT)
        for where, record in records:
            if "event" not in record:
                raise RunDirError(where, "a line of the effects service's log", "no 'event'")
            expect_fields(record, EFFECTS_LOG_FIELDS, where)
        records = [r for _, r in records]
        return EffectsLog(records, torn)

    def _jsonl(self, name: str, limit: int) -> tuple[list[tuple[str, dict[str, Any]]], bool]:
        """A JSON-lines file of the run, read as a stream by ``harness.run_files``' rules: ([(where, object)],
        whether its last line was torn: one with no newline that does not parse, cut by a kill mid-write, is left
        out). RunDirError names a damaged line elsewhere."""
        out, torn = [], False
        with run_files.open_binary(self.run_dir, name, limit) as f:
            lines = [line for line in f if line.strip()]
        for n, line in enumerate(lines, 1):
            where = f"{self.run_dir / name}:{n}"
            try:
                out.append((where, expect(parse_json(line, where), "an object", where)))
            except RunDirError:
                if n == len(lines) and not line.endswith(b"\n"):
                    torn = True
                    break
                raise
        return out, torn

    @cached_property
    def model_record(self) -> ModelRecord | None:
        """``model_record.jsonl`` (``harness.model_record``; None: the run has none), read as a stream by
        ``harness.run_files``' rules; a torn last line (a kill mid-write) is left out, and said."""
        if not os.path.lexists(self.run_dir / MODEL_RECORD):
            return None
        lines, torn = self._jsonl(MODEL_RECORD, RECORD_LIMIT + 2**20)
        entries, truncated = [], False
        for where, entry in lines:
            if entry.get("truncated"):
                truncated = True
                break
            expect_fields(entry, {"token": "a string or null", "tokens": "a list", "seen": "a list",
                                  "answer": "a list", "final": "a boolean", "mark": "a string or null"}, where)
            for key in ("seen", "answer"):
                for i, item in enumerate(entry[key]):
                    expect(item, "an object", where, f"{key}[{i}]")
                    expect(item.get("k"), "a string", where, f"{key}[{i}].k")
            entries.append(entry)
        return ModelRecord(entries, torn, truncated)

    def ledger_rows(self, table: str) -> list[dict[str, Any]]:
        """A ledger table's rows in insertion order; ``[]`` if the ledger or the table does not exist. The ledger is
        opened read-only by ``harness.run_files``' rules (RefusedPath: a symlink, not a regular file), through the
        recording API (``harness.recording.read_ledger``)."""
        if self.ledger_path is None:
            return []
        return read_ledger(self.ledger_path, table, root=self.run_dir)

    def is_model_call(self, execution: dict[str, Any]) -> bool:
        """Whether a ledger execution was a model call (schema-2 ledgers did not say: their model activity did)."""
        if "kind" in execution:
            return execution["kind"] == MODEL_CALL
        return execution["tool"] == self.model_activity

    def workspace(self, workflow_id: str) -> PurePosixPath | None:
        """Where the target keeps this workflow's files (its ``workspace`` template), relative to the run directory,
        or None if it declared none; RefusedPath if the template or the id would leave the run directory."""
        template = self.target.get("workspace")
        if not template:
            return None
        # Substituted, not str.format: a format spec in run data ("{workflow_id:>999999999}") would allocate at will.
        return run_files.below(STATE, template.replace("{workflow_id}", workspace_name(workflow_id)),
                               what="the target's workspace")

    def workspace_file(self, workflow_id: str, path: str) -> str:
        """The text of ``path`` (run data: relative to the workspace) in this workflow's workspace, ``""`` if there
        is none; RefusedPath if it would leave the run directory, is reached through a symlink, is not a regular
        file or is over ``WORKSPACE_FILE_LIMIT``. ValueError if the target declared no workspace."""
        workspace = self.workspace(workflow_id)
        if workspace is None:
            raise ValueError("the target declares no workspace")
        try:
            return run_files.read_text(self.run_dir, workspace / run_files.below(path, what="a planned file"),
                                       run_files.WORKSPACE_FILE_LIMIT, errors="replace")
        except FileNotFoundError:
            return ""

    def updates(self, workflow_id: str) -> list[Any] | None:
        """The updates the server accepted for this workflow, across its chain of runs (``UpdateRecord``s), or None
        if no event history was saved for it (then only the driver's own final read can tell)."""
        chain = self.event_histories.get(workflow_id)
        if not chain:
            return None
        return [u for run in chain for u in run.update_records]

    def server_status(self, workflow_id: str) -> str | None:
        """How the workflow's last run ended as the saved history says (``COMPLETED``, ``RUNNING``, ...), or None."""
        chain = self.event_histories.get(workflow_id)
        if not chain:
            return None
        return chain[-1].status.upper()
