"""The agent under test: ours by default, or yours, described in a TOML file.

    name = "my-agent"
    # {python} {address} {namespace} {task_queue} {identity} {model_url} {state_dir} are filled in per worker
    worker = ["{python}", "-m", "my_agent.worker", "--address", "{address}", "--task-queue", "{task_queue}",
              "--identity", "{identity}", "--model-url", "{model_url}"]
    ready_line = "READY"                 # the worker prints this once it polls
    task_queue = "my-agent"
    driver = "my_agent.chaos_driver:make_driver"   # see Driver below
    workflow = "my_agent.workflows:AgentWorkflow"  # what the replay checker replays histories with
    model_activity = "call_llm"          # the activity that calls the model (kills aimed "mid model call" wait for it)
    ledger = "sandbox/ledger.sqlite3"    # optional, relative to the state dir; written through harness.recording
    workspace = "sandbox/{workflow_id}"  # optional: each conversation's files ({workflow_id}: harness.recording.workspace_name)
    checkers = ["lost", "temporal_history", "replay", "injection_evidence", "stats"]  # default: all
    cwd = "."                            # relative to this file; workers and the replayer run there
    [env]                                # extra environment for workers and the replayer
    MY_FLAG = "1"

The driver factory is called as ``make_driver(client=, history=, task_queue=,
workload=, seed=)`` and returns an object with ``workflow_ids`` (list),
``async run()`` (drive the load, recording each operation in ``history`` as
invoke then ok/fail/info), optionally ``stop()`` (stop sending new messages: the
runner calls it when the faults are healed, so the load spans the fault phase), ``async finish()`` (end the conversations and read
their final state) and ``to_json()``, whose ``conversations`` list the lost
checker reads: ``workflow_id``, ``started``, ``planned`` (``text``,
``expect``, ``kind``), ``final_history`` (chat messages: ``role``,
``content``) and ``final_status``. ``chaos.client.Driver`` is the reference.

Checkers a target leaves out are recorded in the journal as not run; they
never count as passed.
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.checker import ALL_CHECKERS



@dataclass(frozen=True)
class Target:
    name: str = "reference-agent"
    worker: tuple[str, ...] | None = None  # None: this project's `python -m agent worker`
    ready_line: str = "READY"
    task_queue: str | None = None  # None: one per scenario
    driver: str = "chaos.client:Driver"
    workflow: str = "agent.workflow:AgentWorkflow"
    model_activity: str = "plan_next_action"
    ledger: str | None = "sandbox/ledger.sqlite3"
    workspace: str | None = "sandbox/{workflow_id}"  # where a conversation's files are, relative to the state dir
    checkers: tuple[str, ...] = tuple(ALL_CHECKERS)
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    source: str | None = None  # the file it was read from (None: the built-in reference target)

    @property
    def is_reference(self) -> bool:
        return self.worker is None

    def worker_command(self, **values: str) -> list[str]:
        assert self.worker is not None
        values = {"python": sys.executable, **values}
        return [_fill(part, values) for part in self.worker]

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "worker": list(self.worker) if self.worker else None, "ready_line": self.ready_line,
                "task_queue": self.task_queue, "driver": self.driver, "workflow": self.workflow,
                "model_activity": self.model_activity, "ledger": self.ledger, "workspace": self.workspace,
                "checkers": list(self.checkers), "cwd": self.cwd, "env": dict(self.env), "source": self.source}


def _fill(part: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        part = part.replace("{" + key + "}", value)
    return part


REFERENCE = Target()


def load_target(path: Path) -> Target:
    """Read a target file; every mistake names the field, the allowed values and the file."""
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"target file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"target file {path}: not valid TOML ({exc})") from None
    allowed = {"name", "worker", "ready_line", "task_queue", "driver", "workflow", "model_activity", "ledger",
               "workspace", "checkers", "cwd", "env"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ValueError(f"target file {path}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    for required in ("name", "worker", "driver", "workflow"):
        if required not in raw:
            raise ValueError(f"target file {path}: missing required field {required!r}")
    worker = raw["worker"]
    if not isinstance(worker, list) or not worker or not all(isinstance(p, str) for p in worker):
        raise ValueError(f"target file {path}: 'worker' must be a non-empty list of strings (the command)")
    if not any("{address}" in p for p in worker) or not any("{task_queue}" in p for p in worker):
        raise ValueError(f"target file {path}: 'worker' must use {{address}} and {{task_queue}} so workers reach "
                         "Temporal through the fault proxy on the run's task queue")
    for spec_field in ("driver", "workflow"):
        if ":" not in str(raw[spec_field]):
            raise ValueError(f"target file {path}: {spec_field!r} must be MODULE:NAME, got {raw[spec_field]!r}")
    checkers = raw.get("checkers", ALL_CHECKERS)
    bad = [c for c in checkers if c not in ALL_CHECKERS]
    if bad or not checkers:
        raise ValueError(f"target file {path}: unknown checker(s) {', '.join(bad) or '(none listed)'}; "
                         f"allowed: {', '.join(ALL_CHECKERS)}")
    cwd = str((path.parent / raw["cwd"]).resolve()) if "cwd" in raw else str(path.parent.resolve())
    return Target(name=str(raw["name"]), worker=tuple(worker), ready_line=str(raw.get("ready_line", "READY")),
                  task_queue=raw.get("task_queue"), driver=str(raw["driver"]), workflow=str(raw["workflow"]),
                  model_activity=str(raw.get("model_activity", "plan_next_action")),
                  ledger=raw.get("ledger") or None, workspace=raw.get("workspace") or None,
                  checkers=tuple(checkers), cwd=cwd,
                  env={str(k): str(v) for k, v in raw.get("env", {}).items()}, source=str(path))


def load_callable(spec: str) -> Any:
    import importlib

    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load {spec!r} ({exc}); is its package importable from here (cwd / PYTHONPATH)?") from None
