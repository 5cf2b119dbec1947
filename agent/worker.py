"""One agent worker: the workflow and every activity, on one task queue.

``build_worker`` is shared by the ``worker`` command (one process, used by
chaos and migration tooling), the ``demo``/``run`` commands and the tests.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.worker import PollerBehaviorSimpleMaximum, UnsandboxedWorkflowRunner, Worker

from agent import llm
from agent.activities import AgentActivities
from agent.contracts import DEFAULT_TASK_QUEUE
from harness.recording import EffectLedger
from agent.workflow import AgentWorkflow

DEFAULT_STATE_DIR = Path(".dah")
#: where a worker keeps things, relative to its state dir (the chaos target declares the same to the checkers)
SANDBOX = "sandbox"  # one workspace per workflow id (agent.tools.workspace_for), and the effect ledger:
LEDGER = f"{SANDBOX}/ledger.sqlite3"
WORKSPACES = f"{SANDBOX}/{{workflow_id}}"


def default_identity() -> str:
    return f"worker-{os.getpid()}@{socket.gethostname()}"


@dataclass
class WorkerSettings:
    task_queue: str = DEFAULT_TASK_QUEUE
    sandbox_root: Path = DEFAULT_STATE_DIR / SANDBOX
    ledger_path: Path | None = None  # default: <state dir>/LEDGER
    model_base_url: str | None = None  # the scripted model server (ignored by live models)
    identity: str = field(default_factory=default_identity)
    max_concurrent_activities: int = 100
    eager_activities: bool = True  # eager activity execution (the SDK's default); benchmarks compare both
    # The SDK's workflow sandbox re-checks every import and global access in workflow code; off, workflow
    # tasks run faster but nothing catches a non-deterministic call (benchmarks measure the difference).
    workflow_sandbox: bool = True
    workflow: str = "agent.workflow:AgentWorkflow"  # MODULE:CLASS registered as the agent workflow
    # Workflows kept in memory between tasks (the SDK's default 1000). 0: no cache and no sticky queue, so
    # after this worker dies no task waits out the sticky-queue timeout (10 s) meant for it.
    max_cached_workflows: int = 1000
    # How long a workflow task waits on this worker's sticky queue before any worker may take it (the SDK's
    # default 10 s). After this worker dies, that is how long its workflows wait; shorter means faster
    # recovery, at the price of a full-history replay elsewhere when a live but busy worker is slower than it.
    sticky_timeout_s: float = 10.0
    # On SIGTERM the worker drains: it stops polling, lets what it runs finish (and reports it) for up to this long,
    # then cancels what is left (the server retries that elsewhere). 0: cancel at once, as the SDK's default does.
    drain_timeout_s: float = 30.0
    # Activity long polls open at once (the SDK's default 5). A frozen worker's open polls still take tasks (the server
    # hands them over; the frozen process never runs them): each costs a retry one heartbeat timeout later.
    activity_pollers: int = 5
    # The longest the SDK holds back an activity's heartbeats (it sends at most one per 80% of the heartbeat
    # timeout, capped by this). At the SDK's cap of 60 s, a 1.5 s heartbeat timeout (chaos's fast profile) leaves
    # 0.3 s for a busy event loop or a CPU-starved container before the server gives the attempt to another
    # worker (a model call paid twice); at 0.5 s it leaves 1 s. Each running activity then heartbeats <= 2/s.
    heartbeat_throttle_s: float = 0.5

    def __post_init__(self) -> None:
        self.sandbox_root = Path(self.sandbox_root)
        if self.max_cached_workflows < 0:
            raise ValueError(f"--max-cached-workflows {self.max_cached_workflows}: must be 0 or more")
        if not self.sticky_timeout_s > 0:
            raise ValueError(f"--sticky-timeout {self.sticky_timeout_s}: must be more than 0 seconds")
        if self.activity_pollers < 1:
            raise ValueError(f"--activity-pollers {self.activity_pollers}: must be 1 or more")
        if not self.drain_timeout_s >= 0:
            raise ValueError(f"--drain-timeout {self.drain_timeout_s}: must be 0 seconds or more")
        if not self.heartbeat_throttle_s > 0:
            raise ValueError(f"--heartbeat-throttle {self.heartbeat_throttle_s}: must be more than 0 seconds")

    @property
    def resolved_ledger_path(self) -> Path:
        return Path(self.ledger_path) if self.ledger_path else self.sandbox_root.parent / LEDGER

    @classmethod
    def in_state_dir(cls, state_dir: Path, **kwargs: object) -> WorkerSettings:
        """Settings whose workspaces and ledger live in ``state_dir`` (the layout above)."""
        return cls(sandbox_root=Path(state_dir) / SANDBOX, **kwargs)  # type: ignore[arg-type]


def load_workflow(spec: str) -> type:
    """``MODULE:CLASS`` -> the workflow class (the default is the reference agent)."""
    import importlib

    if spec == "agent.workflow:AgentWorkflow":
        return AgentWorkflow
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"--workflow {spec!r}: expected MODULE:CLASS, e.g. agent.workflow:AgentWorkflow")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--workflow {spec!r}: cannot load it ({exc})") from None


#: the packages whose sources make a reference worker's build id (with the --workflow module's and the SDK version)
BUILD_ID_PACKAGES = ("agent", "harness")


@functools.lru_cache(maxsize=None)
def source_build_id(workflow_spec: str = "agent.workflow:AgentWorkflow") -> str:
    """The worker's build id: a hash of the code it runs (the agent's and harness's sources, the --workflow
    module's, the SDK's version), a few ms. The SDK's default hashes the bytecode of every loaded module: ~0.35 s
    on the way to READY, and it changes with whatever a background import (LiteLLM's) has loaded by then."""
    import temporalio

    digest = hashlib.md5(f"temporalio {temporalio.__version__}".encode(), usedforsecurity=False)
    root = Path(__file__).resolve().parent.parent
    files = sorted(f for pkg in BUILD_ID_PACKAGES for f in (root / pkg).rglob("*.py"))
    spec = importlib.util.find_spec(workflow_spec.partition(":")[0])
    if spec is not None and spec.origin and spec.origin.endswith(".py") and Path(spec.origin) not in files:
        files.append(Path(spec.origin))
    for f in files:
        digest.update(str(f.relative_to(root) if f.is_relative_to(root) else f).encode())
        digest.update(f.read_bytes())
    return f"dah-{digest.hexdigest()[:16]}"


def build_worker(client: Client, settings: WorkerSettings, ledger: EffectLedger, *,
                 workflows: Sequence[type] = (), activities: Sequence[Callable[..., Any]] = ()) -> Worker:
    """The agent's worker: its workflow and activities, and ``workflows`` / ``activities`` of the caller's beside
    them (the test bed registers its checkpoint engine's task on Temporal there)."""
    agent_activities = AgentActivities(
        sandbox_root=settings.sandbox_root,
        ledger=ledger,
        worker_identity=settings.identity,
        model_base_url=settings.model_base_url,
    )
    worker = Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[load_workflow(settings.workflow), *workflows],
        activities=[*agent_activities.all(), *activities],
        identity=settings.identity,
        build_id=source_build_id(settings.workflow),
        max_concurrent_activities=settings.max_concurrent_activities,
        disable_eager_activity_execution=not settings.eager_activities,
        max_cached_workflows=settings.max_cached_workflows,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=settings.sticky_timeout_s),
        graceful_shutdown_timeout=timedelta(seconds=settings.drain_timeout_s),
        max_heartbeat_throttle_interval=timedelta(seconds=settings.heartbeat_throttle_s),
        activity_task_poller_behavior=PollerBehaviorSimpleMaximum(maximum=settings.activity_pollers),
        **({} if settings.workflow_sandbox else {"workflow_runner": UnsandboxedWorkflowRunner()}),
    )
    # LiteLLM's import (seconds of CPU) on a thread from now: after the worker is built, so that it does not
    # compete for the GIL with the way to READY; model calls wait for it (llm.wait_loaded).
    llm.preload_in_background()
    return worker
