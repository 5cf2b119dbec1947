"""lost: nothing lost; every conversation completed with the expected answers.

- every started conversation ended ``COMPLETED`` (after ``end_chat``);
- every acknowledged ``send_message`` (ok) got exactly its expected reply,
  and its message is in the final conversation exactly once;
- a message whose outcome is unknown (info) is there at most once, and if
  it is there, it was answered correctly (if it is not there: unknown);
- no turn failed: a durable agent answers every message, whatever was down;
- each conversation's append file holds exactly the appends the conversation
  processed, in order, once each.
Missing final data (the final read failed) makes the verdict ``unknown``.
"""

from __future__ import annotations

from typing import Any

from chaos.checker.run_data import RunData
from harness.verdict import FAIL, PASS, UNKNOWN, CheckResult
from harness.operations import FAIL as OP_FAIL
from harness.operations import INFO, OK, pairs


def _answered(messages: list[dict[str, Any]], text: str) -> list[str]:
    """Final replies (assistant messages without tool calls ending a turn) to each occurrence of ``text``."""
    replies = []
    for i, m in enumerate(messages):
        if m["role"] == "user" and m["content"] == text:
            reply = None
            for later in messages[i + 1:]:
                if later["role"] == "user":
                    break
                if later["role"] == "assistant" and not later.get("tool_calls"):
                    reply = later.get("content")
            replies.append(reply)
    return replies


def _matches(reply: str | None, expect: str, how: str = "exact") -> bool:
    return reply is not None and (reply.startswith(expect) if how == "prefix" else reply == expect)


def check(data: RunData) -> CheckResult:
    problems: list[str] = []
    unknowns: list[str] = []
    convs = {c["workflow_id"]: c for c in data.conversations["conversations"]}
    sends = [(inv, done) for inv, done in pairs(data.ops) if inv.f == "send_message"]
    acked = lost = 0
    for wid, conv in convs.items():
        if not conv["started"]:
            unknowns.append(f"{wid}: never started (start outcome unknown)")
            continue
        if conv["final_history"] is None:
            unknowns.append(f"{wid}: final read failed; cannot tell what it holds")
            continue
        if conv["final_status"] != "COMPLETED":
            problems.append(f"{wid}: ended {conv['final_status']}, not COMPLETED")
        messages = conv["final_history"]
        processed_appends = []
        for planned in conv["planned"]:
            replies = _answered(messages, planned["text"])
            if len(replies) == 1 and _matches(replies[0], planned["expect"], planned.get("match", "exact")) \
                    and planned["kind"] == "append":
                processed_appends.append(planned["content"])
        for inv, done in sends:
            if inv.value["conversation"] != wid:
                continue
            text, expect, how = inv.value["text"], inv.value["expect"], inv.value.get("match", "exact")
            replies = _answered(messages, text)
            kind = done.type if done else INFO
            if kind == OK:
                acked += 1
                if not _matches(done.value["reply"], expect, how):
                    problems.append(f"{wid} #{inv.value['n']}: acknowledged reply {done.value['reply']!r} != {expect!r}")
                if len(replies) != 1:
                    lost += len(replies) == 0
                    problems.append(f"{wid} #{inv.value['n']}: acknowledged message is in the conversation "
                                    f"{len(replies)} times (expected once)")
            elif kind == OP_FAIL:
                # The agent answered "failed": a durable agent does not drop a turn because something was down.
                problems.append(f"{wid} #{inv.value['n']}: the turn failed instead of being answered: "
                                f"{(done.error or '')[:160]}")
            else:
                if not replies:
                    why = (done.error or "no reply") if done else "never completed: the load was abandoned at settle"
                    unknowns.append(f"{wid} #{inv.value['n']}: outcome unknown ({why[:80]}) "
                                    "and the message is not in the conversation")
                if len(replies) > 1:
                    problems.append(f"{wid} #{inv.value['n']}: message with outcome {kind} is there {len(replies)} times")
                elif replies and not _matches(replies[0], expect, how):
                    problems.append(f"{wid} #{inv.value['n']}: processed with reply {replies[0]!r} != {expect!r}")
        paths = sorted({p["path"] for p in conv["planned"] if p["kind"] == "append"})
        workspace = data.workspace(wid)
        if paths and workspace is None:
            unknowns.append(f"{wid}: appends to {', '.join(paths)} were planned but the target declares no "
                            "workspace, so the files cannot be read")
            paths = []
        for path in paths:
            f = workspace / path
            got = f.read_text() if f.exists() else ""
            appends = [p for p in conv["planned"] if p["kind"] == "append" and p["path"] == path]
            want = "".join(p["content"] for p in appends if p["content"] in processed_appends)
            if got != want:
                problems.append(f"{wid}: {path} holds {got!r}, expected {want!r} (each processed append once, in order)")
    details = {"acknowledged": acked, "lost": lost, "problems": problems[:50], "unknowns": unknowns}
    if problems:
        return CheckResult("lost", FAIL, f"{len(problems)} problem(s); first: {problems[0]}", details)
    if unknowns:
        return CheckResult("lost", UNKNOWN, f"{len(unknowns)} conversation(s) could not be checked: {unknowns[0]}", details)
    if not convs:
        return CheckResult("lost", UNKNOWN, "no conversations were run", details)
    return CheckResult("lost", PASS, f"{len(convs)} conversations complete; {acked} acknowledged messages all answered "
                                     "correctly, none lost or doubled", details)
