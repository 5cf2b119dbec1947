"""lost: nothing lost; every conversation completed with the expected answers.

What a conversation holds is read from the server: the updates its saved
event history records as accepted, with their replies (across continue-as-new).
The driver's Query of the conversation (which needs a live worker) is only a
cross-check of what the model saw; an agent whose messages are not updates
(signals) is read from its driver's final read instead.

- every started conversation ended ``COMPLETED`` (after ``end_chat``; still ``RUNNING`` for a ``[chat]``
  target that declares no ``end``, or a conversation that declares ``ends: false``);
- tasks (kind ``task``: a neutral message carrying a token) are left to the ``replies`` check, which judges them
  by the model's record; the properties below are of the other messages;
- every acknowledged ``send_message`` (ok) got exactly its expected reply,
  and its message is in the conversation exactly once;
- an indeterminate send (info: timed out, or never completed) may or may not
  have happened (Jepsen's semantics): absent is legal (counted), present once
  counts as acknowledged and must be answered correctly; twice is a failure.
  Absent is not legal when the client was still sending it the scenario's
  ``recovery_within_s`` after the faults healed: the agent was not taking
  messages any more (a liveness failure, e.g. a workflow task that fails on
  every try of one update);
- no turn failed: a durable agent answers every message, whatever was down;
- each conversation's append file holds exactly the appends the conversation
  processed, in order, once each;
- each planned note (kind ``note``: its ``content`` is a unique token) is checked
  against the effects the external effects service applied (``effects_service.jsonl``,
  an effect whose text holds the token): an acknowledged note applied exactly once
  (absent: lost); any note applied more than once fails (``effects`` says so too);
  an indeterminate one may be absent or applied once.
A conversation whose final state could not be read at all is ``unknown``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from chaos.checker.run_data import RunData
from chaos.checker.run_data import reply_matches as _matches
from chaos.checker.workflow_tasks import RECOVERY_WITHIN_S
from harness.verdict import FAIL, PASS, UNKNOWN, CheckResult
from harness.operations import FAIL as OP_FAIL
from harness.event_history import UNREADABLE
from harness.operations import INFO, OK, Op, pairs
from harness.run_files import RefusedPath


def _answers_by_text(messages: list[dict[str, Any]]) -> dict[str, list[str | None]]:
    """Each user message's text -> the final reply (the last assistant message without tool calls before the next
    user message; None: none) to each of its occurrences, in order: one pass, however long the conversation."""
    out: dict[str, list[str | None]] = {}
    current: list[str | None] | None = None  # the list holding the open turn's reply
    for m in messages:
        if m["role"] == "user":  # content that is not text (parts) is no planned message: its turn is not kept
            current = out.setdefault(m["content"], []) if isinstance(m["content"], str) else []
            current.append(None)
        elif current is not None and m["role"] == "assistant" and not m.get("tool_calls"):
            current[-1] = m.get("content")
    return out


def _uses_updates(data: RunData, wids: list[str]) -> bool:
    """Whether the agent takes messages as updates whose text the server's history shows (then the history is
    the conversation); an agent that takes them as signals leaves none, and its driver's final read is used. A
    ``[chat]`` target whose update argument is more than the text, or whose reply sits at a path in the result,
    is read by its driver (``harness.chat_driver`` reads the same history, through those paths)."""
    chat = data.target.get("chat") if isinstance(data.target, dict) else None
    if isinstance(chat, dict) and (chat.get("message_arg", "{text}") != "{text}" or chat.get("reply_path")):
        return False
    return any(u.text != UNREADABLE for wid in wids for u in (data.updates(wid) or []))


def _notes_applied(data: RunData) -> Counter[str] | None:
    """Planned note token -> how many effects the effects service applied holding it; None: the run has no
    effects service log."""
    tokens = {p["content"] for c in data.conversations["conversations"] for p in c["planned"]
              if p["kind"] == "note" and p.get("content")}
    log = data.effects_log if tokens else None
    if log is None:
        return None
    applied: Counter[str] = Counter()
    for e in log.of("effect"):
        text = e.get("text") or ""
        applied.update(t for t in tokens if t in text)
    return applied
def _ends_running(data: RunData) -> bool:
    """A ``[chat]`` target with no ``end`` signal: its conversations are expected to be still RUNNING."""
    chat = data.target.get("chat") if isinstance(data.target, dict) else None
    return isinstance(chat, dict) and chat.get("style") != "workflow_per_message" and not chat.get("end")


@dataclass
class _Found:
    """What the properties found over the conversations: problems fail the check, unknowns make it unknown."""

    problems: list[str] = field(default_factory=list)
    unknowns: list[str] = field(default_factory=list)
    acked: int = 0
    lost: int = 0
    wrong: int = 0
    absent_info: int = 0
    present_info: int = 0
    notes_checked: int = 0
    notes_lost: int = 0
    notes_doubled: int = 0
    liveness: int = 0  # how many of the problems are of liveness alone (a message still not taken after the heal)


@dataclass
class _Conversation:
    """One conversation as the properties read it: from the server's accepted updates (``updates``, one message
    per update id in ``messages``) or else from the driver's final read (``query``)."""

    wid: str
    planned: list[dict[str, Any]]
    updates: list[Any] | None
    query: Any
    messages: dict[str, list[Any]] = field(default_factory=dict)

    by_text: dict[str, list[str | None]] = field(default_factory=dict)  # ``replies_to``'s answers, read once
    seen: dict[str, list[str | None]] = field(default_factory=dict)  # the final read's answers (``_answered``)

    def __post_init__(self) -> None:
        for u in self.updates or []:
            self.messages.setdefault(u.update_id, []).append(u)
        for copies in self.messages.values():
            done = [u for u in copies if u.outcome == "completed"]
            self.by_text.setdefault(copies[0].text, []).append(done[0].reply if done else None)
        if self.query is not None:
            self.seen = _answers_by_text(self.query)

    def replies_to(self, text: str) -> list[str | None]:
        """Each occurrence of the message ``text`` in the conversation, with its reply (None: never answered)."""
        return list((self.by_text if self.updates is not None else self.seen).get(text, []))


def check(data: RunData) -> CheckResult:
    """The properties of the module's docstring, conversation by conversation."""
    found = _Found()
    convs = {c["workflow_id"]: c for c in data.conversations["conversations"]}
    tasks = {p["text"] for c in convs.values() for p in c["planned"] if p["kind"] == "task"}
    sends = [(inv, done) for inv, done in pairs(data.ops) if inv.f == "send_message"
             and inv.value.get("text") not in tasks]  # a task's reply is judged by the replies check
    from_server = _uses_updates(data, list(convs))
    expected_status = "RUNNING" if _ends_running(data) else "COMPLETED"
    heal = next((inv.time for inv, _ in pairs(data.ops) if inv.f == "phase:heal"), None)
    final_at = next((inv.time for inv, _ in pairs(data.ops) if inv.f == "phase:final"), None)
    limit = float((data.run.get("scenario") or {}).get("recovery_within_s") or RECOVERY_WITHIN_S)
    applied = _notes_applied(data)
    by_conversation: dict[str, list[tuple[Op, Op | None]]] = {}
    for inv, done in sends:
        by_conversation.setdefault(inv.value["conversation"], []).append((inv, done))
    for wid, conv in convs.items():
        status = data.server_status(wid) if from_server else None
        if not conv["started"] and status is None:
            found.unknowns.append(f"{wid}: never started (start outcome unknown)")
            continue
        c = _Conversation(wid, [p for p in conv["planned"] if p["kind"] != "task"],
                          data.updates(wid) if from_server else None, conv.get("final_history"))
        if c.updates is None and c.query is None:
            found.unknowns.append(f"{wid}: neither a saved event history nor a final read: cannot tell what it holds")
            continue
        _completed(c, status or conv.get("final_status"), "RUNNING" if conv.get("ends") is False else expected_status,
                   found)
        _one_answer_per_message(c, found)
        _model_saw_each_answer(c, found)
        _sends_answered(c, by_conversation.get(wid, []), heal, final_at, limit, found)
        _notes_applied_once(c, by_conversation.get(wid, []), applied, found)
        _append_files_hold_each_append_once(data, c, found)
    return _result(found, len(convs), "the server's event histories" if from_server else "the driver's final read")


def _completed(c: _Conversation, status: str | None, expected: str, found: _Found) -> None:
    """Every started conversation ended ``expected`` (``COMPLETED`` after ``end_chat``; ``RUNNING`` for a
    ``[chat]`` target that declares no ``end``). Reads the server's status, else the driver's final read."""
    if status != expected:
        found.problems.append(f"{c.wid}: ended {status}, not {expected}")


def _one_answer_per_message(c: _Conversation, found: _Found) -> None:
    """One message per update id: a re-send that reached the next run after continue-as-new is the same message,
    answered there from the replies the workflow carried, so every completed copy has the same reply (no second
    turn; if it had taken one, the model's view and the append files would show it twice). Only where the
    conversation is read from the server's updates."""
    for uid, copies in c.messages.items():
        answers = {u.reply for u in copies if u.outcome == "completed"}
        if len(answers) > 1:
            found.problems.append(f"{c.wid}: update {uid} ({copies[0].text!r}) was answered differently in different "
                                  f"runs: {sorted(map(str, answers))}")


def _model_saw_each_answer(c: _Conversation, found: _Found) -> None:
    """Each planned message is in the conversation the model sees (the driver's final read) as many times as the
    server answered it: answered turns stay, a failed one is rolled back by design. Only where both the updates
    and the final read exist (the read needs a live worker)."""
    if c.updates is None or c.query is None:
        return
    for planned in c.planned:
        answered = sum(1 for r in c.replies_to(planned["text"]) if r is not None)
        seen = len(c.seen.get(planned["text"], []))
        if seen != answered:
            found.problems.append(f"{c.wid}: {planned['text']!r} was answered {answered} time(s) but is in the "
                                  f"conversation the model sees {seen} time(s)")


def _sends_answered(c: _Conversation, sends: list[tuple[Op, Op | None]], heal: float | None,
                    final_at: float | None, limit: float, found: _Found) -> None:
    """Every acknowledged send (ok) got exactly its expected reply and is in the conversation once; no turn failed
    (a durable agent answers every message, whatever was down); an indeterminate send (info) may be absent (legal,
    Jepsen's semantics) unless the client was still sending it ``limit`` seconds after the heal (the agent was not
    taking messages: a liveness failure), and present once must be answered correctly; twice fails."""
    for inv, done in sends:
        text, expect, how = inv.value["text"], inv.value["expect"], inv.value.get("match", "exact")
        replies = c.replies_to(text)
        kind = done.type if done else INFO
        if kind == OK:
            found.acked += 1
            if not _matches(done.value["reply"], expect, how):
                found.wrong += 1
                found.problems.append(f"{c.wid} #{inv.value['n']}: acknowledged reply {done.value['reply']!r} != "
                                      f"{expect!r}")
            if len(replies) != 1:
                found.lost += len(replies) == 0
                found.problems.append(f"{c.wid} #{inv.value['n']}: acknowledged message is in the conversation "
                                      f"{len(replies)} times (expected once)")
        elif kind == OP_FAIL:
            # The agent answered "failed": a durable agent does not drop a turn because something was down.
            found.problems.append(f"{c.wid} #{inv.value['n']}: the turn failed instead of being answered: "
                                  f"{(done.error or '')[:160]}")
        elif not replies:
            # It may not have happened: legal (Jepsen), unless the client was still sending it when the agent
            # should long have been answering again: then the agent was not live after the faults healed.
            ended = done.time if done is not None else final_at
            closed = bool(done is not None and isinstance(done.value, dict) and done.value.get("closed"))
            if heal is not None and ended is not None and not closed and ended >= heal + limit:
                found.liveness += 1
                found.problems.append(f"{c.wid} #{inv.value['n']}: still unanswered {ended - heal:.0f}s after the "
                                      f"faults healed (the liveness limit is {limit:.0f}s): the agent never took the "
                                      "message")
            found.absent_info += 1
        elif len(replies) > 1:
            found.problems.append(f"{c.wid} #{inv.value['n']}: message with outcome {kind} is there {len(replies)} "
                                  "times")
        else:
            found.present_info += 1  # it happened: it must have been answered as an acknowledged one would
            if replies[0] is None:
                found.problems.append(f"{c.wid} #{inv.value['n']}: the message was taken (accepted) but never "
                                      "answered")
            elif not _matches(replies[0], expect, how):
                found.wrong += 1
                found.problems.append(f"{c.wid} #{inv.value['n']}: processed with reply {replies[0]!r} != "
                                      f"{expect!r}")


def _notes_applied_once(c: _Conversation, sends: list[tuple[Op, Op | None]], applied: Counter[str] | None,
                        found: _Found) -> None:
    """(``sends``: the conversation's.) Each planned note against the effects the effects service applied (an effect whose text holds its token):
    an acknowledged note applied exactly once (absent: lost), any note at most once. Cannot tell without the
    service's log (``effects_service.jsonl``): unknown."""
    notes = [p for p in c.planned if p["kind"] == "note"]
    if notes and applied is None:
        found.unknowns.append(f"{c.wid}: notes were planned but the run has no effects service log "
                              "(effects_service.jsonl): whether they were saved cannot be read")
    for note in notes if applied is not None else ():
        token = note.get("content") or ""
        found.notes_checked += 1
        outcomes = [done.type if done else INFO for inv, done in sends if inv.value["text"] == note["text"]]
        times = applied[token] if token else 0
        if times > 1:
            found.notes_doubled += 1
            found.problems.append(f"{c.wid}: note {token!r} was applied {times} times by the effects service "
                                  "(expected once)")
        elif times == 0 and OK in outcomes:
            found.notes_lost += 1
            found.lost += 1
            found.problems.append(f"{c.wid}: acknowledged note {token!r} was never applied by the effects service: "
                                  "lost")


def _append_files_hold_each_append_once(data: RunData, c: _Conversation, found: _Found) -> None:
    """Each append file holds exactly the appends the conversation processed (answered correctly, once), in order,
    once each. Cannot read them where the target declares no workspace, or a file is refused: unknown."""
    processed = {p["content"] for p in c.planned if p["kind"] == "append" and (replies := c.replies_to(p["text"]))
                 and len(replies) == 1 and _matches(replies[0], p["expect"], p.get("match", "exact"))}
    paths = sorted({p["path"] for p in c.planned if p["kind"] == "append"})
    if paths and not data.target.get("workspace"):
        found.unknowns.append(f"{c.wid}: appends to {', '.join(paths)} were planned but the target declares no "
                              "workspace, so the files cannot be read")
        paths = []
    for path in paths:
        try:
            got = data.workspace_file(c.wid, path)
        except RefusedPath as exc:  # that file is not read; the others still are
            found.unknowns.append(f"{c.wid}: {path!r} cannot be checked: {exc}")
            continue
        appends = [p for p in c.planned if p["kind"] == "append" and p["path"] == path]
        want = "".join(p["content"] for p in appends if p["content"] in processed)
        if got != want:
            found.problems.append(f"{c.wid}: {path} holds {got!r}, expected {want!r} (each processed append once, "
                                  "in order)")


def _result(found: _Found, conversations: int, source: str) -> CheckResult:
    """The properties' findings as one result: any problem fails it; a conversation not read is unknown."""
    problems, unknowns = found.problems, found.unknowns
    absent_info, present_info, notes_checked = found.absent_info, found.present_info, found.notes_checked
    details = {"acknowledged": found.acked, "lost": found.lost, "wrong_answers": found.wrong,
               "indeterminate_absent": absent_info, "indeterminate_present": present_info, "read_from": source,
               "notes_checked": notes_checked, "notes_lost": found.notes_lost,
               "notes_applied_twice_or_more": found.notes_doubled, "problems": problems[:50], "unknowns": unknowns,
               "liveness_only": bool(problems) and found.liveness == len(problems)}
    if problems:
        return CheckResult("lost", FAIL, f"{len(problems)} problem(s); first: {problems[0]}", details)
    if unknowns:
        return CheckResult("lost", UNKNOWN, f"{len(unknowns)} conversation(s) could not be checked: {unknowns[0]}", details)
    if not conversations:
        return CheckResult("lost", UNKNOWN, "no conversations were run", details)
    info = (f"; {absent_info + present_info} indeterminate send(s): {present_info} processed (answered "
            f"correctly), {absent_info} not (legal)") if absent_info + present_info else ""
    notes = f"; {notes_checked} planned note(s) applied at most once by the effects service, every acknowledged " \
        "one exactly once" if notes_checked else ""
    if not found.acked and not absent_info + present_info:
        return CheckResult("lost", PASS, f"{conversations} conversations ended as declared; no note, append or "
                                         f"arithmetic message was sent (the replies check judges tasks) (read from "
                                         f"{source})", details)
    return CheckResult("lost", PASS, f"{conversations} conversations complete; {found.acked} acknowledged messages "
                                     f"all answered correctly, none lost or doubled{info}{notes} (read from {source})",
                       details)
