"""The agent under test: ours by default, or yours, described in a TOML file.

    name = "my-agent"
    python = "../my-agent/.venv/bin/python"   # its own interpreter (default: the harness's); relative to this file
    # {python} {address} {namespace} {task_queue} {identity} {model_url} {state_dir} {ledger} are filled per worker;
    # {sticky_timeout}: seconds, the sticky schedule-to-start timeout the run's timeouts profile asks for
    worker = ["{python}", "-m", "my_agent.worker", "--address", "{address}", "--task-queue", "{task_queue}",
              "--identity", "{identity}", "--model-url", "{model_url}"]
    ready_line = "READY"                 # the worker prints this once it polls
    task_queue = "my-agent"
    driver = "my_agent.chaos_driver:make_driver"   # see Driver below; runs in the target's python
    workflow = "my_agent.workflows:AgentWorkflow"  # what the replay checker replays histories with
    model_activity = "call_llm"          # the activity that calls the model (kills aimed "mid model call" wait for it)
    ledger = "ledger.sqlite3"            # optional, relative to the state dir; written through harness.recording
    workspace = "files/{workflow_id}"    # optional: each conversation's files ({workflow_id}: workspace_name(id))
    checkers = ["lost", "temporal_history", "replay", "injection_evidence", "stats"]  # default: all
    cwd = "."                            # relative to this file; workers, the driver and the replayer run there
    # what the workers build their Worker (and Client) with, so replay runs histories the same way (each optional;
    # MODULE:NAME of an instance, or of a zero-argument callable returning one, importable in the target's python):
    replay_plugins = ["my_agent.temporal:make_plugin"]   # temporalio.plugin.SimplePlugin / worker plugins, in order
    data_converter = "my_agent.temporal:converter"       # e.g. with a payload codec, or pydantic_data_converter
    workflow_runner = "temporalio.worker:UnsandboxedWorkflowRunner"   # or a SandboxedWorkflowRunner with passthroughs
    [env]                                # extra environment for workers, the driver and the replayer
    MY_FLAG = "1"

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

The driver factory is called as ``make_driver(client=, history=, task_queue=,
workload=, seed=)`` and returns an object with ``workflow_ids`` (list),
``async run()`` (drive the load, recording each operation in ``history`` as
invoke then ok/fail/info), optionally ``stop()`` (stop sending new messages: the
runner calls it when the faults are healed, so the load spans the fault phase),
``async finish()`` (end the conversations and read their final state) and
``to_json()``, whose ``conversations`` list the lost checker reads:
``workflow_id``, ``started``, ``planned`` (``text``, ``expect``, ``kind``, and
for appends ``path`` and ``content``), ``final_history`` (chat messages:
``role``, ``content``) and ``final_status``. ``chaos.client.Driver`` is the
reference.

The replay checker builds its ``Replayer`` from ``replay_plugins``,
``data_converter`` and ``workflow_runner`` (none declared: the SDK's defaults,
the sandbox and the default converter), as the workers build their ``Worker``:
declare whatever the worker passes (a converter given to ``Client.connect``
counts; interceptors given to the worker go in as a
``SimplePlugin(name, interceptors=[...])``), or correct histories fail to replay.
A declared object that does not load makes the check unknown, naming it.

Checkers a target leaves out are recorded in the run as not run; they never
count as passed.
"""

from __future__ import annotations

import os
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.worker import LEDGER, WORKSPACES
from chaos.checker import ALL_CHECKERS
from testbed.worker_process import PLACEHOLDER_DEFAULTS, PLACEHOLDERS, REFERENCE_WORKER, fill

FIELDS = ("name", "python", "worker", "ready_line", "warm_line", "task_queue", "driver", "workflow", "model_activity",
          "ledger", "workspace", "checkers", "cwd", "env", "replay_plugins", "data_converter", "workflow_runner")


@dataclass(frozen=True)
class Target:
    name: str = "reference-agent"
    worker: tuple[str, ...] = REFERENCE_WORKER
    ready_line: str = "READY"
    warm_line: str | None = "WARM"  # after READY: the model client is loaded (load starts only then)
    task_queue: str | None = None  # None: one per scenario
    driver: str = "chaos.client:Driver"
    workflow: str = "agent.workflow:AgentWorkflow"
    model_activity: str = "plan_next_action"
    ledger: str | None = LEDGER
    workspace: str | None = WORKSPACES  # where a conversation's files are, relative to the state dir
    checkers: tuple[str, ...] = tuple(ALL_CHECKERS)
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    python: str | None = None  # the target's interpreter (None: the harness's own)
    source: str | None = None  # the file it was read from (None: the built-in reference target)
    # What its workers build their Worker with, as MODULE:NAME (the replay checker builds its Replayer the same way).
    replay_plugins: tuple[str, ...] = ()
    data_converter: str | None = None
    workflow_runner: str | None = None

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
                "workspace": self.workspace, "checkers": list(self.checkers), "cwd": self.cwd, "env": dict(self.env),
                "source": self.source, **self.replay_declarations()}

    def replay_declarations(self) -> dict[str, Any]:
        """What the replayer is built with, as declared (only what is: run.json stays as it was without them)."""
        declared = {"replay_plugins": list(self.replay_plugins), "data_converter": self.data_converter,
                    "workflow_runner": self.workflow_runner}
        return {k: v for k, v in declared.items() if v}


REFERENCE = Target()


def _string(path: Path, raw: dict[str, Any], name: str, default: Any = None, *, required: bool = False) -> Any:
    if name not in raw:
        if required:
            raise ValueError(f"target file {path}: missing required field {name!r}")
        return default
    value = raw[name]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"target file {path}: {name!r} must be a non-empty string, got {value!r}")
    return value


def load_target(path: Path) -> Target:
    """Read a target file; every mistake names the field, what is allowed and the file."""
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"target file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"target file {path}: not valid TOML ({exc})") from None
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise ValueError(f"target file {path}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(FIELDS)}")
    name = _string(path, raw, "name", required=True)
    if "worker" not in raw:
        raise ValueError(f"target file {path}: missing required field 'worker'")
    worker = raw["worker"]
    if not isinstance(worker, list) or not worker or not all(isinstance(p, str) for p in worker):
        raise ValueError(f"target file {path}: 'worker' must be a non-empty list of strings (the command), "
                         f"got {worker!r}")
    if not any("{address}" in p for p in worker) or not any("{task_queue}" in p for p in worker):
        raise ValueError(f"target file {path}: 'worker' must use {{address}} and {{task_queue}} so workers reach "
                         "Temporal through the fault proxy on the run's task queue; placeholders: "
                         + ", ".join("{" + p + "}" for p in PLACEHOLDERS))
    driver, workflow = _string(path, raw, "driver", required=True), _string(path, raw, "workflow", required=True)
    for spec_field, value in (("driver", driver), ("workflow", workflow)):
        if ":" not in value:
            raise ValueError(f"target file {path}: {spec_field!r} must be MODULE:NAME, got {value!r}")
    replay_plugins = raw.get("replay_plugins", [])
    if not isinstance(replay_plugins, list) or not all(isinstance(p, str) and ":" in p for p in replay_plugins):
        raise ValueError(f"target file {path}: 'replay_plugins' must be a list of MODULE:NAME strings (each a "
                         "Temporal plugin, or a zero-argument callable returning one), e.g. "
                         f"[\"my_agent.temporal:make_plugin\"], got {replay_plugins!r}")
    replay_objects = {name: _string(path, raw, name) for name in ("data_converter", "workflow_runner")}
    for spec_field, value in replay_objects.items():
        if value is not None and ":" not in value:
            raise ValueError(f"target file {path}: {spec_field!r} must be MODULE:NAME (an instance, or a "
                             f"zero-argument callable returning one), got {value!r}")
    checkers = raw.get("checkers", ALL_CHECKERS)
    if not isinstance(checkers, list) or not all(isinstance(c, str) for c in checkers):
        raise ValueError(f"target file {path}: 'checkers' must be a list of names such as [\"lost\", \"stats\"], "
                         f"got {checkers!r}; allowed: {', '.join(ALL_CHECKERS)}")
    bad = [c for c in checkers if c not in ALL_CHECKERS]
    if bad or not checkers:
        raise ValueError(f"target file {path}: unknown checker(s) {', '.join(bad) or '(none listed)'}; "
                         f"allowed: {', '.join(ALL_CHECKERS)}")
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, (str, int, float, bool)) for v in env.values()):
        raise ValueError(f"target file {path}: 'env' must be a table of NAME = \"value\" lines ([env] section), "
                         f"got {env!r}")
    base = path.parent.resolve()
    cwd = str((base / _string(path, raw, "cwd", ".")).resolve())
    if not Path(cwd).is_dir():
        raise ValueError(f"target file {path}: 'cwd' {raw.get('cwd')!r} is not a directory ({cwd})")
    python = _string(path, raw, "python")
    if python is not None:
        # A path is relative to this file (kept as given, not resolved: a venv's python is a symlink that
        # must stay one); a bare name is looked up on PATH.
        python = str(base / python) if "/" in python else shutil.which(python)
        if python is None or not os.access(python, os.X_OK):
            raise ValueError(f"target file {path}: 'python' {raw['python']!r} is not an executable interpreter; "
                             "give the target's own, e.g. \"../my-agent/.venv/bin/python\"")
    return Target(name=name, python=python, worker=tuple(worker),
                  ready_line=_string(path, raw, "ready_line", "READY"), warm_line=_string(path, raw, "warm_line"),
                  task_queue=_string(path, raw, "task_queue"), driver=driver, workflow=workflow,
                  model_activity=_string(path, raw, "model_activity", "plan_next_action"),
                  ledger=_string(path, raw, "ledger"), workspace=_string(path, raw, "workspace"),
                  checkers=tuple(checkers), cwd=cwd, env={str(k): str(v) for k, v in env.items()},
                  source=str(path), replay_plugins=tuple(replay_plugins), **replay_objects)


def load_callable(spec: str) -> Any:
    import importlib

    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load {spec!r} ({exc}); is its package importable from here (cwd / PYTHONPATH)?") from None
