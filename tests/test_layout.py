"""The layout's promises, checked on the source: which package may import which, and no import cycles.

    harness   the run-data contract (run directory, operations, event histories, verdicts, recording, faults):
              imports only the standard library and temporalio, so it runs in a target agent's own Python
    agent     the reference agent: imports harness, never the test bed or chaos
    testbed   what stands around an agent (servers, model, workers, the stack, the dah CLI)
    chaos, benchmarks, migration_fuzz, reports: the tools; checkers and reports never import the agent

And one place for faults: they are defined, switched on and sent to workers only from ``testbed/faults/`` (the
orchestrator's) and ``harness/faults.py`` (the in-agent seam); the effect ledger is read only through
``harness.recording``.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "harness", "testbed", "chaos", "benchmarks", "migration_fuzz", "reports", "examples")


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for f in (ROOT / package).rglob("*.py"):
            if {".venv", "node_modules"} & set(f.relative_to(ROOT).parts):
                continue  # an example's own environment (make example-*) is not the project's code
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


def imports(path: Path, name: str) -> set[str]:
    """Every module this file imports, at any depth (function-level imports count too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


def local_edges() -> dict[str, set[str]]:
    mods = modules()

    def resolve(target: str) -> str | None:
        while target and target not in mods:
            target = target.rpartition(".")[0]
        return target or None

    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        for target in imports(path, name):
            resolved = resolve(target)
            if resolved and resolved != name:
                edges[name].add(resolved)
    return edges


def offenders(source_prefix: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{m} imports {t}" for m, targets in local_edges().items()
                  if m == source_prefix or m.startswith(source_prefix + ".")
                  for t in targets if t.split(".")[0] in forbidden)


def test_checkers_read_saved_data_and_never_import_the_agent_or_the_test_bed() -> None:
    assert offenders("chaos.checker", ("agent", "testbed")) == []


#: the agent's imports of the test bed: an in-process engine that starts a server of its own (the engine interface
#: asks for it), and servers are the test bed's: DBOS's ``engine(database="postgres")`` its PostgreSQL server, the
#: Restate engine's ``engine()`` its restate-server (on a free port)
DBOS_POSTGRES = "agent.engines.dbos_agent imports testbed.postgres"
RESTATE_SERVER = {"agent.engines.restate_agent imports testbed.restate_server",
                  "agent.engines.restate_agent imports testbed.processes"}


def test_the_agent_never_imports_chaos_or_the_test_bed() -> None:
    found = offenders("agent", ("chaos", "testbed", "benchmarks", "migration_fuzz", "reports"))
    assert [o for o in found if o != DBOS_POSTGRES and o not in RESTATE_SERVER] == []


def test_harness_imports_only_itself_among_the_project_packages() -> None:
    assert offenders("harness", tuple(p for p in PACKAGES if p != "harness")) == []


def test_reports_read_saved_runs_without_the_agent_or_the_test_bed() -> None:
    assert offenders("reports", ("agent", "testbed", "benchmarks", "migration_fuzz")) == []


def test_no_import_cycles() -> None:
    edges = local_edges()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in modules():
        if v not in index:
            visit(v)
    assert cycles == []


def test_harness_needs_nothing_but_the_standard_library_where_an_agent_uses_it() -> None:
    # What a target agent's own Python imports (no temporalio there: -I -S, an interpreter with no site-packages).
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import harness.recording, harness.faults, "
            "harness.operations, harness.verdict, harness.rundir, harness.durable_files, harness.exit, "
            "harness.run_files")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(ROOT)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr


# -- one place for faults, one reader of the ledger -----------------------------------------------------------------

def _in(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _calls(path: Path) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]


#: the run-time fault switches: arming the model's or the effects service's faults, adding a toxic to a proxy
FAULT_SWITCHES = ("set_model_faults", "set_faults", "add_toxic", "remove_toxic")
#: who may throw them, and why: the fault package; the stack (its ``set_model_faults`` and ``heal``); each service's
#: own admin route applying what was posted to it; the proxy's benchmark, which measures a no-op toxic
FAULT_SWITCH_USERS = ("testbed.faults", "testbed.stack", "testbed.model_server", "testbed.effects_service",
                      "benchmarks.proxy")


def test_faults_are_switched_on_only_from_the_fault_package() -> None:
    found = sorted({f"{m} calls {c.func.attr}" for m, path in modules().items() if not _in(m, FAULT_SWITCH_USERS)
                    for c in _calls(path) if isinstance(c.func, ast.Attribute) and c.func.attr in FAULT_SWITCHES})
    assert found == []
    users = {m for m, path in modules().items() for c in _calls(path)
             if isinstance(c.func, ast.Attribute) and c.func.attr in FAULT_SWITCHES}
    assert {"testbed.faults.nemesis"} <= users  # the rule is about real code: the nemesis throws them


def _worker_signals(path: Path) -> list[str]:
    """``kill``/``terminate``/``pause`` sent to a supervised worker: on ``<x>.process`` or on the process a
    ``with <w>.held() as <name>`` block holds."""
    tree = ast.parse(path.read_text())
    held = {item.optional_vars.id for n in ast.walk(tree) if isinstance(n, (ast.With, ast.AsyncWith))
            for item in n.items if isinstance(item.optional_vars, ast.Name) and isinstance(item.context_expr, ast.Call)
            and isinstance(item.context_expr.func, ast.Attribute) and item.context_expr.func.attr == "held"}
    out = []
    for c in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        f = c.func
        if isinstance(f, ast.Attribute) and f.attr in ("kill", "terminate", "pause"):
            on = f.value
            if (isinstance(on, ast.Attribute) and on.attr == "process") or (isinstance(on, ast.Name) and on.id in held):
                out.append(f.attr)
    return out


def test_only_the_fault_package_signals_a_supervised_worker() -> None:
    """Kills, SIGTERMs and freezes of a running worker are faults (testbed.faults.nemesis, and the effects
    service's crash after an effect): the one other sender is the stack's teardown, which kills what is left."""
    senders = {m: _worker_signals(path) for m, path in modules().items()}
    assert sorted(m for m, s in senders.items() if s and not _in(m, ("testbed.faults",))) == ["testbed.stack"]
    assert senders["testbed.stack"] == ["kill"]  # _stop_workers, at teardown
    assert {"kill", "terminate", "pause"} <= set(senders["testbed.faults.nemesis"])
    assert senders["testbed.faults.effects"] == ["kill"]


#: the fault vocabulary's classes and the nemeses' table: defined once, in the fault package or the in-agent seam
FAULT_DEFINITIONS = {"FaultProxy": "testbed.faults.network", "Toxic": "testbed.faults.network",
                     "FaultRule": "testbed.faults.model", "EffectFault": "testbed.faults.effects",
                     "AgentFaults": "harness.faults", "NEMESES": "testbed.faults.nemesis",
                     "CRASH_POINTS": "harness.faults", "MUTATIONS": "harness.faults"}


def test_each_fault_is_defined_in_the_fault_package_or_the_harness_seam() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for m, path in modules().items():
        for node in ast.parse(path.read_text()).body:
            names = [node.name] if isinstance(node, ast.ClassDef) else \
                [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else \
                [node.target.id] if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) else []
            for name in names:
                if name in FAULT_DEFINITIONS:
                    where[name].append(m)
    assert {name: sorted(ms) for name, ms in where.items()} == {n: [m] for n, m in FAULT_DEFINITIONS.items()}


#: who may import sqlite3, and why: the ledger's own API (harness.recording) and the helpers it stands on; the
#: engines' own stores (the checkpoint engine's, DBOS's system database: where the engines live now and where they
#: move, testbed.engines); the benchmark of SQLite's own commit floor. Until the two "executions in flight" queries
#: are merged into harness.recording: the nemesis's and the one-shot driver's.
SQLITE_USERS = ("harness.recording", "harness.durable_files", "harness.run_files", "agent.checkpoint",
                "agent.engines.dbos_agent", "testbed.engines", "benchmarks.checkpoint_bench",
                "testbed.faults.nemesis", "chaos.backends.oneshot")
#: the ledger's tables, as SQL names them
LEDGER_SQL = re.compile(r"\b(FROM|INTO|UPDATE|JOIN)\s+(executions|effects|applications|crash_points|mutations)\b")


def test_the_ledger_is_read_only_through_the_recording_api() -> None:
    importers = sorted(m for m, path in modules().items() if "sqlite3" in imports(path, m))
    assert [m for m in importers if not _in(m, SQLITE_USERS)] == []
    assert "harness.recording" in importers
    naming = sorted(m for m, path in modules().items() if LEDGER_SQL.search(path.read_text()))
    assert [m for m in naming if m not in ("harness.recording", "testbed.faults.nemesis", "chaos.backends.oneshot")] \
        == []
    assert "harness.recording" in naming
