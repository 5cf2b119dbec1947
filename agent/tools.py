"""The agent's tools: their model-facing specs and their implementations.

Implementations are plain functions of ``(arguments, ToolContext)``. They
raise the classified errors of ``agent.errors``; the engine (a Temporal
activity, or the checkpoint runner) turns those into model-visible results or
retries. Side-effecting tools apply their effect through the effect ledger
with the activity's idempotency key, so a retried attempt does not apply it
twice.

Tool sets: ``default`` (calculator, weather, sandbox files) is what a live
model is offered; ``faults`` adds two tools whose only job is to fail in a
classified way, for scenarios and chaos runs.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import errno
import hashlib
import inspect
import math
import operator
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simpleeval import OperatorNotDefined, SimpleEval

from agent import numeric_limits
from agent.errors import ToolError, ToolExecutionError, ToolRetryableError, ToolValidationError
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

MAX_EXPRESSION_CHARS = 200
_CALCULATOR_GRAMMAR = "numbers, pi, e, + - * / // %, parentheses and abs/round/min/max"


class _CalculatorRefusal(Exception):
    """An expression outside the calculator's grammar or numeric bounds (becomes a ToolValidationError)."""


def _bounded(fn: Callable[..., Any], before: Callable[..., str | None] | None = None) -> Callable[..., Any]:
    """``fn`` with agent.numeric_limits checked on its operands before it runs and on its result after."""
    def run(*operands: Any) -> Any:
        if before is not None and (problem := before(*operands)):
            raise _CalculatorRefusal(problem)
        result = fn(*operands)
        if problem := numeric_limits.integer_problem(result):
            raise _CalculatorRefusal(problem)
        return result

    return run


def _round(number: Any, ndigits: Any = None) -> Any:
    if problem := numeric_limits.round_problem(ndigits):
        raise _CalculatorRefusal(problem)
    return round(number) if ndigits is None else round(number, ndigits)


def _number(node: ast.Constant) -> int | float:
    if type(node.value) not in (int, float):
        raise _CalculatorRefusal(f"{type(node.value).__name__} literals are not numbers")
    return node.value


def _calculator_evaluator() -> SimpleEval:
    """simpleeval cut down to arithmetic on numbers, every operation bounded by agent.numeric_limits (the PTC
    interpreter's limits): no strings, attributes, subscripts, comparisons, shifts, keywords or ``**``."""
    calc = SimpleEval(
        operators={ast.Add: _bounded(operator.add), ast.Sub: _bounded(operator.sub),
                   ast.Mult: _bounded(operator.mul, numeric_limits.product_problem),
                   ast.Div: _bounded(operator.truediv), ast.FloorDiv: _bounded(operator.floordiv),
                   ast.Mod: _bounded(operator.mod), ast.USub: _bounded(operator.neg), ast.UAdd: _bounded(operator.pos)},
        functions={"abs": _bounded(abs), "round": _bounded(_round), "min": _bounded(min), "max": _bounded(max)},
        names={"pi": math.pi, "e": math.e},
    )
    calc.nodes = {ast.Name: calc.nodes[ast.Name], ast.UnaryOp: calc.nodes[ast.UnaryOp],
                  ast.BinOp: calc.nodes[ast.BinOp], ast.Call: calc.nodes[ast.Call], ast.Constant: _number}
    return calc


def evaluate_arithmetic(expression: str) -> str:
    """The value of ``expression`` as text, or ToolValidationError naming what is wrong with it. Every operation
    is bounded before it runs, so any input returns within milliseconds."""
    expression = expression.strip()
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolValidationError(f"calculator: expression longer than {MAX_EXPRESSION_CHARS} characters")
    if "**" in expression:
        raise ToolValidationError("calculator: '**' is not allowed (it can make huge numbers); multiply instead")
    try:
        # one evaluator per call: SimpleEval keeps the expression on itself, and calls run in parallel threads
        value = _calculator_evaluator().eval(expression, previously_parsed=ast.parse(expression, mode="eval").body)
    except ZeroDivisionError:
        raise ToolValidationError(f"calculator: {expression!r} divides by zero") from None
    except _CalculatorRefusal as exc:
        raise ToolValidationError(f"calculator: {expression!r}: {exc}; use {_CALCULATOR_GRAMMAR}") from None
    except OperatorNotDefined as exc:  # its own text shows the operator object's address
        raise ToolValidationError(
            f"calculator: {expression!r}: operator {type(exc.attr).__name__} is not available; use {_CALCULATOR_GRAMMAR}"
        ) from None
    except Exception as exc:  # simpleeval raises several unrelated classes for bad input
        raise ToolValidationError(
            f"calculator: cannot evaluate {expression!r} ({type(exc).__name__}: {exc}); use {_CALCULATOR_GRAMMAR}"
        ) from None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ToolValidationError(f"calculator: {expression!r} is not a number")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


async def calculator(args: dict[str, Any], ctx: ToolContext) -> str:
    """``evaluate_arithmetic`` in a thread, so the worker's event loop (heartbeats, other activities) runs on."""
    return await asyncio.to_thread(evaluate_arithmetic, args["expression"])


# -- weather (a deterministic fake) -------------------------------------------

_CONDITIONS = ["sunny", "cloudy", "light rain", "windy", "overcast", "clear", "snow showers"]


def weather(args: dict[str, Any], ctx: ToolContext) -> str:
    city = args["city"].strip()
    if not city:
        raise ToolValidationError("weather: city must not be empty")
    h = int.from_bytes(hashlib.sha256(city.lower().encode()).digest()[:4], "big")
    return f"{city}: {_CONDITIONS[h % len(_CONDITIONS)]}, {h % 35 - 5} °C"


# -- sandbox files ----------------------------------------------------------
#
# Every access goes through directory file descriptors: the workspace root is opened once, each component of a path
# is opened relative to its parent with O_NOFOLLOW (missing directories are made with mkdirat for the writers), and
# the file itself is opened, created or renamed relative to the last directory. A path is never resolved first and
# reopened by name afterwards, so a directory swapped for a symlink meanwhile cannot redirect anything outside the
# workspace. Symlinks are not followed at all, not even ones that stay inside the workspace: a path through one is
# refused with a validation error that says so.
#
# Every failure is classified (agent.errors): an unclassified exception would be retried forever. Messages name only
# the workspace-relative path the model gave, never a host path (a str(OSError) carries the absolute one).

#: the longest path (in UTF-8 bytes) the file tools accept, and the longest name in it
MAX_PATH_BYTES = 1024
MAX_NAME_BYTES = 255
#: list_files descends at most this deep and looks at no more than this many entries
MAX_LIST_DEPTH = 64
MAX_LIST_ENTRIES = 100_000

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted in the workspace must not block the worker
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | _NONBLOCK | _CLOEXEC
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | _NONBLOCK | _CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC


def _errnos(*names: str) -> frozenset[int]:
    return frozenset(getattr(errno, n) for n in names if hasattr(errno, n))


#: the model's path or content is wrong: it can repair it
_VALIDATION_ERRNOS = _errnos("ENAMETOOLONG", "ENOTDIR", "EISDIR", "EEXIST", "ELOOP", "ENOENT", "ENOTEMPTY", "ENXIO",
                             "EINVAL", "EILSEQ", "EMLINK", "EBUSY", "ETXTBSY")
#: the workspace refuses the work for good (full, read-only, not permitted): terminal, the model is told
_TERMINAL_ERRNOS = _errnos("ENOSPC", "EDQUOT", "EFBIG", "EROFS", "EACCES", "EPERM")
# anything else (EIO, EMFILE, ENOMEM, ...) is transient: retried by the backend's policy

_HINTS = {
    errno.ENAMETOOLONG: f"a name in it is too long (at most {MAX_NAME_BYTES} bytes each)",
    errno.ENOTDIR: "a part of it is not a directory",
    errno.EISDIR: "it is a directory, not a file",
    errno.EEXIST: "something else already exists there",
    errno.ELOOP: "it is a symlink, and symlinks are not followed in the workspace",
    errno.ENOENT: "it (or a directory on the way to it) does not exist, or was removed meanwhile",
    errno.ENOTEMPTY: "it is a directory, not a file",
    errno.ENXIO: "it is not a regular file",
}


def _show(text: object) -> str:
    """A path or name for a message: quoted, bounded, non-printable characters (lone surrogates too) escaped."""
    if isinstance(text, str) and len(text) > 80:
        return f"{text[:60]!r}... ({len(text)} characters)"
    return repr(text)


def _os_error(tool: str, shown: str, exc: OSError) -> ToolError:
    """The classified error for an OSError on a workspace path: its reason (os.strerror), never str(exc), which
    carries the absolute host path."""
    code = exc.errno
    if code is None:
        return ToolRetryableError(f"{tool}: {shown}: file system error ({type(exc).__name__})")
    text = f"{tool}: {shown}: {os.strerror(code)}"
    if code in _TERMINAL_ERRNOS:
        return ToolExecutionError(f"{text}; the workspace refuses this, so it was not retried")
    if code in _VALIDATION_ERRNOS:
        hint = _HINTS.get(code)
        return ToolValidationError(f"{text} ({hint})" if hint else text)
    return ToolRetryableError(f"{text} (transient; the call is retried)")


class _Missing(Exception):
    """A directory on a path does not exist (raised only when the caller does not create it)."""


def _str_arg(tool: str, args: dict[str, Any], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str):
        raise ToolValidationError(f"{tool}: argument {name!r} must be string, got {type(value).__name__}")
    return value


def _split(user_path: object, tool: str = "") -> list[str]:
    """The components of a workspace-relative path ('.' and empty ones dropped), or a validation error."""
    say = f"{tool}: path" if tool else "path"
    if not isinstance(user_path, str) or not user_path.strip() or "\x00" in user_path:
        raise ToolValidationError(
            f"{say} {_show(user_path)} is empty or invalid; give a path relative to the workspace")
    if os.path.isabs(user_path):
        raise ToolValidationError(f"{say} {_show(user_path)} is absolute; give a path relative to the workspace")
    try:
        size = len(user_path.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ToolValidationError(
            f"{say} {_show(user_path)} has a character that is not valid text ({user_path[exc.start]!r} at "
            f"position {exc.start}, a lone surrogate); use ordinary characters") from None
    if size > MAX_PATH_BYTES:
        raise ToolValidationError(f"{say} {_show(user_path)} is {size} bytes long; the limit is {MAX_PATH_BYTES}")
    bad = next((c for c in user_path if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise ToolValidationError(f"{say} {_show(user_path)} contains the control character {bad!r}; "
                                  "use printable characters")
    parts = [p for p in user_path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ToolValidationError(f"{say} {_show(user_path)} contains '..'; a path that escapes the workspace is "
                                  "refused, and '..' is not accepted at all: give the path from the workspace down")
    long_name = next((p for p in parts if len(p.encode("utf-8")) > MAX_NAME_BYTES), None)
    if long_name is not None:
        raise ToolValidationError(f"{say} {_show(user_path)}: the name {_show(long_name)} is "
                                  f"{len(long_name.encode('utf-8'))} bytes long; the limit is {MAX_NAME_BYTES}")
    return parts


def _rel(parts: list[str]) -> str:
    return "/".join(parts) or "."


def _open_root(tool: str, workspace: Path, *, create: bool) -> int:
    """An fd of the workspace directory (the operator's path: a symlink in it is trusted). _Missing if it does not
    exist and is not to be created."""
    try:
        if create:
            os.makedirs(workspace, exist_ok=True)
        return os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except FileNotFoundError:
        if not create:
            raise _Missing() from None
        raise ToolRetryableError(f"{tool}: the workspace disappeared while it was opened") from None
    except OSError as exc:
        # Not the model's doing: terminal if the workspace refuses, otherwise retried (an operator can fix it).
        error = _os_error(tool, "the workspace", exc)
        if isinstance(error, ToolValidationError):
            error = ToolRetryableError(f"{error} (the workspace itself cannot be opened)")
        raise error from None


def _mode_at(parent: int, name: str) -> int | None:
    """The mode of ``name`` in directory ``parent``, not following a symlink; None if it cannot be read."""
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except OSError:
        return None


def _component_error(tool: str, parent: int, name: str, prefix: str, user_path: str, exc: OSError) -> ToolError:
    """A classified error for a directory component that could not be opened (or made), saying which one and why."""
    if exc.errno in (errno.ENOTDIR, errno.ELOOP, errno.EEXIST):
        mode = _mode_at(parent, name)
        if mode is not None and stat.S_ISLNK(mode):
            return ToolValidationError(
                f"{tool}: path {_show(user_path)} goes through a symlink ({_show(prefix)}); symlinks are not "
                "followed in the workspace, so that no path escapes it: use the real path instead")
        if mode is not None and not stat.S_ISDIR(mode):
            return ToolValidationError(
                f"{tool}: path {_show(user_path)}: {_show(prefix)} is a file, not a directory, so it cannot "
                "contain anything")
    return _os_error(tool, f"path {_show(user_path)} at {_show(prefix)}", exc)


def _open_subdir(tool: str, parent: int, name: str, prefix: str, user_path: str, create: bool) -> int:
    for _ in range(5):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise _Missing() from None
        except OSError as exc:
            raise _component_error(tool, parent, name, prefix, user_path, exc) from None
        try:
            os.mkdir(name, 0o777, dir_fd=parent)
        except FileExistsError:
            pass  # made meanwhile (by a concurrent call, or planted): opened, never followed, on the next round
        except OSError as exc:
            raise _component_error(tool, parent, name, prefix, user_path, exc) from None
    raise ToolRetryableError(f"{tool}: path {_show(user_path)}: {_show(prefix)} kept changing while it was opened")


@contextlib.contextmanager
def _directory(tool: str, workspace: Path, dirs: list[str], user_path: str, *, create: bool) -> Iterator[int]:
    """An fd of the workspace directory ``dirs`` names, opened one component at a time, none of them followed if it
    is a symlink; with ``create``, missing directories are made. Raises _Missing (without ``create``) if one is
    missing, or a classified error."""
    fd = _open_root(tool, workspace, create=create)
    try:
        for i, name in enumerate(dirs):
            child = _open_subdir(tool, fd, name, _rel(dirs[: i + 1]), user_path, create)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _file_error(tool: str, parent: int, name: str, rel: str, exc: OSError) -> ToolError:
    """A classified error for the last component of a path (the file itself)."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
        mode = _mode_at(parent, name)
        if mode is not None and stat.S_ISLNK(mode):
            return ToolValidationError(f"{tool}: {_show(rel)} is a symlink; symlinks are not followed in the "
                                       "workspace, so that no path escapes it: use the real path instead")
        if mode is not None and stat.S_ISDIR(mode):
            return ToolValidationError(f"{tool}: {_show(rel)} is a directory, not a file")
    return _os_error(tool, _show(rel), exc)


def _check_regular(tool: str, fd: int, rel: str) -> os.stat_result:
    st = os.fstat(fd)
    if stat.S_ISDIR(st.st_mode):
        raise ToolValidationError(f"{tool}: {_show(rel)} is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise ToolValidationError(f"{tool}: {_show(rel)} is not a regular file")
    return st


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_at(tool: str, parent: int, name: str, rel: str) -> bytes:
    """The bytes of the regular file ``name`` in directory ``parent`` (a symlink is not followed), at most
    MAX_FILE_BYTES of them, or a classified error."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        raise ToolValidationError(
            f"{tool}: {_show(rel)} does not exist in the workspace; list_files shows what does") from None
    except OSError as exc:
        raise _file_error(tool, parent, name, rel, exc) from None
    try:
        st = _check_regular(tool, fd, rel)
        if st.st_size > MAX_FILE_BYTES:
            raise ToolValidationError(f"{tool}: {_show(rel)} is {st.st_size} bytes; the limit is {MAX_FILE_BYTES}")
        chunks, size = [], 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_FILE_BYTES:  # it grew while it was read
            raise ToolValidationError(f"{tool}: {_show(rel)} is over {MAX_FILE_BYTES} bytes; that is the limit")
        return b"".join(chunks)
    except OSError as exc:
        raise _os_error(tool, _show(rel), exc) from None
    finally:
        os.close(fd)


def _read_in_workspace(tool: str, workspace: Path, parts: list[str], user_path: str) -> bytes:
    if not parts:
        raise ToolValidationError(f"{tool}: {_show(user_path)} is the workspace directory, not a file")
    try:
        with _directory(tool, workspace, parts[:-1], user_path, create=False) as fd:
            return _read_at(tool, fd, parts[-1], _rel(parts))
    except _Missing:
        raise ToolValidationError(
            f"{tool}: {_show(_rel(parts))} does not exist in the workspace; list_files shows what does") from None


def _temp_names(name: str, attempt: int) -> Iterator[str]:
    """Names for a write's temporary file: hidden (list_files skips it), short enough for any target name."""
    stem = f".{name}".encode("utf-8")[: MAX_NAME_BYTES - 40].decode("utf-8", "ignore")
    yield f"{stem}.{attempt}.tmp"
    yield f"{stem}.{attempt}.tmp"  # again, once a stale one is removed
    for _ in range(6):
        yield f"{stem}.{attempt}.{secrets.token_hex(6)}.tmp"


def _create_temp(tool: str, parent: int, name: str, attempt: int, rel: str) -> tuple[str, int]:
    for i, tmp in enumerate(_temp_names(name, attempt)):
        try:
            return tmp, os.open(tmp, _TEMP_FLAGS, 0o666, dir_fd=parent)
        except FileExistsError:
            if i == 0:
                # A crashed attempt's leftover, or something planted (a symlink to a victim): removed with
                # unlinkat, which never follows it; a name that cannot be removed is passed over for a fresh one.
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent)
        except OSError as exc:
            raise _os_error(tool, _show(rel), exc) from None
    raise ToolRetryableError(f"{tool}: {_show(rel)}: no temporary file could be created next to it")


def _write_at(tool: str, parent: int, name: str, rel: str, data: bytes, attempt: int) -> None:
    """Replace ``name`` in ``parent`` atomically: a fresh temporary file (O_EXCL, O_NOFOLLOW) written and fsynced,
    then renamed over it within the same directory fd. A crash leaves the old file or the new one, never half."""
    tmp, fd = _create_temp(tool, parent, name, attempt, rel)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)  # renameat: replaces a symlink, never follows
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=parent)
        raise _file_error(tool, parent, name, rel, exc) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=parent)
        raise
    with contextlib.suppress(OSError):
        os.fsync(parent)  # the rename itself survives a crash


def _append_at(tool: str, parent: int, name: str, rel: str, data: bytes) -> None:
    try:
        fd = os.open(name, _APPEND_FLAGS, 0o666, dir_fd=parent)
    except OSError as exc:
        raise _file_error(tool, parent, name, rel, exc) from None
    try:
        _check_regular(tool, fd, rel)
        _write_all(fd, data)
        os.fsync(fd)
    except OSError as exc:
        raise _os_error(tool, _show(rel), exc) from None
    finally:
        os.close(fd)


def _refuse_existing(tool: str, workspace: Path, parts: list[str], user_path: str, *, directory: bool) -> None:
    """Refuse what is at the path now if it is a symlink (or, with ``directory``, a directory); a path that does not
    exist (yet) passes: a writer makes it, inside the workspace."""
    try:
        with _directory(tool, workspace, parts[:-1], user_path, create=False) as fd:
            try:
                mode = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False).st_mode
            except FileNotFoundError:
                return
            except OSError as exc:
                raise _file_error(tool, fd, parts[-1], _rel(parts), exc) from None
            if stat.S_ISLNK(mode) or (directory and stat.S_ISDIR(mode)):
                code = errno.ELOOP if stat.S_ISLNK(mode) else errno.EISDIR
                raise _file_error(tool, fd, parts[-1], _rel(parts), OSError(code, "refused"))
    except _Missing:
        pass


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _file_write_target(tool: str, args: dict[str, Any], ctx: ToolContext) -> tuple[list[str], bytes, str]:
    """(path components, bytes to write, workspace-relative path) for a writing tool, or a validation error.

    What is there now is checked too (a directory, a file on the way, a symlink), so that a call refused for its
    arguments is refused before its effect is claimed in the ledger; the write itself checks again, safely."""
    user_path = _str_arg(tool, args, "path")
    content = _str_arg(tool, args, "content")
    parts = _split(user_path, tool)
    try:
        data = content.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ToolValidationError(
            f"{tool}: content has a character that cannot be written as UTF-8 text ({content[exc.start]!r} at "
            f"position {exc.start}, a lone surrogate); remove or replace it") from None
    if len(data) > MAX_FILE_BYTES:
        raise ToolValidationError(f"{tool}: content is {len(data)} bytes; the limit is {MAX_FILE_BYTES}")
    rel = _rel(parts)
    if not parts:
        raise ToolValidationError(f"{tool}: {_show(user_path)} is the workspace directory, not a file")
    _refuse_existing(tool, ctx.workspace, parts, user_path, directory=True)
    return parts, data, rel


def write_file(args: dict[str, Any], ctx: ToolContext) -> str:
    tool = "write_file"
    parts, data, rel = _file_write_target(tool, args, ctx)
    digest = _digest(data)

    def apply() -> dict[str, Any]:
        with _directory(tool, ctx.workspace, parts[:-1], rel, create=True) as fd:
            _write_at(tool, fd, parts[-1], rel, data, ctx.ident.attempt)
        return {"path": rel, "bytes": len(data)}

    def already_present() -> bool:
        try:
            return _digest(_read_in_workspace(tool, ctx.workspace, parts, rel)) == digest
        except (ToolError, OSError):
            return False

    # A retry answers exactly as the first attempt did: the model cannot tell (and need not know).
    ctx.ledger.apply_once(ctx.ident, tool, rel, digest, apply, already_present)
    return f"wrote {len(data)} bytes to {rel}"


def append_file(args: dict[str, Any], ctx: ToolContext) -> str:
    """Append text: not idempotent by nature, so only the idempotency key keeps a retry from appending twice."""
    tool = "append_file"
    parts, data, rel = _file_write_target(tool, args, ctx)

    def apply() -> dict[str, Any]:
        with _directory(tool, ctx.workspace, parts[:-1], rel, create=True) as fd:
            _append_at(tool, fd, parts[-1], rel, data)
        return {"path": rel, "bytes": len(data)}

    def already_present() -> bool:
        # An interrupted attempt appended iff the file now ends with the text (good enough for distinct lines).
        try:
            return _read_in_workspace(tool, ctx.workspace, parts, rel).endswith(data)
        except (ToolError, OSError):
            return False

    ctx.ledger.apply_once(ctx.ident, tool, rel, _digest(data), apply, already_present)
    return f"appended {len(data)} bytes to {rel}"


def read_file(args: dict[str, Any], ctx: ToolContext) -> str:
    tool = "read_file"
    user_path = _str_arg(tool, args, "path")
    return _read_in_workspace(tool, ctx.workspace, _split(user_path, tool), user_path).decode(errors="replace")


def _printable(name: str) -> str:
    """A directory entry's name as text (a name that is not UTF-8 arrives with surrogate escapes)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _scan(fd: int, prefix: str, depth: int, files: list[str], budget: list[int]) -> None:
    """Collect the regular files under directory ``fd`` (hidden ones skipped), descending through directories
    opened relative to it without following symlinks; a symlink is neither listed nor entered."""
    with os.scandir(fd) as entries:
        listing = list(entries)
    for entry in listing:
        budget[0] -= 1
        if budget[0] < 0:
            return
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
            is_file = not is_dir and entry.is_file(follow_symlinks=False)
        except OSError:
            continue
        if is_file and not entry.name.startswith("."):
            files.append(prefix + _printable(entry.name))
        elif is_dir and depth < MAX_LIST_DEPTH:
            try:
                child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # removed, or swapped for a symlink, since it was listed: skipped
            try:
                _scan(child, f"{prefix}{_printable(entry.name)}/", depth + 1, files, budget)
            except OSError:
                pass  # a subdirectory that cannot be read is left out
            finally:
                os.close(child)


def list_files(args: dict[str, Any], ctx: ToolContext) -> str:
    tool = "list_files"
    user_path = args.get("path") or "."
    parts = _split(user_path, tool)
    files: list[str] = []
    budget = [MAX_LIST_ENTRIES]
    try:
        with _directory(tool, ctx.workspace, parts, user_path, create=False) as fd:
            try:
                _scan(fd, "/".join(parts) + "/" if parts else "", 0, files, budget)
            except OSError as exc:
                raise _os_error(tool, _show(_rel(parts)), exc) from None
    except _Missing:
        return "(no files)"
    files.sort()
    shown = files[:MAX_LISTED_FILES]
    more = f"\n... and {len(files) - len(shown)} more" if len(files) > len(shown) else ""
    if budget[0] < 0:
        more += f"\n... (the listing stopped after {MAX_LIST_ENTRIES} entries)"
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


#: the longest a tool run as a local activity may be expected to take (it runs inside the workflow task's lease)
LOCAL_TOOL_MAX_SECONDS = 5.0


def local_tool_problem(name: str) -> str | None:
    """Why ``name`` may not run as a local activity (None: it may). A local activity is retried by the worker
    that runs the workflow task and recorded only when that task completes: after a crash it runs again, so
    only a tool without side effects, short enough for the task's lease, may run that way."""
    tool = TOOLS.get(name)
    if tool is None:
        return f"{name!r} is not an activity tool" + (" (the workflow runs it itself)" if name in NATIVE_TOOLS else "")
    if tool.side_effects:
        return f"{name!r} has side effects (a local activity is run again after a crash, unrecorded)"
    if tool.expected_seconds > LOCAL_TOOL_MAX_SECONDS:
        return f"{name!r} may take {tool.expected_seconds:g} s (local activities are for <= {LOCAL_TOOL_MAX_SECONDS:g} s)"
    return None


def check_local_tools(names: list[str]) -> None:
    problems = [p for p in (local_tool_problem(n) for n in names) if p]
    if problems:
        raise ValueError("local_tools: " + "; ".join(problems))


def tool_specs(names: list[str]) -> list[dict[str, Any]]:
    check_tool_names(names)
    return [(TOOLS.get(n) or NATIVE_TOOLS[n]).spec() for n in names]


def workspace_for(sandbox_root: Path, workflow_id: str) -> Path:
    """The per-run workspace directory: one per workflow id (it survives continue-as-new). Named by
    ``harness.recording.workspace_name``, so the checkers find it from the target's ``workspace`` template."""
    return sandbox_root / workspace_name(workflow_id)
