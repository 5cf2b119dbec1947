"""What the scripted model does with a task: a seeded turn over the tools the request declares.

A task is a user message carrying a token (``harness.model_record.TOKEN``), sent by the chat driver to an agent
we did not write. Whatever its framework, language and tools, the model:

1. **hands off** first when the request declares handoff tools (``transfer_to_*``, the OpenAI Agents SDK's) and
   the turn has not handed off yet, for most tokens: one handoff call;
2. makes 0-3 **steps of calls** over the other tools (a step is one call, or two in parallel), each call's
   arguments drawn from the tool's JSON schema by ``jsf`` (a generator of schema-valid data), seeded, and
   checked against the schema with ``jsonschema``;
3. gives its **final answer**, carrying the token: through the output tool if the request declares one
   (Pydantic AI's ``final_result``), as a schema-valid JSON object with the token in a string field if the
   request asks for structured output (a ``json_schema`` response format), else as ``final_text(token)``.

It is a pure function of the conversation and the server's seed: the token, the tools this request declares,
and what the turn already holds (how many steps, whether it handed off). So a retried or replayed call sees the
same model. Tool results, even errors, do not change the plan: the model goes on, as a real one would.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
import random
import threading
from typing import Any

from harness.model_record import TOKEN, final_text, tokens_in

log = logging.getLogger(__name__)

Message = dict[str, Any]
#: how likely a token's turn hands off (when it can), does a second call in a step, and how many steps it takes
HANDOFF_P, PARALLEL_P, STEPS = 0.7, 0.3, (0, 1, 1, 2, 2, 3)
#: names of the output tool a framework declares for structured output (Pydantic AI's default and its variants)
OUTPUT_TOOL_PREFIXES = ("final_result",)
#: fields a structured answer's token goes in, by preference; else the first string field
ANSWER_FIELDS = ("answer", "response", "reply", "text", "message", "content", "summary", "result", "output")
_jsf_lock = threading.Lock()  # jsf draws from the random module and Faker's shared generator


def task_token(messages: list[Message]) -> tuple[str, int] | None:
    """(the token of the current turn, the index of its user message), or None: the last user message carries no
    token (not a task)."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            found = tokens_in(messages[i].get("content"))
            return (found[-1], i) if found else None
    return None


def declared(tools: list[Any] | None) -> list[tuple[str, dict]]:
    """(name, parameters schema) of each function tool a chat request declares."""
    out = []
    for tool in tools or []:
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out.append((fn["name"], params if isinstance(params, dict) else {"type": "object", "properties": {}}))
    return out


def is_handoff(name: str) -> bool:
    return name.startswith("transfer_to_")


def is_output_tool(name: str) -> bool:
    return name.startswith(OUTPUT_TOOL_PREFIXES)


def _digest(*parts: Any) -> str:
    return hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()


def _rng(*parts: Any) -> random.Random:
    return random.Random(_digest(*parts))


def plan(messages: list[Message], tools: list[Any] | None, response_format: Any = None, seed: int = 0
         ) -> Message | None:
    """The model's next message in a task's turn, or None if the conversation's last user message is no task."""
    found = task_token(messages)
    if found is None:
        return None
    token, user_at = found
    declared_tools = declared(tools)
    since = messages[user_at + 1:]
    calls = [c.get("function", {}).get("name", "") for m in since if m.get("role") == "assistant"
             for c in m.get("tool_calls") or []]
    handed_off = any(is_handoff(name) for name in calls)
    steps_done = sum(1 for m in since if m.get("role") == "assistant"
                     and any(not is_handoff(c.get("function", {}).get("name", ""))
                             for c in m.get("tool_calls") or []))
    handoffs = sorted(n for n, _ in declared_tools if is_handoff(n))
    outputs = [(n, s) for n, s in declared_tools if is_output_tool(n)]
    regular = sorted((n, s) for n, s in declared_tools if not is_handoff(n) and not is_output_tool(n))
    turn = _rng(seed, token)
    wants_handoff, steps = turn.random() < HANDOFF_P, turn.choice(STEPS)
    if handoffs and wants_handoff and not handed_off:
        name = _rng(seed, token, "handoff", *handoffs).choice(handoffs)
        schema = dict(declared_tools)[name]
        return _calls(token, "handoff", [(name, draw(schema, _digest(seed, token, name)))])
    if regular and steps_done < steps:
        step = _rng(seed, token, "step", steps_done, *(n for n, _ in regular))
        chosen = [step.choice(regular) for _ in range(2 if step.random() < PARALLEL_P else 1)]
        return _calls(token, steps_done, [(name, draw(schema, _digest(seed, token, steps_done, j, name)))
                                          for j, (name, schema) in enumerate(chosen)])
    answer = final_text(token)
    if outputs:
        name, schema = outputs[0]
        return _calls(token, "output", [(name, carrying(draw(schema, _digest(seed, token, name)), schema, answer))])
    schema = _structured(response_format)
    if schema is not None:
        return {"role": "assistant", "content": json.dumps(carrying(draw(schema, _digest(seed, token)), schema,
                                                                    answer))}
    return {"role": "assistant", "content": answer}


def _calls(token: str, step: Any, calls: list[tuple[str, Any]]) -> Message:
    # Call ids unique per token and step, the same on every retry of the same request.
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{_digest(token, step, j, name)[:20]}", "type": "function",
         "function": {"name": name, "arguments": json.dumps(args)}} for j, (name, args) in enumerate(calls)]}


def _structured(response_format: Any) -> dict | None:
    """The JSON schema a ``json_schema`` response format asks for (chat completions' shape), or None."""
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        return schema if isinstance(schema, dict) else {"type": "object", "properties": {}}
    return None


# -- arguments from a JSON schema ------------------------------------------------------------------------------


def draw(schema: dict, seed: str) -> Any:
    """A value valid against ``schema``, the same for the same (schema, seed): jsf's draw, checked by jsonschema
    (up to 8 draws); a schema neither can satisfy gets ``{}``."""
    return copy.deepcopy(_draw(json.dumps(schema, sort_keys=True), seed))


@functools.lru_cache(maxsize=4096)
def _draw(schema_json: str, seed: str) -> Any:
    import faker
    import jsonschema
    from jsf import JSF

    schema = json.loads(schema_json)
    validator = jsonschema.validators.validator_for(schema)(schema)
    for attempt in range(8):
        try:
            with _jsf_lock:
                n = int(_digest(seed, attempt)[:12], 16)
                random.seed(n)
                faker.Faker.seed(n)
                value = JSF(schema).generate()
        except Exception as exc:  # noqa: BLE001 - a schema jsf cannot draw from: try again, then {}
            log.debug("jsf could not draw from %s: %s", schema_json[:200], exc)
            continue
        if not list(validator.iter_errors(value)):
            return value
    log.warning("no schema-valid arguments drawn for %s: sending {}", schema_json[:200])
    return {}


def carrying(value: Any, schema: dict, answer: str) -> Any:
    """``value`` (valid against ``schema``) with ``answer`` put in one of its string fields: a field named like
    an answer if there is one, else the first string field, depth first; unchanged if it has none."""
    paths = list(_string_paths(value, schema, schema))
    if not paths:
        return value
    path = min(paths, key=lambda p: (not (p and str(p[-1]).lower() in ANSWER_FIELDS), len(p)))
    if not path:
        return answer
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = answer
    return value


def _resolve(schema: dict, root: dict) -> dict:
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part, {}) if isinstance(node, dict) else {}
        return node if isinstance(node, dict) else {}
    return schema if isinstance(schema, dict) else {}


def _free_string(schema: dict) -> bool:
    """Whether any string is valid here (no enum, const, pattern, format or length bound that a sentence breaks)."""
    kinds = schema.get("type")
    return (kinds == "string" or (isinstance(kinds, list) and "string" in kinds)) and not (
        {"enum", "const", "pattern", "format", "maxLength"} & schema.keys())


def _string_paths(value: Any, schema: dict, root: dict, path: tuple = ()) -> Any:
    schema = _resolve(schema, root)
    branches = [_resolve(b, root) for b in schema.get("anyOf") or schema.get("oneOf") or [] if isinstance(b, dict)]
    if isinstance(value, str) and (_free_string(schema) or any(_free_string(b) for b in branches)):
        yield path
    elif isinstance(value, dict):
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        for key, item in value.items():
            if key in props:
                yield from _string_paths(item, props[key], root, (*path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from _string_paths(item, schema["items"], root, (*path, i))


def warm() -> None:
    """Import the generator now (about 0.6 s), not inside the first task's request."""
    draw({"type": "object", "properties": {"x": {"type": "string"}}}, "warm")


__all__ = ["TOKEN", "plan", "draw", "carrying", "task_token", "warm"]
