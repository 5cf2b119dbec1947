"""The agent's tools: their model-facing specs and their implementations.

Implementations are plain functions of ``(arguments, ToolContext)``. They
raise the classified errors of ``agent.errors``; the backend (a Temporal
activity, or the checkpoint runner) turns those into model-visible results or
retries. Side-effecting tools apply their effect through the effect ledger
with the activity's idempotency key, so a retried attempt does not apply it
twice.

Tool sets: ``default`` (calculator, weather, sandbox files) is what a live
model is offered; ``faults`` adds two tools whose only job is to fail in a
classified way, for scenarios and chaos runs.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simpleeval import SimpleEval

from agent.errors import ToolExecutionError, ToolRetryableError, ToolValidationError
from harness.recording import EffectLedger, ExecutionIdentity, workspace_name

MAX_FILE_BYTES = 256 * 1024
MAX_LISTED_FILES = 200


@dataclass
class ToolContext:
    """Where and as whom a tool runs."""

    workspace: Path
    ledger: EffectLedger
    ident: ExecutionIdentity


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    run: Callable[[dict[str, Any], ToolContext], Any]  # returns str, or an awaitable of str
    side_effects: bool = False
    # The longest this tool may legitimately take; the backend's timeouts derive from it.
    expected_seconds: float = 5.0

    def spec(self) -> dict[str, Any]:
        """The OpenAI function-calling spec offered to the model."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


def _schema(properties: dict[str, dict[str, Any]], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def validate_arguments(tool: Tool, args: dict[str, Any]) -> None:
    """Check arguments against the tool's schema; the error names the argument and what was expected."""
    props = tool.parameters.get("properties", {})
    missing = [name for name in tool.parameters.get("required", []) if name not in args]
    if missing:
        raise ToolValidationError(f"{tool.name}: missing required argument(s) {', '.join(missing)}")
    for name, value in args.items():
        if name not in props:
            raise ToolValidationError(
                f"{tool.name}: unknown argument {name!r}; allowed: {', '.join(sorted(props)) or 'none'}"
            )
        expected = props[name].get("type")
        types = _JSON_TYPES.get(expected, (object,))
        if not isinstance(value, types) or (expected in ("integer", "number") and isinstance(value, bool)):
            raise ToolValidationError(f"{tool.name}: argument {name!r} must be {expected}, got {type(value).__name__}")


# -- calculator -------------------------------------------------------------

_calc = SimpleEval(functions={"abs": abs, "round": round, "min": min, "max": max})
_calc.names = {"pi": 3.141592653589793, "e": 2.718281828459045}


def calculator(args: dict[str, Any], ctx: ToolContext) -> str:
    expression = args["expression"].strip()
    if len(expression) > 200:
        raise ToolValidationError("calculator: expression longer than 200 characters")
    if "**" in expression:
        raise ToolValidationError("calculator: '**' is not allowed (it can make huge numbers); multiply instead")
    try:
        value = _calc.eval(expression)
    except ZeroDivisionError:
        raise ToolValidationError(f"calculator: {expression!r} divides by zero") from None
    except Exception as exc:  # simpleeval raises several unrelated classes for bad input
        raise ToolValidationError(
            f"calculator: cannot evaluate {expression!r} ({type(exc).__name__}: {exc}); "
            "use numbers with + - * / // % and parentheses"
        ) from None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ToolValidationError(f"calculator: {expression!r} is not a number")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


# -- weather (a deterministic fake) -------------------------------------------

_CONDITIONS = ["sunny", "cloudy", "light rain", "windy", "overcast", "clear", "snow showers"]


def weather(args: dict[str, Any], ctx: ToolContext) -> str:
    city = args["city"].strip()
    if not city:
        raise ToolValidationError("weather: city must not be empty")
    h = int.from_bytes(hashlib.sha256(city.lower().encode()).digest()[:4], "big")
    return f"{city}: {_CONDITIONS[h % len(_CONDITIONS)]}, {h % 35 - 5} °C"


# -- sandbox files ----------------------------------------------------------


def resolve_in_workspace(workspace: Path, user_path: str) -> Path:
    """The real path of ``user_path`` inside ``workspace``, or a validation error.

    Absolute paths, ``..`` escapes and symlinks pointing outside are refused
    before anything touches the file system outside the workspace.
    """
    if not isinstance(user_path, str) or not user_path.strip() or "\x00" in user_path:
        raise ToolValidationError(f"path {user_path!r} is empty or invalid; give a path relative to the workspace")
    if os.path.isabs(user_path):
        raise ToolValidationError(f"path {user_path!r} is absolute; give a path relative to the workspace")
    root = Path(os.path.realpath(workspace))
    resolved = Path(os.path.realpath(root / user_path))
    if resolved != root and root not in resolved.parents:
        raise ToolValidationError(f"path {user_path!r} escapes the workspace; it was refused")
    return resolved


def _relative(ctx: ToolContext, path: Path) -> str:
    return str(path.relative_to(os.path.realpath(ctx.workspace))) or "."


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_write_target(tool: str, args: dict[str, Any], ctx: ToolContext) -> tuple[Path, bytes, str]:
    """(real path, bytes to write, workspace-relative path) for a writing tool, or a validation error."""
    target = resolve_in_workspace(ctx.workspace, args["path"])
    data = args["content"].encode()
    if len(data) > MAX_FILE_BYTES:
        raise ToolValidationError(f"{tool}: content is {len(data)} bytes; the limit is {MAX_FILE_BYTES}")
    if target.is_dir():
        raise ToolValidationError(f"{tool}: {args['path']!r} is a directory")
    return target, data, _relative(ctx, target)


def write_file(args: dict[str, Any], ctx: ToolContext) -> str:
    target, data, rel = _file_write_target("write_file", args, ctx)
    digest = _digest(data)

    def apply() -> dict[str, Any]:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{ctx.ident.attempt}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)  # atomic: a crash leaves the old file or the new one, never half of it
        return {"path": rel, "bytes": len(data)}

    def already_present() -> bool:
        return target.is_file() and _digest(target.read_bytes()) == digest

    # A retry answers exactly as the first attempt did: the model cannot tell (and need not know).
    ctx.ledger.apply_once(ctx.ident, "write_file", rel, digest, apply, already_present)
    return f"wrote {len(data)} bytes to {rel}"


def append_file(args: dict[str, Any], ctx: ToolContext) -> str:
    """Append text: not idempotent by nature, so only the idempotency key keeps a retry from appending twice."""
    target, data, rel = _file_write_target("append_file", args, ctx)

    def apply() -> dict[str, Any]:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return {"path": rel, "bytes": len(data)}

    def already_present() -> bool:
        # An interrupted attempt appended iff the file now ends with the text (good enough for distinct lines).
        return target.is_file() and target.read_bytes().endswith(data)

    ctx.ledger.apply_once(ctx.ident, "append_file", rel, _digest(data), apply, already_present)
    return f"appended {len(data)} bytes to {rel}"


def read_file(args: dict[str, Any], ctx: ToolContext) -> str:
    target = resolve_in_workspace(ctx.workspace, args["path"])
    if not target.is_file():
        raise ToolValidationError(f"read_file: {args['path']!r} does not exist in the workspace; list_files shows what does")
    data = target.read_bytes()
    if len(data) > MAX_FILE_BYTES:
        raise ToolValidationError(f"read_file: {args['path']!r} is {len(data)} bytes; the limit is {MAX_FILE_BYTES}")
    return data.decode(errors="replace")


def list_files(args: dict[str, Any], ctx: ToolContext) -> str:
    base = resolve_in_workspace(ctx.workspace, args.get("path") or ".")
    if not base.exists():
        return "(no files)"
    if not base.is_dir():
        raise ToolValidationError(f"list_files: {args.get('path')!r} is not a directory")
    files = sorted(
        _relative(ctx, p) for p in base.rglob("*") if p.is_file() and not p.name.startswith(".")
    )
    shown = files[:MAX_LISTED_FILES]
    more = f"\n... and {len(files) - len(shown)} more" if len(files) > len(shown) else ""
    return "\n".join(shown) + more if shown else "(no files)"


# -- fault tools: classified failures on demand --------------------------------


def flaky_service(args: dict[str, Any], ctx: ToolContext) -> str:
    fail_attempts = args.get("fail_attempts", 2)
    if ctx.ident.attempt <= fail_attempts:
        raise ToolRetryableError(
            f"flaky_service: transient failure on attempt {ctx.ident.attempt} of the first {fail_attempts}"
        )
    return f"flaky_service answered {args['request']!r} on attempt {ctx.ident.attempt}"


def broken_service(args: dict[str, Any], ctx: ToolContext) -> str:
    raise ToolExecutionError(f"broken_service rejected {args['request']!r}: account is closed")


MAX_SLOW_SECONDS = 600.0


async def slow_task(args: dict[str, Any], ctx: ToolContext) -> str:
    """Work that takes a while (and can be cancelled): for cancellation and fan-out scenarios."""
    seconds = args["seconds"]
    if not 0 <= seconds <= MAX_SLOW_SECONDS:
        raise ToolValidationError(f"slow_task: seconds must be between 0 and {MAX_SLOW_SECONDS:g}, got {seconds}")
    if args.get("fail"):
        await asyncio.sleep(seconds)
        raise ToolExecutionError(f"slow_task {args.get('label', '')!r} failed after {seconds:g} s (asked to fail)")
    await asyncio.sleep(seconds)
    return f"slow_task {args.get('label', '')!r} finished after {seconds:g} s"


async def run_tool(tool: Tool, args: dict[str, Any], ctx: ToolContext) -> str:
    """Run a tool, awaiting it if it is asynchronous."""
    out = tool.run(args, ctx)
    if inspect.isawaitable(out):
        out = await out
    return out


TOOLS: dict[str, Tool] = {
    t.name: t
    for t in [
        Tool("calculator", "Evaluate an arithmetic expression, e.g. '25 * 4'.",
             _schema({"expression": {"type": "string", "description": "arithmetic expression"}}, ["expression"]),
             calculator),
        Tool("weather", "Current weather for a city.",
             _schema({"city": {"type": "string"}}, ["city"]), weather),
        Tool("write_file", "Write a text file in your workspace (path relative to the workspace).",
             _schema({"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]),
             write_file, side_effects=True),
        Tool("append_file", "Append text to a file in your workspace (creates it if missing).",
             _schema({"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"]),
             append_file, side_effects=True),
        Tool("read_file", "Read a text file from your workspace.",
             _schema({"path": {"type": "string"}}, ["path"]), read_file),
        Tool("list_files", "List the files in your workspace, or under a directory of it.",
             _schema({"path": {"type": "string", "description": "directory; default '.'"}}, []), list_files),
        Tool("flaky_service", "Call a service that fails transiently for its first attempts.",
             _schema({"request": {"type": "string"}, "fail_attempts": {"type": "integer"}}, ["request"]),
             flaky_service),
        Tool("broken_service", "Call a service that always rejects the request.",
             _schema({"request": {"type": "string"}}, ["request"]), broken_service),
        Tool("slow_task", "Do work that takes the given number of seconds; with fail=true, fail at the end.",
             _schema({"seconds": {"type": "number"}, "label": {"type": "string"}, "fail": {"type": "boolean"}},
                     ["seconds"]), slow_task, expected_seconds=MAX_SLOW_SECONDS),
    ]
}

def _workflow_native(args: dict[str, Any], ctx: ToolContext) -> str:
    raise RuntimeError("a workflow-native tool runs in the workflow, never as an activity")


# Tools the workflow runs itself (agent.workflow): no activity; their specs and schemas live here.
_NATIVE_SPECS: dict[str, dict[str, Any]] = {
    "spawn": {
        "description": (
            "Start a subagent (a child agent run) on a task and, by default, wait for its final answer. "
            "agent_name picks a configured profile. With wait=false it returns a handle at once; "
            "pass the handle to wait() later to collect the answer (a run that ends terminates subagents it never "
            "waited for)."
        ),
        "parameters": _schema({
            "agent_name": {"type": "string", "description": "a configured subagent profile, e.g. 'generic'"},
            "task": {"type": "string", "description": "what the subagent must do, self-contained"},
            "wait": {"type": "boolean", "description": "wait for the answer (default true)"},
        }, ["agent_name", "task"]),
    },
    "wait": {
        "description": "Wait for a subagent started with spawn(..., wait=false) and return its final answer.",
        "parameters": _schema({"handle": {"type": "string", "description": "the handle spawn returned"}}, ["handle"]),
    },
    "run_ptc": {
        "description": (
            "Run a short Python program that orchestrates your other tools: each tool is an async function "
            "taking keyword arguments (await write_file(path=..., content=...)); fan out with "
            "await asyncio.gather(...). Allowed: assignments, arithmetic, comparisons, if/for/while, "
            "list/dict literals and comprehensions, f-strings, len/range/sorted/sum/min/max/str/int and similar "
            "builtins, print. No imports, no attribute access beyond a few str/list/dict methods, no files or "
            "network except through tools. The value of the last expression is the result. Tool results are strings."
        ),
        "parameters": _schema({"code": {"type": "string", "description": "the program"}}, ["code"]),
    },
}

TOOL_SETS: dict[str, list[str]] = {
    "default": ["calculator", "weather", "write_file", "append_file", "read_file", "list_files"],
    "faults": ["calculator", "weather", "write_file", "append_file", "read_file", "list_files", "flaky_service",
               "broken_service"],
    "orchestration": ["calculator", "weather", "write_file", "append_file", "read_file", "list_files", "spawn",
                      "wait", "run_ptc"],
}
NATIVE_TOOLS: dict[str, Tool] = {
    name: Tool(name, spec["description"], spec["parameters"], _workflow_native) for name, spec in _NATIVE_SPECS.items()
}


def known_tools() -> list[str]:
    return [*TOOLS, *NATIVE_TOOLS]


def check_tool_names(names: list[str]) -> None:
    unknown = [n for n in names if n not in TOOLS and n not in NATIVE_TOOLS]
    if unknown:
        raise ValueError(f"unknown tool(s) {', '.join(unknown)}; known tools: {', '.join(known_tools())}")


def tool_specs(names: list[str]) -> list[dict[str, Any]]:
    check_tool_names(names)
    return [(TOOLS.get(n) or NATIVE_TOOLS[n]).spec() for n in names]


def workspace_for(sandbox_root: Path, workflow_id: str) -> Path:
    """The per-run workspace directory: one per workflow id (it survives continue-as-new). Named by
    ``harness.recording.workspace_name``, so the checkers find it from the target's ``workspace`` template."""
    return sandbox_root / workspace_name(workflow_id)
