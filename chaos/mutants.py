"""Deliberately broken builds of the reference workflow: the planted bugs that prove the checkers catch what
they claim (``chaos.planted``). Each registers under the reference's workflow type name, so the driver and the
histories are unchanged; a scenario selects one with ``ClusterSpec(workflow="chaos.mutants:NAME")``. Never used
outside a planted-bug run.
"""

from __future__ import annotations

import time

from temporalio import workflow

from agent.contracts import AgentInput, AgentReply, AgentResult
from agent.workflow import AgentWorkflow


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
