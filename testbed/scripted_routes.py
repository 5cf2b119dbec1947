"""What the scripted model answers, keyed by scenario.

A route is a pure function of the conversation it is sent (OpenAI chat
messages): the same messages always get the same answer, so a retried or
replayed planning call sees a consistent model. The scenario comes from the
request's model name (``scripted:<scenario>`` becomes ``openai/<scenario>``
on the wire); a name that is no scenario (``gpt-4o``, whatever an agent
framework is configured with) gets ``auto``. ``auto`` reads the user's message
and picks a tool, which is what the demo and free-form prompts use.

``respond`` hands a route the messages with their content as plain strings
(a list of parts is joined), and ``auto`` also the tools the request declares
(``TOOL_AWARE`` routes), so it answers an agent it did not write by the tools
that agent has, recognised by name and schema. A *task* (a user message carrying a token, the chat driver's
neutral message) is planned by ``testbed.task_planner``: a seeded turn over whatever tools the request declares,
then a final answer carrying the token. The conventions below are the reference agent's, and those of targets
that declare note or append effects:

* ``save the note '<token>'``: call the declared tool whose name contains
  ``note`` with its first string property set to the token; after its result,
  reply ``saved note <token>``, or ``could not save note <token>: <reason>``
  when the result reports a failure (names an error, an exception or a
  failure, or starts with an HTTP error status: ``503 Service Unavailable``).
* ``What is <a> * <b>?`` (any one of + - * /): with a calculator-like tool
  declared (a name with ``calc`` or an ``expression`` property), call it as
  before; with none, answer ``<a> * <b> = <result>`` at once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from testbed import task_planner
from testbed.model_wire import text_of

Message = dict[str, Any]
Route = Callable[[list[Message]], Message]
ToolSpec = dict[str, Any]  # a chat tool: {"type": "function", "function": {"name", "parameters"}}


def _final(text: str) -> Message:
    return {"role": "assistant", "content": text}


def _calls(messages: list[Message], *calls: tuple[str, dict[str, Any]]) -> Message:
    # Ids unique within the conversation: the message index plus the call's position.
    base = len(messages)
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call_{base}_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for i, (name, args) in enumerate(calls)
        ],
    }


def _last_user_index(messages: list[Message]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "user":
            return i
    raise ValueError("the conversation has no user message")


def _turn(messages: list[Message]) -> tuple[str, int, list[Message]]:
    """(user text, model steps already taken this turn, tool messages since the user spoke)."""
    i = _last_user_index(messages)
    since = messages[i + 1:]
    return (
        messages[i]["content"] or "",
        sum(1 for m in since if m["role"] == "assistant"),
        [m for m in since if m["role"] == "tool"],
    )


def _is_error(tool_message: Message) -> bool:
    return str(tool_message.get("content", "")).startswith("ERROR")


# -- auto: free-form prompts -----------------------------------------------------

_ARITH = re.compile(r"[-+*/%().\d\s]*\d[-+*/%().\d\s]*")
_NUMBER_REQUEST = re.compile(r"reply with the number\s+(-?\d+)", re.I)
_WEATHER = re.compile(r"weather\s+(?:in|for|at)\s+([A-Za-z][A-Za-z .'-]*)", re.I)
_WRITE = re.compile(r"(?:write|save)\s+['\"]?(.+?)['\"]?\s+(?:to|into|in)\s+(?:the\s+)?(?:file\s+)?([\w./-]+)", re.I)
_APPEND = re.compile(r"append\s+['\"]?(.+?)['\"]?\s+(?:to|onto)\s+(?:the\s+)?(?:file\s+)?([\w./-]+)", re.I)
_FLAKY = re.compile(r"check the flaky service (?:for|about)\s+([\w-]+)", re.I)
_EXACT = re.compile(r"compute\s+(.+?)\s+exactly", re.I)
_READ = re.compile(r"read\s+(?:the\s+)?(?:file\s+)?([\w./-]+)", re.I)
_WORK_FOR = re.compile(r"work for\s+(\d+(?:\.\d+)?)\s+seconds?", re.I)
_SHELL = re.compile(r"(?:run|execute)\s+(?:the\s+command\s+)?`([^`]+)`", re.I)
_OPEN_URL = re.compile(r"\b(?:open|visit|go to|browse)\s+(https?://\S+?)[.,)]?(?:\s|$)", re.I)


def _arithmetic(text: str) -> str | None:
    candidates = [c.strip() for c in _ARITH.findall(text.replace("x", "*").replace("×", "*"))]
    candidates = [c for c in candidates if re.search(r"\d\s*[-+*/%]\s*[\d(]", c)]
    return max(candidates, key=len) if candidates else None


def _plan_from_text(messages: list[Message], text: str) -> Message:
    if m := _NUMBER_REQUEST.search(text):
        return _final(m.group(1))
    if re.search(r"\b(recall|first message|what did i (say|ask) first)\b", text, re.I):
        users = [m["content"] for m in messages if m["role"] == "user"]
        return _final(f"Your first message was: {users[0]!r}")
    if m := _WEATHER.search(text):
        return _calls(messages, ("weather", {"city": m.group(1).strip().rstrip("?.!")}))
    if m := _SHELL.search(text):  # the shell_local environment's tool
        return _calls(messages, ("bash", {"command": m.group(1)}))
    if m := _OPEN_URL.search(text):  # a browser environment's tool
        return _calls(messages, ("go_to_url", {"url": m.group(1)}))
    if m := _WORK_FOR.search(text):
        return _calls(messages, ("slow_task", {"seconds": float(m.group(1)), "label": "work"}))
    if m := _FLAKY.search(text):
        return _calls(messages, ("flaky_service", {"request": m.group(1), "fail_attempts": 2}))
    if m := _EXACT.search(text):  # the expression as written, even if the calculator will refuse it
        return _calls(messages, ("calculator", {"expression": m.group(1)}))
    if m := _APPEND.search(text):
        return _calls(messages, ("append_file", {"path": m.group(2), "content": m.group(1)}))
    if m := _WRITE.search(text):
        return _calls(messages, ("write_file", {"path": m.group(2), "content": m.group(1)}))
    if re.search(r"\blist\b.*\bfiles?\b", text, re.I):
        return _calls(messages, ("list_files", {}))
    if m := _READ.search(text):
        return _calls(messages, ("read_file", {"path": m.group(1)}))
    if expr := _arithmetic(text):
        return _calls(messages, ("calculator", {"expression": expr}))
    return _final(
        "I am the scripted model: I can do arithmetic ('What is 25 * 4?'), weather ('weather in Paris'), "
        "and files ('write hello to notes.txt', 'list files', 'read notes.txt')."
    )


def _summarise(messages: list[Message], tool_messages: list[Message]) -> Message:
    # Pair each tool result with the call that produced it.
    calls = {c["id"]: c for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []}
    parts = []
    for t in tool_messages:
        call = calls.get(t.get("tool_call_id"), {}).get("function", {})
        name, content = call.get("name", t.get("name", "tool")), str(t.get("content", ""))
        if _is_error(t):
            parts.append(f"{name} reported: {content}")
        elif name == "calculator":
            parts.append(f"{json.loads(call['arguments'])['expression']} = {content}")
        else:
            parts.append(content)
    return _final("\n".join(parts))


# -- the tools an agent declares --------------------------------------------------

_SAVE_NOTE = re.compile(r"save the note '([^']+)'", re.I)
_BINARY = re.compile(r"what is\s+(-?\d+)\s*([-+*/])\s*(-?\d+)\s*\?", re.I)
#: a tool result reporting a failure: an error or exception named, or an HTTP error status (an exception message
#: such as "503 Service Unavailable" is all the AI SDK sends back for a tool that threw)
_FAILED = re.compile(r"\b(errors?|exception|failed|failure|unavailable|refused|timed out|timeout)\b"
                     r"|(?:^|http\s*|status\s*(?:code\s*)?)[45]\d\d\b", re.I)


def _declared(tools: list[ToolSpec] | None) -> list[tuple[str, dict]]:
    """(name, parameters schema) of each declared function tool."""
    return task_planner.declared(tools)


def _string_properties(schema: dict) -> list[str]:
    props = schema.get("properties")
    if not isinstance(props, dict):
        return []
    return [k for k, v in props.items() if isinstance(v, dict) and (v.get("type") == "string"
                                                                    or "string" in (v.get("type") or []))]


def _note_tool(tools: list[ToolSpec] | None) -> tuple[str, str] | None:
    """(name, argument) of the declared tool that saves a note: its name contains 'note', and it takes a string."""
    for name, schema in _declared(tools):
        if "note" in name.lower() and (strings := _string_properties(schema)):
            return name, strings[0]
    return None


def _has_calculator(tools: list[ToolSpec] | None) -> bool:
    return any("calc" in name.lower() or "expression" in (schema.get("properties") or {})
               for name, schema in _declared(tools))


def _direct_arithmetic(a: str, op: str, b: str) -> str:
    x, y = int(a), int(b)
    if op == "/":
        result: Any = "undefined (division by zero)" if y == 0 else (x // y if x % y == 0 else x / y)
    else:
        result = {"+": x + y, "-": x - y, "*": x * y}[op]
    return f"{a} {op} {b} = {result}"


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _notes(messages: list[Message], text: str, step: int, results: list[Message],
           tools: list[ToolSpec] | None) -> Message | None:
    """The notes convention: call the declared note tool once, then report what its result says."""
    m = _SAVE_NOTE.search(text)
    if m is None:
        return None
    token = m.group(1)
    if step == 0:
        found = _note_tool(tools)
        if found is None:
            names = ", ".join(name for name, _ in _declared(tools)) or "none"
            return _final(f"could not save note {token}: no declared tool saves notes (declared: {names})")
        name, argument = found
        return _calls(messages, (name, {argument: token}))
    outcome = str(results[-1].get("content") or "").strip() if results else ""
    if not results or _FAILED.search(outcome):
        return _final(f"could not save note {token}: {_one_line(outcome) or 'the tool returned nothing'}")
    return _final(f"saved note {token}")


def route_auto(messages: list[Message], tools: list[ToolSpec] | None = None) -> Message:
    """``tools``: what the request declares (None: not told, e.g. a subagent's turn: plan as if a calculator
    were there)."""
    text, step, results = _turn(messages)
    if (answer := _notes(messages, text, step, results, tools)) is not None:
        return answer
    if step == 0 and tools is not None and not _has_calculator(tools) and (m := _BINARY.search(text)):
        return _final(_direct_arithmetic(*m.groups()))
    if step == 0:
        return _plan_from_text(messages, text)
    if (repair := _repair(messages, results)) is not None:
        return repair
    return _summarise(messages, results[-_last_batch_size(messages):])


def _repair(messages: list[Message], tools: list[Message]) -> Message | None:
    """After a calculator validation error on 'a x b', call again with 'a * b' (the model repairs its call)."""
    last = tools[-1] if tools else None
    if last is None or not str(last.get("content", "")).startswith("ERROR (validation_error): calculator"):
        return None
    call = next((c for m in reversed(messages) if m["role"] == "assistant" for c in m.get("tool_calls") or []
                 if c["id"] == last.get("tool_call_id")), None)
    expression = json.loads(call["function"]["arguments"]).get("expression", "") if call else ""
    if "x" not in expression:
        return None
    return _calls(messages, ("calculator", {"expression": expression.replace("x", "*")}))


def _last_batch_size(messages: list[Message]) -> int:
    for m in reversed(messages):
        if m["role"] == "assistant":
            return len(m.get("tool_calls") or []) or 1
    return 1


# -- scripted walkthroughs -------------------------------------------------------


def _script(*steps: Callable[[list[Message], list[Message]], Message]) -> Route:
    """A route that plays ``steps`` in order within a turn; each step sees the tool results so far."""

    def route(messages: list[Message]) -> Message:
        _, step, tools = _turn(messages)
        if step >= len(steps):
            return _final("(script finished)")
        return steps[step](messages, tools)

    return route


def route_multi_step(messages: list[Message]) -> Message:
    return _script(
        lambda m, t: _calls(m, ("write_file", {"path": "notes/plan.txt", "content": "step one: gather data"})),
        lambda m, t: _calls(m, ("read_file", {"path": "notes/plan.txt"})),
        lambda m, t: _calls(m, ("write_file", {"path": "notes/done.txt", "content": "done"}),
                            ("list_files", {})),
        lambda m, t: _final(f"Saved the plan ({t[1]['content']!r}); the workspace now holds:\n{t[-1]['content']}"),
    )(messages)


def route_validation_repair(messages: list[Message]) -> Message:
    return _script(
        lambda m, t: _calls(m, ("calculator", {"expression": "25 x 4"})),
        lambda m, t: _calls(m, ("calculator", {"expression": "25 * 4"})) if _is_error(t[-1])
        else _final(f"25 * 4 = {t[-1]['content']}"),
        lambda m, t: _final(f"After repairing my call: 25 * 4 = {t[-1]['content']}"),
    )(messages)


def route_retry(messages: list[Message]) -> Message:
    return _script(
        lambda m, t: _calls(m, ("flaky_service", {"request": "status", "fail_attempts": 2})),
        lambda m, t: _final(f"The flaky service answered: {t[-1]['content']}"),
    )(messages)


def route_terminal(messages: list[Message]) -> Message:
    return _script(
        lambda m, t: _calls(m, ("broken_service", {"request": "refund order 42"})),
        lambda m, t: _final(f"I could not complete the refund: {t[-1]['content']}"),
    )(messages)


def route_path_escape(messages: list[Message]) -> Message:
    return _script(
        lambda m, t: _calls(m, ("write_file", {"path": "../../etc/passwd", "content": "root::0:0::/root:/bin/sh"})),
        lambda m, t: _calls(m, ("read_file", {"path": "/etc/passwd"})),
        lambda m, t: _calls(m, ("write_file", {"path": "safe.txt", "content": "stayed inside"})),
        lambda m, t: _final("Both paths outside my workspace were refused; I wrote safe.txt inside it instead."),
    )(messages)


def route_malformed(messages: list[Message]) -> Message:
    def broken_call(m: list[Message], t: list[Message]) -> Message:
        msg = _calls(m, ("calculator", {}))
        msg["tool_calls"][0]["function"]["arguments"] = '{"expression": "25 * 4"'  # missing brace
        return msg

    return _script(
        broken_call,
        lambda m, t: _calls(m, ("calculator", {"expression": "25 * 4"})),
        lambda m, t: _final(f"After fixing my malformed call: 25 * 4 = {t[-1]['content']}"),
    )(messages)


def route_parallel(messages: list[Message]) -> Message:
    return _script(
        lambda m, t: _calls(m, ("calculator", {"expression": "6 * 7"}), ("weather", {"city": "Lisbon"}),
                            ("calculator", {"expression": "100 / 8"})),
        lambda m, t: _summarise(m, t),
    )(messages)


# -- environments (agent.envs) ---------------------------------------------------


def env_state(messages: list[Message]) -> str:
    """The environment state the planning activity appended (the last system message), or ''."""
    for m in reversed(messages):
        if m["role"] == "system" and str(m.get("content", "")).startswith("Environment state"):
            return str(m["content"])
    return ""


SHELL_CREATE = ("mkdir -p notes && echo 'first note' > notes/one.txt && echo 'second note' > notes/two.txt"
                " && printf 'created by the agent\\n' > README.txt")
SHELL_LIST = "find . -type f | sort && wc -l < README.txt"


def route_shell(messages: list[Message]) -> Message:
    def answer(m: list[Message], t: list[Message]) -> Message:
        where = re.search(r"Your workspace: (\S+)", env_state(m))
        return _final(f"I created three files in my workspace ({where.group(1) if where else '?'}); "
                      f"listing them:\n{t[-1]['content']}")

    return _script(
        lambda m, t: _calls(m, ("bash", {"command": SHELL_CREATE})),
        lambda m, t: _calls(m, ("bash", {"command": SHELL_LIST})),
        answer,
    )(messages)


SHELL_SLOW = "echo start >> log.txt; sleep {seconds}; echo done >> log.txt; cat log.txt"
_SLOW_SHELL = re.compile(r"slow command (\d+(?:\.\d+)?)", re.I)


def route_shell_slow(messages: list[Message]) -> Message:
    """One command that appends, sleeps, appends: a worker killed during the sleep must not double the first line."""
    seconds = (_SLOW_SHELL.search(_turn(messages)[0]) or [None, "3"])[1]
    return _script(
        lambda m, t: _calls(m, ("bash", {"command": SHELL_SLOW.format(seconds=seconds)})),
        lambda m, t: _final(f"The command finished:\n{t[-1]['content']}"),
    )(messages)


_URL = re.compile(r"https?://\S+")
_TYPE = re.compile(r"type\s+['\"]([^'\"]+)['\"]", re.I)


def _element(state: str, tag: str) -> int | None:
    m = re.search(rf"^\[(\d+)\] <{tag}\b", state, re.M)
    return int(m.group(1)) if m else None


def route_browser(messages: list[Message]) -> Message:
    """Open the page named in the prompt, type into its first input, click its first button, report the page."""
    text = _turn(messages)[0]

    def fill(m: list[Message], t: list[Message]) -> Message:
        index = _element(env_state(m), "input")
        if index is None:
            return _final(f"The page has no input field. Page state:\n{env_state(m)}")
        typed = (_TYPE.search(text) or [None, "Ada Lovelace"])[1]
        return _calls(m, ("input_text", {"index": index, "text": typed}))

    def click(m: list[Message], t: list[Message]) -> Message:
        index = _element(env_state(m), "button")
        if index is None:
            return _final(f"The page has no button. Page state:\n{env_state(m)}")
        return _calls(m, ("click_element", {"index": index}))

    def report(m: list[Message], t: list[Message]) -> Message:
        state = env_state(m)
        page = state.split("Page text:\n", 1)[-1].split("\n\nInteractive elements:", 1)[0]
        return _final(f"I submitted the form. The page now says: {page.splitlines()[0] if page else '(nothing)'}")

    return _script(
        lambda m, t: _calls(m, ("go_to_url", {"url": (_URL.search(text) or [""])[0].rstrip(".,)")})),
        fill, click, report,
    )(messages)


# -- subagents and programmatic tool calling ------------------------------------

SUBAGENT_PREFIX = "You are a subagent"  # agent.contracts.SUBAGENT_PROMPT_PREFIX (kept import-free here)
_SLOW = re.compile(r"\bslow (\d+(?:\.\d+)?)\b", re.I)


def _is_subagent(messages: list[Message]) -> bool:
    first = messages[0] if messages else {}
    return first.get("role") == "system" and str(first.get("content") or "").startswith(SUBAGENT_PREFIX)


def route_subagent(messages: list[Message]) -> Message:
    """Every scenario's children: do the task like ``auto`` does, with a few scripted twists."""
    text, step, tools = _turn(messages)
    if "impossible" in text.lower():
        # HTTP 400 from the model server: a non-retryable model error, so the child workflow fails.
        raise ValueError(f"the scripted subagent cannot do {text!r}")
    delegates = "may delegate" in str(messages[0].get("content"))
    if step == 0 and (m := _SLOW.search(text)):
        return _calls(messages, ("slow_task", {"seconds": float(m.group(1)), "label": text[:40]}))
    if step == 0 and delegates:
        return _calls(messages, ("spawn", {"agent_name": "generic", "task": text}))
    if delegates:
        return _final(f"Delegation result: {tools[-1]['content']}")
    return route_auto(messages)


def _subagents(parent: Route) -> Route:
    def route(messages: list[Message]) -> Message:
        return route_subagent(messages) if _is_subagent(messages) else parent(messages)

    return route


PTC_FANOUT = """
results = await asyncio.gather(
    write_file(path="notes/a.txt", content="alpha"),
    write_file(path="notes/b.txt", content="beta"),
    spawn(agent_name="generic", task="What is 6 * 7?"),
)
print(f"wrote {len(results) - 1} files")
{"files": results[:2], "subagent": results[2]}
""".strip()


def route_ptc(messages: list[Message]) -> Message:
    return _script(
        lambda m, t: _calls(m, ("run_ptc", {"code": PTC_FANOUT})),
        lambda m, t: _final(f"The program finished: {t[-1]['content']}"),
    )(messages)


def route_spawn(messages: list[Message]) -> Message:
    return _script(
        lambda m, t: _calls(m, ("spawn", {"agent_name": "researcher", "task": "What is the weather in Lisbon?"})),
        lambda m, t: _final(f"My researcher reports: {t[-1]['content']}"),
    )(messages)


def route_spawn_failure(messages: list[Message]) -> Message:
    return _script(
        lambda m, t: _calls(m, ("spawn", {"agent_name": "generic", "task": "Do the impossible: divide by zero."})),
        lambda m, t: _final(f"The subagent could not do it: {t[-1]['content']}"),
    )(messages)


def route_spawn_detached(messages: list[Message]) -> Message:
    return _script(
        lambda m, t: _calls(m, ("spawn", {"agent_name": "generic", "task": "What is 6 * 7?", "wait": False}),
                            ("spawn", {"agent_name": "generic", "task": "write gamma to notes/c.txt",
                                       "wait": False})),
        # Meanwhile the parent does its own work, then comes back for both answers.
        lambda m, t: _calls(m, ("write_file", {"path": "notes/parent.txt", "content": "started two helpers"})),
        lambda m, t: _calls(m, ("wait", {"handle": t[0]["content"]}), ("wait", {"handle": t[1]["content"]})),
        lambda m, t: _final(f"Both helpers answered: {t[-2]['content']} / {t[-1]['content']}"),
    )(messages)


def route_spawn_across_runs(messages: list[Message]) -> Message:
    """Turn 1 starts a detached helper; after continue-as-new, turn 2 collects it by its handle."""
    text, step, tools = _turn(messages)
    if "collect" not in text:
        return _script(
            lambda m, t: _calls(m, ("spawn", {"agent_name": "generic", "task": "What is 6 * 7?", "wait": False})),
            lambda m, t: _final(f"Started helper {t[-1]['content']}"),
        )(messages)
    started = next(str(m["content"]) for m in messages if m["role"] == "assistant"
                   and str(m.get("content") or "").startswith("Started helper "))
    return _script(
        lambda m, t: _calls(m, ("wait", {"handle": started.removeprefix("Started helper ")})),
        lambda m, t: _final(f"The helper answered: {t[-1]['content']}"),
    )(messages)


def route_spawn_limits(messages: list[Message]) -> Message:
    return _script(
        lambda m, t: _calls(m, ("spawn", {"agent_name": "planner", "task": "What is 2 + 2?"}),
                            ("spawn", {"agent_name": "generic", "task": "What is 3 + 3?"}),
                            ("spawn", {"agent_name": "generic", "task": "What is 4 + 4?"})),
        lambda m, t: _final(" | ".join(x["content"] for x in t)),
    )(messages)


PTC_RETRY = 'answer = await flaky_service(request="inventory", fail_attempts=2)\nanswer'

PTC_BAD_CALCULATION = """
total = 0
for expression in ["1 + 1", "25 x 4"]:
    total += int(await calculator(expression=expression))
total
""".strip()


def route_ptc_retry(messages: list[Message]) -> Message:
    return _script(
        lambda m, t: _calls(m, ("run_ptc", {"code": PTC_RETRY})),
        lambda m, t: _final(f"Through the program: {t[-1]['content']}"),
    )(messages)


def route_ptc_validation(messages: list[Message]) -> Message:
    return _script(
        lambda m, t: _calls(m, ("run_ptc", {"code": PTC_BAD_CALCULATION})),
        # The error names the line and the tool; the model repairs the program.
        lambda m, t: _calls(m, ("run_ptc", {"code": PTC_BAD_CALCULATION.replace("25 x 4", "25 * 4")}))
        if _is_error(t[-1]) else _final(t[-1]["content"]),
        lambda m, t: _final(f"After repairing the program the total is {t[-1]['content']}"),
    )(messages)


PTC_PARALLEL_FAIL = """
results = await asyncio.gather(
    slow_task(seconds=60, label="long sibling"),
    broken_service(request="refund order 42"),
)
results
""".strip()


def route_ptc_parallel_fail(messages: list[Message]) -> Message:
    return _script(
        lambda m, t: _calls(m, ("run_ptc", {"code": PTC_PARALLEL_FAIL})),
        lambda m, t: _final(f"The fan-out failed: {t[-1]['content']}"),
    )(messages)


HOSTILE_PROGRAMS = {
    "import": "import os\nos.listdir('/')",
    "dunder_walk": "().__class__.__bases__[0].__subclasses__()",
    "infinite_loop": "n = 0\nwhile True:\n    n += 1\nn",
    "huge_allocation": "x = [0] * 10 ** 9\nlen(x)",
    "huge_string": "s = 'a' * (10 ** 10)\nlen(s)",
    "open_file": "open('/etc/passwd').read()",
}


def route_ptc_hostile(messages: list[Message]) -> Message:
    programs = list(HOSTILE_PROGRAMS.values())
    return _script(
        *[(lambda code: lambda m, t: _calls(m, ("run_ptc", {"code": code})))(code) for code in programs],
        lambda m, t: _final("Refused: " + " | ".join(x["content"][:80] for x in t)),
    )(messages)


def route_cancel(messages: list[Message]) -> Message:
    """One long step, for cancelling the run while it is in flight: a direct tool, a child, or PTC-inner."""
    text, step, tools = _turn(messages)
    if step > 0:
        return _final("(this answer must never be asked for: the run was cancelled)")
    if "child" in text:
        return _calls(messages, ("spawn", {"agent_name": "generic", "task": "slow 120"}))
    if "ptc" in text:
        return _calls(messages, ("run_ptc", {"code": "await asyncio.gather(slow_task(seconds=120, label='x'), "
                                                     "slow_task(seconds=120, label='y'))"}))
    return _calls(messages, ("slow_task", {"seconds": 120, "label": "direct"}))


_FUZZ = re.compile(r"FUZZ kind=(\S+) n=(\d+) writes=(\d+) tag=(\S+)")
#: the shapes that fan out into subagents (spawn, run_ptc: tools of the engines that have them)
FUZZ_FAN_OUT = ("direct-spawns", "ptc-spawns", "ptc-mixed")
#: every shape: the fan-out ones, and ``writes`` (N file writes in one turn's parallel tool calls), which any
#: engine runs
FUZZ_KINDS = (*FUZZ_FAN_OUT, "writes")


def fuzz_prompt(kind: str, n: int, writes: int, tag: str) -> str:
    """The parent prompt of a ``migration_fuzz`` shape; ``route_migration`` plays it."""
    return f"FUZZ kind={kind} n={n} writes={writes} tag={tag}"


def fuzz_child_task(k: int) -> str:
    return f"What is {k} + {k}?"


def fuzz_file(tag: str, j: int) -> tuple[str, str]:
    return f"fuzz/{tag}/file-{j}.txt", f"{tag} file {j}"


def fuzz_answer(tag: str, writes: int) -> str:
    """The final answer of a ``writes`` shape whose writes all succeeded."""
    return f"{tag}: wrote {writes} files"


def route_migration(messages: list[Message]) -> Message:
    """The shapes of cross-worker migration fuzzing (``python -m migration_fuzz``): fan-outs, or parallel writes."""
    text, step, tools = _turn(messages)
    m = _FUZZ.search(text)
    if m is None:
        raise ValueError(f"the migration route expects {fuzz_prompt('KIND', 1, 0, 'TAG')!r}, got {text!r}")
    kind, n, writes, tag = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
    if kind not in FUZZ_KINDS:
        raise ValueError(f"unknown fuzz kind {kind!r}; kinds: {', '.join(FUZZ_KINDS)}")
    files = [fuzz_file(tag, j) for j in range(1, writes + 1)]
    if kind == "writes" and step > 0:  # the answer names what failed, so a failed write fails the fuzz's check
        return _final("\n".join(t["content"] for t in tools if _is_error(t)) or fuzz_answer(tag, writes))
    if step > 0:
        return _final("\n".join(t["content"] for t in tools))
    if kind == "writes":
        return _calls(messages, *(("write_file", {"path": p, "content": c}) for p, c in files))
    spawns = [("spawn", {"agent_name": "generic", "task": fuzz_child_task(k)}) for k in range(1, n + 1)]
    if kind == "direct-spawns":
        return _calls(messages, *spawns)
    calls = [f"spawn(agent_name='generic', task={fuzz_child_task(k)!r})" for k in range(1, n + 1)]
    if kind == "ptc-mixed":
        calls = [f"write_file(path={p!r}, content={c!r})" for p, c in files] + calls
    code = "results = await asyncio.gather(\n" + "".join(f"    {c},\n" for c in calls) + ")\n'\\n'.join(results)"
    return _calls(messages, ("run_ptc", {"code": code}))


ROUTES: dict[str, Route] = {
    "auto": route_auto,
    "direct": route_auto,
    "multi_step": route_multi_step,
    "validation_repair": route_validation_repair,
    "retry": route_retry,
    "terminal": route_terminal,
    "path_escape": route_path_escape,
    "malformed": route_malformed,
    "parallel": route_parallel,
    "conversation": route_auto,
    "ptc": _subagents(route_ptc),
    "spawn": _subagents(route_spawn),
    "spawn_failure": _subagents(route_spawn_failure),
    "spawn_detached": _subagents(route_spawn_detached),
    "spawn_limits": _subagents(route_spawn_limits),
    "spawn_across_runs": _subagents(route_spawn_across_runs),
    "ptc_retry": _subagents(route_ptc_retry),
    "ptc_validation": _subagents(route_ptc_validation),
    "ptc_parallel_fail": _subagents(route_ptc_parallel_fail),
    "ptc_hostile": _subagents(route_ptc_hostile),
    "cancel": _subagents(route_cancel),
    "migration": _subagents(route_migration),
    "shell": route_shell,
    "shell_slow": route_shell_slow,
    "browser": route_browser,
}


#: routes that also take the request's declared tools (``tools=``)
TOOL_AWARE: frozenset[Route] = frozenset({route_auto})


def _plain(message: Any, index: int) -> Message:
    """A chat message with its content as one string (a list of parts joined), so routes read text."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise ValueError(f"messages[{index}] must be an object with a string 'role'")
    if isinstance(message.get("content"), str) or message.get("content") is None:
        return message
    return {**message, "content": text_of(message["content"])}


def respond(body: dict[str, Any]) -> Message:
    """The model server's responder: an assistant message for an OpenAI chat request body. A model name that
    is no scenario gets ``auto``."""
    scenario = str(body.get("model") or "auto").removeprefix("openai/")
    route = ROUTES.get(scenario, route_auto)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("request has no messages")
    messages = [_plain(m, i) for i, m in enumerate(messages)]
    if route is route_auto:  # a task (a message carrying a token): a turn over the agent's own tools
        tools = body.get("tools")
        planned = task_planner.plan(messages, tools if isinstance(tools, list) else [], body.get("response_format"))
        if planned is not None:
            return planned
    if route in TOOL_AWARE:
        tools = body.get("tools")  # absent: the request declares none
        return route(messages, tools=tools if isinstance(tools, list) else [])  # type: ignore[call-arg]
    return route(messages)
