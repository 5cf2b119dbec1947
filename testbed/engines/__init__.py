"""Engines: what makes the agent durable, each defined here and only here, behind one protocol (``base.Engine``).

``ENGINES`` names them (the ``--durability`` choices of ``python -m chaos`` and ``dah``); ``make_engine`` makes
one. Each is one module (or package) with its engine class, its driver and, where the agent needs binding to
it, the binding beside it:

* ``temporal``: ``ReferenceOnTemporal``, the reference agent (``agent/``) on Temporal; its workers are processes,
  or Docker containers with ``workers="docker"``;
* ``byo``: ``OwnAgentOnTemporal``, your agent on Temporal, described by a target file (``target.py``), run in its
  own Python;
* ``checkpoint/``: ``CheckpointEngine``, this project's own checkpoint engine (runs, steps, leases and a queue in
  one SQLite file) with the agent loop as its task;
* ``dbos`` / ``dbos_agent``: ``DbosEngine``, the agent loop as a DBOS Transact workflow (SQLite or PostgreSQL);
* ``restate`` / ``restate_agent`` / ``restate_client``: ``RestateEngine``, the agent loop as a Restate service;
* ``steps``: what a step does on every engine but Temporal (the model call, the tool call); ``oneshot``: the
  driver of the engines that run one message as one durable run; ``driver``: the reference agent's chat driver
  on Temporal (the seeded workload, the timeouts profiles).

The modules load lazily: a worker process importing its engine's binding does not import the others.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Names only, for the type hints: importing the engines here would import them all (and make this package a
# cycle with what the engines import).
Engine = TemporalConnection = Target = Any


class EngineUnavailable(RuntimeError):
    """An engine cannot run on this machine (its server binary or database is not installed): the message says
    what is missing and how to install it. Benchmarks report such an engine ``unavailable``, never leave it out."""


def _engine(module: str, name: str) -> Any:
    return getattr(importlib.import_module(f"testbed.engines.{module}"), name)


def _on_temporal(workers: str = "process", image: str | None = None, target: Target | None = None,
                 target_file: Path | None = None, connection: TemporalConnection | None = None) -> Engine:
    """The reference agent on Temporal, or the agent a target file describes (``connection``: an external
    cluster; default the embedded server)."""
    from testbed.connection import TemporalConnection

    connection = connection or TemporalConnection()
    if target is not None and not target.is_reference:
        return _engine("byo", "OwnAgentOnTemporal")(target, workers=workers, image=image, target_file=target_file,
                                                    connection=connection)
    return _engine("temporal", "ReferenceOnTemporal")(workers=workers, image=image, connection=connection)


#: --durability name -> the engine's factory (the Temporal one takes the placement, target and cluster options;
#: the others run the reference agent and take none)
ENGINES: dict[str, Callable[..., Engine]] = {
    "temporal": _on_temporal,
    "checkpoint": lambda **_: _engine("checkpoint.engine", "CheckpointEngine")(),
    "dbos": lambda **_: _engine("dbos", "DbosEngine")(database="sqlite"),
    "dbos-postgres": lambda **_: _engine("dbos", "DbosEngine")(database="postgres"),
    "restate": lambda **_: _engine("restate", "RestateEngine")(),
}


def make_engine(durability: str = "temporal", **options: Any) -> Engine:
    """The engine ``durability`` names (``ENGINES``), made with ``options`` (``workers``, ``image``, ``target``,
    ``target_file``, ``connection``: used by Temporal's); ValueError naming the choices for an unknown one."""
    try:
        factory = ENGINES[durability]
    except KeyError:
        raise ValueError(f"--durability {durability!r}: use one of {', '.join(ENGINES)}") from None
    return factory(**options)
