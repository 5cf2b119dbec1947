"""Step functions that run on either backend: ``step_call(fn, **kwargs)``.

A task function written for the substrate passes its step work to
``ctx.step(intent, fn)``. On the checkpoint runner ``fn`` is simply called. On
Temporal a step is an activity, and an activity cannot carry a closure, so a
portable task passes a ``StepCall``: a module-level async function plus JSON
keyword arguments. The checkpoint runner calls it like any function; the
Temporal adapter ships ``(function name, kwargs)`` to the generic
``durable_step`` activity, which imports the function and calls it.

While a step function runs, ``current_step()`` says which step (run id,
index, attempt) it is: what a side-effecting tool needs for its idempotency
key in the effect ledger, on either backend.
"""

from __future__ import annotations

import contextvars
import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from testbed.engines.checkpoint.records import canonical_json


@dataclass(frozen=True)
class StepInfo:
    run_id: str
    step_index: int  # on Temporal: the activity id
    attempt: int
    worker_id: str


_CURRENT: contextvars.ContextVar[StepInfo | None] = contextvars.ContextVar("durable_step", default=None)


def current_step() -> StepInfo:
    info = _CURRENT.get()
    if info is None:
        raise RuntimeError("not inside a durable step (ctx.step or the durable_step activity)")
    return info


def set_current_step(info: StepInfo) -> contextvars.Token:
    return _CURRENT.set(info)


def reset_current_step(token: contextvars.Token) -> None:
    _CURRENT.reset(token)


@dataclass(frozen=True)
class StepCall:
    """A call of a module-level async function with JSON keyword arguments; callable like a closure."""

    function: str  # "module:qualname"
    kwargs: dict[str, Any]

    def __call__(self) -> Awaitable[Any]:
        return resolve(self.function)(**self.kwargs)


def step_call(fn: Callable[..., Awaitable[Any]], **kwargs: Any) -> StepCall:
    name = f"{fn.__module__}:{fn.__qualname__}"
    if "<locals>" in name or "<lambda>" in name:
        raise ValueError(f"{name}: a step function must be defined at module level to run on Temporal")
    canonical_json(kwargs)  # the arguments cross a process boundary on Temporal
    return StepCall(name, kwargs)


def resolve(name: str) -> Callable[..., Awaitable[Any]]:
    module, _, qualname = name.partition(":")
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target  # type: ignore[no-any-return]


# What step functions of this process may use (the effect ledger, the model server, the worker's identity):
# set once by whoever runs steps here, the checkpoint worker or a Temporal worker (build_worker).
_RESOURCES: dict[str, Any] = {}


def configure_worker(**resources: Any) -> None:
    _RESOURCES.update(resources)


def worker_resources() -> dict[str, Any]:
    return _RESOURCES
