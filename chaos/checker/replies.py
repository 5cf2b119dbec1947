"""replies: every acknowledged task got the model's own final answer for its turn, once, in order.

A task (a planned message of kind ``task``) carries a token; the scripted model planned its turn and gave a
final answer carrying it (``model_record.jsonl``: ``harness.model_record``). The model's record is the oracle,
whatever the agent's framework, language or reply shape:

- each acknowledged send's reply contains the model's final answer for *its* token (the record's ``mark``: the
  answer's text, or the string of a structured answer that carries the token). A reply that lacks it fails,
  naming what it holds instead: another turn's answer (stale, or another turn's), or nothing the model said.
  A reply that carries its own answer twice, or another turn's answer beside it, fails too;
- the model gave that token a final answer at all: a reply to a turn the model never finished came from
  somewhere else (a cache, a guess): fail;
- a send whose turn failed fails (a durable agent answers every message, whatever was down);
- an indeterminate send (info) may be absent from the conversation; present, it must be answered as an
  acknowledged one would;
- the final conversation (the driver's final read) holds each acknowledged task once, in the order sent
  (its user message found by its token, however the agent wrapped it); an indeterminate one at most once.

Not applicable to a run that sent no task. ``unknown`` where the record is missing or cut short (its bound) before
a turn it would judge, or the final conversation was not read.
"""

from __future__ import annotations

from typing import Any

from chaos.checker.run_data import RunData
from harness.chat_driver import reply_after
from harness.model_record import TOKEN
from harness.operations import FAIL as OP_FAIL
from harness.operations import INFO, OK, pairs
from harness.verdict import FAIL, NOT_APPLICABLE, PASS, UNKNOWN, CheckResult


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(c.get("text", c) if isinstance(c, dict) else c) for c in content)
    return "" if content is None else str(content)


def tasks(data: RunData) -> dict[str, list[dict[str, Any]]]:
    """Conversation -> its planned tasks, in order."""
    return {c["workflow_id"]: [p for p in c["planned"] if p["kind"] == "task" and p.get("content")]
            for c in data.conversations["conversations"]}


def check(data: RunData) -> CheckResult:
    planned = tasks(data)
    if not any(planned.values()):
        return CheckResult("replies", NOT_APPLICABLE, "the run sent no task messages (its messages follow the "
                                                      "scripted model's conventions: lost judges them)")
    record = data.model_record
    if record is None:
        return CheckResult("replies", UNKNOWN, "the run sent tasks but has no model record (model_record.jsonl): "
                                               "what the model answered cannot be read")
    finals = record.finals()
    marks = {t: m for t, ms in finals.items() for m in ms}
    problems: list[str] = []
    unknowns: list[str] = []
    counts = {"acknowledged": 0, "answered_by_the_model": 0, "indeterminate_absent": 0, "indeterminate_present": 0}
    convs = {c["workflow_id"]: c for c in data.conversations["conversations"]}
    sends = [(inv, done) for inv, done in pairs(data.ops) if inv.f == "send_message"]
    by_text = {p["text"]: p for ps in planned.values() for p in ps}
    for wid, conv_tasks in planned.items():
        if not conv_tasks:
            continue
        history = convs[wid].get("final_history")
        order = _tokens_in_order(history) if isinstance(history, list) else None
        if order is None:
            unknowns.append(f"{wid}: its final conversation was not read, so what it holds cannot be checked")
        mine = [(inv, done) for inv, done in sends if inv.value.get("conversation") == wid
                and inv.value.get("text") in by_text]
        acked_order = []
        for inv, done in mine:
            task = by_text[inv.value["text"]]
            token, n = task["content"], inv.value.get("n")
            kind = done.type if done is not None else INFO
            seen = order.count(token) if order is not None else None
            own = marks.get(token)
            if kind == OK:
                counts["acknowledged"] += 1
                acked_order.append(token)
                reply = _text((done.value or {}).get("reply"))
                _judge(wid, n, token, reply, own, marks, record.truncated, problems, unknowns, counts)
                if seen is not None and seen != 1:
                    problems.append(f"{wid} #{n} ({token}): acknowledged, but in the final conversation {seen} "
                                    "times (expected once)")
            elif kind == OP_FAIL:
                problems.append(f"{wid} #{n} ({token}): the turn failed instead of being answered: "
                                f"{(done.error or '')[:160]}")
            elif seen == 0:
                counts["indeterminate_absent"] += 1
            elif seen is not None:
                counts["indeterminate_present"] += 1
                acked_order.append(token)
                if seen > 1:
                    problems.append(f"{wid} #{n} ({token}): indeterminate, and in the final conversation {seen} times")
                reply = reply_after(history, "", 1, token)
                if reply is None:
                    problems.append(f"{wid} #{n} ({token}): taken (in the conversation) but never answered")
                else:
                    _judge(wid, n, token, reply, own, marks, record.truncated, problems, unknowns, counts)
        if order is not None:
            kept = [t for t in order if t in acked_order]
            if kept != [t for t in acked_order if t in kept] or len(set(kept)) != len(kept):
                problems.append(f"{wid}: the final conversation holds the tasks in the order {kept[:8]}, not the "
                                f"order they were sent {acked_order[:8]}")
    details = {**counts, "problems": problems[:50], "unknowns": unknowns[:20],
               "record_torn_last_line": record.torn_last_line, "record_truncated": record.truncated}
    if problems:
        return CheckResult("replies", FAIL, f"{len(problems)} problem(s); first: {problems[0]}", details)
    if unknowns:
        return CheckResult("replies", UNKNOWN, f"{len(unknowns)} could not be checked: {unknowns[0]}", details)
    return CheckResult("replies", PASS, f"{counts['acknowledged']} acknowledged task(s) each answered with the "
                                        "model's own final answer for its turn, once, in order; "
                                        f"{counts['indeterminate_present']} indeterminate one(s) processed, "
                                        f"{counts['indeterminate_absent']} not (legal)", details)


def _judge(wid: str, n: Any, token: str, reply: str, own: str | None, marks: dict[str, str], truncated: bool,
           problems: list[str], unknowns: list[str], counts: dict[str, int]) -> None:
    """One reply against the model's final answer for its token."""
    others = sorted(t for t, m in marks.items() if t != token and m in reply)
    shown = reply[:160]
    if own is None:
        if truncated:
            unknowns.append(f"{wid} #{n} ({token}): the model record reached its bound before this turn")
        else:
            held = f"the answer to {others[0]} (another turn's)" if others else "nothing the model said"
            problems.append(f"{wid} #{n} ({token}): replied {shown!r}, which holds {held}, and the model never gave "
                            "this turn a final answer: the reply came from somewhere else (a cache, a stale state)")
        return
    times = reply.count(own)
    if times == 0:
        what = f"the answer to {others[0]} (another turn's, or a stale one)" if others else "nothing the model said"
        problems.append(f"{wid} #{n} ({token}): replied {shown!r}, which holds {what}, not the model's answer "
                        f"{own!r}")
    elif times > 1:
        problems.append(f"{wid} #{n} ({token}): the reply holds the model's answer {times} times: {shown!r}")
    elif others:
        problems.append(f"{wid} #{n} ({token}): the reply also holds the answer to {others[0]}: {shown!r}")
    else:
        counts["answered_by_the_model"] += 1


def _tokens_in_order(history: list[dict[str, Any]]) -> list[str]:
    """The task tokens of the user messages of a final conversation, in order (one per user message)."""
    out = []
    for m in history:
        if isinstance(m, dict) and m.get("role") == "user":
            found = TOKEN.findall(_text(m.get("content")))
            if found:
                out.append(found[-1])
    return out
