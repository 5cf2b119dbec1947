"""The engine protocol (see ``testbed.engines``), with the defaults most engines share.

An engine is what makes the agent durable (Temporal, the checkpoint engine, DBOS, Restate, or your agent's own
Temporal workers). Every caller reaches it through this one class:

* the chaos runner: ``stack_spec`` (what to start), ``make_driver`` (the load), ``running`` and ``aiming`` (what
  is in flight, for the nemeses that aim at busy workers), ``save`` (what it leaves in the run directory),
  ``checkers`` / ``not_applicable`` (which checks apply), ``record`` / ``reproduce``;
* the test bed's stack (``testbed.stack.StackSpec.engine``): ``server`` (the engine's own server, exposed as
  ``Stack.server``) and ``start_in_stack`` (its parts that run in the stack's process): ``testbed.stack.EnginePart``
  (Temporal's is a part of its own: ``testbed.engines.temporal.cluster.TemporalCluster``);
* ``dah run``, ``dah demo``, the benchmarks' engines: ``in_process`` (the engine in this process, one prompt one run:
  ``Session``), and what ``dah`` may ask of it beyond a prompt (``environments``, ``walkthroughs``).

An engine never imports the chaos package: a scenario is what ``Scenario`` names, duck-typed.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.contracts import AgentConfig
from harness.engines import names, registered
from harness.event_history import RunRecord, fetch_run, fetch_tree, save_histories
from harness.operations import History
from harness.rundir import RunDir
from testbed.engines import EngineUnavailable, SessionSpec
from testbed.engines.temporal.connection import TemporalConnection
from testbed.engines.byo.target import REFERENCE, Target
from testbed.stack import EnginePart, Stack, StackSpec


#: the checks that read Temporal's event histories
EVENT_HISTORY_CHECKS = ("temporal_history", "workflow_tasks", "replay")


def without_event_histories(why: str) -> dict[str, str]:
    """``not_applicable`` of an engine that keeps no Temporal event histories: each check that reads them, and why."""
    return dict.fromkeys(EVENT_HISTORY_CHECKS, why)


class Cluster(Protocol):
    """What an engine reads of a scenario's cluster (``chaos.scenarios.ClusterSpec``)."""

    workers: int
    model_latency: str
    workflow: str | None

    @property
    def faults(self) -> Any: ...  # harness.faults.AgentFaults: what the workers carry


class Scenario(Protocol):
    """What an engine reads of a scenario (``chaos.scenarios.ChaosScenario``): the cluster, the load and the agent
    settings it asks for."""

    name: str
    cluster: Cluster
    workload: Any  # testbed.engines.workload.Workload
    timeouts: str  # a key of testbed.engines.workload.TIMEOUTS
    planning_max_attempts: int
    max_history_events: int
    local_tools: tuple[str, ...]
    local_model: bool


class Session(Protocol):
    """An engine running in this process (``Engine.in_process``): each prompt one run of its own, for ``dah run``,
    ``dah demo`` and the benchmarks' engines section. A session subclasses this class for its defaults."""

    banner: str  # what ``dah demo`` says first: the engine, where its state is

    def record(self) -> dict[str, Any]:
        """What runs, with its durability settings as read from it (the benchmarks' ``configs``)."""
        return {}

    async def run_turn(self, config: AgentConfig, prompt: str, run_id: str) -> dict[str, Any]:
        """The run ``run_id`` of ``prompt`` to its result (``reply``, ``messages``, what else names the run); an
        exception if it failed: ``oneshot.RunFailedError`` when the engine can say why in one line."""
        ...

    async def describe_run(self, run_id: str) -> list[str]:
        """Where the run is kept, then one line per step as the engine recorded it (what ``dah run`` prints)."""
        ...

    async def walkthrough(self, walkthrough: Any) -> Any:
        """Run a scripted walkthrough (``testbed.walkthroughs``) and check it: its outcome. Only an engine whose
        ``walkthroughs`` is true has it; the others run none."""
        raise NotImplementedError("this engine runs no walkthroughs")

    async def noop_steps(self, n: int) -> list[float]:
        """The time of each of ``n`` no-op steps of one run (ms): what the engine's durability alone costs a step;
        ``EngineUnavailable`` (reported as such by the benchmarks) where it is not measured."""
        raise EngineUnavailable(f"{type(self).__name__}: a no-op step is not measured on this engine")


@dataclass
class Engine(EnginePart):
    """The protocol, with the defaults most engines share (in the stack: ``testbed.stack.EnginePart``'s)."""

    target: Target = REFERENCE
    name: str = ""
    not_applicable: dict[str, str] = field(default_factory=dict)  # checker -> why it cannot apply here
    scenarios: tuple[str, ...] | None = None  # the named scenarios this engine can run (None: all)
    #: where Temporal is: the embedded dev server (default), or an external cluster (its address and namespace)
    connection: TemporalConnection = field(default_factory=TemporalConnection)

    @classmethod
    def made(cls, entry: dict[str, Any], **options: Any) -> Engine:
        """This engine from its registry entry's options (``harness.engines.Registered.options``) and a command's
        ``options``; those a command gives for another engine (a placement, a target, a cluster) are not its."""
        return cls(**entry)

    @property
    def suffix(self) -> str:
        """Appended to scenario names where its runs sit beside other engines' (``@checkpoint``; "" on the
        engine the scenarios are written for): its registry entry's."""
        return registered(self.name).suffix if self.name in names() else ""

    def own_cluster_because(self) -> str | None:
        """Why this engine's runs cannot take turns on one warm cluster (a soak's lanes); None: they can."""
        return "only the reference agent's worker processes on Temporal's embedded server share one"

    @property
    def external(self) -> bool:
        """Temporal is a cluster this harness does not own (it cannot restart it, and shares it with others)."""
        return not self.connection.embedded

    @property
    def checkers(self) -> list[str]:
        return [c for c in self.target.checkers if c not in self.not_applicable]

    def record(self) -> dict[str, Any]:
        """``run.json``'s ``backend``: what ran, and which checkers cannot apply to it (and why)."""
        return {"name": self.name, "not_applicable": dict(self.not_applicable),
                "temporal": self.connection.redacted()}

    def reproduce(self) -> dict[str, Any]:
        """The command-line flags that select this engine again (TLS and API keys come from the environment or
        a profile, as they did: never on a command line)."""
        if self.external:
            return {"--address": self.connection.address, "--namespace": self.connection.namespace}
        return {}

    def task_queue(self, scenario: Scenario) -> str:
        """The scenario's task queue; on an external cluster, one of this run's own (``-<random>``): workers of
        another run on the same cluster and namespace (another user's, an earlier seed's) never take its tasks."""
        # a scenario under another timeouts profile is named SCENARIO~PROFILE: a task queue takes no "~"
        queue = self.target.task_queue or "chaos-" + re.sub(r"[^A-Za-z0-9_.:@+=-]", "-", scenario.name)
        # A worker that hard-codes its address hard-codes its queue too: it is the one it polls.
        return f"{queue}-{uuid.uuid4().hex[:8]}" if self.external and not self.target.address else queue

    # -- the chaos runner ------------------------------------------------------------------------------------

    def stack_spec(self, scenario: Scenario, run: RunDir, seed: int, history: History, ui: bool) -> StackSpec:
        raise NotImplementedError

    def make_driver(self, stack: Stack, history: History, scenario: Scenario, seed: int) -> Any:
        raise NotImplementedError

    #: what is running right now, by the engine's own lights: ``async running(stack)`` ->
    #: [{"workflow_id", "activity", "attempt", "worker"}]; None: the in-flight observer ``aiming`` gives says
    running = None

    def aiming(self, stack: Stack, driver: Any) -> dict[str, Any]:
        """What aimed kills read beyond the stack, as ``testbed.faults.nemesis.NemesisContext`` fields (``observer``:
        the engine's in-flight observer; ``ledger``: the effect ledger where this process can read it;
        ``continue_as_new_events``); none by default."""
        return {}

    async def latest_runs(self, stack: Stack, driver: Any) -> list[RunRecord] | None:
        """Each conversation's latest run as the server holds it now (the late wait reads what is still pending
        in it: ``chaos.checker.late``); None: this engine keeps no Temporal histories to tell."""
        if stack.client is None or "temporal_history" in self.not_applicable:
            return None

        async def one(wid: str) -> RunRecord | None:
            try:
                return await fetch_run(stack.client, wid)
            except Exception:  # never started (or gone): nothing pending
                return None

        runs = await asyncio.gather(*(one(wid) for wid in driver.workflow_ids))
        return [r for r in runs if r is not None]

    async def run_tree(self, stack: Stack, run_id: str) -> dict[str, list[RunRecord]] | None:
        """Run ``run_id`` and the children it started as the server's event histories hold them (which worker ran
        each workflow task and activity: ``harness.event_history.fetch_tree``); None: this engine keeps none."""
        if stack.client is None or "temporal_history" in self.not_applicable:
            return None
        return await fetch_tree(stack.client, run_id)

    async def save(self, stack: Stack, run: RunDir, driver: Any) -> None:
        """Every conversation's event histories (what temporal_history and replay read)."""
        if stack.client is not None:
            await save_histories(stack.client, driver.workflow_ids, run.event_histories)

    # -- dah run / dah demo, the benchmarks' engines section -------------------------------------------------

    #: the workflow-native tools (spawn, wait, run_ptc: ``agent.contracts.WORKFLOW_NATIVE_TOOLS``) run on it
    workflow_tools = False
    #: the agent's environments other than ``base`` (a shell, a browser) run on this engine's session
    environments = False
    #: the scripted walkthroughs (``testbed.walkthroughs``: they check Temporal's event histories) run on it
    walkthroughs = False

    def in_process(self, spec: SessionSpec) -> contextlib.AbstractAsyncContextManager[Session]:
        """This engine in this process, as ``spec`` asks, stopped on exit; ValueError (or ``EngineUnavailable``)
        naming what it cannot do."""
        raise NotImplementedError(f"{self.name}: no in-process session")

