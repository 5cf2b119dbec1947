"""The environment interface, the null environment, option checking and ``get_env``.

An environment is the world an agent works in. It tells the model where it
is (``get_state``, shown to the model before every model call) and gives it
tools (``get_tools``); ``build`` and ``cleanup`` bound its life. On Temporal
every one of these is activity work (``agent.activities``): the workflow only
keeps the ``EnvRecord`` that ``build`` returned, and any worker can re-attach
to the environment from it, or rebuild it and say so.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

from agent.contracts import EnvRecord
from harness.recording import EffectLedger
from agent.tools import Tool, workspace_for



class EnvConfigError(ValueError):
    """A configuration the environment cannot use; the message names the field and what is allowed."""


class EnvUnavailableError(RuntimeError):
    """This machine cannot provide the environment (no isolation, no browser, no Docker engine)."""


@dataclasses.dataclass
class EnvContext:
    """Where environments keep their files, and the effect ledger their side-effecting tools write to."""

    root: Path  # one directory per environment below it
    ledger: EffectLedger | None = None


class Env(ABC):
    """One environment instance, built fresh or attached to an existing one."""

    name: ClassVar[str]
    settings_class: ClassVar[type]

    def __init__(self, settings: Any, ctx: EnvContext, env_id: str) -> None:
        self.settings = settings
        self.ctx = ctx
        self.env_id = env_id
        self.record: EnvRecord | None = None

    @property
    def directory(self) -> Path:
        """This environment's own directory (workspace, tokens, logs)."""
        return workspace_for(self.ctx.root, self.env_id)  # the same safe naming as the tools' workspaces

    @abstractmethod
    async def build(self) -> EnvRecord:
        """Create the environment from nothing; the record says how to find it again."""

    @abstractmethod
    async def attach(self, record: EnvRecord) -> str:
        """Find the environment ``record`` describes; rebuild it if it is gone. Says which it did."""

    @abstractmethod
    async def get_state(self) -> str:
        """What the model is told about the environment before each of its calls."""

    @abstractmethod
    def get_tools(self) -> list[Tool]:
        """The tools this environment gives the agent."""

    @abstractmethod
    async def cleanup(self) -> str:
        """Release everything ``build`` acquired; safe to call twice. Says what it did."""


class BaseEnv(Env):
    """The null environment: no state, no tools, nothing to build."""

    name = "base"

    @dataclasses.dataclass
    class Settings:
        pass

    settings_class = Settings

    async def build(self) -> EnvRecord:
        self.record = EnvRecord(name=self.name, env_id=self.env_id, note="nothing to build")
        return self.record

    async def attach(self, record: EnvRecord) -> str:
        self.record = record
        return "attached (nothing to attach to)"

    async def get_state(self) -> str:
        return ""

    def get_tools(self) -> list[Tool]:
        return []

    async def cleanup(self) -> str:
        return "nothing to clean up"


def _describe(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    return {type(None): "null", bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def _accepts(tp: Any, value: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(a, value) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return value in typing.get_args(tp)
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def parse_settings(env_name: str, settings_class: type, options: dict[str, Any]) -> Any:
    """Options -> the environment's settings dataclass, refusing unknown, missing and mistyped fields."""
    hints = typing.get_type_hints(settings_class)
    fields = {f.name: f for f in dataclasses.fields(settings_class)}
    allowed = ", ".join(fields) or "none"
    unknown = [k for k in options if k not in fields]
    if unknown:
        raise EnvConfigError(f"env.{unknown[0]}: not an option of environment {env_name!r}; its options are: "
                             f"{allowed}")
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in options:
            raise EnvConfigError(f"env.{name}: required by environment {env_name!r} and missing "
                                 f"({_describe(hints[name])}); its options are: {allowed}")
        if name in options and not _accepts(hints[name], options[name]):
            raise EnvConfigError(f"env.{name}: must be {_describe(hints[name])}, got {options[name]!r}")
    settings = settings_class(**options)
    check = getattr(settings, "check", None)
    if check is not None:
        check()
    return settings
