"""The agent under test: ours by default, or yours, described in a TOML file.

    name = "my-agent"
    python = "../my-agent/.venv/bin/python"   # its own interpreter (default: the harness's); relative to this file
    # {python} {address} {namespace} {task_queue} {identity} {model_url} {state_dir} {ledger} are filled per worker;
    # {sticky_timeout}: seconds, the sticky schedule-to-start timeout the run's timeouts profile asks for;
    # {heartbeat_throttle}: seconds, the most the SDK may hold an activity's heartbeats back (the profile's)
    worker = ["{python}", "-m", "my_agent.worker", "--address", "{address}", "--task-queue", "{task_queue}",
              "--identity", "{identity}", "--model-url", "{model_url}"]
    ready_line = "READY"                 # optional: the worker prints this once it polls; unset: ready once the
                                         # server lists the worker's identity ({identity}; without it the SDKs'
                                         # <pid>@<hostname> of the started process) polling the task queue
    ready_timeout_s = 60                 # seconds a worker has to be ready (else: its log path and last lines)
    task_queue = "my-agent"
    # address = "127.0.0.1:7233"         # a worker that hard-codes its server (and task_queue): the fault proxy
                                         # listens there; such a target runs one scenario at a time
    driver = "my_agent.chaos_driver:make_driver"   # a driver of your own (harness/driver_api.py), or a [chat] table:
    workflow = "my_agent.workflows:AgentWorkflow"  # what the replay checker replays histories with (Python)
    # replay_command = ["node", "replay.js", "{history}"]  # or: your own replayer, run per workflow in cwd with env
                                         # ({history}: a folder of one workflow's runs, <nn>-<run id>.json in
                                         # Temporal's JSON; {workflow_id}); exit 0 replays, 1 does not (one line
                                         # on stderr), else unknown. One of workflow / replay_command is needed
    model_activity = "call_llm"          # the activity that calls the model (kills aimed "mid model call" wait for it)
    ledger = "ledger.sqlite3"            # optional, relative to the state dir; written through harness.recording
    workspace = "files/{workflow_id}"    # optional: each conversation's files ({workflow_id}: workspace_name(id))
    effects = "service"                  # optional: where its effects are seen: "service" (its tools call the effects
                                         # service at {effects_url} / $DAH_EFFECTS_URL), "ledger", or "none" with
    # effects_reason = "..."             # why it has no external effects (the effects check is then not applicable)
    checkers = ["lost", "temporal_history", "replay", "injection_evidence", "stats"]  # default: all
    cwd = "."                            # relative to this file; workers, the driver and the replayer run there
    # what the workers build their Worker (and Client) with, so replay runs histories the same way (each optional;
    # MODULE:NAME of an instance, or of a zero-argument callable returning one, importable in the target's python):
    replay_plugins = ["my_agent.temporal:make_plugin"]   # temporalio.plugin.SimplePlugin / worker plugins, in order
    data_converter = "my_agent.temporal:converter"       # e.g. with a payload codec, or pydantic_data_converter
    workflow_runner = "temporalio.worker:UnsandboxedWorkflowRunner"   # or a SandboxedWorkflowRunner with passthroughs
    # replay also compares each scheduled activity's input with the history's (harness/strict_replay.py):
    strict_replay = true                 # false: only Temporal's own command check (the summary says so)
    strict_replay_ignore = ["$.messages[*].timestamp"]   # JSON paths a framework computes afresh on each replay
    continue_as_new_events = 200         # optional: the agent continues as new past this many history events (a
                                         # kill aimed before a continue-as-new needs it; unknown: not injected)
    continue_as_new_suggested = true     # or: it continues as new when Temporal suggests it; the server the
                                         # harness starts then suggests it past the scenario's threshold
    [chat]                               # zero code: harness/chat_driver.py drives the agent (instead of driver)
    style = "update"                     # "update" | "signal" | "workflow_per_message"
    workflow = "ChatWorkflow"            # the workflow TYPE to start
    start_input = {}                     # JSON template of its argument (unset: none; per message: holds {text})
    update = "send"                      # style update: each message is this Update...
    # signal = "ask"                     # style signal: ...or this Signal (its reply read with the query)
    message_arg = "{text}"               # JSON template: {text} {message_id} {workflow_id} {n}
    reply_path = ""                      # the reply in the update's / workflow's result ("a.b"; "": the result)
    # query = "messages"                 # the conversation: a list of {role, content} (at conversation_path),
    # conversation_path = ""             #   or of turns with turn_keys = ["question", "answer"]; unset: the
    # turn_keys = ["question", "answer"] #   updates the event history records
    end = "end"                          # the signal that ends a chat (unset: chats stay RUNNING)
    # ends = false                       # a chat that never ends: RUNNING (or continued as new) at the end is right
    # effect = "note"                    # side-effect messages: "note" (save the note '<token>') or "append"
                                         # (append <token> to <file>, read through `workspace`); unset: every
                                         # message is a task, planned by the scripted model over your own tools
    [env]                                # extra environment for workers, the driver and the replayer
    MY_FLAG = "1"                        # values are strings (run.json redacts *KEY*, *TOKEN*, *SECRET*... values)

Types are strict (``TargetFile``): a string field takes a string, never a number; a list field takes a list,
never one string; an unknown field is refused. Each mistake is one line naming the file, the field, the value
and what is allowed; ``python -m chaos`` exits 2 on it.

The target's own Python runs its workers, its driver and the replay of its
histories (``harness/driver_host.py``, ``harness/replayer.py``), so the
harness's own pins never meet the agent's: that interpreter needs only
``temporalio`` and the agent's own packages. The harness puts just its
``harness`` package (standard library only) on that interpreter's path, which
is where the recording API (``harness.recording``), the operation-log
constants (``harness.operations``) and the fault seams (``harness.faults``)
come from. A worker that records through ``harness.recording`` gets
``$DAH_LEDGER`` (the ledger file the target declared) and the in-agent faults
the scenario asks for (crash points, logic bugs) in its environment.

The driver API is ``harness/driver_api.py`` (versioned; ``python -m chaos`` checks a target's own driver against
it in the target's Python when the target loads, and refuses a mismatch in one line). The driver factory is
called as ``make_driver(client=, history=, task_queue=, workload=, seed=)`` (``workload``: the
``harness.driver_api.Workload`` dataclass, with the scenario's settings) and returns an object with ``workflow_ids`` (list),
``async run()`` (drive the load, recording each operation in ``history`` as
invoke then ok/fail/info), optionally ``stop()`` (stop sending new messages: the
runner calls it when the faults are healed, so the load spans the fault phase),
``async finish()`` (end the conversations and read their final state) and
``to_json()``, whose ``conversations`` list the lost checker reads:
``workflow_id``, ``started``, ``planned`` (``text``, ``expect``, ``kind``, and
for appends ``path`` and ``content``), ``final_history`` (chat messages:
``role``, ``content``) and ``final_status``. ``testbed.engines.temporal.driver.Driver`` is the
reference.

The replay checker builds its ``Replayer`` from ``replay_plugins``,
``data_converter`` and ``workflow_runner`` (none declared: the SDK's defaults,
the sandbox and the default converter), as the workers build their ``Worker``:
declare whatever the worker passes (a converter given to ``Client.connect``
counts; interceptors given to the worker go in as a
``SimplePlugin(name, interceptors=[...])``), or correct histories fail to replay.
A declared object that does not load makes the check unknown, naming it.

A saved run's replay (``replay_target``) runs only a target file the user controls: the one given on the command
line, or the one run.json names if the invoking user owns it and no one else can write it
(``harness.private.control_problem``); a path written in run.json proves nothing. A reference agent's run
replays with the harness's own code. What run.json records of a target is never run.

Checkers a target leaves out are recorded in the run as not run; they never
count as passed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError

from agent.strict import NonEmpty, Spec, StrictModel, looks_secret, one_line
from agent.worker import LEDGER, WORKSPACES
from harness.rundir import CHECKS
from testbed.worker_process import PLACEHOLDER_DEFAULTS, PLACEHOLDERS, REFERENCE_WORKER, fill

#: the driver of a target with a [chat] table (runs in the target's Python)
CHAT_DRIVER = "harness.chat_driver:make_driver"

@dataclass(frozen=True)
class Target:
    name: str = "reference-agent"
    worker: tuple[str, ...] = REFERENCE_WORKER
    ready_line: str | None = "READY"  # None: ready once the server lists the worker polling its task queue
    warm_line: str | None = "WARM"  # after READY: the model client is loaded (load starts only then)
    ready_timeout_s: float = 60.0  # how long a worker has to print ready_line (or be seen polling)
    task_queue: str | None = None  # None: one per scenario
    driver: str = "testbed.engines.temporal.driver:Driver"
    workflow: str | None = "agent.workflow:AgentWorkflow"  # None: a target replayed by its replay_command
    model_activity: str = "plan_next_action"
    ledger: str | None = LEDGER
    workspace: str | None = WORKSPACES  # where a conversation's files are, relative to the state dir
    checkers: tuple[str, ...] = tuple(CHECKS)
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    python: str | None = None  # the target's interpreter (None: the harness's own)
    source: str | None = None  # the file it was read from (None: the built-in reference target)
    # What its workers build their Worker with, as MODULE:NAME (the replay checker builds its Replayer the same way).
    replay_plugins: tuple[str, ...] = ()
    data_converter: str | None = None
    workflow_runner: str | None = None
    strict_replay: bool = True  # replay compares scheduled inputs too (harness.strict_replay)
    strict_replay_ignore: tuple[str, ...] = ()  # JSON paths left out of that comparison
    #: where its effects are seen: "service" (testbed.effects_service), "ledger", "none" (None: not declared)
    effects: str | None = None
    effects_reason: str | None = None  # with effects "none": why
    #: the history length past which the agent's conversations continue as new (0: not declared); what a kill aimed
    #: just before a continue-as-new (``kill_worker(at="continue_as_new", phase="before")``) waits for
    continue_as_new_events: int = 0
    #: the agent continues as new when Temporal suggests it (``is_continue_as_new_suggested()``): the embedded server
    #: is told to suggest it past a scenario's threshold (``limit.historyCount.suggestContinueAsNew``)
    continue_as_new_suggested: bool = False
    chat: dict[str, Any] | None = None  # the [chat] table (harness.chat_driver drives it), as validated
    address: str | None = None  # HOST:PORT the workers hard-code: the fault proxy listens there (one run at a time)
    #: the target's own replayer, run per workflow ({history}, {workflow_id}); () : the Python replayer on ``workflow``
    replay_command: tuple[str, ...] = ()

    @property
    def is_reference(self) -> bool:
        return self.source is None

    @property
    def interpreter(self) -> str:
        return self.python or sys.executable

    def worker_command(self, **values: str) -> list[str]:
        return fill(self.worker, {"python": self.interpreter, **PLACEHOLDER_DEFAULTS, **values})

    def as_dict(self) -> dict[str, Any]:
        """What ``run.json`` records of the target (the checkers read model_activity, ledger, workspace, workflow)."""
        return {"name": self.name, "python": self.python, "worker": list(self.worker), "ready_line": self.ready_line,
                "warm_line": self.warm_line, "task_queue": self.task_queue, "driver": self.driver,
                "workflow": self.workflow, "model_activity": self.model_activity, "ledger": self.ledger,
                "workspace": self.workspace, "checkers": list(self.checkers), "cwd": self.cwd, "env": self.recorded_env(),
                "source": self.source, **self.replay_declarations(), **self.effects_declaration(),
                **self.zero_code()}

    def effects_declaration(self) -> dict[str, Any]:
        """Where its effects are seen, as declared (only if declared: run.json stays as it was without it)."""
        return {k: v for k, v in (("effects", self.effects), ("effects_reason", self.effects_reason)) if v}

    def zero_code(self) -> dict[str, Any]:
        """The ``[chat]`` table and fixed address, as declared (only what is: run.json stays as it was without)."""
        declared: dict[str, Any] = {"chat": self.chat, "address": self.address}
        if self.address:
            declared["one_at_a_time"] = (f"its workers hard-code the Temporal address {self.address}: the fault "
                                         "proxy listens there, so this target runs one scenario at a time")
        return {k: v for k, v in declared.items() if v}

    def recorded_env(self) -> dict[str, str]:
        """``env`` as run.json keeps it: a secret-looking variable's value (``*_API_KEY``, ``*TOKEN*``...) redacted."""
        return {k: "(redacted)" if looks_secret(k) else v for k, v in self.env.items()}

    def replay_declarations(self) -> dict[str, Any]:
        """What the replayer is built with, as declared (only what is: run.json stays as it was without them)."""
        declared = {"replay_command": list(self.replay_command),
                    "replay_plugins": list(self.replay_plugins), "data_converter": self.data_converter,
                    "workflow_runner": self.workflow_runner,
                    "strict_replay": None if self.strict_replay else False,
                    "strict_replay_ignore": list(self.strict_replay_ignore)}
        return {k: v for k, v in declared.items() if v or v is False}


REFERENCE = Target()


#: an environment variable's name, as a shell would accept it
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_names(env: dict[str, str]) -> dict[str, str]:
    bad = [k for k in env if not _ENV_NAME.fullmatch(k)]
    if bad:
        raise ValueError(f"must name each variable with letters, digits and _ (not a digit first); {bad[0]!r} is not such a name")
    return env


def _worker_placeholders(worker: list[str], address: str | None) -> str | None:
    """What is wrong with a worker command (None: nothing): without a fixed ``address``, it must take the address
    and task queue from the harness."""
    if address is None and (not any("{address}" in p for p in worker) or not any("{task_queue}" in p for p in worker)):
        return ("must use {address} and {task_queue} so workers reach Temporal through the fault proxy on the run's "
                "task queue (or declare the fixed address = \"HOST:PORT\" and task_queue its worker hard-codes); "
                "placeholders: " + ", ".join("{" + p + "}" for p in PLACEHOLDERS))
    return None


def _local_address(value: str) -> str:
    host, _, port = value.rpartition(":")
    if host not in ("127.0.0.1", "localhost") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("must be 127.0.0.1:PORT or localhost:PORT (where the worker connects: the fault proxy "
                         "listens there)")
    return value


class ChatTable(StrictModel):
    """The ``[chat]`` table: how ``harness.chat_driver`` drives the agent, with no Python from its author."""

    style: Literal["update", "signal", "workflow_per_message"] = Field(
        description="one of update, signal, workflow_per_message")
    workflow: NonEmpty = Field(description="a non-empty string (the workflow TYPE name to start)")
    start_input: Any = Field(None, description="a JSON template (a string, list or table; {workflow_id}, and "
                                               "{text} {message_id} with workflow_per_message)")
    update: NonEmpty | None = Field(None, description="a non-empty string (the update each message is sent as)")
    signal: NonEmpty | None = Field(None, description="a non-empty string (the signal each message is sent as)")
    message_arg: str | dict[str, Any] = Field(
        "{text}", description="a JSON template, a string or a table ({text}, {message_id}, {workflow_id}, {n}, "
                              "{history_length}: the length of the query's list just before the message)")
    reply_path: str = Field("", description="a dotted path in the result (\"\": the result itself is the reply; "
                                            "a list of strings is read as its lines)")
    query: NonEmpty | None = Field(None, description="a non-empty string (the query returning the conversation)")
    conversation_path: str = Field("", description="a dotted path in the query's result (\"\": the result itself)")
    turn_keys: Annotated[list[NonEmpty], Field(min_length=2, max_length=2)] | None = Field(
        None, description="two strings: the keys of the user's text and the reply in each turn of the query's list")
    end: NonEmpty | None = Field(None, description="a non-empty string (the signal that ends the chat)")
    ends: bool | None = Field(None, strict=True, description="true or false (false: the chat never ends, and RUNNING "
                                                             "at the end is right; default: whether end is set)")
    effect: Literal["note", "append"] | None = Field(
        None, description="note (save the note '<token>': its tools call the effects service) or append "
                          "(append <token> to <file>: read back through the target's workspace); unset: every "
                          "message is a task the scripted model plans over the agent's own tools")


def _chat_problem(chat: ChatTable) -> str | None:
    """What a [chat] table lacks for its style (None: nothing)."""
    need = {"update": ["update"], "signal": ["signal", "query"], "workflow_per_message": ["start_input"]}[chat.style]
    missing = [n for n in need if getattr(chat, n) is None]
    if missing:
        return f"style {chat.style!r} needs {' and '.join(missing)}"
    template = chat.start_input if chat.style == "workflow_per_message" else chat.message_arg
    if "{text}" not in json.dumps(template):
        where = "start_input" if chat.style == "workflow_per_message" else "message_arg"
        return f"{where} must hold {{text}} (where the message goes), got {json.dumps(template)[:200]}"
    if chat.style == "workflow_per_message" and (chat.update or chat.signal or chat.end):
        return "style 'workflow_per_message' takes no update, signal or end (each message is a workflow of its own)"
    if "{history_length}" in json.dumps(chat.message_arg) and chat.query is None:
        return "message_arg uses {history_length}, the length of the query's list: declare query = \"...\""
    if chat.ends and chat.end is None and chat.style != "workflow_per_message":
        return "ends = true needs end = \"...\" (the signal that ends a chat)"
    return None


def _one_line(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise ValueError("must be one line (workers are watched line by line)")
    return value


#: what a worker prints: text within one line of its output
OutputLine = Annotated[NonEmpty, AfterValidator(_one_line)]


class TargetFile(StrictModel):
    """A target file as written: each field's type, default and (``description``) what it allows."""

    name: NonEmpty = Field(description="a non-empty string")
    python: NonEmpty | None = Field(None, description="the path of the target's interpreter (a string)")
    worker: Annotated[list[NonEmpty], Field(min_length=1)] = Field(
        description="a non-empty list of strings (the command, with {placeholders})")
    ready_line: OutputLine | None = Field(None, description="a non-empty string (what a worker prints once it "
                                                            "polls; unset: the server lists it polling)")
    warm_line: OutputLine | None = Field(None, description="a non-empty string (printed after ready_line)")
    ready_timeout_s: float = Field(60.0, gt=0, allow_inf_nan=False, description="a finite number of seconds > 0")
    task_queue: NonEmpty | None = Field(None, description="a non-empty string")
    driver: Spec | None = Field(None, description="MODULE:NAME (a string; unset: the [chat] table drives it)")
    workflow: Spec | None = Field(None, description="MODULE:NAME (a string; optional with replay_command)")
    replay_command: Annotated[list[NonEmpty], Field(min_length=1)] | None = Field(
        None, description='a non-empty list of strings (your replayer\'s command, with {history} and optionally '
                          '{workflow_id}), e.g. ["node", "replay.js", "{history}"]')
    model_activity: NonEmpty = Field("plan_next_action", description="a non-empty string (an activity's name)")
    ledger: NonEmpty | None = Field(None, description="a non-empty string (a path relative to the state dir)")
    workspace: NonEmpty | None = Field(None, description="a non-empty string (a path relative to the state dir)")
    checkers: list[Literal[tuple(CHECKS)]] = Field(  # type: ignore[valid-type]
        list(CHECKS), min_length=1,
        description=f"a non-empty list of checker names, each one of {', '.join(CHECKS)}")
    cwd: NonEmpty = Field(".", description="a directory, relative to this file (a string)")
    env: Annotated[dict[str, str], AfterValidator(_env_names)] = Field(
        {}, description='a table of NAME = "value" lines ([env] section), each value a string')
    replay_plugins: list[Spec] = Field(
        [], description="a list of MODULE:NAME strings (each a Temporal plugin, or a zero-argument callable "
                        "returning one), e.g. [\"my_agent.temporal:make_plugin\"]")
    data_converter: Spec | None = Field(None, description="MODULE:NAME (an instance, or a zero-argument callable "
                                                           "returning one)")
    effects: Literal["service", "ledger", "none"] | None = Field(
        None, description='"service", "ledger" or "none" (where its effects are seen)')
    effects_reason: NonEmpty | None = Field(None, description='a non-empty string (why effects = "none")')
    workflow_runner: Spec | None = Field(None, description="MODULE:NAME (an instance, or a zero-argument callable "
                                                            "returning one)")
    strict_replay: bool = Field(True, strict=True, description="true or false (replay also compares each scheduled "
                                                              "activity's input with the history's)")
    strict_replay_ignore: list[NonEmpty] = Field(
        [], description='a list of JSON paths ("$.a.b", "$.items[*].c") left out of the strict comparison')
    continue_as_new_events: int = Field(0, ge=0, description="an integer >= 0 (the history length past which the "
                                                             "agent continues as new; 0: not declared)")
    continue_as_new_suggested: bool = Field(False, description="true or false (the agent continues as new when "
                                                               "Temporal suggests it)")
    address: Annotated[str, AfterValidator(_local_address)] | None = Field(
        None, description="127.0.0.1:PORT (the address its workers hard-code)")
    chat: dict[str, Any] | None = Field(None, description="a table ([chat] section; see testbed/engines/byo/target.py)")


#: the fields a target file may have
FIELDS = tuple(TargetFile.model_fields)


def load_target(path: Path) -> Target:
    """Read a target file; every mistake is one line naming the file, the field, the value and what is allowed."""
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"target file {path} does not exist") from None
    except OSError as exc:
        raise ValueError(f"target file {path}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ValueError(f"target file {path}: not a text file (UTF-8)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"target file {path}: not valid TOML ({exc})") from None
    try:
        t = TargetFile.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(one_line(exc, f"target file {path}", TargetFile)) from None
    if t.effects == "none" and not t.effects_reason:
        raise ValueError(f"target file {path}: 'effects' = \"none\" needs 'effects_reason': why the agent has no "
                         "external effects (it is shown beside the effects check), e.g. \"it only answers questions\"")
    chat = None
    if t.chat is not None:
        try:
            table = ChatTable.model_validate(t.chat)
        except ValidationError as exc:
            raise ValueError(one_line(exc, f"target file {path}: [chat]", ChatTable)) from None
        problem = _chat_problem(table)
        if problem:
            raise ValueError(f"target file {path}: [chat] {problem}")
        if table.effect is not None and t.effects == "none":
            raise ValueError(f"target file {path}: [chat] effect = {table.effect!r} sends side-effect messages, but "
                             "effects = \"none\" says the agent has none: remove one of them")
        chat = table.model_dump()
    if (t.driver is None) == (chat is None):
        raise ValueError(f"target file {path}: give either driver = \"MODULE:NAME\" (your own driver) or a [chat] "
                         "table (the built-in one), " + ("not both" if chat else "not neither"))
    if t.workflow is None and t.replay_command is None:
        raise ValueError(f"target file {path}: give workflow = \"MODULE:NAME\" (the Python workflow class replay "
                         "runs histories with) or replay_command = [...] (your own replayer, with {history}), not neither")
    if t.replay_command is not None and not any("{history}" in part for part in t.replay_command):
        raise ValueError(f"target file {path}: 'replay_command' {t.replay_command!r} must hold {{history}} (where a "
                         "workflow's saved histories go), e.g. [\"node\", \"replay.js\", \"{history}\"]")
    problem = _worker_placeholders(t.worker, t.address)
    if problem:
        raise ValueError(f"target file {path}: 'worker' {problem}")
    if t.address and not t.task_queue:
        raise ValueError(f"target file {path}: 'address' {t.address!r} needs task_queue = \"...\" too (the task "
                         "queue its worker hard-codes)")
    base = path.parent.resolve()
    cwd = str((base / t.cwd).resolve())
    if not Path(cwd).is_dir():
        raise ValueError(f"target file {path}: 'cwd' {t.cwd!r} is not a directory ({cwd})")
    python = t.python
    if python is not None:
        # A path is relative to this file (kept as given, not resolved: a venv's python is a symlink that
        # must stay one); a bare name is looked up on PATH.
        python = str(base / python) if "/" in python else shutil.which(python)
        if python is None or not os.access(python, os.X_OK):
            raise ValueError(f"target file {path}: 'python' {t.python!r} is not an executable interpreter; "
                             "give the target's own, e.g. \"../my-agent/.venv/bin/python\"")
    return Target(name=t.name, python=python, worker=tuple(t.worker), ready_line=t.ready_line,
                  warm_line=t.warm_line, ready_timeout_s=t.ready_timeout_s, task_queue=t.task_queue,
                  driver=t.driver or CHAT_DRIVER, workflow=t.workflow, model_activity=t.model_activity, ledger=t.ledger,
                  workspace=t.workspace, checkers=tuple(t.checkers), cwd=cwd, env=dict(t.env), source=os.path.abspath(path),
                  replay_plugins=tuple(t.replay_plugins), data_converter=t.data_converter,
                  workflow_runner=t.workflow_runner, effects=t.effects, effects_reason=t.effects_reason,
                  continue_as_new_events=t.continue_as_new_events,
                  continue_as_new_suggested=t.continue_as_new_suggested, strict_replay=t.strict_replay,
                  strict_replay_ignore=tuple(t.strict_replay_ignore),
                  chat=chat, address=t.address, replay_command=tuple(t.replay_command or ()))


def check_driver(target: Target) -> None:
    """Check a target's own driver against the driver API (``harness.driver_api``) in the target's Python, before
    any run: ValueError, one line saying what changed, if it does not fit. The ``[chat]`` driver is the harness's."""
    if target.chat is not None or target.is_reference:
        return
    import subprocess

    try:
        out = subprocess.run([target.interpreter, "-m", "harness.driver_api", "--check", target.driver],
                             capture_output=True, text=True, timeout=120, cwd=target.cwd,
                             env={**os.environ, **target_environment(target)})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"target file {target.source}: cannot check its driver {target.driver} ({exc})") from None
    if out.returncode != 0:
        line = (out.stdout.strip().splitlines() or out.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ValueError(f"target file {target.source}: {line[:500]}")


def target_environment(target: Target) -> dict[str, str]:
    """The environment of every process of the target's: its own variables, and ``harness`` on its path."""
    from harness import target_pythonpath

    return {**target.env, "PYTHONPATH": target_pythonpath(target.env.get("PYTHONPATH"))}


def load_recorded_target(path: str | Path, run_dir: Path,
                         what: str = "the target file the run directory names") -> Target:
    """The target file ``run_dir``'s run.json names, loaded only if this user's harness wrote that run.json
    (``RunDir.unsigned_reason``: its signature verifies with this user's run key, so the path was given on this
    user's command line), the path is absolute and outside the run directory, and the invoking user still
    controls the file (``harness.private.control_problem``). Ownership alone proves nothing: copying or extracting
    a received directory makes it yours. ValueError saying why not, or what is wrong with the file."""
    from harness.private import control_problem
    from harness.rundir import RunDir

    shown = str(path)[:300]
    unsigned = RunDir(run_dir).unsigned_reason()
    if unsigned:
        raise ValueError(f"{what}, {shown}, is not used: {unsigned}")
    if not os.path.isabs(path):
        raise ValueError(f"{what}, {shown}, is not an absolute path: it is not used")
    real, inside = os.path.realpath(path), os.path.realpath(run_dir)
    if os.path.commonpath([real, inside]) == inside:
        raise ValueError(f"{what}, {shown}, is inside the run directory: it is not used")
    problem = control_problem(Path(path))
    if problem:
        raise ValueError(f"{what}, {shown}, {problem}: it is not used")
    return load_target(Path(real))
