"""The durable-run substrate's records, canonical JSON and its hash, and errors.

A run is split into ordered, idempotent *steps*; each step's result
is persisted before the next step runs; on resume the runner returns the
recorded results of completed steps without running them again, up to the
first unfinished step.

Boundary disciplines (enforced here and by the runner):

1. Step results are JSON: ``canonical_json`` refuses NaN, infinities and
   anything that is not a JSON value.
2. A step is identified by its position; its ``intent`` must be the same
   on every replay (else ``DivergenceError``).
3. Clock and randomness go through ``ctx.now()`` / ``ctx.uuid()``, which are
   checkpointed steps of kind ``deterministic``.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
from dataclasses import asdict, dataclass, field
from typing import Any

STEP_KINDS: tuple[str, ...] = ("logic", "llm", "tool", "readiness", "deterministic", "event")
DEFAULT_LEASE_MS = 30_000


@dataclass
class StepError:
    message: str
    code: str | None = None
    stack: str | None = None  # for diagnostics only: never replayed as an exception


@dataclass
class StepRecord:
    run_id: str
    step_index: int  # 0-based position: the load-bearing identity of a step
    intent: str  # a label that must be stable across replays
    kind: str
    input_hash: str  # sha256 of the canonical input fingerprint; "" when there is none
    status: str
    attempts: int  # incremented each time the step begins
    result: Any = None  # JSON; meaningful when status == "completed"
    error: StepError | None = None
    started_at: str | None = None
    completed_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepRecord:
        error = data.get("error")
        return cls(**{**data, "error": StepError(**error) if error else None})


@dataclass
class EventRecord:
    run_id: str
    key: str
    payload: Any
    emitted_at: str


@dataclass
class RunOutcome:
    pass_: bool | None = None
    score: float | None = None
    notes: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class DurableRunManifest:
    project_id: str  # e.g. "durable-agent"
    task: dict[str, Any]  # at least an id; intent and domain are hashed too
    input: dict[str, Any]  # hashed into the run identity
    scenario_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


@dataclass
class RunRecord:
    run_id: str
    manifest_hash: str
    project_id: str
    status: str
    created_at: str
    updated_at: str
    step_count: int = 0
    scenario_id: str | None = None
    completed_at: str | None = None
    lease_holder_id: str | None = None
    lease_expires_at: str | None = None
    outcome: RunOutcome | None = None


@dataclass
class StartResult:
    run: RunRecord
    completed_steps: list[StepRecord]
    lease_expires_at: str


# -- canonical JSON and identity -----------------------------------------------------------------------


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace; only JSON values (no NaN, infinities, objects)."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not a canonical JSON value ({exc})") from None


def canonical_hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def manifest_hash(manifest: DurableRunManifest) -> str:
    """The run identity: same hash, same run (tags do not count)."""
    task = manifest.task
    return canonical_hash({"project_id": manifest.project_id, "scenario_id": manifest.scenario_id,
                           "task": {"id": task.get("id"), "intent": task.get("intent"), "domain": task.get("domain")},
                           "input": manifest.input})


def derive_worker_id() -> str:
    """``host:pid:rand``: unique per process even where pids are recycled quickly."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


# -- errors -------------------------------------------------------------------------------------------------


class DurableRunError(Exception):
    code = "durable_run_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class LeaseHeldError(DurableRunError):
    """Another worker holds a live lease on this run."""

    code = "lease_held"


class InputMismatchError(DurableRunError):
    """The run exists with a different manifest hash (same run id, different inputs)."""

    code = "manifest_mismatch"


class DivergenceError(DurableRunError):
    """The step at this position was recorded with a different intent: the task function changed."""

    code = "step_divergence"


class StepInputMismatchError(DurableRunError):
    """Same intent at the same position, but a different input fingerprint."""

    code = "step_input_mismatch"


class AwaitEventTimeoutError(DurableRunError):
    code = "await_event_timeout"
