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
import re
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.numeric_limits import integer_problem, power_problem, product_problem, round_problem

try:
    from temporalio import workflow as _workflow
except ImportError:  # the interpreter works without Temporal (the checkpoint engine, tests)
    _workflow = None  # type: ignore[assignment]

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

MAX_NESTING_DEPTH = 100
MAX_FORMAT_WIDTH = 1000
MAX_CODE_CHARS = 100_000
#: work that costs one operation: this many elements compared, hashed, copied or rendered ...
ELEMENTS_PER_OPERATION = 1000
#: ... or this many bytes allocated (a 10,000-element list: 10 operations; a 10,000-entry set: ~65)
BYTES_PER_OPERATION = 8000
#: how often (in operations) the compute-time backstop reads the clock
_CLOCK_EVERY = 64


def _clock() -> float:
    """``time.thread_time()``, also inside Temporal's workflow sandbox, which refuses clocks to workflow code:
    the compute-time backstop is the interpreter's one deliberate read of one (see ``PtcLimits``). CPU time of this
    thread, not wall time: on a busy machine (a shared CI runner) the interpreter waits for a CPU, and that wait is
    no work of the program's. A program computes between two awaits in one thread (a workflow may resume on
    another, so every slice is read on its own: ``resume_clock``)."""
    if _workflow is not None and _workflow.unsafe.in_sandbox():
        with _workflow.unsafe.sandbox_unrestricted():
            return time.thread_time()
    return time.thread_time()


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
    # AST node evaluations, plus the work builtins and operators do: +1 per 1000 elements compared,
    # hashed, sorted, copied or rendered, and per 8000 bytes allocated (charged *before* the work)
    max_operations: int = 10_000
    max_loop_iterations: int = 1_000  # per loop/comprehension execution
    max_output_chars: int = 20_000  # length of the result's text and total printed text
    max_collection_size: int = 10_000  # elements of any list/tuple/dict/set built
    max_string_chars: int = 1_000_000  # length of any string the program builds
    max_tool_argument_chars: int = 1_000_000  # JSON text of one tool call's arguments
    # A backstop, not a budget: CPU seconds of interpreter compute (time awaiting tools, or waiting for a CPU on
    # a busy machine, is not counted).
    # The budgets above end any program long before it; this ends a program that a gap in them would let
    # run on and stall the worker. Being a clock, it is the one limit that is not deterministic.
    max_compute_seconds: float = 1.5


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
class _Builtin:
    """An allowed builtin as a program sees it: renders by name, whatever implements it."""

    name: str
    fn: Callable[..., Any]
    needs_node: bool = False

    def __repr__(self) -> str:
        return f"<builtin {self.name}>"


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
        self.compute_seconds = 0.0
        self.slice_start = _clock()
        self.next_clock_check = _CLOCK_EVERY
        plain: dict[str, Callable[..., Any]] = {"len": len, "int": int, "float": float, "bool": bool, "abs": abs}
        with_node: dict[str, Callable[..., Any]] = {
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
            "round": self._round,
            "enumerate": self._enumerate,
            "zip": self._zip,
            "any": self._consuming(any),
            "all": self._consuming(all),
            "print": self._print,
        }
        self.builtins: dict[str, _Builtin] = {
            **{name: _Builtin(name, fn) for name, fn in plain.items()},
            **{name: _Builtin(name, fn, needs_node=True) for name, fn in with_node.items()},
        }

    # ---- bookkeeping

    def charge(self, node: ast.AST | None, n: int = 1, what: str = "") -> None:
        self.operations += n
        if self.operations > self.limits.max_operations:
            why = f" ({what})" if what else ""
            raise PtcLimitExceeded(
                f"operation limit of {self.limits.max_operations} exceeded{why}; do less work per program "
                "(fewer iterations, smaller data) or split it into several run_ptc calls",
                _line(node),
            )
        if self.operations >= self.next_clock_check:
            self.next_clock_check = self.operations + _CLOCK_EVERY
            self.check_clock(node)

    def check_clock(self, node: ast.AST | None) -> None:
        spent = self.compute_seconds + _clock() - self.slice_start
        if spent > self.limits.max_compute_seconds:
            raise PtcLimitExceeded(
                f"the program computed for more than {self.limits.max_compute_seconds:g} s (the interpreter's "
                "time backstop); do less work per program or split it into several run_ptc calls",
                _line(node),
            )

    def pause_clock(self) -> None:
        self.compute_seconds += _clock() - self.slice_start

    def resume_clock(self) -> None:
        self.slice_start = _clock()

    def remaining_elements(self) -> int:
        return max(0, self.limits.max_operations - self.operations + 1) * ELEMENTS_PER_OPERATION

    def measure(self, value: Any, node: ast.AST | None, what: str, *, chars: bool = False, budget: int | None = None) -> int:
        """``_measure`` within what the program has left (or ``budget``); a value that contains itself is refused."""
        left = self.remaining_elements() if budget is None else budget
        try:
            size, cost = _measure(value, left, chars=chars, walk_budget=self.remaining_elements())
        except _Cycle:
            raise PtcRuntimeError(
                f"{what}: a value contains itself (a list or dict holding a reference to itself); "
                "build it without the self-reference",
                _line(node),
            ) from None
        self.work(node, cost, what)  # the walk itself is work
        return size

    def work(self, node: ast.AST | None, elements: int, what: str) -> None:
        """Charge ``elements`` of work before doing it (refused if over the remaining budget)."""
        self.charge(node, elements // ELEMENTS_PER_OPERATION, what)
        if elements >= _CLOCK_EVERY * ELEMENTS_PER_OPERATION:
            self.check_clock(node)

    def weigh(self, node: ast.AST | None, what: str, *values: Any, factor: int = 1) -> None:
        """Charge the elements an operation on ``values`` touches (each shared one every time it is reached)."""
        total = 0
        for value in values:
            if type(value) in _CONTAINER_TYPES or (type(value) is str and len(value) >= ELEMENTS_PER_OPERATION):
                total += self.measure(value, node, what, budget=max(0, self.remaining_elements() - total))
        self.work(node, total * factor, what)

    def alloc(self, node: ast.AST | None, nbytes: int) -> None:
        self.charge(node, nbytes // BYTES_PER_OPERATION, "memory allocated")

    def check_size(self, value: Any, node: ast.AST) -> Any:
        kind = type(value)
        if kind is str:
            if len(value) > self.limits.max_string_chars:
                raise PtcLimitExceeded(
                    f"string of {len(value)} characters exceeds the limit of {self.limits.max_string_chars}",
                    _line(node),
                )
            self.charge(node, len(value) // ELEMENTS_PER_OPERATION)
        elif kind in _CONTAINER_TYPES:
            if len(value) > self.limits.max_collection_size:
                raise PtcLimitExceeded(
                    f"collection of {len(value)} elements exceeds the limit of {self.limits.max_collection_size}",
                    _line(node),
                )
            self.alloc(node, sys.getsizeof(value))
        elif kind is int and (problem := integer_problem(value)):
            raise PtcLimitExceeded(problem, _line(node))
        return value

    def check_renderable(self, value: Any, node: ast.AST | None, cap: int | None = None, what: str = "str()") -> int:
        """Refuse (before building it) a text of ``value`` longer than ``cap``; charge its length. Returns the estimate."""
        cap = self.limits.max_string_chars if cap is None else cap
        if type(value) is str:
            return len(value)
        size = self.measure(value, node, f"turning a value into {what}", chars=True, budget=cap)
        if size > cap:
            raise PtcLimitExceeded(
                f"value is too large to turn into text ({what}: over {cap} characters); format a summary instead",
                _line(node),
            )
        self.work(node, size, f"turning a value into {what}")
        return size

    def hashing(self, node: ast.AST | None, key: Any) -> None:
        """Charge hashing ``key``: a tuple's hash is not cached and follows every element."""
        if type(key) is tuple:
            self.weigh(node, "hashing a tuple", key)

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
            self.weigh(node, "ordering a set", value, factor=max(1, size.bit_length()))
            return _ordered(value)  # set order of strings depends on the process's hash seed
        if isinstance(value, str):
            self.alloc(node, size * 80)  # one object per character
        elif isinstance(value, range):
            self.alloc(node, size * 40)  # one int per element
        elif isinstance(value, type({}.items())):
            self.alloc(node, size * 64)  # one tuple per item
        self.charge(node, size // ELEMENTS_PER_OPERATION)
        return list(value)

    # ---- builtins that need bounds

    def _range(self, node: ast.AST, *args: Any) -> range:
        return range(*args)

    def _round(self, node: ast.AST, number: Any, ndigits: Any = None) -> Any:
        if problem := round_problem(ndigits):
            raise PtcLimitExceeded(problem, _line(node))
        return round(number) if ndigits is None else round(number, ndigits)

    def _consuming(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(node: ast.AST, *args: Any, **kwargs: Any) -> Any:
            allowed_kwargs = {"default"} if fn in (min, max) else {"start"} if fn is sum else set()
            if set(kwargs) - allowed_kwargs:
                raise PtcDisallowed(f"{fn.__name__}() keyword arguments {sorted(kwargs)} are not supported", _line(node))
            if fn is sum and not _is_number(kwargs.get("start", 0)) or fn is sum and len(args) > 1:
                raise PtcDisallowed("sum() adds numbers only; use a loop with list.extend to concatenate", _line(node))
            items = self.iterate(args[0], node) if len(args) == 1 else list(args)
            if fn in (min, max):
                self.weigh(node, f"{fn.__name__}() comparing elements", items)
            elif fn is set:
                self.weigh(node, "hashing the elements of a set", items)
            if len(args) == 1:
                return fn(items, **kwargs)
            if not args:
                return fn(**kwargs)
            return fn(*args, **kwargs)

        return call

    def _sorted(self, node: ast.AST, iterable: Any, *, reverse: bool = False) -> list:
        items = self.iterate(iterable, node)
        self.weigh(node, "sorting", items, factor=max(1, len(items).bit_length()))
        return sorted(items, reverse=bool(reverse))

    def _dict(self, node: ast.AST, *args: Any, **kwargs: Any) -> dict:
        if args:
            (source,) = args
            if isinstance(source, dict):
                return {**source, **kwargs}
            pairs = self.iterate(source, node)
            self.weigh(node, "hashing the keys of a dict", pairs)
            return {**dict(pairs), **kwargs}
        return dict(kwargs)

    def _enumerate(self, node: ast.AST, iterable: Any, start: int = 0) -> list:
        items = self.iterate(iterable, node)
        self.alloc(node, len(items) * 64)
        return list(enumerate(items, start))

    def _zip(self, node: ast.AST, *iterables: Any) -> list:
        lists = [self.iterate(it, node) for it in iterables]
        self.alloc(node, min(map(len, lists), default=0) * (48 + 8 * len(lists)))
        return list(zip(*lists))

    def _str(self, node: ast.AST, value: Any = "") -> str:
        """``str(value)``, bounded and deterministic."""
        if isinstance(value, _Pending):
            raise _unawaited(value, node)
        self.check_renderable(value, node)
        return _text(value)

    def _print(self, node: ast.AST, *args: Any, sep: Any = " ", end: Any = "\n") -> None:
        for name, value in (("sep", sep), ("end", end)):
            if value is not None and type(value) is not str:
                raise PtcRuntimeError(f"print(): {name} must be None or a string, not {type(value).__name__}", _line(node))
        sep = " " if sep is None else sep
        end = "\n" if end is None else end
        room = self.limits.max_output_chars - self.output_chars
        size = len(end) + len(sep) * max(0, len(args) - 1)
        for arg in args:
            if isinstance(arg, _Pending):
                raise _unawaited(arg, node)
            if size <= room:
                size += len(arg) if type(arg) is str else \
                    self.measure(arg, node, "printing", chars=True, budget=max(0, room + 1 - size))
        if size > room:
            raise PtcLimitExceeded(
                f"printed output exceeds {self.limits.max_output_chars} characters; print less "
                "(summaries or counts instead of whole values)",
                _line(node),
            )
        self.work(node, size, "printing")
        text = sep.join(_text(a) for a in args) + end
        self.output_chars += len(text)
        if self.output_chars > self.limits.max_output_chars:
            raise PtcLimitExceeded(
                f"printed output exceeds {self.limits.max_output_chars} characters; print less "
                "(summaries or counts instead of whole values)",
                _line(node),
            )
        self.output.append(text)

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
            if isinstance(obj, dict):
                self.hashing(target, key)
            before = len(obj)
            try:
                obj[key] = value
            except (KeyError, IndexError, TypeError, ValueError) as e:
                raise PtcRuntimeError(_error_text(e), _line(target)) from None
            self.grown(obj, before, target)
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
            obj[key] = new  # the key was hashed (and charged) by the subscript above
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
            raise PtcRuntimeError(_error_text(e), _line(node)) from None
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
                self.weigh(node, "hashing the elements of a set", items)
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
                    self.hashing(key_node, key)
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
        if isinstance(op, ast.Pow) and (problem := power_problem(left, right)):
            raise PtcLimitExceeded(problem, _line(node))
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
        if isinstance(op, ast.Mult) and (problem := product_problem(left, right)):
            raise PtcLimitExceeded(problem, _line(node))
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
            self.charge_compare(op, left, right, node)
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
            self.weigh(node, "hashing the elements of a set", results)
            return self.check_size(set(results), node)
        self.weigh(node, "hashing the keys of a dict", [key for key, _ in results])
        return self.check_size(dict(results), node)

    def subscript(self, obj: Any, key: Any, node: ast.AST) -> Any:
        if isinstance(obj, _Pending):
            raise _unawaited(obj, node)
        if not isinstance(obj, (list, tuple, dict, str, range)):
            raise PtcDisallowed(f"cannot index {type(obj).__name__}; only list, tuple, dict, str and range support [...]", _line(node))
        if isinstance(obj, dict):
            self.hashing(node, key)
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
            value = _render(value)
        elif node.conversion == ord("a"):
            value = _render(value).encode("ascii", "backslashreplace").decode("ascii")
        elif node.conversion == ord("s") or type(value) not in (str, int, float, bool):
            value = _text(value)  # containers, None, builtins: their deterministic text
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
            self.check_tool_arguments(func.name, args, kwargs, node)
            return self._track(_PendingCall(self, func, args, kwargs, node.lineno))
        if isinstance(func, _BoundMethod):
            return self.call_method(func, args, kwargs, node)
        if isinstance(func, _Builtin):
            result = func.fn(node, *args, **kwargs) if func.needs_node else func.fn(*args, **kwargs)
            return self.check_size(result, node)
        raise PtcDisallowed(f"{type(func).__name__} value is not callable; call a tool or an allowed builtin", node.lineno)

    def call_method(self, method: _BoundMethod, args: list, kwargs: dict, node: ast.AST) -> Any:
        obj, name = method.obj, method.name
        kind = type(obj)
        if kind is str:
            self.charge(node, len(obj) // ELEMENTS_PER_OPERATION)  # every str method reads the whole string
        if name == "sort":
            if args or set(kwargs) - {"reverse"}:
                raise PtcDisallowed("list.sort() takes only reverse=...; key functions are not available", _line(node))
            self.weigh(node, "sorting", obj, factor=max(1, len(obj).bit_length()))
            obj.sort(reverse=bool(kwargs.get("reverse", False)))
            return None
        if name in ("extend", "update", "union", "intersection", "difference") or (name == "join" and kind is str):
            args = [a if isinstance(a, dict) else self.iterate(a, node) for a in args]
        if kind in (list, tuple) and name in ("count", "index", "remove"):
            self.weigh(node, f"{kind.__name__}.{name} comparing elements", obj)
            if name == "index" and args and args[0] not in obj:  # list.index's error would quote the value
                raise PtcRuntimeError(f"ValueError: {_short(args[0])} is not in the {kind.__name__}", _line(node))
        elif kind in (dict, set) and args and name in ("get", "pop", "setdefault", "add", "discard", "remove"):
            self.hashing(node, args[0])
        elif name in ("update", "union", "intersection", "difference"):
            self.weigh(node, "hashing elements", *args)
        if name == "join" and kind is str and args:
            cap = self.limits.max_string_chars
            pieces = args[0]
            if sum(_scalar_chars(p) for p in pieces) + len(obj) * len(pieces) > cap:
                raise PtcLimitExceeded(f"str.join result would exceed {cap} characters", _line(node))
        if name == "replace" and kind is str and len(args) >= 2 and isinstance(args[1], str):
            old, new = args[0], args[1]
            occurrences = obj.count(old) if isinstance(old, str) else 0
            if len(obj) + occurrences * len(new) > self.limits.max_string_chars:
                raise PtcLimitExceeded(
                    f"str.replace result would exceed {self.limits.max_string_chars} characters", _line(node)
                )
        if name in ("split", "rsplit", "splitlines") and kind is str and len(obj) > self.limits.max_collection_size:
            self.check_pieces(obj, name, args, kwargs, node)
        before = len(obj) if kind in _CONTAINER_TYPES else 0
        result = getattr(obj, name)(*args, **kwargs)
        if name in ("keys", "values", "items"):
            result = list(result)
            if name == "items":
                self.alloc(node, len(result) * 64)
        if kind in _CONTAINER_TYPES:
            self.grown(obj, before, node)
        return self.check_size(result, node)

    def check_pieces(self, obj: str, name: str, args: list, kwargs: dict, node: ast.AST) -> None:
        """Refuse a split of a long string into more pieces than a collection may hold, before splitting."""
        limit = self.limits.max_collection_size
        if name == "splitlines":
            pieces = 1 + sum(obj.count(c) for c in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
        else:
            sep = args[0] if args else kwargs.get("sep")
            maxsplit = args[1] if len(args) > 1 else kwargs.get("maxsplit", -1)
            if isinstance(maxsplit, int) and 0 <= maxsplit <= limit:
                return
            if sep is not None and not isinstance(sep, str):
                return  # str.split itself refuses it
            pieces = len(obj.split(sep, limit))  # at most limit + 1 pieces: bounded work
        if pieces > limit:
            raise PtcLimitExceeded(f"str.{name} would make more than {limit} pieces; pass maxsplit or split less text",
                                   _line(node))

    def grown(self, obj: Any, before: int, node: ast.AST) -> None:
        """A container changed in place: its length bounded, its growth charged as memory."""
        if len(obj) > self.limits.max_collection_size:
            raise PtcLimitExceeded(
                f"collection of {len(obj)} elements exceeds the limit of {self.limits.max_collection_size}", _line(node)
            )
        if len(obj) > before:
            self.alloc(node, (len(obj) - before) * _BYTES_PER_ELEMENT.get(type(obj), 8))

    def charge_compare(self, op: ast.cmpop, left: Any, right: Any, node: ast.AST) -> None:
        """Charge a comparison the elements it may touch, before doing it."""
        if isinstance(op, (ast.Is, ast.IsNot)):
            return
        if isinstance(op, (ast.In, ast.NotIn)):
            if type(right) in (list, tuple):
                self.weigh(node, "'in' comparing elements", right)
            elif type(right) in (dict, set, frozenset):
                self.hashing(node, left)
            elif type(right) is str and type(left) is str:
                self.work(node, len(left) + len(right), "'in' searching a string")
            elif type(right) is range and type(left) not in (int, bool):
                self.work(node, len(right) if len(right) < 2**62 else 2**62, "'in' scanning a range")
            return
        if type(left) in _CONTAINER_TYPES and type(right) in _CONTAINER_TYPES:
            # the comparison stops at the smaller side: measure the first, then the second within it
            first = self.measure(left, node, "comparing values")
            second = self.measure(right, node, "comparing values", budget=min(first, self.remaining_elements()))
            self.work(node, min(first, second), "comparing values")
        elif type(left) is str and type(right) is str:
            self.work(node, min(len(left), len(right)), "comparing strings")

    def check_tool_arguments(self, tool: str, args: list, kwargs: dict, node: ast.AST) -> None:
        """A tool's arguments are JSON (what the workflow records and sends): checked, bounded and charged
        before anything serialises them."""
        cap = self.limits.max_tool_argument_chars
        stack = [*args, *kwargs.values()]
        seen: set[int] = set()
        while stack:
            value = stack.pop()
            kind = type(value)
            if kind in (list, tuple, dict):
                if id(value) in seen:
                    continue
                seen.add(id(value))
                if kind is dict:
                    bad = next((k for k in value if type(k) is not str), None)
                    if bad is not None:
                        raise PtcRuntimeError(f"tool {tool}: a dict in its arguments has a {type(bad).__name__} key "
                                              f"{_short(bad, 40)}; tool arguments are JSON, whose keys are strings",
                                              _line(node))
                    stack.extend(value.values())
                else:
                    stack.extend(value)
            elif isinstance(value, _Pending):
                raise _unawaited(value, node)
            elif kind not in (str, int, float, bool) and value is not None:
                hint = "; pass sorted(...) of it" if kind in (set, frozenset) else ""
                raise PtcDisallowed(f"tool {tool}: a {kind.__name__} cannot be a tool argument (tool arguments are "
                                    f"JSON: str, int, float, bool, None, list, dict){hint}", _line(node))
        size = self.measure([args, kwargs], node, f"tool {tool} arguments", chars=True, budget=cap)
        if size > cap:
            raise PtcLimitExceeded(f"tool {tool}: arguments over {cap} characters; pass less data to one call",
                                   _line(node))
        self.work(node, size, f"tool {tool} arguments")

    async def await_(self, node: ast.Await) -> Any:
        value = await self.eval(node.value)
        if not isinstance(value, _Pending):
            raise PtcDisallowed(
                f"cannot await a {type(value).__name__}; await only tool calls and asyncio.gather(...)", node.lineno
            )
        if value.consumed:
            raise PtcDisallowed(f"{value.describe()} was already awaited; call the tool again", node.lineno)
        value.consumed = True
        self.pause_clock()
        try:
            return await value.run()
        finally:
            self.resume_clock()

    def _track(self, pending: _Pending) -> _Pending:
        self.pending.append(pending)
        return pending


# --------------------------------------------------------------------------- helpers


def _line(node: ast.AST | None) -> int | None:
    return getattr(node, "lineno", None)


#: memory per element a container grows by (pointers; dict and set entries with their hash tables)
_BYTES_PER_ELEMENT = {list: 8, tuple: 8, dict: 40, set: 64}
MAX_ERROR_CHARS = 300


def _error_text(e: Exception) -> str:
    """A Python error as model-visible text: bounded, and deterministic (a missing key is rendered by ``_short``)."""
    if type(e) is KeyError and len(e.args) == 1:
        return f"KeyError: {_short(e.args[0])}"
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


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


_CONTAINER_TYPES = frozenset({list, tuple, dict, set, frozenset})


class _Cycle(Exception):
    """A value contains itself: its size (and its text) has no bound."""


def _children(obj: Any) -> list[Any]:
    if type(obj) is dict:
        return [*obj.keys(), *obj.values()]
    return obj if type(obj) in (list, tuple) else list(obj)


def _scalar_weight(value: Any) -> int:
    # A long string costs its length in comparisons (memcmp) and hashing, not one step.
    return 1 + len(value) // 100 if type(value) is str else 1


def _scalar_chars(value: Any) -> int:
    kind = type(value)
    if kind is str:
        return len(value) + 2
    if kind is bool:
        return 5
    if kind is int:
        return value.bit_length() * 30103 // 100000 + 2
    if kind is float:
        return 24
    if value is None:
        return 4
    return 48  # builtins, tools, methods, ranges: short fixed texts


#: walk cost (in elements) of visiting one container in Python, and of scanning one element in Python
_VISIT_COST = 32
_SCAN_COST = 2


def _flat_size(obj: Any, chars: bool) -> int | None:
    """The size of a container whose elements are all ints, or all strs, or all floats, computed at C speed
    (``map``); None if its elements are mixed or may be containers."""
    items = obj.keys() if type(obj) is dict else obj
    kinds = set(map(type, items))
    if type(obj) is dict:
        if kinds != {str}:
            return None
        kinds = set(map(type, obj.values()))
        if len(kinds) != 1 or not kinds <= {int, str, float}:
            return None
        keys = sum(map(len, obj)) + 2 * len(obj) if chars else len(obj) + sum(map(len, obj)) // 100
        values = obj.values()
    else:
        keys, values = 0, obj
    if not kinds:
        return keys
    if len(kinds) != 1:
        return None
    (kind,) = kinds
    n = len(obj)
    if kind is int:
        return keys + (sum(map(int.bit_length, values)) * 30103 // 100000 + 2 * n if chars else n)
    if kind is str:
        return keys + (sum(map(len, values)) + 2 * n if chars else n + sum(map(len, values)) // 100)
    if kind is float:
        return keys + (24 * n if chars else n)
    return None


def _measure(value: Any, budget: int, *, chars: bool, walk_budget: int | None = None) -> tuple[int, int]:
    """(size, cost of measuring it) of ``value`` as C code would see it, following every shared reference
    every time.

    ``chars=False``: elements (what ``==``, ``in``, sorting and hashing touch);
    ``chars=True``: a lower bound on the length of its text. Containers
    reached many times are measured once (memoised by identity), so the walk
    costs the *distinct* containers, never the expanded size; flat containers
    are summed at C speed. The walk stops as soon as the size or its own cost
    passes ``budget`` (the size is then ``> budget``) or its cost passes
    ``walk_budget`` (default: ``budget``). Raises ``_Cycle`` if the value
    contains itself.
    """
    walk_budget = budget if walk_budget is None else walk_budget
    scalar = _scalar_chars if chars else _scalar_weight
    if type(value) not in _CONTAINER_TYPES:
        return scalar(value), 1
    memo: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[Any, bool]] = [(value, False)]
    walked = 0
    while stack:
        obj, closing = stack.pop()
        oid = id(obj)
        if closing:
            kind = type(obj)
            total = (2 + 2 * len(obj) if kind is not dict else 2 + 4 * len(obj)) + (11 if kind is frozenset else 0) \
                if chars else 1
            for item in _children(obj):
                total += memo[id(item)] if type(item) in _CONTAINER_TYPES else scalar(item)
            memo[oid] = total
            open_.discard(oid)
            if total > budget:
                return total, walked
            continue
        if oid in memo:
            continue
        if oid in open_:
            raise _Cycle()
        walked += _VISIT_COST + len(obj) // 4
        flat = _flat_size(obj, chars)
        if flat is not None:
            memo[oid] = flat + (0 if chars else 1)
            if flat > budget or walked > walk_budget:
                return max(flat, budget + 1), walked
            continue
        open_.add(oid)
        stack.append((obj, True))
        items = _children(obj)
        walked += _SCAN_COST * len(items)
        if walked > walk_budget:
            return budget + 1, walked
        for item in items:
            if type(item) in _CONTAINER_TYPES and id(item) not in memo:
                stack.append((item, False))
    return memo[id(value)], walked


def _sort_key(value: Any) -> tuple[str, str]:
    return type(value).__name__, _render(value)


def _ordered(items: Any) -> list[Any]:
    """The elements of a set in an order that does not depend on the hash seed."""
    try:
        return sorted(items)
    except TypeError:
        return sorted(items, key=_sort_key)


def _render(value: Any) -> str:
    """``repr(value)``, except that it is the same in every process: set elements are sorted,
    and builtins, tools and methods render by name (no memory address)."""
    kind = type(value)
    if kind in (str, int, float, bool, range) or value is None:
        return repr(value)
    if kind is list:
        return "[" + ", ".join(_render(v) for v in value) + "]"
    if kind is tuple:
        inner = ", ".join(_render(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if kind is dict:
        return "{" + ", ".join(f"{_render(k)}: {_render(v)}" for k, v in value.items()) + "}"
    if kind in (set, frozenset):
        if not value:
            return "set()" if kind is set else "frozenset()"
        inner = "{" + ", ".join(_render(v) for v in _ordered(value)) + "}"
        return inner if kind is set else f"frozenset({inner})"
    if isinstance(value, (_Builtin, _ToolRef, _BoundMethod, _Pending, _AsyncioMarker, _GatherRef)):
        return repr(value)
    return f"<{kind.__name__}>"  # no address, whatever it is


def _text(value: Any) -> str:
    """``str(value)`` with ``_render``'s determinism."""
    return value if type(value) is str else _render(value)


#: the text of a program's result as the model is shown it (deterministic, see ``_render``)
render_value = _text


def _short(value: Any, limit: int = 200) -> str:
    """A bounded, deterministic text of a value for an error message."""
    try:
        if _measure(value, limit, chars=True)[0] <= limit:
            return _render(value)
    except _Cycle:
        pass
    size = f" of {len(value)} elements" if type(value) in _CONTAINER_TYPES else ""
    return f"<a {type(value).__name__}{size}>"


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
    if type(value) is not str:  # first: bounds the walk for pending calls below
        interp.check_renderable(value, tree.body[-1] if tree.body else None, cap=limits.max_output_chars,
                                what="the result's text")
    pending = _contains_pending(value)
    if pending is not None:
        raise _unawaited(pending, None)
    rendered = len(_text(value))
    if rendered > limits.max_output_chars:
        raise PtcLimitExceeded(
            f"result of {rendered} characters exceeds {limits.max_output_chars}; return a summary instead",
            last_line,
        )
    return PtcResult(value=value, output="".join(interp.output), operations=interp.operations, tool_calls=interp.tool_calls)
