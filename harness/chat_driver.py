"""The built-in driver of a target file's ``[chat]`` table: drives a chat agent with no Python from its author.

Runs in the target's own Python (``harness.driver_host``; standard library and temporalio only) under the driver
API (``harness.driver_api``). Three shapes of agent (``style``):

- ``update``: each conversation is one workflow (type ``workflow``, started with ``start_input``); each message
  is the Update ``update`` with the argument ``message_arg``, its update id the message id; the reply is at
  ``reply_path`` in the update's result. A try that ends with no answer (a timeout, a broken link, an update
  lost with a dead worker's task) is re-sent under the same update id, which Temporal de-duplicates, until
  ``op_timeout_s``: then the send is ``info``. Each try that simply runs out of time doubles the next (``next_try_s``).
- ``signal``: each message is the Signal ``signal``; its reply is read by polling the Query ``query`` (the
  conversation: the assistant message after the message's own user message). A signal is re-sent only if its
  argument carries ``{message_id}`` (the agent drops a second copy); without one, a signal whose delivery is
  uncertain is never re-sent, and the run records that statement (a ``no_resend`` event).
- ``workflow_per_message``: each message is a workflow of its own (``start_input`` holds ``{text}``), whose
  result at ``reply_path`` is the reply; its workflow id is the message id (started with REJECT_DUPLICATE: a
  re-sent start can never run the message twice).

Messages are **tasks**: a neutral text carrying a unique token (``Please take care of request req-...``, kind
``task``), which the scripted model answers by planning a turn over the agent's own tools and a final answer
carrying the token (``testbed.task_planner``); the ``replies`` and ``context`` checks judge them against the
model's record. A target that declares a side-effect convention (``effect``: ``note`` or ``append``) gets the
scripted model's conventions instead: arithmetic (``What is {a} * {b}?``, expecting ``{a} * {b} = {a*b}``) and,
for ``append_ratio`` of them, its effect (``save the note '{token}'`` expecting ``saved note {token}``, or
``append {token} to {file}``).

``ends`` (default: whether ``end`` is declared) says whether a chat ends: one that never ends is rightly RUNNING
at the end (it may have continued as new). ``{history_length}`` in ``message_arg`` is the length of the list the
``query`` returns (at ``conversation_path``) just before the message is first sent, for agents whose message
must carry it. A reply (at ``reply_path``) that is a list of strings is read as its lines joined. Every operation is recorded as invoke then ok / fail / info, as
``testbed.engines.temporal.driver`` does. The final conversation is read from the Query when one is declared, else from the
server's event history (the updates each run accepted, and their results).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
import uuid
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from temporalio.client import (Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle,
                               WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError)
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from harness.driver_api import DRIVER_API_VERSION, Workload, at_path, fill_template
from harness.model_record import final_text, make_token
from harness.operations import FAIL, INFO, OK

DRIVER_API = DRIVER_API_VERSION
RETRY_PAUSE_S = (0.5, 2.0)  # between tries of a send: from the first to the last value
POLL_S = 0.2  # between Queries while a signal's reply is awaited
#: a try that simply ran out of time is followed by one twice as long, up to this many times the first: a re-send
#: of a live update only re-attaches to it, so a slow turn re-sent every try adds RPCs and events and nothing else
TRY_GROWTH_MAX = 8.0
QUERY_TIMEOUT = timedelta(seconds=3)  # a query waits for a worker; a dead one must not stall the poll


@dataclass
class Planned:
    text: str
    expect: str
    kind: str  # "task" | "calc" | "note" | "append"
    path: str | None = None
    content: str | None = None
    match: str = "exact"  # "contains": the reply holds ``expect`` (a task's: the model's final answer)


def task_message(tag: str, conversation: int, n: int) -> Planned:
    """Message ``n`` of conversation ``conversation``: a task, a neutral text carrying its token."""
    token = make_token(tag, conversation, n)
    return Planned(f"Please take care of request {token}.", final_text(token), "task", content=token,
                   match="contains")


def plan_message(conversation: int, n: int, rng: random.Random, append_ratio: float, effect: str | None = "note",
                 tag: str = "000000") -> Planned:
    """Message ``n`` of conversation ``conversation``: with no ``effect`` declared, a task; else a side effect
    (``append_ratio`` of them: a note to save, or with ``effect = "append"`` a line appended to the
    conversation's file, read back through the target's ``workspace``) or arithmetic."""
    if effect is None:
        return task_message(tag, conversation, n)
    draw = rng.random()
    if draw < append_ratio and effect == "append":
        path, token = f"log-{conversation}.txt", f"note-{n}-{rng.randrange(10**6):06d};"
        return Planned(f"append {token} to {path}", f"appended {len(token)} bytes to {path}", "append", path, token)
    if draw < append_ratio:
        token = f"note-{conversation}.{n}-{rng.randrange(10**6):06d};"  # unique: the effect's identity
        return Planned(f"save the note '{token}'", f"saved note {token}", "note", content=token)
    a, b = rng.randrange(2, 999), rng.randrange(2, 99)
    return Planned(f"What is {a} * {b}?", f"{a} * {b} = {a * b}", "calc")


def ran_out_of_time(exc: BaseException) -> bool:
    """Whether a try of a send ended only because its time ran out (not on an error)."""
    return isinstance(exc, (asyncio.TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError))


def next_try_s(try_timeout_s: float, timed_out_in_a_row: int) -> float:
    """How long a try of a send waits after ``timed_out_in_a_row`` tries that each simply ran out of time."""
    return try_timeout_s * min(TRY_GROWTH_MAX, 2.0 ** timed_out_in_a_row)


def text_path(template: Any, prefix: str = "") -> str | None:
    """Where ``{text}`` sits in a message template ("" : the argument is the text itself), or None."""
    if template == "{text}":
        return prefix
    if isinstance(template, dict):
        for key, value in template.items():
            found = text_path(value, f"{prefix}.{key}" if prefix else key)
            if found is not None:
                return found
    return None


def as_messages(value: Any, turn_keys: list[str] | None, sent: Collection[str] = ()) -> list[dict[str, Any]]:
    """A conversation as ``role``/``content`` messages: the Query's list itself, or (``turn_keys`` = [the user's
    key, the reply's key]) a list of turns, each a user message and its reply. A list of lines (strings, such as
    ``"User: hi"``, ``"Triage Agent: hello"``) is read without any convention of the agent's: a line holding a
    text the driver ``sent`` is that user message, any other line is the agent's."""
    if not isinstance(value, list):
        raise ValueError(f"the conversation is a {type(value).__name__}, not a list")
    if not turn_keys:
        return [m if isinstance(m, dict) else
                {"role": "user" if any(t in m for t in sent) else "assistant", "content": m}
                for m in value if (isinstance(m, dict) and "role" in m) or isinstance(m, str)]
    user, reply = turn_keys
    out: list[dict[str, Any]] = []
    for turn in value:
        if isinstance(turn, dict) and user in turn:
            out.append({"role": "user", "content": turn[user]})
            if turn.get(reply) is not None:
                out.append({"role": "assistant", "content": turn[reply]})
    return out


def reply_after(messages: list[dict[str, Any]], text: str, occurrence: int, token: str | None = None
                ) -> str | None:
    """The reply to the ``occurrence``-th user message ``text`` (with ``token``: the user message carrying it,
    however the agent wrapped it) (the last assistant message before the next user message), or None if it is
    not there (yet)."""
    seen = 0
    for i, m in enumerate(messages):
        if m.get("role") == "user" and (token in _reply_text(m.get("content")) if token
                                        else m.get("content") == text):
            seen += 1
            if seen == occurrence:
                reply = None
                for later in messages[i + 1:]:
                    if later.get("role") == "user":
                        break
                    if later.get("role") == "assistant" and not later.get("tool_calls") and later.get("content"):
                        reply = _reply_text(later["content"])
                return reply
    return None


def _reply_text(value: Any) -> str:
    """A reply as text: a list of strings (one line each, e.g. "Agent: text") joined by newlines."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _retrieve(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


@dataclass
class Conversation:
    workflow_id: str
    planned: list[Planned] = field(default_factory=list)
    started: bool = False
    final_history: list[dict[str, Any]] | None = None
    final_status: str | None = None
    ends: bool = True  # False: the chat never ends (RUNNING at the end is right)

    def as_dict(self) -> dict[str, Any]:
        return {"workflow_id": self.workflow_id, "started": self.started,
                "planned": [asdict(p) for p in self.planned], "final_history": self.final_history,
                "final_status": self.final_status, "ends": self.ends}


class ChatDriver:
    """The ``[chat]`` table's driver (see the module docstring); ``chat`` is that table, validated by the
    harness (``testbed.engines.byo.target.ChatTable``)."""

    def __init__(self, *, client: Client, history: Any, task_queue: str, workload: Workload, seed: int,
                 chat: dict[str, Any], on_workflow: Any = None) -> None:
        self.client, self.history, self.task_queue, self.workload, self.seed = client, history, task_queue, workload, seed
        self.chat = chat
        self.style = chat["style"]
        self.tag = uuid.uuid4().hex[:6]
        # the tasks' tokens: of the seed (the same plan on a rerun), unique within the run's model server
        self.token_tag = hashlib.sha256(f"chat-{seed}".encode()).hexdigest()[:6]
        self.ends = chat.get("ends") if chat.get("ends") is not None else bool(chat.get("end"))
        self.on_workflow = on_workflow  # told of each workflow id made after the start (one per message)
        self.statements: list[str] = []
        self._stop = asyncio.Event()
        self._chats = [f"chat-{self.tag}-{i}" for i in range(workload.conversations)]
        self._rngs = [random.Random(f"{seed}-messages-{i}") for i in range(workload.conversations)]
        self.conversations: list[Conversation] = []
        self._per_message: dict[int, list[Conversation]] = {i: [] for i in range(workload.conversations)}
        if self.style != "workflow_per_message":
            self.conversations = [Conversation(wid, ends=self.ends) for wid in self._chats]
        arg = chat.get("message_arg", "{text}")
        self._dedup = "{message_id}" in json.dumps(arg)
        if self.style == "signal" and not self._dedup:
            self.statements.append(
                f"the signal {chat['signal']!r} carries no message id ({{message_id}} is not in message_arg), so "
                "the agent cannot tell a re-sent message from a new one: a signal whose delivery is uncertain is "
                "not re-sent, and is recorded info")

    @property
    def workflow_ids(self) -> list[str]:
        return [c.workflow_id for c in self.conversations]

    def stop(self) -> None:
        self._stop.set()

    # -- the load

    async def run(self) -> None:
        for s in self.statements:
            self.history.event("driver", "no_resend", {"statement": s})
        await asyncio.gather(*(self._drive(i) for i in range(len(self._chats))))

    def _next(self, i: int, sent: int) -> Planned | None:
        if sent >= self.workload.messages and (self._stop.is_set() or not self.workload.until_heal):
            return None
        return plan_message(i, sent, self._rngs[i], self.workload.append_ratio, self.chat.get("effect"),
                            self.token_tag)

    async def _drive(self, i: int) -> None:
        process, rng = f"client-{i}", random.Random(f"{self.seed}-{i}")
        handle = None
        if self.style != "workflow_per_message":
            conv = self.conversations[i]
            op = self.history.invoke(process, "start_conversation", {"conversation": conv.workflow_id})
            try:
                handle = await self._start(conv.workflow_id, self.chat.get("start_input"), {})
                conv.started = True
                self.history.complete(op, OK)
            except Exception as exc:  # nothing else can proceed on this conversation
                self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")
                return
        n = 0
        while True:
            await asyncio.sleep(rng.expovariate(1.0 / self.workload.think_s) if self.workload.think_s else 0)
            msg = self._next(i, n)
            if msg is None:
                return
            if self.style == "workflow_per_message":
                conv = Conversation(f"{self._chats[i]}-m{n}")
                self.conversations.append(conv)
                self._per_message[i].append(conv)
                if self.on_workflow is not None:
                    self.on_workflow(self.workflow_ids)
                message_id = conv.workflow_id
            else:
                message_id = f"{conv.workflow_id}-m{n}"
            conv.planned.append(msg)
            op = self.history.invoke(process, "send_message", {"conversation": conv.workflow_id, "n": n,
                                                               "text": msg.text, "expect": msg.expect,
                                                               "match": msg.match, "message_id": message_id})
            values = {"text": msg.text, "message_id": message_id, "workflow_id": conv.workflow_id, "n": str(n)}
            try:
                if self.style == "update":
                    outcome = await self._send_update(handle, values, process, n, conv, msg)
                elif self.style == "signal":
                    outcome = await self._send_signal(handle, values, process, n, conv, msg)
                else:
                    outcome = await self._send_workflow(conv, values, process)
                self.history.complete(op, *outcome)
            except Exception as exc:  # anything else: the message may or may not have been processed
                self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")
            n += 1

    async def _start(self, workflow_id: str, template: Any, values: dict[str, str]) -> WorkflowHandle:
        args = [] if template is None else [fill_template(template, {"workflow_id": workflow_id, **values})]
        return await self.client.start_workflow(
            self.chat["workflow"], args=args, id=workflow_id, task_queue=self.task_queue,
            task_timeout=timedelta(seconds=self.workload.workflow_task_timeout_s),
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE)

    def _resent(self, process: str, n: int, workflow_id: str, attempt: int, error: str) -> None:
        self.history.event(process, "resend_message", {"conversation": workflow_id, "n": n, "attempt": attempt,
                                                       "after": error})

    async def _retrying(self, try_once: Any, handle: WorkflowHandle | None, process: str, n: int,
                        workflow_id: str, resend: bool) -> tuple[str, Any, str | None]:
        """``try_once(timeout_s)`` until it answers, the workflow closes or ``op_timeout_s`` passes (re-sent only
        when ``resend``): an (ok/fail/info, value, error) outcome."""
        started, attempt, errors, in_a_row = time.monotonic(), 0, [], 0
        deadline = self.workload.op_timeout_s
        while True:
            attempt += 1
            left = deadline - (time.monotonic() - started)
            this_try = max(0.5, min(next_try_s(self.workload.try_timeout_s, in_a_row) if resend else left, left))
            call = asyncio.ensure_future(try_once(this_try))
            call.add_done_callback(_retrieve)
            try:
                return await asyncio.wait_for(call, timeout=this_try + 1.0)
            except (asyncio.TimeoutError, RPCError, WorkflowUpdateRPCTimeoutOrCancelledError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:200])
                in_a_row = in_a_row + 1 if ran_out_of_time(exc) else 0
            closed = handle is not None and await workflow_closed(handle)
            if closed or not resend or time.monotonic() - started >= deadline:
                why = "the workflow has closed" if closed else f"no reply within {deadline:.0f}s"
                return INFO, {"attempts": attempt, "closed": closed}, f"{why}; last: {errors[-1]}"
            self._resent(process, n, workflow_id, attempt + 1, errors[-1])
            await asyncio.sleep(min(RETRY_PAUSE_S[1], RETRY_PAUSE_S[0] * attempt))

    async def _message_arg(self, handle: WorkflowHandle, values: dict[str, Any]) -> Any:
        """The message's argument: ``message_arg`` filled, ``{history_length}`` read from the query first."""
        template = self.chat.get("message_arg", "{text}")
        if "{history_length}" in json.dumps(template):
            result = await handle.query(self.chat["query"], rpc_timeout=QUERY_TIMEOUT * 3)
            listed = at_path(result, self.chat.get("conversation_path", ""))
            values = {**values, "history_length": len(listed) if isinstance(listed, list) else 0}
        return fill_template(template, values)

    async def _send_update(self, handle: WorkflowHandle, values: dict[str, str], process: str, n: int,
                           conv: Conversation, msg: Planned) -> tuple[str, Any, str | None]:
        arg = await self._message_arg(handle, values)
        attempts = 0

        async def once(timeout_s: float) -> tuple[str, Any, str | None]:
            nonlocal attempts
            attempts += 1
            try:
                result = await handle.execute_update(self.chat["update"], arg, id=values["message_id"],
                                                     rpc_timeout=timedelta(seconds=timeout_s))
            except WorkflowUpdateFailedError as exc:  # the workflow's own answer: the turn failed
                if attempts == 1:
                    return FAIL, None, f"update failed: {exc.cause}"
                return await self._rejected_resend(handle, conv, msg, attempts, exc)
            return OK, {"reply": _reply_text(at_path(result, self.chat.get("reply_path", ""))),
                        "attempts": attempts}, None

        return await self._retrying(once, handle, process, n, handle.id, resend=True)

    async def _rejected_resend(self, handle: WorkflowHandle, conv: Conversation, msg: Planned, attempts: int,
                               exc: WorkflowUpdateFailedError) -> tuple[str, Any, str | None]:
        """A re-sent Update the workflow refused, after a try whose outcome is unknown. Temporal de-duplicates an
        update id only within a run: once the run that applied the first try has continued as new, the re-send
        reaches the new run, whose validator may refuse it as stale (the chat has moved on: by that very turn).
        So the refusal does not say the message failed. As a user would, the driver reads the conversation: the
        message answered there is ``ok`` with that reply; otherwise ``info`` (it may or may not have been
        applied), never ``fail``."""
        why = f"update failed when re-sent (try {attempts}), after a try with no answer: {exc.cause}"
        if self.chat.get("query"):
            occurrence = sum(1 for p in conv.planned if p.text == msg.text)
            try:
                reply = reply_after(await self._conversation(handle, QUERY_TIMEOUT * 3), msg.text, occurrence,
                                    msg.content if msg.kind == "task" else msg.text)
            except Exception as read_exc:  # a worker is down: the outcome stays unknown
                return INFO, {"attempts": attempts}, f"{why}; the conversation could not be read: {read_exc}"
            if reply is not None:
                return OK, {"reply": _reply_text(reply), "attempts": attempts, "read_from": "query",
                            "refused_resend": str(exc.cause)}, None
        return INFO, {"attempts": attempts}, f"{why}: the earlier try may have been applied"

    async def _send_signal(self, handle: WorkflowHandle, values: dict[str, str], process: str, n: int,
                           conv: Conversation, msg: Planned) -> tuple[str, Any, str | None]:
        arg = await self._message_arg(handle, values)
        signalled = False

        async def once(timeout_s: float) -> tuple[str, Any, str | None]:
            nonlocal signalled
            await handle.signal(self.chat["signal"], arg, rpc_timeout=timedelta(seconds=timeout_s))
            signalled = True
            return OK, None, None

        outcome = await self._retrying(once, handle, process, n, conv.workflow_id, resend=self._dedup)
        if not signalled:
            return outcome
        occurrence = sum(1 for p in conv.planned if p.text == msg.text)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.workload.op_timeout_s
        while loop.time() < deadline:
            try:
                reply = reply_after(await self._conversation(handle), msg.text, occurrence,
                                    msg.content if msg.kind == "task" else None)
                if reply is not None:
                    return OK, {"reply": _reply_text(reply)}, None
            except Exception:  # a worker is down or restarting: keep asking until the deadline
                pass
            if await workflow_closed(handle):
                return INFO, {"closed": True}, "the workflow has closed with no reply to it"
            await asyncio.sleep(POLL_S)
        return INFO, None, f"signalled, but no reply within {self.workload.op_timeout_s:.0f}s"

    async def _send_workflow(self, conv: Conversation, values: dict[str, str], process: str
                             ) -> tuple[str, Any, str | None]:
        async def once(timeout_s: float) -> tuple[str, Any, str | None]:
            try:
                handle = await self._start(conv.workflow_id, self.chat["start_input"], values)
            except WorkflowAlreadyStartedError:  # an earlier try's start landed: the same workflow
                handle = self.client.get_workflow_handle(conv.workflow_id)
            conv.started = True
            try:
                result = await handle.result(rpc_timeout=timedelta(seconds=timeout_s))
            except WorkflowFailureError as exc:
                return FAIL, None, f"the workflow failed: {exc.cause}"
            return OK, {"reply": _reply_text(at_path(result, self.chat.get("reply_path", "")))}, None

        # No "has it closed?" between tries: before its start lands the workflow does not exist, and once it has
        # closed the next try reads its result.
        return await self._retrying(once, None, process, 0, conv.workflow_id, resend=True)

    # -- the end

    async def finish(self, timeout_s: float = 60.0) -> None:
        await asyncio.gather(*(self._finish(i, c, timeout_s) for i, c in enumerate(self.conversations)))

    async def _finish(self, i: int, conv: Conversation, timeout_s: float) -> None:
        process = f"client-{i}"
        handle = self.client.get_workflow_handle(conv.workflow_id)
        if self.style == "workflow_per_message":
            await self._read_message_workflow(process, conv, handle, timeout_s)
            return
        if not conv.started:
            return
        end = self.chat.get("end")
        if end and conv.ends:
            op = self.history.invoke(process, "end_chat", {"conversation": conv.workflow_id})
            try:
                await handle.signal(end, rpc_timeout=timedelta(seconds=10))
                await asyncio.wait_for(handle.result(), timeout=timeout_s)
                self.history.complete(op, OK)
            except Exception as exc:
                self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")
        op = self.history.invoke(process, "read_conversation", {"conversation": conv.workflow_id})
        try:
            conv.final_status = (await handle.describe(rpc_timeout=timedelta(seconds=10))).status.name
            if self.chat.get("query"):
                conv.final_history = await self._conversation(handle, QUERY_TIMEOUT * 3)
            else:
                conv.final_history = await self._from_history(conv.workflow_id)
            self.history.complete(op, OK, {"status": conv.final_status, "messages": len(conv.final_history)})
        except Exception as exc:
            self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")

    async def _read_message_workflow(self, process: str, conv: Conversation, handle: WorkflowHandle,
                                     timeout_s: float) -> None:
        op = self.history.invoke(process, "read_conversation", {"conversation": conv.workflow_id})
        try:
            try:
                result = await asyncio.wait_for(handle.result(), timeout=timeout_s)
                reply: Any = _reply_text(at_path(result, self.chat.get("reply_path", "")))
            except WorkflowFailureError:
                reply = None
            conv.final_status = (await handle.describe(rpc_timeout=timedelta(seconds=10))).status.name
            conv.started = True
            conv.final_history = [{"role": "user", "content": conv.planned[0].text}]
            if reply is not None:
                conv.final_history.append({"role": "assistant", "content": reply})
            self.history.complete(op, OK, {"status": conv.final_status})
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:  # never started: the message was not taken
                conv.final_status, conv.final_history = None, []
            self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            self.history.complete(op, INFO, error=f"{type(exc).__name__}: {exc}")

    async def _conversation(self, handle: WorkflowHandle, timeout: timedelta = QUERY_TIMEOUT) -> list[dict[str, Any]]:
        result = await handle.query(self.chat["query"], rpc_timeout=timeout)
        sent = {p.text for c in self.conversations if c.workflow_id == handle.id for p in c.planned}  # its own
        return as_messages(at_path(result, self.chat.get("conversation_path", "")), self.chat.get("turn_keys"), sent)

    async def _from_history(self, workflow_id: str) -> list[dict[str, Any]]:
        """The conversation as the server holds it: each update accepted (across continue-as-new), with its reply
        when it completed."""
        convert = self.client.data_converter.payload_converter
        where = text_path(self.chat.get("message_arg", "{text}"))
        runs: list[list[Any]] = []
        run_id: str | None = None
        while len(runs) < 100:  # a chain of runs, newest first, linked by continued_execution_run_id
            history = await self.client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
            runs.insert(0, history.events)
            first = history.events[0].workflow_execution_started_event_attributes if history.events else None
            run_id = first.continued_execution_run_id if first is not None else ""
            if not run_id:
                break
        messages: list[dict[str, Any]] = []
        seen: dict[str, dict[str, Any]] = {}
        for events in runs:
            for ev in events:
                if ev.HasField("workflow_execution_update_accepted_event_attributes"):
                    a = ev.workflow_execution_update_accepted_event_attributes
                    uid = a.accepted_request.meta.update_id
                    if uid in seen:
                        continue
                    payloads = list(a.accepted_request.input.args.payloads)
                    arg = convert.from_payload(payloads[0]) if payloads else None
                    text = at_path(arg, where) if where is not None else arg
                    seen[uid] = {"role": "user", "content": text}
                    messages.append(seen[uid])
                elif ev.HasField("workflow_execution_update_completed_event_attributes"):
                    a = ev.workflow_execution_update_completed_event_attributes
                    uid, done = a.meta.update_id, seen.get(a.meta.update_id)
                    if done is None or done.get("answered") or not a.outcome.HasField("success"):
                        continue
                    payloads = list(a.outcome.success.payloads)
                    result = convert.from_payload(payloads[0]) if payloads else None
                    done["answered"] = True
                    messages.insert(messages.index(done) + 1, {"role": "assistant", "content": _reply_text(
                        at_path(result, self.chat.get("reply_path", "")))})
        for m in messages:
            m.pop("answered", None)
        return messages

    def to_json(self) -> dict[str, Any]:
        return {"workload": asdict(self.workload), "chat": self.chat, "statements": self.statements,
                "conversations": [c.as_dict() for c in self.conversations]}


async def workflow_closed(handle: WorkflowHandle) -> bool:
    """Whether the workflow has closed (a failed describe says nothing: not closed, as far as we know)."""
    try:
        desc = await handle.describe(rpc_timeout=timedelta(seconds=5))
    except RPCError as exc:
        return exc.status == RPCStatusCode.NOT_FOUND
    except Exception:
        return False
    return desc.status is not None and desc.status != WorkflowExecutionStatus.RUNNING


def make_driver(*, client: Client, history: Any, task_queue: str, workload: Workload, seed: int,
                chat: dict[str, Any] | None = None, on_workflow: Any = None) -> ChatDriver:
    if chat is None:
        raise ValueError("the chat driver needs the target's [chat] table")
    return ChatDriver(client=client, history=history, task_queue=task_queue, workload=workload, seed=seed,
                      chat=chat, on_workflow=on_workflow)
