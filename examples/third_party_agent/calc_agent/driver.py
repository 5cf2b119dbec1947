"""The chaos driver for CalcAgent: the harness's client protocol, over Signals and a Query.

``make_driver(client=, history=, task_queue=, workload=, seed=)`` (see the
harness's ``testbed/engines/byo/target.py``); the harness runs it in this agent's own Python
(``harness.driver_host``). Each conversation is one CalcAgent workflow; each
message is an ``ask`` Signal, acknowledged once the ``answers`` Query shows
its answer: arithmetic, or (``workload.append_ratio`` of them) an append to
the conversation's own notebook file, which the harness's ``lost`` checker
reads back through the target's ``workspace`` and its ``effects`` checker
counts in the ledger. Every operation is recorded as invoke then ok / fail /
info: a signal that errored or an answer that did not show up within
``op_timeout_s`` is ``info`` (it may still be answered later), and nothing is
re-sent.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowHandle

from calc_agent.app import CalcAgent, CalcAgentParams
from harness.operations import INFO, OK

DRIVER_API = 2  # harness/driver_api.py: the version this driver is written for (checked when the target loads)

POLL_S = 0.1
QUERY_TIMEOUT = timedelta(seconds=3)  # a query waits for a worker; a dead one must not stall the poll


@dataclass
class Question:
    text: str
    expect: str
    kind: str = "calc"  # or "append"
    path: str | None = None
    content: str | None = None


@dataclass
class CalcSession:
    workflow_id: str
    questions: list[Question]
    started: bool = False
    final_answers: list[dict[str, Any]] | None = None
    final_status: str | None = None

    def as_conversation(self) -> dict[str, Any]:
        """The shape the lost checker reads: chat messages, one user/assistant pair per answer."""
        history = None
        if self.final_answers is not None:
            history = []
            for a in self.final_answers:
                history += [{"role": "user", "content": a["question"]}, {"role": "assistant", "content": a["answer"]}]
        return {
            "workflow_id": self.workflow_id,
            "started": self.started,
            "planned": [{"text": q.text, "expect": q.expect, "kind": q.kind, "path": q.path, "content": q.content}
                        for q in self.questions],
            "final_history": history,
            "final_status": self.final_status,
        }


@dataclass
class CalcLoad:
    client: Client
    history: Any  # records operations (the harness's operation log)
    task_queue: str
    workload: Any  # the scenario's workload: conversations, messages, think_s, op_timeout_s, append_ratio
    seed: int
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    sessions: list[CalcSession] = field(default_factory=list)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        appends = getattr(self.workload, "append_ratio", 0.0)
        for i in range(self.workload.conversations):
            questions = []
            for n in range(self.workload.messages):
                if rng.random() < appends:
                    path, token = f"log-{i}.txt", f"note-{n}-{rng.randrange(10**6):06d};"
                    questions.append(Question(f"append {token} to {path}", f"appended {len(token)} bytes to {path}",
                                              "append", path, token))
                else:
                    a, b = rng.randrange(2, 999), rng.randrange(2, 99)
                    questions.append(Question(f"What is {a} * {b}?", f"{a} * {b} = {a * b}"))
            self.sessions.append(CalcSession(f"byo-{self.tag}-{i}", questions))

    @property
    def workflow_ids(self) -> list[str]:
        return [s.workflow_id for s in self.sessions]

    async def run(self) -> None:
        await asyncio.gather(*(self._converse(i, s) for i, s in enumerate(self.sessions)))

    async def _converse(self, i: int, session: CalcSession) -> None:
        process, rng = f"client-{i}", random.Random(f"{self.seed}-{i}")
        op = self.history.invoke(process, "start_conversation", {"conversation": session.workflow_id})
        try:
            handle = await self.client.start_workflow(CalcAgent.run, CalcAgentParams(), id=session.workflow_id,
                                                      task_queue=self.task_queue, task_timeout=timedelta(seconds=5))
            session.started = True
            self.history.complete(op, OK)
        except Exception as exc:  # the conversation cannot go on
            self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")
            return
        asked: Counter[str] = Counter()
        for n, q in enumerate(session.questions):
            await asyncio.sleep(rng.expovariate(1.0 / self.workload.think_s) if self.workload.think_s else 0)
            op = self.history.invoke(process, "send_message",
                                     {"conversation": session.workflow_id, "n": n, "text": q.text, "expect": q.expect})
            asked[q.text] += 1
            try:
                await handle.signal(CalcAgent.ask, q.text)
            except Exception as exc:  # the signal may or may not have landed
                self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")
                continue
            answer = await self._await_answer(handle, q.text, asked[q.text])
            if answer is None:
                self.history.complete(op, INFO, error=f"no answer within {self.workload.op_timeout_s}s")
            else:
                self.history.complete(op, OK, {"reply": answer})

    async def _await_answer(self, handle: WorkflowHandle, text: str, occurrence: int) -> str | None:
        """Poll ``answers`` until the ``occurrence``-th answer to ``text`` shows up, or the op timeout passes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.workload.op_timeout_s
        while loop.time() < deadline:
            try:
                answers = await handle.query(CalcAgent.answers, rpc_timeout=QUERY_TIMEOUT)
                matching = [a["answer"] for a in answers if a["question"] == text]
                if len(matching) >= occurrence:
                    return matching[occurrence - 1]
            except Exception:  # a worker is down or restarting: keep asking until the deadline
                pass
            await asyncio.sleep(POLL_S)
        return None

    async def finish(self) -> None:
        """Close every conversation, wait for it to complete and read its answers."""
        for i, session in enumerate(self.sessions):
            if not session.started:
                continue
            process = f"client-{i}"
            handle = self.client.get_workflow_handle(session.workflow_id)
            op = self.history.invoke(process, "end_chat", {"conversation": session.workflow_id})
            try:
                await handle.signal(CalcAgent.close)
                result = await asyncio.wait_for(handle.result(), timeout=self.workload.op_timeout_s)
                self.history.complete(op, OK, {"answers": len(result)})
            except Exception as exc:
                self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")
            op = self.history.invoke(process, "read_conversation", {"conversation": session.workflow_id})
            try:
                session.final_answers = await handle.query(CalcAgent.answers)
                session.final_status = (await handle.describe()).status.name
                self.history.complete(op, OK, {"answers": len(session.final_answers), "status": session.final_status})
            except Exception as exc:
                self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")

    def to_json(self) -> dict[str, Any]:
        return {"workload": vars(self.workload), "conversations": [s.as_conversation() for s in self.sessions]}


def make_driver(*, client: Client, history: Any, task_queue: str, workload: Any, seed: int) -> CalcLoad:
    return CalcLoad(client, history, task_queue, workload, seed)
