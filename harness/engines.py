"""The engines, listed once: every tool's engine names, twins, display order and engine-only checks come from here.

An engine is what makes an agent durable. Each has a folder of its own under ``testbed/engines/`` (its server,
its workers, its client, what it has in flight, its records); this list only names them, so that reading a saved
run (the checkers, the report) needs none of that code. ``testbed.engines.make_engine`` makes one from its entry.

To add an engine: its folder, and one ``Registered`` here. The chaos commands (``--durability``, its twins
``SCENARIO<suffix>``, ``chaos list``, ``chaos suite``), the checkers, the report's columns and the benchmarks'
engines section all find it from this entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Registered:
    """One engine, as every tool names it."""

    name: str  # ``--durability NAME``, run.json's backend name, a report column, a benchmark row
    make: str  # "module:Class" under testbed.engines, made on demand (so a worker imports only its own engine)
    options: dict[str, Any] = field(default_factory=dict)  # what the class is made with
    #: its twins' suffix: SCENARIO<suffix> runs SCENARIO on this engine ("": the engine the scenarios are written for)
    suffix: str = ""
    #: what a scenario's "server" and "server link" are on this engine, where that is not plain
    stand_in: str = ""
    #: the checks that read only this engine's records: not applicable to a run on any other engine
    own_checks: tuple[str, ...] = ()
    suite: bool = False  # in ``chaos suite`` by default
    table2: bool = False  # the benchmarks' Table 2 can run the agent loop on it (``dah-bench --durability``)
    aliases: tuple[str, ...] = ()  # names older saved results gave it
    #: its worker's entry point, "module:function first-argument" under testbed.engines: what ``dah worker
    #: --durability NAME ...`` runs ("": ``dah worker`` itself, the engine the scenarios are written for)
    worker: str = ""
    about: str = ""  # what it is, in a few words: every ``--durability`` help says it


REGISTRY: tuple[Registered, ...] = (
    # the reference agent on Temporal, or your agent on Temporal when a target file names it (OwnAgentOnTemporal.made)
    Registered("temporal", "byo.engine:OwnAgentOnTemporal", suite=True, table2=True,
               about="the agent as a workflow on a Temporal server"),
    Registered("checkpoint", "checkpoint.engine:CheckpointEngine", suffix="@checkpoint", suite=True, table2=True,
               worker="checkpoint.service:main worker",
               about="the same agent loop, each step checkpointed in a SQLite file"),
    Registered("dbos", "dbos.engine:DbosEngine", {"database": "sqlite"}, suffix="@dbos", own_checks=("dbos_steps",),
               aliases=("dbos-sqlite",), worker="dbos.agent:main worker",
               about="a DBOS workflow, its system database on SQLite"),
    Registered("dbos-postgres", "dbos.engine:DbosEngine", {"database": "postgres"}, suffix="@dbos-postgres",
               stand_in="the server is PostgreSQL, the link the workers' to it", own_checks=("dbos_steps",),
               worker="dbos.agent:main worker", about="DBOS on a PostgreSQL server it starts"),
    Registered("restate", "restate.engine:RestateEngine", suffix="@restate",
               stand_in="the server is restate-server, the link the server's to the endpoint",
               own_checks=("restate_journal",), worker="restate.agent:main endpoint",
               about="the same loop as a Restate service on a restate-server it starts"),
)
#: the one engine the named scenarios are written for; each other engine runs its twins
HOME = next(r.name for r in REGISTRY if not r.suffix)
#: the benchmarks' baseline beside the engines: the agent loop with no durability at all
PLAIN = "plain"


def names() -> tuple[str, ...]:
    """Every engine, in display order."""
    return tuple(r.name for r in REGISTRY)


def described(more: Any = lambda name: "") -> str:
    """Every engine with what it is (``NAME (about; more(NAME))``), the scenarios' own first and marked default."""
    def one(r: Registered) -> str:
        words = "; ".join(w for w in ("default" if r.name == HOME else "", r.about, more(r.name)) if w)
        return f"{r.name} ({words})" if words else r.name
    return ", ".join(one(r) for r in REGISTRY)


def registered(name: str) -> Registered:
    """The entry of ``name`` (or of a name older results gave it); ValueError naming the engines."""
    for r in REGISTRY:
        if name == r.name or name in r.aliases:
            return r
    raise ValueError(f"engine {name!r}: use one of {', '.join(names())}")


def canonical(name: str) -> str:
    """``name`` as the registry spells it now (an older alias mapped; an unknown name kept as it is)."""
    return next((r.name for r in REGISTRY if name == r.name or name in r.aliases), name)


def twin_suffixes() -> dict[str, str]:
    """Twin suffix -> engine, for every engine but the scenarios' own."""
    return {r.suffix: r.name for r in REGISTRY if r.suffix}


def split_twin(label: str) -> tuple[str, str]:
    """(the scenario, its engine) of a run label: ``kill_mid_turn@dbos`` -> (kill_mid_turn, dbos)."""
    for suffix, name in twin_suffixes().items():
        if label.endswith(suffix):
            return label.removesuffix(suffix), name
    return label, HOME


def own_checks() -> dict[str, tuple[str, ...]]:
    """Check -> the engines whose own records it reads."""
    out: dict[str, tuple[str, ...]] = {}
    for r in REGISTRY:
        for check in r.own_checks:
            out[check] = (*out.get(check, ()), r.name)
    return out


def rank(name: str, first: tuple[str, ...] = ()) -> int:
    """Where ``name`` sorts among the engines (after ``first``; unknown names last)."""
    order = (*first, *names())
    name = canonical(name)
    return order.index(name) if name in order else len(order)
