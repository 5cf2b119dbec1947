"""context: each model request of a conversation is a consistent continuation of what the model saw and said.

Read from the model's record (``model_record.jsonl``, ``harness.model_record``): every request the agent sent
while a task was in its conversation, as the model saw it. Whatever the framework re-serialises (timestamps,
chat completions or Responses shapes), items are compared by meaning: user text and tokens, tool names,
arguments (canonical JSON) and call ids. For each request:

- **one conversation**: every task token it holds was planned for the same conversation (nothing from another);
- **each user message once**: no task token appears twice (a user message appended again on a retried turn);
- **each tool call answered exactly once before the next step**: every call in it has exactly one result, after
  it; no result answers a call the request does not hold (a tool result dropped or doubled after a restart);
- **the model's own outputs unchanged**: every call in it is one the model made (its id known from the record's
  answers), with the same name and arguments; every text the agent presents as the model's holds one of the
  model's answers (a final answer it gave this conversation).

A framework may leave earlier turns out (a window, a summary): that is never a failure here; what a request holds
must be consistent, not complete. Not applicable to a run that sent no task; ``unknown`` without a record.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from chaos.checker.replies import tasks
from chaos.checker.run_data import RunData
from harness.verdict import FAIL, NOT_APPLICABLE, PASS, UNKNOWN, CheckResult


def check(data: RunData) -> CheckResult:
    planned = tasks(data)
    if not any(planned.values()):
        return CheckResult("context", NOT_APPLICABLE, "the run sent no task messages: the model's record has no "
                                                      "conversation to follow")
    record = data.model_record
    if record is None:
        return CheckResult("context", UNKNOWN, "the run sent tasks but has no model record (model_record.jsonl)")
    owner = {p["content"]: wid for wid, ps in planned.items() for p in ps}
    issued: dict[str, dict[str, tuple[str, str]]] = {}  # conversation -> call id -> (name, args) the model issued
    said: dict[str, set[str]] = {}  # conversation -> the texts the model said
    problems: list[str] = []
    checked = 0
    for entry in record.entries:
        wids = {owner.get(t) for t in entry["tokens"]}
        where = f"request {entry.get('n')} (turn {entry.get('token')}, step {entry.get('step')})"
        if None in wids or len(wids) != 1:
            strangers = sorted(t for t in entry["tokens"] if owner.get(t) != owner.get(entry.get("token")))
            problems.append(f"{where}: holds tasks of more than one conversation or none planned ({strangers[:4]})")
            continue
        wid = wids.pop()
        calls, texts = issued.setdefault(wid, {}), said.setdefault(wid, set())
        checked += 1
        problems += [f"{wid} {where}: {p}" for p in _consistent(entry["seen"], calls, texts)]
        for item in entry["answer"]:  # what the model says now, for the requests after this one
            if item["k"] == "call":
                calls[item.get("id", "")] = (item.get("name", ""), item.get("args", ""))
            elif item["k"] == "say":
                texts.add(item.get("text", ""))
    details = {"requests_checked": checked, "conversations": len(issued), "problems": problems[:50],
               "record_torn_last_line": record.torn_last_line, "record_truncated": record.truncated}
    if problems:
        return CheckResult("context", FAIL, f"{len(problems)} problem(s); first: {problems[0]}", details)
    if not checked:
        return CheckResult("context", UNKNOWN, "the model's record holds no request of the run's tasks", details)
    cut = "; the record reached its bound: later requests were not recorded" if record.truncated else ""
    return CheckResult("context", PASS, f"{checked} model request(s) over {len(issued)} conversation(s), each a "
                                        "consistent continuation: every user message once, every tool call "
                                        "answered exactly once, the model's outputs as it gave them" + cut, details)


def _consistent(seen: list[dict[str, Any]], calls: dict[str, tuple[str, str]], texts: set[str]) -> list[str]:
    """What is wrong with one request's items, given what the model had issued and said before it."""
    problems = []
    tokens = Counter(t for item in seen if item["k"] == "user" for t in item.get("tokens") or [])
    for token, n in tokens.items():
        if n > 1:
            problems.append(f"the user message of {token} is there {n} times (appended again?)")
    open_calls: dict[str, int] = {}
    answered: Counter[str] = Counter()
    for i, item in enumerate(seen):
        if item["k"] == "call":
            cid = item.get("id", "")
            mine = calls.get(cid)
            if mine is None:
                problems.append(f"a tool call {item.get('name')!r} (id {cid[:40]}) the model never made")
            elif mine != (item.get("name", ""), item.get("args", "")):
                problems.append(f"the model's call {cid[:40]} changed: {mine[0]}({mine[1][:80]}) became "
                                f"{item.get('name')}({str(item.get('args'))[:80]})")
            open_calls[cid] = i
        elif item["k"] == "result":
            cid = item.get("id", "")
            if cid not in open_calls:
                problems.append(f"a tool result for {cid[:40]}, a call the request does not hold before it")
            answered[cid] += 1
        elif item["k"] == "say" and texts and not any(t and t in item.get("text", "") for t in texts):
            if _looks_final(item.get("text", "")):
                problems.append(f"an answer the model never gave: {item.get('text', '')[:120]!r}")
    for cid in open_calls:
        if answered[cid] != 1:
            problems.append(f"the model's call {cid[:40]} is answered {answered[cid]} times, not once, before the "
                            "next step")
    return problems


def _looks_final(text: str) -> bool:
    """A text presented as the model's that claims a task's final answer (the planner's wording)."""
    return text.startswith("Request req-") or '"Request req-' in text
