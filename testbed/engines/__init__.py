"""Engines: what makes the agent durable, each in a folder of its own, behind one protocol (``base.Engine``).

The list of them is ``harness.engines.REGISTRY`` (names, twins, order, engine-only checks); ``make_engine`` makes
one from its entry. Each folder holds the same parts: the engine class (``engine.py``), its server, its worker or
endpoint entry point, its client, and the records it leaves:

* ``temporal/``: ``ReferenceOnTemporal``, the reference agent (``agent/``) on Temporal: ``engine.py``, ``server.py``
  (the dev server), ``connection.py`` (an external cluster), ``cluster.py`` (its part in a stack), ``driver.py`` (the
  chat driver), ``session.py`` (``dah run`` and ``dah demo``), ``on_server.py`` (a session on a server this process already runs: the
  benchmarks'), ``in_flight.py`` (what its workers are running, for aimed faults); workers are processes, or Docker
  containers;
* ``byo/``: ``OwnAgentOnTemporal``, your agent on Temporal, described by a target file (``target.py``), run in its
  own Python;
* ``checkpoint/``: ``CheckpointEngine``, this project's own checkpoint engine (runs, steps, leases and a queue in
  one SQLite file) with the agent loop as its task;
* ``dbos/``: ``DbosEngine``, the agent loop as a DBOS Transact workflow (``agent.py``; SQLite or PostgreSQL:
  ``postgres.py``);
* ``restate/``: ``RestateEngine``, the agent loop as a Restate service (``agent.py``, ``client.py``,
  ``server.py``);
* beside them, what several share: ``workload.py`` (the seeded load and the timeouts profiles), ``steps.py`` (what
  a step does on every engine but Temporal), ``oneshot.py`` (the driver of the engines that run one message as
  one durable run) and, here, ``SessionSpec`` (what ``dah run`` and ``dah demo`` ask of an engine).

The modules load lazily: a worker process importing its engine's binding does not import the others.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.contracts import DEFAULT_TASK_QUEUE

if TYPE_CHECKING:
    from harness.recording import EffectLedger


# Names only, for the type hints: importing the engines here would import them all (and make this package a
# cycle with what the engines import).
Engine = Any


class EngineUnavailable(RuntimeError):
    """An engine cannot run on this machine (its server binary or database is not installed): the message says
    what is missing and how to install it. Benchmarks report such an engine ``unavailable``, never leave it out."""


@dataclass
class SessionSpec:
    """What ``dah run`` / ``dah demo`` ask of an engine in this process (``Engine.in_process``): each engine takes
    what applies to it."""

    state_dir: Path  # its state, the workspaces and the effect ledger
    model_url: str | None  # the scripted model server (None: a live provider)
    ledger: EffectLedger  # open: the steps record their effects in it
    worker: bool = True  # run the steps here too; False: only submit them, for workers elsewhere
    ui: bool = False  # the engine's server with its Web UI, where it has one
    task_queue: str = DEFAULT_TASK_QUEUE  # where its runs go, where it has task queues
    transcript: bool = False  # ``describe_run`` adds the conversation as the model saw it, where it keeps one
    say: Callable[[str], None] = lambda line: None  # news while a run goes on (what it retries, and why)


def _class(make: str) -> Any:
    module, name = make.split(":")
    return getattr(importlib.import_module(f"testbed.engines.{module}"), name)


def engine_worker(argv: list[str]) -> int | None:
    """``dah worker --durability NAME ...`` of an engine with a worker of its own (``Registered.worker``): run it
    with the other arguments and return its exit status; None for ``dah worker`` itself (no ``--durability``, or
    the engine the scenarios are written for). Imports only that engine; the fork server (testbed.forkserver) runs
    it too, in a worker forked from its warm parent."""
    if argv[:1] != ["worker"]:
        return None
    rest, name = list(argv[1:]), None
    for i, arg in enumerate(rest):
        if arg == "--durability" and i + 1 < len(rest):
            name, rest = rest[i + 1], rest[:i] + rest[i + 2:]
            break
        if arg.startswith("--durability="):
            name, rest = arg.partition("=")[2], rest[:i] + rest[i + 1:]
            break
    from harness.engines import REGISTRY

    entry = next((r for r in REGISTRY if r.name == name), None)
    if name is None or (entry is not None and not entry.worker):
        return None
    if entry is None:
        print(f"dah worker: error: --durability {name!r}: use one of {', '.join(r.name for r in REGISTRY)}",
              file=sys.stderr)
        return 2
    function, _, first = entry.worker.partition(" ")
    return int(_class(function)([first, *rest]) or 0)


def make_engine(durability: str = "temporal", **options: Any) -> Engine:
    """The engine ``durability`` names (``harness.engines.REGISTRY``; imported here, not at the top: a workflow
    module in this package is imported again in Temporal's sandbox, which must not run the harness's own), made with its entry's options and the command's ``options``
    (``workers``, ``image``, ``target``, ``target_file``, ``connection``: each engine takes what applies to it,
    ``Engine.made``); ValueError naming the choices for an unknown one."""
    from harness.engines import REGISTRY

    entry = next((r for r in REGISTRY if r.name == durability), None)
    if entry is None:
        raise ValueError(f"--durability {durability!r}: use one of {', '.join(r.name for r in REGISTRY)}")
    return _class(entry.make).made(entry.options, **options)
