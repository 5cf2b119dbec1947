"""The backend protocol (see ``chaos.backends``), with the defaults most backends share."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from typing import Any

from testbed.faults.nemesis import EMBEDDED_ONLY, NEMESES, NemesisContext
from chaos.scenarios import ChaosScenario
from chaos.target import REFERENCE, Target
from harness.event_history import save_histories
from harness.operations import History
from harness.rundir import RunDir
from testbed.connection import TemporalConnection
from testbed.stack import Stack, StackSpec


@dataclass
class Backend:
    """The protocol, with the defaults most backends share."""

    target: Target = REFERENCE
    name: str = ""
    suffix: str = ""  # appended to scenario names where both backends' runs sit side by side ("@checkpoint")
    not_applicable: dict[str, str] = field(default_factory=dict)  # checker -> why it cannot apply here
    scenarios: tuple[str, ...] | None = None  # the named scenarios this backend can run (None: all)
    #: where Temporal is: the embedded dev server (default), or an external cluster (its address and namespace)
    connection: TemporalConnection = field(default_factory=TemporalConnection)

    @property
    def external(self) -> bool:
        """Temporal is a cluster this harness does not own (it cannot restart it, and shares it with others)."""
        return not self.connection.embedded

    @property
    def unavailable_nemeses(self) -> frozenset[str]:
        """The nemeses this backend's cluster cannot have (``testbed.faults.nemesis.EMBEDDED_ONLY`` on an external one)."""
        return frozenset(EMBEDDED_ONLY) if self.external else frozenset()

    def skip_reason(self, scenario: ChaosScenario) -> str | None:
        """Why this backend cannot run ``scenario`` at all (None: it can): a fixed fault its cluster cannot have.
        A skipped scenario is reported ``skipped``, never as a pass."""
        ops = sorted({e.op for e in scenario.events} & self.unavailable_nemeses)
        return "; ".join(f"{op} {EMBEDDED_ONLY[op]}" for op in ops) or None

    @property
    def checkers(self) -> list[str]:
        return [c for c in self.target.checkers if c not in self.not_applicable]

    def record(self) -> dict[str, Any]:
        """``run.json``'s ``backend``: what ran, and which checkers cannot apply to it (and why)."""
        return {"name": self.name, "not_applicable": dict(self.not_applicable),
                "temporal": self.connection.redacted()}

    def reproduce(self) -> dict[str, Any]:
        """The command-line flags that select this backend again (TLS and API keys come from the environment or
        a profile, as they did: never on a command line)."""
        if self.external:
            return {"--address": self.connection.address, "--namespace": self.connection.namespace}
        return {}

    def task_queue(self, scenario: ChaosScenario) -> str:
        """The scenario's task queue; on an external cluster, one of this run's own (``-<random>``): workers of
        another run on the same cluster and namespace (another user's, an earlier seed's) never take its tasks."""
        queue = self.target.task_queue or f"chaos-{scenario.name}"
        # A worker that hard-codes its address hard-codes its queue too: it is the one it polls.
        return f"{queue}-{uuid.uuid4().hex[:8]}" if self.external and not self.target.address else queue

    def stack_spec(self, scenario: ChaosScenario, run: RunDir, seed: int, history: History, ui: bool) -> StackSpec:
        raise NotImplementedError

    def make_driver(self, stack: Stack, history: History, scenario: ChaosScenario, seed: int) -> Any:
        raise NotImplementedError

    def nemesis_context(self, stack: Stack, history: History, driver: Any, seed: int) -> NemesisContext:
        return NemesisContext(stack, history, driver.workflow_ids, random.Random(seed), self.target.model_activity,
                              driver_stop=getattr(driver, "stop", None), running=self.running)

    running = None  # Temporal backends: the nemesis asks Temporal (testbed.faults.nemesis.temporal_in_flight)
    nemeses = NEMESES

    async def save(self, stack: Stack, run: RunDir, driver: Any) -> None:
        """Every conversation's event histories (what temporal_history and replay read)."""
        if stack.client is not None:
            await save_histories(stack.client, driver.workflow_ids, run.event_histories)
