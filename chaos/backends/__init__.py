"""Backends: what the chaos runner attacks, behind one small protocol.

The runner (``chaos/runner.py``) knows no backend by name. A backend says:

* ``stack_spec``: what to start (``testbed.stack``): server, model, proxies, workers;
* ``make_driver``: the client that drives the load and records every operation (may be a coroutine);
* ``running``: what is in flight right now, for nemeses that aim at busy workers
  (Temporal's pending activities, or the effect ledger's unfinished executions);
* ``save``: what it leaves in the run directory beyond the operation log and the
  driver's final reads (Temporal event histories);
* ``target``: what the checkers need to know about the agent (``chaos.target``),
  ``checkers`` that apply, and ``not_applicable`` ones with the reason;
* ``scenarios``: the named scenarios it can run (None: all), and ``reproduce``
  flags for the command line that runs it again.

Implementations: ``temporal.ReferenceOnTemporal`` (the reference agent; its
workers are processes, or Docker containers with ``workers="docker"``),
``checkpoint.CheckpointBackend`` (the reference agent on the checkpoint
backend), ``dbos.DbosBackend`` (the reference agent on DBOS Transact, SQLite or
PostgreSQL), ``restate.RestateBackend`` (the reference agent as a Restate service) and
``byo.OwnAgentOnTemporal`` (an agent described by a target file, in its own Python). ``make_backend`` picks one from the command line's choices.
"""

from __future__ import annotations

from pathlib import Path

from chaos.backends.base import Backend
from chaos.backends.byo import OwnAgentOnTemporal
from chaos.backends.checkpoint import CheckpointBackend
from chaos.backends.dbos import DbosBackend
from chaos.backends.restate import RestateBackend
from chaos.backends.temporal import ReferenceOnTemporal
from chaos.target import Target
from testbed.connection import TemporalConnection

__all__ = ["Backend", "CheckpointBackend", "DbosBackend", "OwnAgentOnTemporal", "ReferenceOnTemporal",
           "RestateBackend", "make_backend"]


def make_backend(durability: str = "temporal", workers: str = "process", image: str | None = None,
                 target: Target | None = None, target_file: Path | None = None,
                 connection: TemporalConnection | None = None) -> Backend:
    """The backend the command line asked for (its choices were validated by the CLI); ``connection``: an
    external cluster (default: the embedded server; the checkpoint backend has no Temporal)."""
    if durability == "checkpoint":
        return CheckpointBackend()
    if durability in ("dbos", "dbos-postgres"):
        return DbosBackend(database="postgres" if durability == "dbos-postgres" else "sqlite")
    if durability == "restate":
        return RestateBackend()
    connection = connection or TemporalConnection()
    if target is not None and not target.is_reference:
        return OwnAgentOnTemporal(target, workers=workers, image=image, target_file=target_file,
                                  connection=connection)
    return ReferenceOnTemporal(workers=workers, image=image, connection=connection)
