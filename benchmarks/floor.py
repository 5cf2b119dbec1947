"""The floor of a turn's shape: a workflow whose Update runs N trivial activities (the reference agent's
``calculator`` on ``6 * 7``), dispatched or local, and nothing else: no agent loop, no model, a few hundred bytes
of payload. The ``overhead`` section serves it from a worker process beside the agent's, on the same server, so
the agent's overhead per turn sits next to the least its number of dispatches can cost on this machine.

Served by ``dah worker --workflow benchmarks.floor:FloorWorkflow`` (the reference worker, whose activities
include ``calculator``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from agent.contracts import ToolInput, ToolOutput


@dataclass
class FloorStep:
    activities: int  # how many trivial activities the Update runs, one after another
    local: bool  # as local activities (in the workflow task) instead of dispatched ones


@workflow.defn
class FloorWorkflow:
    def __init__(self) -> None:
        self._ended = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self._ended)

    @workflow.signal
    def end(self) -> None:
        self._ended = True

    @workflow.update
    async def step(self, step: FloorStep) -> int:
        for i in range(step.activities):
            arg = ToolInput(call_id=f"floor-{i}", arguments={"expression": "6 * 7"})
            if step.local:
                await workflow.execute_local_activity("calculator", arg, result_type=ToolOutput,
                                                      start_to_close_timeout=timedelta(seconds=10))
            else:
                await workflow.execute_activity("calculator", arg, result_type=ToolOutput,
                                                start_to_close_timeout=timedelta(seconds=10))
        return step.activities
