"""Programmatic tool calling: a deterministic, sandboxed interpreter for
model-written tool-orchestration Python.

``run_ptc(code, tools)`` parses the program with ``ast.parse`` and walks the
tree itself; the user's code is never compiled to CPython bytecode. It is
meant to run *inside* a Temporal workflow, so it uses no threads, wall clock,
randomness or I/O: its result and the order in which it starts tool calls are
a pure function of the code and the tool results (gather starts its calls in
argument order, and failures are observed in completion order, which the
workflow event loop replays exactly).

The language is the subset orchestration needs: literals, names, assignment
(incl. unpacking and ``+=``), arithmetic, comparisons, boolean ops,
``if``/``for``/``while``/``break``/``continue``/``pass``, list/tuple/dict/set
literals and comprehensions, subscripts and slices, f-strings, conditional
expressions, an allow-list of builtins, a few safe methods of str/list/dict,
``await tool(...)`` and ``await asyncio.gather(...)``. The last expression
statement is the result. Anything else is refused with a ``PtcError`` whose
text is model-visible repair feedback: ``"line N: <what>; <how to fix>"``.

Why not an off-the-shelf interpreter: RestrictedPython compiles to real
bytecode and runs it with ``exec``; asteval and simpleeval have no
``async``/``await``; Monty (pydantic-monty) runs outside the Python event loop,
so its tool calls cannot be workflow-native awaits. A small AST walker is the
one option that awaits tools on the workflow's own loop.
"""

from __future__ import annotations

import ast
import asyncio
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PtcDisallowed",
    "PtcError",
    "PtcLimitExceeded",
    "PtcLimits",
    "PtcResult",
    "PtcRuntimeError",
    "PtcSyntaxError",
    "PtcToolError",
    "ToolFn",
    "run_ptc",
]

ToolFn = Callable[..., Awaitable[Any]]

MAX_INT_DIGITS = 1000
MAX_NESTING_DEPTH = 100
MAX_FORMAT_WIDTH = 1000
MAX_CODE_CHARS = 100_000


# --------------------------------------------------------------------------- errors


class PtcError(Exception):
    """A program failure the model can repair; ``str(e)`` is the feedback text."""

    kind = "error"

    def __init__(self, message: str, line: int | None = None) -> None:
        self.line = line
        self.message = message
        super().__init__(f"line {line}: {message}" if line is not None else message)


class PtcSyntaxError(PtcError):
    kind = "syntax"


class PtcDisallowed(PtcError):
    kind = "disallowed"


class PtcLimitExceeded(PtcError):
    kind = "limit"


class PtcRuntimeError(PtcError):
    """An ordinary Python error in the program (KeyError, ZeroDivisionError, ...)."""

    kind = "runtime"


class PtcToolError(PtcError):
    """A tool call raised; ``.tool`` names it, ``.tool_message`` is its message."""

    kind = "tool"

    def __init__(self, tool: str, tool_message: str, line: int | None = None) -> None:
        self.tool = tool
        self.tool_message = tool_message
        super().__init__(f"tool {tool} failed: {tool_message}", line)


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class PtcLimits:
    max_operations: int = 10_000  # AST node evaluations (+1 per 1000 elements allocated)
    max_loop_iterations: int = 1_000  # per loop/comprehension execution
    max_output_chars: int = 20_000  # len(repr(result)) and total printed text
    max_collection_size: int = 10_000  # elements of any list/tuple/dict/set built
    max_string_chars: int = 1_000_000  # length of any string the program builds


@dataclass
class PtcResult:
    value: Any
    output: str
    operations: int
    tool_calls: int


# --------------------------------------------------------------------------- runtime values


class _AsyncioMarker:
    """The predefined name ``asyncio``; only ``asyncio.gather`` exists on it."""

    def __repr__(self) -> str:
        return "<asyncio>"


class _GatherRef:
    def __repr__(self) -> str:
        return "<asyncio.gather>"


_ASYNCIO = _AsyncioMarker()
_GATHER = _GatherRef()


@dataclass(eq=False)
class _ToolRef:
    name: str
    fn: ToolFn

    def __repr__(self) -> str:
        return f"<tool {self.name}>"


class _Pending:
    """An un-awaited tool call or gather; only ``await`` / ``asyncio.gather`` consume it."""

    line: int
    consumed: bool = False

    def describe(self) -> str:
        raise NotImplementedError

    async def run(self) -> Any:
        raise NotImplementedError


class _PendingCall(_Pending):
    def __init__(self, interp: _Interpreter, tool: _ToolRef, args: list, kwargs: dict, line: int):
        self.interp, self.tool, self.args, self.kwargs, self.line = interp, tool, args, kwargs, line

    def describe(self) -> str:
        return f"{self.tool.name}(...)"

    def __repr__(self) -> str:
        return f"<un-awaited call {self.tool.name}(...)>"

    async def run(self) -> Any:
        self.interp.tool_calls += 1
        try:
            return await self.tool.fn(*self.args, **self.kwargs)
        except PtcError:
            raise
        except Exception as e:  # CancelledError is a BaseException and passes through
            raise PtcToolError(self.tool.name, str(e) or type(e).__name__, self.line) from e


class _PendingGather(_Pending):
    def __init__(self, interp: _Interpreter, items: list[_Pending], line: int):
        self.interp, self.items, self.line = interp, items, line

    def describe(self) -> str:
        return "asyncio.gather(...)"

    def __repr__(self) -> str:
        return "<un-awaited asyncio.gather(...)>"

    async def run(self) -> Any:
        return await _gather(self.items)


async def _gather(items: list[_Pending]) -> list[Any]:
    """Run pending calls concurrently, started in argument order; results in order.

    On the first failure (in completion order) the in-flight siblings are
    cancelled and awaited, then the failure is raised. Cancellation of the
    caller cancels every inner task. Uses done-callbacks rather than
    ``asyncio.wait`` so nothing depends on set iteration order.
    """
    tasks = [asyncio.create_task(item.run()) for item in items]
    if not tasks:
        return []
    loop = asyncio.get_running_loop()
    settled = loop.create_future()
    first_failure: list[asyncio.Task] = []
    remaining = len(tasks)

    def on_done(task: asyncio.Task) -> None:
        nonlocal remaining
        remaining -= 1
        failed = task.cancelled() or task.exception() is not None
        if failed and not first_failure:
            first_failure.append(task)
        if not settled.done() and (failed or remaining == 0):
            settled.set_result(None)

    for task in tasks:
        task.add_done_callback(on_done)
    try:
        await settled
    except BaseException:
        await _cancel_and_wait(tasks)
        raise
    if first_failure:
        await _cancel_and_wait(tasks)
        return first_failure[0].result()  # raises its PtcToolError / CancelledError
    return [task.result() for task in tasks]


async def _cancel_and_wait(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    pending = [task for task in tasks if not task.done()]
    if pending:
        loop = asyncio.get_running_loop()
        all_done = loop.create_future()
        left = len(pending)

        def on_done(_: asyncio.Task) -> None:
            nonlocal left
            left -= 1
            if left == 0 and not all_done.done():
                all_done.set_result(None)

        for task in pending:
            task.add_done_callback(on_done)
        await all_done  # an outer cancellation here propagates; tasks are already cancelled
    for task in tasks:
        if not task.cancelled():
            task.exception()  # mark retrieved so asyncio does not log it


@dataclass(eq=False)
class _BoundMethod:
    obj: Any
    name: str

    def __repr__(self) -> str:
        return f"<method {type(self.obj).__name__}.{self.name}>"


_SAFE_METHODS: dict[type, frozenset[str]] = {
    str: frozenset(
        "upper lower strip lstrip rstrip split rsplit join startswith endswith replace "
        "splitlines find count title capitalize isdigit isalpha isalnum isspace islower isupper".split()
    ),
    list: frozenset("append extend pop index count sort reverse insert remove copy clear".split()),
    dict: frozenset("get keys values items update pop copy setdefault clear".split()),
    tuple: frozenset("index count".split()),
    set: frozenset("add discard remove union intersection difference copy".split()),
}
_ITERABLE_TYPES = (list, tuple, dict, str, range, set, frozenset, type({}.keys()), type({}.values()), type({}.items()))


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


# --------------------------------------------------------------------------- interpreter

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
}
_CMPOPS: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
}
_REFUSED_STATEMENTS: dict[type, str] = {
    ast.Import: "imports are not allowed; tools are already available as functions and asyncio.gather is predefined",
    ast.ImportFrom: "imports are not allowed; tools are already available as functions and asyncio.gather is predefined",
    ast.FunctionDef: "defining functions is not allowed; write the steps inline or use a loop",
    ast.AsyncFunctionDef: "defining functions is not allowed; write the steps inline or use a loop",
    ast.ClassDef: "defining classes is not allowed; use dicts and lists",
    ast.Try: "try/except is not available; a failing tool call ends the program and its error is reported to you",
    ast.With: "'with' is not available; call tools directly",
    ast.AsyncWith: "'async with' is not available; call tools directly",
    ast.AsyncFor: "'async for' is not available; use a for loop with await inside, or asyncio.gather",
    ast.Global: "'global' is not available; all names are already global",
    ast.Nonlocal: "'nonlocal' is not available; all names are already global",
    ast.Delete: "'del' is not available; reassign the name or use dict.pop / list.pop",
    ast.Return: "'return' is not available; the last expression statement is the program's result",
    ast.Raise: "'raise' is not available; end the program with a result describing the problem",
    ast.Assert: "'assert' is not available; use if",
    ast.Match: "'match' is not available; use if/elif",
}
_REFUSED_BUILTINS = frozenset(
    "open eval exec compile globals locals vars getattr setattr delattr hasattr input breakpoint "
    "type object dir help id hash memoryview bytes bytearray iter next super property".split()
)
_REFUSED_EXPRESSIONS: dict[type, str] = {
    ast.Lambda: "lambda is not available; use a comprehension or a loop",
    ast.Yield: "'yield' is not available; collect values in a list",
    ast.YieldFrom: "'yield from' is not available; collect values in a list",
    ast.NamedExpr: "':=' is not available; assign on its own line",
    ast.GeneratorExp: "generator expressions are not available; use a list comprehension [...]",
}


class _Interpreter:
    def __init__(self, tools: Mapping[str, ToolFn], limits: PtcLimits) -> None:
        self.limits = limits
        self.tools = {name: _ToolRef(name, fn) for name, fn in tools.items()}
        self.env: dict[str, Any] = {}
        self.operations = 0
        self.tool_calls = 0
        self.output: list[str] = []
        self.output_chars = 0
        self.depth = 0
        self.pending: list[_Pending] = []
        self.builtins: dict[str, Callable[..., Any]] = {
            "len": len,
            "range": self._range,
            "min": self._consuming(min),
            "max": self._consuming(max),
            "sum": self._consuming(sum),
            "sorted": self._sorted,
            "list": self._consuming(list),
            "tuple": self._consuming(tuple),
            "set": self._consuming(set),
            "dict": self._dict,
            "str": self._str,
            "int": int,
            "float": float,
            "bool": bool,
            "abs": abs,
            "round": round,
            "enumerate": self._enumerate,
            "zip": self._zip,
            "any": self._consuming(any),
            "all": self._consuming(all),
            "print": self._print,
        }

    # ---- bookkeeping

    def charge(self, node: ast.AST, n: int = 1) -> None:
        self.operations += n
        if self.operations > self.limits.max_operations:
            raise PtcLimitExceeded(
                f"operation limit of {self.limits.max_operations} exceeded; do less work per program "
                "(fewer iterations, smaller data) or split it into several run_ptc calls",
                _line(node),
            )

    def check_size(self, value: Any, node: ast.AST) -> Any:
        if isinstance(value, str):
            if len(value) > self.limits.max_string_chars:
                raise PtcLimitExceeded(
                    f"string of {len(value)} characters exceeds the limit of {self.limits.max_string_chars}",
                    _line(node),
                )
            self.charge(node, len(value) // 1000)
        elif isinstance(value, (list, tuple, dict, set, frozenset)):
            if len(value) > self.limits.max_collection_size:
                raise PtcLimitExceeded(
                    f"collection of {len(value)} elements exceeds the limit of {self.limits.max_collection_size}",
                    _line(node),
                )
            self.charge(node, len(value) // 1000)
        elif isinstance(value, int) and not isinstance(value, bool):
            if value.bit_length() > MAX_INT_DIGITS * 3.33:
                raise PtcLimitExceeded(f"integer with more than {MAX_INT_DIGITS} digits refused", _line(node))
        return value

    def check_renderable(self, value: Any, node: ast.AST | None) -> None:
        cap = self.limits.max_string_chars
        if not isinstance(value, (str, int, float, bool, type(None))) and _render_estimate(value, cap) > cap:
            raise PtcLimitExceeded(
                f"value is too large to turn into text (over {cap} characters); format a summary instead",
                _line(node),
            )

    def iterate(self, value: Any, node: ast.AST) -> list[Any]:
        """Materialise an iterable in a deterministic order, bounded in size."""
        if isinstance(value, _Pending):
            raise _unawaited(value, node)
        if not isinstance(value, _ITERABLE_TYPES):
            raise PtcRuntimeError(f"cannot iterate over {type(value).__name__}; iterate over a list, dict, str or range", _line(node))
        try:
            size = len(value)
        except OverflowError:
            size = self.limits.max_collection_size + 1
        if size > self.limits.max_collection_size and not isinstance(value, str):
            raise PtcLimitExceeded(
                f"iterating over {type(value).__name__} of {size} elements exceeds the limit of "
                f"{self.limits.max_collection_size}",
                _line(node),
            )
        if isinstance(value, (set, frozenset)):
            try:
                return sorted(value)  # set order of strings depends on the process's hash seed
            except TypeError:
                raise PtcRuntimeError("cannot iterate over a set of mixed types deterministically; use a list", _line(node)) from None
        self.charge(node, size // 1000)
        return list(value)

    # ---- builtins that need bounds

    def _range(self, *args: Any) -> range:
        return range(*args)

    def _consuming(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(node: ast.AST, *args: Any, **kwargs: Any) -> Any:
            allowed_kwargs = {"default"} if fn in (min, max) else {"start"} if fn is sum else set()
            if set(kwargs) - allowed_kwargs:
                raise PtcDisallowed(f"{fn.__name__}() keyword arguments {sorted(kwargs)} are not supported", _line(node))
            if fn is sum and not _is_number(kwargs.get("start", 0)) or fn is sum and len(args) > 1:
                raise PtcDisallowed("sum() adds numbers only; use a loop with list.extend to concatenate", _line(node))
            if len(args) == 1:
                return fn(self.iterate(args[0], node), **kwargs)
            if not args:
                return fn(**kwargs)
            return fn(*args, **kwargs)

        call.needs_node = True  # type: ignore[attr-defined]
        return call

    def _sorted(self, node: ast.AST, iterable: Any, *, reverse: bool = False) -> list:
        return sorted(self.iterate(iterable, node), reverse=bool(reverse))

    _sorted.needs_node = True  # type: ignore[attr-defined]

    def _dict(self, node: ast.AST, *args: Any, **kwargs: Any) -> dict:
        if args:
            (source,) = args
            if isinstance(source, dict):
                return {**source, **kwargs}
            return {**dict(self.iterate(source, node)), **kwargs}
        return dict(kwargs)

    _dict.needs_node = True  # type: ignore[attr-defined]

    def _enumerate(self, node: ast.AST, iterable: Any, start: int = 0) -> list:
        return list(enumerate(self.iterate(iterable, node), start))

    _enumerate.needs_node = True  # type: ignore[attr-defined]

    def _zip(self, node: ast.AST, *iterables: Any) -> list:
        return list(zip(*(self.iterate(it, node) for it in iterables)))

    _zip.needs_node = True  # type: ignore[attr-defined]

    def _str(self, node: ast.AST, value: Any = "") -> str:
        if isinstance(value, _Pending):
            raise _unawaited(value, node)
        self.check_renderable(value, node)
        return str(value)

    _str.needs_node = True  # type: ignore[attr-defined]

    def _print(self, node: ast.AST, *args: Any, sep: str = " ", end: str = "\n") -> None:
        for arg in args:
            if isinstance(arg, _Pending):
                raise _unawaited(arg, node)
        if _render_estimate(args, self.limits.max_output_chars) > self.limits.max_output_chars - self.output_chars:
            raise PtcLimitExceeded(
                f"printed output exceeds {self.limits.max_output_chars} characters; print less "
                "(summaries or counts instead of whole values)",
                _line(node),
            )
        text = str(sep).join(str(a) for a in args) + str(end)
        self.output_chars += len(text)
        if self.output_chars > self.limits.max_output_chars:
            raise PtcLimitExceeded(
                f"printed output exceeds {self.limits.max_output_chars} characters; print less "
                "(summaries or counts instead of whole values)",
                _line(node),
            )
        self.output.append(text)

    _print.needs_node = True  # type: ignore[attr-defined]

    # ---- statements

    async def run(self, tree: ast.Module) -> Any:
        value = None
        for i, stmt in enumerate(tree.body):
            if i == len(tree.body) - 1 and isinstance(stmt, ast.Expr):
                self.charge(stmt)
                value = await self.eval(stmt.value)
            else:
                await self.exec(stmt)
        for pending in self.pending:
            if not pending.consumed:
                raise _unawaited(pending, None)
        return value

    async def exec_block(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            await self.exec(stmt)

    async def exec(self, stmt: ast.stmt) -> None:
        self.charge(stmt)
        kind = type(stmt)
        if kind is ast.Expr:
            await self.eval(stmt.value)
        elif kind is ast.Assign:
            value = await self.eval(stmt.value)
            for target in stmt.targets:
                await self.assign(target, value)
        elif kind is ast.AugAssign:
            await self.aug_assign(stmt)
        elif kind is ast.AnnAssign:
            if stmt.value is not None:
                await self.assign(stmt.target, await self.eval(stmt.value))
        elif kind is ast.If:
            await self.exec_block(stmt.body if _truth(await self.eval(stmt.test), stmt) else stmt.orelse)
        elif kind is ast.For:
            await self.exec_for(stmt)
        elif kind is ast.While:
            await self.exec_while(stmt)
        elif kind is ast.Break:
            raise _Break()
        elif kind is ast.Continue:
            raise _Continue()
        elif kind is ast.Pass:
            pass
        elif kind in _REFUSED_STATEMENTS:
            raise PtcDisallowed(_REFUSED_STATEMENTS[kind], stmt.lineno)
        else:
            raise PtcDisallowed(f"{kind.__name__} statements are not available", stmt.lineno)

    def _loop_tick(self, stmt: ast.AST, count: int) -> None:
        if count > self.limits.max_loop_iterations:
            raise PtcLimitExceeded(
                f"loop exceeded {self.limits.max_loop_iterations} iterations; bound the loop or process less data",
                _line(stmt),
            )

    async def exec_for(self, stmt: ast.For) -> None:
        items = self.iterate(await self.eval(stmt.iter), stmt.iter)
        count = 0
        for item in items:
            count += 1
            self._loop_tick(stmt, count)
            await self.assign(stmt.target, item)
            try:
                await self.exec_block(stmt.body)
            except _Break:
                return
            except _Continue:
                continue
        await self.exec_block(stmt.orelse)

    async def exec_while(self, stmt: ast.While) -> None:
        count = 0
        while _truth(await self.eval(stmt.test), stmt.test):
            count += 1
            self._loop_tick(stmt, count)
            try:
                await self.exec_block(stmt.body)
            except _Break:
                return
            except _Continue:
                continue
        await self.exec_block(stmt.orelse)

    async def assign(self, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            _check_name(target.id, target)
            self.env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            items = self.iterate(value, target)
            starred = [i for i, elt in enumerate(target.elts) if isinstance(elt, ast.Starred)]
            if starred:
                (s,) = starred
                after = len(target.elts) - s - 1
                if len(items) < s + after:
                    raise PtcRuntimeError(f"not enough values to unpack (expected at least {s + after}, got {len(items)})", _line(target))
                parts = items[:s] + [items[s : len(items) - after]] + items[len(items) - after :]
                for elt, part in zip(target.elts, parts, strict=True):
                    await self.assign(elt.value if isinstance(elt, ast.Starred) else elt, part)
                return
            if len(items) != len(target.elts):
                raise PtcRuntimeError(f"cannot unpack {len(items)} values into {len(target.elts)} names", _line(target))
            for elt, item in zip(target.elts, items, strict=True):
                await self.assign(elt, item)
        elif isinstance(target, ast.Subscript):
            obj = await self.eval(target.value)
            if not isinstance(obj, (list, dict)):
                raise PtcRuntimeError(f"cannot assign items of {type(obj).__name__}; only list and dict items", _line(target))
            key = await self.eval(target.slice)
            try:
                obj[key] = value
            except (KeyError, IndexError, TypeError, ValueError) as e:
                raise PtcRuntimeError(f"{type(e).__name__}: {e}", _line(target)) from None
            self.check_size(obj, target)
        elif isinstance(target, ast.Attribute):
            raise PtcDisallowed("assigning attributes is not allowed; use dict items: d['key'] = value", _line(target))
        else:
            raise PtcDisallowed(f"cannot assign to {type(target).__name__}", _line(target))

    async def aug_assign(self, stmt: ast.AugAssign) -> None:
        target = stmt.target
        if isinstance(target, ast.Name):
            current = await self.eval(ast.copy_location(ast.Name(id=target.id, ctx=ast.Load()), target))
            self.env[target.id] = self.binop(stmt.op, current, await self.eval(stmt.value), stmt)
        elif isinstance(target, ast.Subscript):
            obj = await self.eval(target.value)
            key = await self.eval(target.slice)
            current = self.subscript(obj, key, target)
            new = self.binop(stmt.op, current, await self.eval(stmt.value), stmt)
            if not isinstance(obj, (list, dict)):
                raise PtcRuntimeError(f"cannot assign items of {type(obj).__name__}; only list and dict items", _line(target))
            obj[key] = new
        else:
            raise PtcDisallowed("augmented assignment works on names and list/dict items only", _line(target))

    # ---- expressions

    async def eval(self, node: ast.expr) -> Any:
        self.charge(node)
        self.depth += 1
        try:
            if self.depth > MAX_NESTING_DEPTH:
                raise PtcLimitExceeded(f"expression nested deeper than {MAX_NESTING_DEPTH} levels; split it into steps", _line(node))
            return await self._eval(node)
        except (PtcError, _Break, _Continue):
            raise
        except RecursionError:
            raise PtcLimitExceeded("expression too deeply nested; split it into steps", _line(node)) from None
        except MemoryError:
            raise PtcLimitExceeded("value too large", _line(node)) from None
        except Exception as e:
            raise PtcRuntimeError(f"{type(e).__name__}: {e}", _line(node)) from None
        finally:
            self.depth -= 1

    async def _eval(self, node: ast.expr) -> Any:
        kind = type(node)
        if kind is ast.Constant:
            if not isinstance(node.value, (int, float, str, bool, type(None))):
                raise PtcDisallowed(f"{type(node.value).__name__} literals are not available", node.lineno)
            return node.value
        if kind is ast.Name:
            return self.lookup(node)
        if kind is ast.BinOp:
            return self.binop(node.op, await self.eval(node.left), await self.eval(node.right), node)
        if kind is ast.UnaryOp:
            operand = await self.eval(node.operand)
            if isinstance(operand, _Pending):
                raise _unawaited(operand, node)
            if isinstance(node.op, ast.Not):
                return not _truth(operand, node)
            if isinstance(node.op, ast.USub):
                return -operand
            if isinstance(node.op, ast.UAdd):
                return +operand
            raise PtcDisallowed(f"operator {type(node.op).__name__} is not available", node.lineno)
        if kind is ast.BoolOp:
            is_and = isinstance(node.op, ast.And)
            value: Any = None
            for operand_node in node.values:
                value = await self.eval(operand_node)
                if _truth(value, operand_node) != is_and:
                    return value
            return value
        if kind is ast.Compare:
            return await self.compare(node)
        if kind is ast.IfExp:
            branch = node.body if _truth(await self.eval(node.test), node.test) else node.orelse
            return await self.eval(branch)
        if kind in (ast.List, ast.Tuple, ast.Set):
            items: list[Any] = []
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    items.extend(self.iterate(await self.eval(elt.value), elt))
                else:
                    items.append(await self.eval(elt))
            if kind is ast.Set:
                for item in items:
                    _no_pending(item, node)
            built = items if kind is ast.List else tuple(items) if kind is ast.Tuple else set(items)
            return self.check_size(built, node)
        if kind is ast.Dict:
            result: dict[Any, Any] = {}
            for key_node, value_node in zip(node.keys, node.values, strict=True):
                if key_node is None:  # {**other}
                    other = await self.eval(value_node)
                    if not isinstance(other, dict):
                        raise PtcRuntimeError("'**' in a dict literal needs a dict", _line(value_node))
                    result.update(other)
                else:
                    key = await self.eval(key_node)
                    result[key] = await self.eval(value_node)
            return self.check_size(result, node)
        if kind in (ast.ListComp, ast.SetComp, ast.DictComp):
            return await self.comprehension(node)
        if kind is ast.Subscript:
            obj = await self.eval(node.value)
            return self.subscript(obj, await self.eval(node.slice), node)
        if kind is ast.Slice:
            parts = [None if p is None else await self.eval(p) for p in (node.lower, node.upper, node.step)]
            return slice(*parts)
        if kind is ast.Attribute:
            return self.attribute(await self.eval(node.value), node)
        if kind is ast.JoinedStr:
            pieces = []
            length = 0
            for value_node in node.values:
                piece = value_node.value if isinstance(value_node, ast.Constant) else await self.eval(value_node)
                pieces.append(piece)
                length += len(piece)
                if length > self.limits.max_string_chars:
                    raise PtcLimitExceeded(f"f-string longer than {self.limits.max_string_chars} characters", _line(node))
            return self.check_size("".join(pieces), node)
        if kind is ast.FormattedValue:
            return await self.formatted(node)
        if kind is ast.Call:
            return await self.call(node)
        if kind is ast.Await:
            return await self.await_(node)
        if kind is ast.Starred:
            raise PtcDisallowed("'*' unpacking is only available in calls and list/tuple literals", node.lineno)
        if kind in _REFUSED_EXPRESSIONS:
            raise PtcDisallowed(_REFUSED_EXPRESSIONS[kind], node.lineno)
        raise PtcDisallowed(f"{kind.__name__} expressions are not available", _line(node))

    def lookup(self, node: ast.Name) -> Any:
        name = node.id
        _check_name(name, node)
        if name in self.env:
            return self.env[name]
        if name in self.tools:
            return self.tools[name]
        if name in self.builtins:
            return self.builtins[name]
        if name == "asyncio":
            return _ASYNCIO
        if name in _REFUSED_BUILTINS:
            raise PtcDisallowed(
                f"builtin '{name}' is not available; allowed builtins: {', '.join(sorted(self.builtins))}; "
                f"use the tools for any I/O: {_names(self.tools)}",
                node.lineno,
            )
        raise PtcDisallowed(f"name '{name}' is not defined; available tools: {_names(self.tools)}", node.lineno)

    def binop(self, op: ast.operator, left: Any, right: Any, node: ast.AST) -> Any:
        for operand in (left, right):
            if isinstance(operand, _Pending):
                raise _unawaited(operand, node)
        fn = _BINOPS.get(type(op))
        if fn is None:
            raise PtcDisallowed(f"operator {type(op).__name__} is not available", _line(node))
        if isinstance(op, ast.Mod) and isinstance(left, str):
            raise PtcDisallowed("'%' string formatting is not available; use an f-string", _line(node))
        if isinstance(op, ast.Pow) and _is_number(left) and _is_number(right) and isinstance(right, int):
            if abs(right) > 1 and abs(left) > 1 and right * math.log10(abs(left)) > MAX_INT_DIGITS:
                raise PtcLimitExceeded(f"'**' result would have more than {MAX_INT_DIGITS} digits; refused", _line(node))
        if isinstance(op, ast.Mult):
            seq, count = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, list, tuple)) and isinstance(count, int) and not isinstance(count, bool):
                limit = self.limits.max_string_chars if isinstance(seq, str) else self.limits.max_collection_size
                if len(seq) * count > limit:
                    raise PtcLimitExceeded(
                        f"repeating a {type(seq).__name__} would create {len(seq) * count} elements, "
                        f"over the limit of {limit}",
                        _line(node),
                    )
        if isinstance(op, ast.Mult) and _is_number(left) and _is_number(right) and isinstance(left + right, int):
            if left.bit_length() + right.bit_length() > MAX_INT_DIGITS * 3.33 + 64:
                raise PtcLimitExceeded(f"integer with more than {MAX_INT_DIGITS} digits refused", _line(node))
        return self.check_size(fn(left, right), node)

    async def compare(self, node: ast.Compare) -> bool:
        left = await self.eval(node.left)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = await self.eval(right_node)
            for operand in (left, right):
                if isinstance(operand, _Pending):
                    raise _unawaited(operand, node)
            if isinstance(op, (ast.Is, ast.IsNot)) and not any(v is None or isinstance(v, bool) for v in (left, right)):
                raise PtcDisallowed("'is' only compares with None, True or False; use == to compare values", node.lineno)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True

    async def comprehension(self, node: ast.ListComp | ast.SetComp | ast.DictComp) -> Any:
        results: list[Any] = []
        bound: set[str] = set()
        for gen in node.generators:
            for target in ast.walk(gen.target):
                if isinstance(target, ast.Name):
                    bound.add(target.id)
        saved = {name: self.env[name] for name in bound if name in self.env}
        count = 0

        async def loop(level: int) -> None:
            nonlocal count
            if level == len(node.generators):
                count += 1
                self._loop_tick(node, count)
                if isinstance(node, ast.DictComp):
                    results.append((await self.eval(node.key), await self.eval(node.value)))
                else:
                    results.append(await self.eval(node.elt))
                if len(results) > self.limits.max_collection_size:
                    raise PtcLimitExceeded(f"comprehension built more than {self.limits.max_collection_size} elements", _line(node))
                return
            gen = node.generators[level]
            if gen.is_async:
                raise PtcDisallowed("'async for' is not available in comprehensions", _line(node))
            for item in self.iterate(await self.eval(gen.iter), gen.iter):
                await self.assign(gen.target, item)
                passed = True
                for cond in gen.ifs:
                    if not _truth(await self.eval(cond), cond):
                        passed = False
                        break
                if passed:
                    await loop(level + 1)
                else:
                    count += 1
                    self._loop_tick(node, count)

        try:
            await loop(0)
        finally:
            # comprehension variables do not leak, as in Python 3
            for name in bound:
                self.env.pop(name, None)
            self.env.update(saved)
        if isinstance(node, ast.ListComp):
            return results
        if isinstance(node, ast.SetComp):
            for item in results:
                if isinstance(item, _Pending):
                    raise _unawaited(item, node)
            return set(results)
        return dict(results)

    def subscript(self, obj: Any, key: Any, node: ast.AST) -> Any:
        if isinstance(obj, _Pending):
            raise _unawaited(obj, node)
        if not isinstance(obj, (list, tuple, dict, str, range)):
            raise PtcDisallowed(f"cannot index {type(obj).__name__}; only list, tuple, dict, str and range support [...]", _line(node))
        result = obj[key]
        if isinstance(result, range):
            self.iterate(result, node)  # bound a range slice like other collections
        return self.check_size(result, node)

    def attribute(self, obj: Any, node: ast.Attribute) -> Any:
        name = node.attr
        if name.startswith("_"):
            raise PtcDisallowed(f"attribute '{name}' is not accessible; private and dunder attributes are refused", node.lineno)
        if isinstance(obj, _Pending):
            raise _unawaited(obj, node)
        if obj is _ASYNCIO:
            if name == "gather":
                return _GATHER
            raise PtcDisallowed(f"asyncio.{name} is not available; only asyncio.gather(...) is", node.lineno)
        allowed = _SAFE_METHODS.get(type(obj))
        if allowed is None:
            raise PtcDisallowed(
                f"attribute '{name}' of {type(obj).__name__} is not accessible; only methods of str, list and dict "
                "values are; index dicts with value['key']",
                node.lineno,
            )
        if name not in allowed:
            raise PtcDisallowed(
                f"{type(obj).__name__}.{name} is not available; allowed: {', '.join(sorted(allowed))}", node.lineno
            )
        return _BoundMethod(obj, name)

    async def formatted(self, node: ast.FormattedValue) -> str:
        value = await self.eval(node.value)
        if isinstance(value, _Pending):
            raise _unawaited(value, node)
        self.check_renderable(value, node)
        if node.conversion == ord("r"):
            value = repr(value)
        elif node.conversion == ord("a"):
            value = ascii(value)
        elif node.conversion == ord("s"):
            value = str(value)
        spec = ""
        if node.format_spec is not None:
            spec = await self.eval(node.format_spec)
            if any(int(digits) > MAX_FORMAT_WIDTH for digits in re.findall(r"\d+", spec)):
                raise PtcLimitExceeded(f"format width or precision over {MAX_FORMAT_WIDTH} refused", _line(node))
        return self.check_size(format(value, spec), node)

    async def call(self, node: ast.Call) -> Any:
        func = await self.eval(node.func)
        args: list[Any] = []
        for arg_node in node.args:
            if isinstance(arg_node, ast.Starred):
                args.extend(self.iterate(await self.eval(arg_node.value), arg_node))
            else:
                args.append(await self.eval(arg_node))
        kwargs: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:
                extra = await self.eval(kw.value)
                if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra):
                    raise PtcRuntimeError("'**' in a call needs a dict with str keys", _line(kw.value))
                kwargs.update(extra)
            else:
                kwargs[kw.arg] = await self.eval(kw.value)
        if func is _GATHER:
            if kwargs:
                raise PtcDisallowed("asyncio.gather(...) takes only tool calls; no keyword arguments", node.lineno)
            for arg in args:
                if not isinstance(arg, _Pending):
                    raise PtcDisallowed(
                        f"asyncio.gather(...) takes un-awaited tool calls like fetch(x=1), got {type(arg).__name__}",
                        node.lineno,
                    )
                if arg.consumed:
                    raise PtcDisallowed(f"{arg.describe()} was already awaited; call the tool again", node.lineno)
                arg.consumed = True
            return self._track(_PendingGather(self, args, node.lineno))
        for value in [*args, *kwargs.values()]:
            if isinstance(value, _Pending):
                raise _unawaited(value, node)
        if isinstance(func, _ToolRef):
            return self._track(_PendingCall(self, func, args, kwargs, node.lineno))
        if isinstance(func, _BoundMethod):
            return self.call_method(func, args, kwargs, node)
        if callable(func) and any(func is b for b in self.builtins.values()):
            if getattr(func, "needs_node", False):
                result = func(node, *args, **kwargs)
            else:
                result = func(*args, **kwargs)
            return self.check_size(result, node)
        raise PtcDisallowed(f"{type(func).__name__} value is not callable; call a tool or an allowed builtin", node.lineno)

    def call_method(self, method: _BoundMethod, args: list, kwargs: dict, node: ast.AST) -> Any:
        obj, name = method.obj, method.name
        if name == "sort":
            if args or set(kwargs) - {"reverse"}:
                raise PtcDisallowed("list.sort() takes only reverse=...; key functions are not available", _line(node))
            obj.sort(reverse=bool(kwargs.get("reverse", False)))
            return None
        if name in ("extend", "update", "union", "intersection", "difference") or (name == "join" and isinstance(obj, str)):
            args = [a if isinstance(a, dict) else self.iterate(a, node) for a in args]
        if name == "join" and isinstance(obj, str) and args:
            cap = self.limits.max_string_chars
            if _render_estimate(args[0], cap) + len(obj) * len(args[0]) > cap:
                raise PtcLimitExceeded(f"str.join result would exceed {cap} characters", _line(node))
        if name == "replace" and isinstance(obj, str) and len(args) >= 2 and isinstance(args[1], str):
            old, new = args[0], args[1]
            occurrences = obj.count(old) if isinstance(old, str) else 0
            if len(obj) + occurrences * len(new) > self.limits.max_string_chars:
                raise PtcLimitExceeded(
                    f"str.replace result would exceed {self.limits.max_string_chars} characters", _line(node)
                )
        result = getattr(obj, name)(*args, **kwargs)
        if name in ("keys", "values", "items"):
            result = list(result)
        self.check_size(obj, node)
        return self.check_size(result, node)

    async def await_(self, node: ast.Await) -> Any:
        value = await self.eval(node.value)
        if not isinstance(value, _Pending):
            raise PtcDisallowed(
                f"cannot await a {type(value).__name__}; await only tool calls and asyncio.gather(...)", node.lineno
            )
        if value.consumed:
            raise PtcDisallowed(f"{value.describe()} was already awaited; call the tool again", node.lineno)
        value.consumed = True
        result = await value.run()
        return result

    def _track(self, pending: _Pending) -> _Pending:
        self.pending.append(pending)
        return pending


# --------------------------------------------------------------------------- helpers


def _line(node: ast.AST | None) -> int | None:
    return getattr(node, "lineno", None)


def _names(tools: Mapping[str, Any]) -> str:
    return ", ".join(sorted(tools)) or "(none)"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_name(name: str, node: ast.AST) -> None:
    if name.startswith("__"):
        raise PtcDisallowed(f"name '{name}' is not accessible; dunder names are refused", _line(node))


def _unawaited(pending: _Pending, node: ast.AST | None) -> PtcDisallowed:
    return PtcDisallowed(
        f"{pending.describe()} was never awaited; write `await {pending.describe()}` "
        "or pass it to `await asyncio.gather(...)`",
        _line(node) if node is not None else pending.line,
    )


def _no_pending(value: Any, node: ast.AST) -> Any:
    if isinstance(value, _Pending):
        raise _unawaited(value, node)
    return value


def _truth(value: Any, node: ast.AST) -> bool:
    if isinstance(value, _Pending):
        raise _unawaited(value, node)
    return bool(value)


def _contains_pending(value: Any, depth: int = 0) -> _Pending | None:
    if isinstance(value, _Pending):
        return value
    if depth > 20:
        return None
    if isinstance(value, (list, tuple, set, frozenset)):
        items = value
    elif isinstance(value, dict):
        items = list(value.values())
    else:
        return None
    for item in items:
        found = _contains_pending(item, depth + 1)
        if found is not None:
            return found
    return None


def _render_estimate(value: Any, cap: int) -> int:
    """A lower bound on len(repr(value)), walked iteratively and stopped once over ``cap``.

    Guards str()/print/f-strings/the result against structures that share one
    big list many times, whose repr would be huge although each list is small.
    """
    total = 0
    stack = [value]
    while stack and total <= cap:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2 + len(item)
            stack.extend(item)
        elif isinstance(item, dict):
            total += 2 + 2 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        else:
            total += 1
    return total


# --------------------------------------------------------------------------- entry point


async def run_ptc(code: str, tools: Mapping[str, ToolFn], *, limits: PtcLimits = PtcLimits()) -> PtcResult:
    """Interpret ``code`` with ``tools`` available as async functions.

    Raises a ``PtcError`` subclass whose text is model-visible feedback; a
    cancellation of the caller propagates (inner tool tasks are cancelled).
    """
    if len(code) > MAX_CODE_CHARS:
        raise PtcLimitExceeded(f"program of {len(code)} characters exceeds {MAX_CODE_CHARS}; write a shorter program")
    try:
        tree = ast.parse(code, mode="exec")
    except SyntaxError as e:
        raise PtcSyntaxError(f"syntax error: {e.msg}; fix the Python syntax", e.lineno) from None
    except (RecursionError, MemoryError):
        raise PtcLimitExceeded("program is nested too deeply to parse; flatten it") from None
    interp = _Interpreter(tools, limits)
    value = await interp.run(tree)
    last_line = tree.body[-1].lineno if tree.body else None
    interp.check_renderable(value, tree.body[-1] if tree.body else None)  # first: bounds the walk below
    pending = _contains_pending(value)
    if pending is not None:
        raise _unawaited(pending, None)
    rendered = len(repr(value))
    if rendered > limits.max_output_chars:
        raise PtcLimitExceeded(
            f"result of {rendered} characters exceeds {limits.max_output_chars}; return a summary instead",
            last_line,
        )
    return PtcResult(value=value, output="".join(interp.output), operations=interp.operations, tool_calls=interp.tool_calls)
