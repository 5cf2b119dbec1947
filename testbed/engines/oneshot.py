"""The chaos client for engines that run one message as one durable run (checkpoint, DBOS, Restate).

The load is the same seeded workload as on Temporal (``testbed.engines.temporal.driver.Driver``: the same conversations, messages
and think times); each message becomes a one-shot run of the agent loop whose id is ``<conversation>-msg-<n>``
(a resubmission of that id is the same run on every engine: its idempotency key), the messages of a
conversation sharing its workspace. The final read collects each conversation's runs: their messages, in order,
are the conversation the ``lost`` checker reads; a run still pending at the final read leaves its conversation
``RUNNING`` (unknown, never a pass).

An engine says how to submit a run, wait for it and read its outcome (``submit``, ``wait``, ``outcome``).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any

from harness.operations import FAIL, INFO, OK
from harness.recording import executions_in_flight
from testbed.engines.temporal.driver import Conversation, Driver

QUEUED, DONE, FAILED = "queued", "done", "failed"


async def running_from_ledger(engine: Any, stack: Any) -> list[dict[str, Any]]:
    """An engine's ``running``: the ledger's unfinished executions, the model calls and tools in flight now."""
    return await asyncio.to_thread(executions_in_flight, stack.spec.state_dir / engine.target.ledger) or []


class RunFailedError(RuntimeError):
    """The engine ran the run to a failure (a step gave up): the message was answered with an error. Its message
    says why in one line; ``ids``: what else names the run (Temporal's workflow and run ids, in ``dah run --json``)."""

    def __init__(self, message: str, ids: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.ids = ids or {}


@dataclass
class OneShotDriver(Driver):
    """``client`` and ``task_queue`` are unused; subclasses implement ``submit``, ``wait`` and ``outcome``."""

    engine: str = "oneshot"

    def __post_init__(self) -> None:
        super().__post_init__()
        # The workflow-native tools (spawn, wait, run_ptc) are Temporal's.
        self.config.tools = [t for t in self.config.tools if t not in ("spawn", "wait", "run_ptc")]
        self._runs: dict[str, list[str]] = {c.workflow_id: [] for c in self.conversations}

    async def submit(self, run_id: str, prompt: str, workspace: str) -> None:
        """Start the run (idempotent: the same ``run_id`` again is the same run)."""
        raise NotImplementedError

    async def wait(self, run_id: str, timeout_s: float) -> dict[str, Any]:
        """The run's result; ``RunFailedError`` if it failed; ``TimeoutError`` if it did not end in time."""
        raise NotImplementedError

    async def outcome(self, run_id: str) -> tuple[str, Any, str | None] | None:
        """(QUEUED / DONE / FAILED, result, error), or None if the engine never heard of the run."""
        raise NotImplementedError

    async def close_client(self) -> None:
        pass

    async def _drive(self, i: int, conv: Conversation) -> None:
        process = f"client-{i}"
        rng = random.Random(f"{self.seed}-{i}")
        conv.started = True
        async for n, msg in self._messages(conv, rng):
            run_id = f"{conv.workflow_id}-msg-{n}"
            self._runs[conv.workflow_id].append(run_id)
            op = self.history.invoke(process, "send_message", {"conversation": conv.workflow_id, "n": n,
                                                               "text": msg.text, "expect": msg.expect,
                                                               "match": msg.match, "run_id": run_id})
            try:
                await self.submit(run_id, msg.text, conv.workflow_id)
                result = await self.wait(run_id, self.workload.op_timeout_s)
                self.history.complete(op, OK, {"reply": result["reply"], "turn": n + 1})
            except RunFailedError as exc:  # the run failed (a step gave up)
                self.history.complete(op, FAIL, error=str(exc))
            except Exception as exc:  # timed out or the engine unreachable: processed or not, nobody knows yet
                self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")

    async def finish(self, timeout_s: float = 60.0) -> None:
        """Wait for every submitted run, then read each conversation back from the engine (the final read)."""
        try:
            for i, conv in enumerate(self.conversations):
                op = self.history.invoke(f"client-{i}", "read_conversation", {"conversation": conv.workflow_id})
                deadline = time.monotonic() + timeout_s
                outcomes: dict[str, Any] = {}
                while time.monotonic() < deadline:
                    outcomes = {r: await self._outcome_or_none(r) for r in self._runs[conv.workflow_id]}
                    if all(o is not None and o[0] != QUEUED for o in outcomes.values()):
                        break
                    await asyncio.sleep(0.1)
                messages: list[dict[str, Any]] = []
                done = True
                for run_id in self._runs[conv.workflow_id]:
                    got = outcomes.get(run_id)
                    if got is None or got[0] == QUEUED:
                        done = False
                    elif got[0] == DONE:
                        messages.extend(got[1]["messages"])
                conv.final_history = messages
                conv.final_status = "COMPLETED" if done else "RUNNING"
                self.history.complete(op, OK, {"messages": len(messages), "status": conv.final_status})
        finally:
            await self.close_client()

    async def _outcome_or_none(self, run_id: str) -> tuple[str, Any, str | None] | None:
        try:
            return await self.outcome(run_id)
        except Exception:  # the engine is unreachable right now: unknown, asked again until the deadline
            return (QUEUED, None, None)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "backend": self.engine, "runs": self._runs}
