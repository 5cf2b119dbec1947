"""The OpenAI wire formats the scripted model speaks: chat completions and the Responses API, whole or streamed.

The scripted routes think in chat messages (``{"role", "content", "tool_calls"}``). Agent frameworks send what
their client sends by default: the OpenAI Agents SDK and the Vercel AI SDK's OpenAI provider use the Responses
API (``POST /v1/responses``), and most of them stream. This module translates, with no I/O:

* ``responses_to_chat(body)``: a Responses request (``input`` as a string or a list of items: messages whose
  content is a string or ``input_text``/``output_text`` parts, ``function_call`` and ``function_call_output``
  items, ``item_reference`` to an item this server produced; ``instructions``; tools as
  ``{"type": "function", "name", "parameters"}``) becomes a chat request body the responder answers.
  The function calls of one model response (and its text) become one assistant message, so a route counts
  model steps the same way on both APIs.
* ``response_object`` / ``response_events``: the assistant message as a Response (``output`` of ``message``
  items with ``output_text`` parts and ``function_call`` items) or as its stream of events
  (``response.created`` ... ``response.completed``, each with ``sequence_number``).
* ``chat_completion`` / ``chat_chunks``: the assistant message as a ``chat.completion`` or as
  ``chat.completion.chunk`` objects (text deltas, tool-call deltas with ``index``, a last chunk with
  ``finish_reason``, an optional usage chunk); the ``[DONE]`` line is the server's.
* ``text_of(content)``: message content given as a string or a list of parts, as one string.

Item ids carry their item (``msg_``/``fc_`` + compressed JSON), so an ``item_reference`` resolves with no state
on the server, across restarts: the AI SDK's default (``store: true``) sends earlier answers that way.
"""

from __future__ import annotations

import base64
import json
import time
import zlib
from typing import Any

__all__ = ["responses_to_chat", "response_object", "response_events", "chat_completion", "chat_chunks",
           "text_of", "usage_counts"]

Message = dict[str, Any]

#: characters per streamed text delta (a real model streams a few characters per event)
DELTA_CHARS = 16
#: the longest item a reference id carries (past this, the id holds only the item's kind)
MAX_REFERENCE_JSON = 16 * 1024


def strip_provider(model: str) -> str:
    """Scenario name of a model string: LiteLLM strips "openai/" but raw clients may not."""
    return model[len("openai/"):] if model.startswith("openai/") else model


def text_of(content: Any) -> str:
    """Content as one string: a string as is; a list of parts joined by their text (``text``, ``input_text``,
    ``output_text``, ``refusal``); parts with no text (images, files) are left out; None is ''."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict):
                text = part.get("text", part.get("refusal"))
                if isinstance(text, str):
                    texts.append(text)
        return "".join(texts)
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return content["text"]
    return str(content)


def usage_counts(request: Any, message: Message) -> tuple[int, int]:
    """(prompt, completion) tokens, estimated at four characters a token: good enough for accounting tests."""
    prompt_chars = len(json.dumps(request, default=str))
    completion_chars = len(message.get("content") or "") + len(json.dumps(message.get("tool_calls") or []))
    return max(1, prompt_chars // 4), max(1, completion_chars // 4)


# --------------------------------------------------------------------------- item ids that carry their item


def _item_id(prefix: str, item: dict) -> str:
    raw = json.dumps(item, separators=(",", ":"), sort_keys=True).encode()
    if len(raw) > MAX_REFERENCE_JSON:
        raw = b"{}"
    return prefix + base64.urlsafe_b64encode(zlib.compress(raw)).decode().rstrip("=")


def _referenced_item(ref_id: str) -> dict:
    """The item an ``item_reference`` id names; ValueError if this server did not make it."""
    prefix, _, packed = ref_id.partition("_")
    try:
        raw = zlib.decompressobj().decompress(base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4)),
                                              MAX_REFERENCE_JSON)  # bounded: the id is the client's data
        item = json.loads(raw)
        if not isinstance(item, dict):
            raise ValueError("not an object")
    except (ValueError, zlib.error):
        raise ValueError(f"item_reference {ref_id[:60]!r} is not an item this server produced; send the item "
                         "itself (store: false)") from None
    if prefix == "msg":
        return {"type": "message", "role": "assistant", "content": item.get("text", "")}
    if prefix == "fc":
        return {"type": "function_call", **item}
    raise ValueError(f"item_reference {ref_id[:60]!r} names no message or function call")


# --------------------------------------------------------------------------- Responses request -> chat body


def _chat_tool(tool: Any) -> dict | None:
    """A Responses function tool as a chat tool; other kinds (web_search, ...) are not the model's to call."""
    if not isinstance(tool, dict):
        return None
    if isinstance(tool.get("function"), dict):  # already in chat form
        return tool
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        return None
    function = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def responses_to_chat(body: dict) -> dict:
    """A Responses API request body as a chat completions body (model, messages, tools); ValueError naming the
    bad field otherwise."""
    messages: list[Message] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        given = [{"role": "user", "content": given}]
    if not isinstance(given, list):
        raise ValueError(f"'input' must be a string or a list of items, got {type(given).__name__}")
    pending: Message | None = None  # the assistant message the current model response's items go into

    def assistant() -> Message:
        nonlocal pending
        if pending is None:
            pending = {"role": "assistant", "content": None}
            messages.append(pending)
        return pending

    for index, item in enumerate(given):
        if not isinstance(item, dict):
            raise ValueError(f"input[{index}] must be an object, got {type(item).__name__}")
        kind = item.get("type", "message")
        if kind == "item_reference":
            item = _referenced_item(str(item.get("id", "")))
            kind = item["type"]
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ValueError(f"input[{index}] has role {role!r}; roles are user, system, developer, assistant")
            text = text_of(item.get("content"))
            if role == "assistant":
                msg = assistant()
                msg["content"] = (msg["content"] or "") + text
                continue
            pending = None
            messages.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            call_id = item.get("call_id") or item.get("id")
            if not isinstance(call_id, str) or not isinstance(item.get("name"), str):
                raise ValueError(f"input[{index}] is a function_call without a string call_id and name")
            arguments = item.get("arguments", "")
            assistant().setdefault("tool_calls", []).append({
                "id": call_id, "type": "function",
                "function": {"name": item["name"],
                             "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)},
            })
        elif kind == "function_call_output":
            pending = None
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                             "content": text_of(item.get("output"))})
        # reasoning and provider items carry nothing the scripted routes read
    tools = [t for t in (_chat_tool(t) for t in body.get("tools") or []) if t is not None]
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    if tools or "tools" in body:
        chat["tools"] = tools
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":  # structured output, in chat's shape
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            "name": fmt.get("name", "output"), "schema": fmt.get("schema") or {}, "strict": fmt.get("strict")}}
    return chat


# --------------------------------------------------------------------------- assistant message -> Response


def _output_items(message: Message) -> list[dict]:
    items: list[dict] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        items.append({"type": "message", "id": _item_id("msg_", {"text": text}), "status": "completed",
                      "role": "assistant",
                      "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        core = {"call_id": call.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments") or ""}
        items.append({"type": "function_call", "id": _item_id("fc_", core), "status": "completed", **core})
    return items


def response_object(body: dict, response_id: str, message: Message, *, status: str = "completed",
                    output: list[dict] | None = None, created_at: int | None = None) -> dict:
    """A Response (``object: response``) answering ``body`` with ``message``; ``status`` other than completed
    (``in_progress``) has no output and no usage yet."""
    done = status == "completed"
    prompt, completion = usage_counts(body.get("input"), message)
    usage = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": completion,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + completion}
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    return {
        "id": response_id, "object": "response", "created_at": created_at or int(time.time()), "status": status,
        "background": False, "error": None, "incomplete_details": None,
        "instructions": body.get("instructions") if isinstance(body.get("instructions"), str) else None,
        "max_output_tokens": None, "model": body.get("model") or "scripted",
        "output": (output if output is not None else _output_items(message)) if done else [],
        "parallel_tool_calls": True, "previous_response_id": None, "reasoning": {"effort": None, "summary": None},
        "store": bool(body.get("store", True)), "temperature": 1.0, "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto", "tools": tools, "top_p": 1.0, "truncation": "disabled",
        "usage": usage if done else None, "user": None, "metadata": {},
    }


def _pieces(text: str) -> list[str]:
    return [text[i:i + DELTA_CHARS] for i in range(0, len(text), DELTA_CHARS)] or [""]


def response_events(body: dict, response_id: str, message: Message) -> list[tuple[str, dict]]:
    """The stream of (event name, event) a streamed Responses request gets, ``response.completed`` last."""
    created = int(time.time())
    items = _output_items(message)
    events: list[dict] = [
        {"type": "response.created",
         "response": response_object(body, response_id, message, status="in_progress", created_at=created)},
        {"type": "response.in_progress",
         "response": response_object(body, response_id, message, status="in_progress", created_at=created)},
    ]
    for index, item in enumerate(items):
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events.append({"type": "response.output_item.added", "output_index": index,
                           "item": {**item, "status": "in_progress", "content": []}})
            events.append({"type": "response.content_part.added", **where, "content_index": 0, "part": empty})
            events += [{"type": "response.output_text.delta", **where, "content_index": 0, "delta": piece,
                        "logprobs": []} for piece in _pieces(text)]
            events.append({"type": "response.output_text.done", **where, "content_index": 0, "text": text,
                           "logprobs": []})
            events.append({"type": "response.content_part.done", **where, "content_index": 0,
                           "part": item["content"][0]})
        else:
            events.append({"type": "response.output_item.added", "output_index": index,
                           "item": {**item, "status": "in_progress", "arguments": ""}})
            events += [{"type": "response.function_call_arguments.delta", **where, "delta": piece}
                       for piece in _pieces(item["arguments"])]
            events.append({"type": "response.function_call_arguments.done", **where, "name": item["name"],
                           "arguments": item["arguments"]})
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed",
                   "response": response_object(body, response_id, message, output=items, created_at=created)})
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return [(event["type"], event) for event in events]


# --------------------------------------------------------------------------- assistant message -> chat completion


def chat_completion(body: dict, completion_id: str, scenario: str, message: Message) -> dict:
    """A ``chat.completion`` answering ``body`` with ``message``."""
    prompt, completion = usage_counts(body.get("messages", []), message)
    return {
        "id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": scenario,
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }


def chat_chunks(body: dict, completion_id: str, scenario: str, message: Message) -> list[dict]:
    """The ``chat.completion.chunk`` objects of a streamed chat request: the role, text deltas, each tool call
    (id and name first, then its arguments in pieces, keyed by ``index``), a chunk with ``finish_reason``, and a
    usage chunk (empty ``choices``) if ``stream_options.include_usage`` is set. ``[DONE]`` is not among them."""
    created = int(time.time())

    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": scenario,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    text = message.get("content")
    if isinstance(text, str) and text:
        chunks += [chunk({"content": piece}) for piece in _pieces(text)]
    calls = message.get("tool_calls") or []
    for index, call in enumerate(calls):
        fn = call.get("function") or {}
        chunks.append(chunk({"tool_calls": [{"index": index, "id": call.get("id"), "type": "function",
                                             "function": {"name": fn.get("name"), "arguments": ""}}]}))
        chunks += [chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                   for piece in _pieces(fn.get("arguments") or "") if piece]
    chunks.append(chunk({}, "tool_calls" if calls else "stop"))
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        prompt, completion = usage_counts(body.get("messages", []), message)
        chunks.append({"id": completion_id, "object": "chat.completion.chunk", "created": created,
                       "model": scenario, "choices": [],
                       "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion}})
    return chunks
