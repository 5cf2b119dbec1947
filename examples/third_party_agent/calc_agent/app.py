"""CalcAgent: a small calculator agent with a notebook, written the way a third party might.

It shares nothing with this project's agent: questions arrive as Signals
(``ask``), answers are read with a Query (``answers``), a ``close`` Signal
ends it. The run loop takes one question at a time from its inbox and lets
the model decide: ``call_model`` (a plain httpx POST to an OpenAI-style
``/chat/completions``), then ``calculate`` for each ``calculator`` tool call
and ``append_note`` for each ``append_file`` call, then ``call_model`` again
with the results, until the model answers in text.

``append_note`` has a side effect (it appends to a file of the conversation's)
that no retry may repeat. It applies it through the harness's recording API
(``harness.recording``): ``apply_once`` under the activity's idempotency key,
and every model call and tool run recorded as an execution, so the harness's
``effects`` checker can count what this agent physically did, and its
in-agent faults (a crash right after an effect) reach it without any code of
the harness's inside it.

Layout: inputs, activities, workflow. The workflow does no I/O.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import operator
import os
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    import httpx

    from harness.faults import AgentFaults
    from harness.recording import EffectLedger, ExecutionIdentity, workspace_name

WORKFLOW_NAME = "CalcAgent"
CALCULATOR_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression (+ - * / // % and parentheses).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 12 * 7"}},
            "required": ["expression"],
        },
    },
}
APPEND_TOOL = {
    "type": "function",
    "function": {
        "name": "append_file",
        "description": "Append text to a file of this conversation's notebook.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    },
}
SYSTEM_PROMPT = "You are a calculator assistant. Use the calculator tool for any arithmetic."


# -- inputs ----------------------------------------------------------------------


@dataclass
class CalcAgentParams:
    model: str = "auto"
    max_model_calls: int = 4  # per question; past it the question is answered with an apology


@dataclass
class ModelRequest:
    model: str
    messages: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Calculation:
    expression: str


@dataclass
class Note:
    path: str  # relative to the conversation's notebook
    content: str


# -- activities ------------------------------------------------------------------


class ModelGateway:
    """The model API, reached over HTTP; the worker builds one per model URL."""

    def __init__(self, model_url: str, ledger: EffectLedger, worker: str, request_timeout_s: float = 8.0,
                 answers: Path | None = None) -> None:
        self.model_url = model_url.rstrip("/")
        self.ledger = ledger
        self.worker = worker
        self.request_timeout_s = request_timeout_s  # under the activity's 10 s start-to-close
        self.answers = answers  # each conversation's latest answer (read back only by a planted bug)
        self.mutated = AgentFaults.from_environment().mutated

    def _planted_bugs(self, messages: list[dict[str, Any]], retried: bool) -> dict[str, Any] | None:
        """The planted context bugs (harness.faults.MUTATIONS, off unless the harness plants them): on a retried
        call, the user's message sent again or the previous answer returned; on a restarted worker (a generation
        after the first: it lost the memory of the one that died), the turn's last tool result left out."""
        restarted = self.worker.rpartition("-")[2].isdigit() and int(self.worker.rpartition("-")[2]) > 1
        if self.mutated("context_drops_tool_result") and restarted and any(m["role"] == "tool" for m in messages):
            del messages[max(i for i, m in enumerate(messages) if m["role"] == "tool")]
        if not retried:
            return None
        if self.mutated("context_repeats_user_message"):
            messages.append(next(m for m in reversed(messages) if m["role"] == "user"))
        if self.mutated("stale_reply_after_crash") and self.answers is not None:
            cached = self.answers / _safe(activity.info().workflow_id)
            if cached.is_file():
                return json.loads(cached.read_text())
        return None

    @activity.defn(name="call_model")
    async def call_model(self, request: ModelRequest) -> dict[str, Any]:
        """One chat completion; returns the assistant message. Any HTTP or parse error is retried by Temporal."""
        messages, retried = list(request.messages), activity.info().attempt > 1
        stale = self._planted_bugs(messages, retried)
        if stale is not None:
            return stale
        body = {"model": request.model, "messages": messages, "tools": [CALCULATOR_TOOL, APPEND_TOOL]}
        headers = {"X-DAH-Run": activity.info().workflow_id}
        execution = self.ledger.begin_execution(ExecutionIdentity.current(self.worker), "call_model", model_call=True)
        outcome = "error"
        beat = asyncio.create_task(_heartbeat_every(1.0))
        try:
            # trust_env=False: the model URL is explicit; an HTTP(S)_PROXY in the environment must not reroute it.
            async with httpx.AsyncClient(timeout=self.request_timeout_s, trust_env=False) as http:
                response = await http.post(f"{self.model_url}/chat/completions", json=body, headers=headers)
            response.raise_for_status()
            message = response.json()["choices"][0]["message"]
            outcome = "ok"
            if not message.get("tool_calls") and self.answers is not None:  # the conversation's latest answer
                self.answers.joinpath(_safe(activity.info().workflow_id)).write_text(json.dumps(message))
            return message
        finally:
            beat.cancel()
            self.ledger.end_execution(execution, outcome)


class Notebook:
    """Each conversation's files, under ``<root>/<workspace_name(workflow id)>/``."""

    def __init__(self, root: Path, ledger: EffectLedger, worker: str) -> None:
        self.root = root
        self.ledger = ledger
        self.worker = worker

    @activity.defn(name="append_note")
    async def append_note(self, note: Note) -> str:
        """Append once per activity, however often it is retried; a bad path is an answer, not a retry."""
        ident = ExecutionIdentity.current(self.worker)
        execution = self.ledger.begin_execution(ident, "append_note")
        outcome = "error"
        try:
            folder = self.root / workspace_name(ident.workflow_id)
            target = (folder / note.path).resolve()
            if folder.resolve() not in target.parents:
                outcome = "refused"
                return f"ERROR: {note.path!r} is outside this conversation's notebook"
            data = note.content.encode()

            def apply() -> dict[str, Any]:
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "ab") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                return {"bytes": len(data)}

            def already_present() -> bool:  # an attempt that died after appending, before recording it
                return target.is_file() and target.read_bytes().endswith(data)

            self.ledger.apply_once(ident, "append_note", note.path, hashlib.sha256(data).hexdigest(), apply,
                                   already_present)
            outcome = "ok"
            return f"appended {len(data)} bytes to {note.path}"
        finally:
            self.ledger.end_execution(execution, outcome)


def _safe(workflow_id: str) -> str:
    return hashlib.sha256(workflow_id.encode()).hexdigest()[:32]


async def _heartbeat_every(period_s: float) -> None:
    while True:
        activity.heartbeat()
        await asyncio.sleep(period_s)


_OPERATORS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.USub: operator.neg, ast.UAdd: operator.pos,
}


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"not plain arithmetic: {ast.dump(node)[:80]}")


@activity.defn(name="calculate")
async def calculate(calc: Calculation) -> str:
    """Literal arithmetic only (no names, calls or attributes). A bad expression is an answer, not a retry."""
    try:
        return str(_evaluate(ast.parse(calc.expression, mode="eval")))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"ERROR: {type(exc).__name__}: {exc}"


# -- workflow --------------------------------------------------------------------

RETRY_FOREVER = RetryPolicy(initial_interval=timedelta(seconds=0.5), backoff_coefficient=2.0,
                            maximum_interval=timedelta(seconds=4), maximum_attempts=0)


@workflow.defn(name=WORKFLOW_NAME)
class CalcAgent:
    def __init__(self) -> None:
        self._inbox: list[str] = []
        self._answers: list[dict[str, Any]] = []
        self._closing = False

    @workflow.signal
    def ask(self, question: str) -> None:
        self._inbox.append(question)

    @workflow.signal
    def close(self) -> None:
        self._closing = True  # questions already in the inbox are still answered

    @workflow.query
    def answers(self) -> list[dict[str, Any]]:
        return list(self._answers)

    @workflow.run
    async def run(self, params: CalcAgentParams) -> list[dict[str, Any]]:
        while True:
            await workflow.wait_condition(lambda: bool(self._inbox) or self._closing)
            if not self._inbox:
                return list(self._answers)
            question = self._inbox.pop(0)
            answer, calls = await self._solve(params, question)
            self._answers.append({"question": question, "answer": answer, "model_calls": calls})

    async def _solve(self, params: CalcAgentParams, question: str) -> tuple[str, int]:
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                          {"role": "user", "content": question}]
        for call in range(1, params.max_model_calls + 1):
            reply = await workflow.execute_activity(
                "call_model", ModelRequest(params.model, messages), result_type=dict,
                start_to_close_timeout=timedelta(seconds=10), heartbeat_timeout=timedelta(seconds=3),
                retry_policy=RETRY_FOREVER)
            tool_calls = reply.get("tool_calls") or []
            if not tool_calls:
                return str(reply.get("content") or ""), call
            messages.append({"role": "assistant", "content": reply.get("content"), "tool_calls": tool_calls})
            for tc in tool_calls:
                messages.append({"role": "tool", "tool_call_id": tc["id"], "content": await self._run_tool(tc)})
        return f"Sorry, I could not answer within {params.max_model_calls} model calls.", params.max_model_calls

    async def _run_tool(self, tool_call: dict[str, Any]) -> str:
        fn = tool_call.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
            if fn.get("name") == "calculator":
                return await workflow.execute_activity(
                    calculate, Calculation(str(args["expression"])),
                    start_to_close_timeout=timedelta(seconds=10), retry_policy=RETRY_FOREVER)
            if fn.get("name") == "append_file":
                return await workflow.execute_activity(
                    "append_note", Note(str(args["path"]), str(args["content"])), result_type=str,
                    start_to_close_timeout=timedelta(seconds=10), retry_policy=RETRY_FOREVER)
        except (ValueError, KeyError, TypeError) as exc:
            return f"ERROR: bad {fn.get('name')} arguments ({type(exc).__name__}: {exc})"
        return f"ERROR: unknown tool {fn.get('name')!r}; the tools are calculator and append_file"
