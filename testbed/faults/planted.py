"""The planted bugs' code: deliberately broken builds of the reference agent that prove the checkers catch what
they claim (the suite that runs them and tables the result: ``chaos/planted.py``, ``python -m chaos planted``).
Never used outside a planted-bug run.

Contract
--------
* The broken workflows below each register under the reference's workflow type name, so the driver and the
  histories are unchanged; a scenario selects one with ``ClusterSpec(workflow="testbed.faults.planted:NAME")``
  (``workflow_spec(NAME)``), which the worker loads by that module path. Each docstring says what is broken and
  what a run must show.
* ``cancel_on_sigterm`` (a mutation of ``harness.faults.MUTATIONS``, applied by the reference worker's entry
  point, ``drain_timeout`` and ``on_sigterm``): the worker cancels its in-flight work on SIGTERM instead of
  draining it; the ``drain`` checker must catch it.
* The other mutations (``unkeyed_effects``, ``attempt_keyed_effects``, ``swallow_tool_errors``,
  ``slow_tool_without_heartbeat``) fire inside the agent, through the in-agent seam (``harness.faults``,
  ``harness.recording``), because a target agent carries them in its own Python.
* A reader of older run directories: they name these workflows ``chaos.mutants:NAME`` (the module's old path);
  ``current_workflow`` maps that to the path now, so a saved run re-checks and reruns with the same build.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from temporalio import workflow

from agent.contracts import AgentInput, AgentReply, AgentResult
from agent.workflow import AgentWorkflow

if TYPE_CHECKING:  # the worker's entry point's helpers only: this module is loaded in the workflow sandbox too
    from harness.faults import AgentFaults
    from harness.recording import EffectLedger


@workflow.defn(name="AgentWorkflow", sandboxed=False)
class WallClockAgentWorkflow(AgentWorkflow):
    """Reads the wall clock in workflow code (the sandbox is off): a fresh turn does an extra 'cache refresh'
    timer. While running, every turn is fresh; replayed later, none is: different commands, non-determinism."""

    @workflow.run
    async def run(self, inp: AgentInput) -> AgentResult:
        return await super().run(inp)

    async def _turn(self, text: str) -> AgentReply:  # type: ignore[override]
        if time.time() - workflow.now().timestamp() < 1.0:  # BUG: wall clock in workflow code
            await workflow.sleep(0.01)
        return await super()._turn(text)


@workflow.defn(name="AgentWorkflow")
class HashSeedAgentWorkflow(AgentWorkflow):
    """Branches on ``hash()`` of the message, which the SDK's sandbox allows: a string's hash follows the
    process's hash seed, so the worker that runs a turn and the one (or the replayer) that replays it may
    disagree on whether it set a timer: non-determinism only another process sees."""

    @workflow.run
    async def run(self, inp: AgentInput) -> AgentResult:
        return await super().run(inp)

    async def _turn(self, text: str) -> AgentReply:  # type: ignore[override]
        if hash(text) % 2:  # BUG: hash randomisation differs between processes
            await workflow.sleep(0.01)
        return await super()._turn(text)


@workflow.defn(name="AgentWorkflow")
class CrashOnThirdTurnAgentWorkflow(AgentWorkflow):
    """Raises from workflow code on its third turn: the workflow task fails, is retried, and fails forever; the
    conversation is stuck and its messages go unanswered."""

    @workflow.run
    async def run(self, inp: AgentInput) -> AgentResult:
        return await super().run(inp)

    async def _turn(self, text: str) -> AgentReply:  # type: ignore[override]
        if self.turns == 2:
            raise RuntimeError("planted: the workflow code cannot handle a third turn")  # BUG
        return await super()._turn(text)


@workflow.defn(name="AgentWorkflow")
class ForgetfulAgentWorkflow(AgentWorkflow):
    """Drops the last exchange from the conversation it carries into continue-as-new: every reply was given,
    but the next run's model no longer sees the last message (the kind of state bug a kill at
    continue-as-new is aimed at)."""

    @workflow.run
    async def run(self, inp: AgentInput) -> AgentResult:
        return await super().run(inp)

    def _history_too_long(self) -> bool:
        due = super()._history_too_long()
        if due and len(self.messages) > 3:
            last_user = max(i for i, m in enumerate(self.messages) if m["role"] == "user")
            del self.messages[last_user:]  # BUG: the carried state loses the last turn
        return due


#: a reader of older run directories: the module their scenarios and targets name the planted workflows by -> the
#: module now; not a spelling to use
OLD_MODULES = {"chaos.mutants": __name__}
CANCEL_ON_SIGTERM = "cancel_on_sigterm"


def workflow_spec(name: str) -> str:
    """How a scenario names the planted workflow class ``name`` (``module:Class``, what ``--workflow`` loads)."""
    if not isinstance(globals().get(name), type):
        raise ValueError(f"no planted workflow {name!r}; planted workflows are {', '.join(planted_workflows())}")
    return f"{__name__}:{name}"


def planted_workflows() -> list[str]:
    """The planted workflow classes' names."""
    return [n for n, obj in globals().items() if isinstance(obj, type) and obj.__module__ == __name__
            and issubclass(obj, AgentWorkflow)]


def current_workflow(spec: object) -> object:
    """A workflow spec as a run directory recorded it, with a planted workflow's old module path (``OLD_MODULES``)
    replaced by its path now; anything else unchanged."""
    if isinstance(spec, str):
        module, sep, name = spec.partition(":")
        if sep and module in OLD_MODULES:
            return f"{OLD_MODULES[module]}:{name}"
    return spec


def drain_timeout(faults: AgentFaults, drain_timeout_s: float) -> float:
    """The reference worker's drain timeout: ``drain_timeout_s``, or 0 (no drain: the SDK cancels what runs) for a
    worker built with ``cancel_on_sigterm``."""
    return 0.0 if faults.mutated(CANCEL_ON_SIGTERM) else drain_timeout_s


def on_sigterm(faults: AgentFaults, ledger: EffectLedger, identity: str) -> None:
    """At the reference worker's SIGTERM: a worker built with ``cancel_on_sigterm`` records in the effect ledger
    that its mutated path ran (``injection_evidence`` counts a declared mutation only once it ran)."""
    if faults.mutated(CANCEL_ON_SIGTERM):
        from harness.recording import ExecutionIdentity

        ledger.record_mutation(CANCEL_ON_SIGTERM, ExecutionIdentity("-", "-", "-", 0, identity), "worker")
