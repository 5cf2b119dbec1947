"""Deliberately broken agents, to prove the chaos checkers catch what they claim to."""

from __future__ import annotations

import time

from temporalio import workflow

from agent.contracts import AgentInput, AgentResult
from agent.workflow import AgentWorkflow


@workflow.defn(name="AgentWorkflow", sandboxed=False)
class WallClockAgentWorkflow(AgentWorkflow):
    """Reads the wall clock in workflow code: a fresh turn does an extra 'cache refresh' timer.

    While running, every turn is fresh; replayed later, none is, so the replay
    issues different commands than the history holds: non-determinism.
    """

    @workflow.run
    async def run(self, inp: AgentInput) -> AgentResult:
        return await super().run(inp)

    async def _turn(self, text: str):  # type: ignore[override]
        if time.time() - workflow.now().timestamp() < 1.0:  # BUG: wall clock in workflow code
            await workflow.sleep(0.01)
        return await super()._turn(text)
