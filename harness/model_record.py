"""The model's record: what each model request of a task asked, and what the scripted model answered.

A *task* is a user message carrying a unique token (``make_token``): the chat driver sends one per turn, and the
scripted model (``testbed.task_planner``) plans the turn over whatever tools the request declares, then gives a
final answer carrying the token. The model server writes every request whose conversation holds a token to
``model_record.jsonl`` in the run directory, one JSON object a line, in one shape whatever the API (chat
completions or Responses, streamed or not):

    {"n": 7, "api": "responses", "stream": false, "token": "req-1a2b3c-0-3", "step": 1,
     "tokens": ["req-1a2b3c-0-0", ..., "req-1a2b3c-0-3"],
     "seen": [ITEM, ...],            what the request holds, in order (system messages left out)
     "answer": [ITEM, ...],          what the model answered
     "final": true, "mark": "Request req-1a2b3c-0-3 is done."}

An ITEM is compared by meaning, not bytes (frameworks re-serialise history): ``{"k": "user", "tokens": [...],
"text": ...}``, ``{"k": "call", "id": ..., "name": ..., "args": <canonical JSON>}``, ``{"k": "result", "id": ...,
"text": ...}``, ``{"k": "say", "text": ...}``. ``mark`` is what a reply must contain to carry the final answer: its
text, or for a structured answer the string field that carries the token.

The record is data: the checkers (``replies``, ``context``) read it by ``harness.run_files``' rules, bounded.
Writing it is bounded too (``RECORD_LIMIT``; past it, one ``{"truncated": true}`` line and nothing more).

Standard library only.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

MODEL_RECORD = "model_record.jsonl"
#: a task's token: ``req-<run tag>-<conversation>-<message>``
TOKEN = re.compile(r"\breq-[0-9a-f]{6}-\d{1,4}-\d{1,6}\b")
#: the most the record grows to (a 50 x 10 run writes a few MB)
RECORD_LIMIT = 256 * 2**20
TEXT_CHARS, ARGS_CHARS = 300, 4000


def make_token(tag: str, conversation: int, n: int) -> str:
    """The token of message ``n`` of conversation ``conversation`` in the run tagged ``tag`` (six hex digits)."""
    return f"req-{tag[:6]}-{conversation}-{n}"


def tokens_in(text: Any) -> list[str]:
    return TOKEN.findall(text) if isinstance(text, str) else []


def final_text(token: str) -> str:
    """The model's final answer to a task, as text: a pure function of the token."""
    return f"Request {token} is done."


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return "" if content is None else json.dumps(content, sort_keys=True, default=str)


def canonical_args(arguments: Any) -> str:
    """A tool call's arguments as canonical JSON (keys sorted, no spaces); unparseable text as it is."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return arguments[:ARGS_CHARS]
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)[:ARGS_CHARS]


def items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as record items, in order (system and developer messages left out)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "user":
            text = _text(m.get("content"))
            out.append({"k": "user", "tokens": tokens_in(text), "text": text[:TEXT_CHARS]})
        elif role == "assistant":
            out += answer_items(m)
        elif role == "tool":
            out.append({"k": "result", "id": str(m.get("tool_call_id", "")),
                        "text": _text(m.get("content"))[:TEXT_CHARS]})
    return out


def answer_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """An assistant message as record items: what it says, then its tool calls."""
    out: list[dict[str, Any]] = []
    text = _text(message.get("content"))
    if text.strip():
        out.append({"k": "say", "text": text[:TEXT_CHARS * 4]})
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        out.append({"k": "call", "id": str(call.get("id", "")), "name": str(fn.get("name", "")),
                    "args": canonical_args(fn.get("arguments"))})
    return out


class RecordWriter:
    """Appends one line per recorded request to ``path``, flushed at once (a killed harness leaves at most a
    torn last line), under a lock (the model server answers on many threads), bounded by ``RECORD_LIMIT``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file: Any = None
        self._written = 0
        self._n = 0
        self._full = False

    def write(self, entry: dict[str, Any]) -> None:
        with self._lock:
            if self._full:
                return
            if self._file is None:
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            entry = {"n": self._n, **entry}
            self._n += 1
            line = json.dumps(entry, default=str, ensure_ascii=False) + "\n"
            if self._written + len(line) > RECORD_LIMIT:
                line, self._full = json.dumps({"truncated": True, "n": self._n}) + "\n", True
            self._file.write(line)
            self._file.flush()
            self._written += len(line)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
