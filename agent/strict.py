"""Strict configuration models (pydantic v2), and their errors as one line a person can act on.

Every configuration the harness reads from a person (a target file, an agent config file, ``DAH_*`` variables)
is a ``StrictModel``: a wrong type is refused, never coerced (``5`` is not ``"5"``, a string is not a list of its
letters), an unknown field is refused, and ``one_line`` turns the first problem into

    <where>: 'field' must be <what is allowed>, got <the value>

Each field says what it allows in its ``description``; a validator's own message (``must ...``) replaces it, and
an element of a list or table is described by pydantic's own words (``'env.A' must be a valid string, got 1``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError


class StrictModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


def _non_empty(value: str) -> str:
    if not value.strip():
        raise ValueError("must be a non-empty string")
    return value


def _spec(value: str) -> str:
    module, _, name = value.partition(":")
    if not module.strip() or not name.strip():
        raise ValueError("must be MODULE:NAME, e.g. \"my_agent.workflows:AgentWorkflow\"")
    return value


#: a string with something in it
NonEmpty = Annotated[str, AfterValidator(_non_empty)]
#: an importable object, ``module.path:name``
Spec = Annotated[str, AfterValidator(_spec)]

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.I)


def looks_secret(name: str) -> bool:
    """Whether a variable or field of this name holds a secret (its value is never shown)."""
    return bool(_SECRET_NAME.search(name))


def _shown(value: Any) -> Any:
    """A value as an error may show it: a table's secret-looking entries hidden."""
    if isinstance(value, dict):
        return {k: "(hidden)" if looks_secret(str(k)) else _shown(v) for k, v in value.items()}
    return value


def _where(loc: tuple[Any, ...]) -> str:
    out = str(loc[0]) if loc else "(top level)"
    for part in loc[1:]:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def one_line(exc: ValidationError, where: str, model: type[BaseModel], noun: str = "field") -> str:
    """The first problem of ``exc`` in one line: ``where``, the field, what is allowed and the value given
    (a secret-looking field's value is not shown). More problems are counted, not listed."""
    errors = exc.errors(include_url=False)
    error = errors[0]
    loc = tuple(error["loc"])
    field = _where(loc)
    info = model.model_fields.get(str(loc[0])) if loc else None
    allowed = (info.description if info else None) or "something else"
    value = "(hidden)" if any(looks_secret(str(p)) for p in loc) else repr(_shown(error.get("input")))
    kind = error["type"]
    if kind == "extra_forbidden":
        line = f"unknown {noun} {field!r}; allowed {noun}s: {', '.join(model.model_fields)}"
    elif kind == "missing":
        line = f"missing required {noun} {field!r} ({allowed})"
    elif kind == "value_error":  # a validator's message; a table it refused is not repeated back
        line = f"{field!r} {error['msg'].removeprefix('Value error, ')}"
        line += "" if isinstance(error.get("input"), dict) else f", got {value}"
    elif len(loc) > 1 and error["msg"].startswith("Input should be "):  # an element: pydantic says what it takes
        line = f"{field!r} must be {error['msg'].removeprefix('Input should be ')}, got {value}"
    else:
        line = f"{field!r} must be {allowed}, got {value}"
    more = len(errors) - 1
    return f"{where}: {line}" + (f" (and {more} more problem{'s' * (more > 1)})" if more else "")
