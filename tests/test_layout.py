"""The layout's promises, checked on the source: which package may import which, and no import cycles.

    harness   the run-data contract (run directory, operations, event histories, verdicts, recording, faults):
              imports only the standard library and temporalio, so it runs in a target agent's own Python
    agent     the reference agent: imports harness and itself only
    testbed   what stands around an agent (servers, model, workers, the stack, the faults); its ``engines``
              package is the one place an engine is defined, and never imports chaos
    chaos, benchmarks, migration_fuzz, reports: the tools; checkers and reports never import the agent
    cli       the tools' command lines, on top: nothing imports it but a package's ``__main__.py``, and a command
              line of a dah tool is built nowhere else
    a run's verdict is decided in chaos.checker.verdict alone; harness.verdict holds the values and names no check

And one place for faults: they are defined, switched on and sent to workers only from ``testbed/faults/`` (the
orchestrator's) and ``harness/faults.py`` (the in-agent seam); the effect ledger is read only through
``harness.recording``.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "harness", "testbed", "chaos", "benchmarks", "migration_fuzz", "reports", "cli", "examples")


def modules() -> dict[str, Path]:
    return dict(_modules())


@functools.cache
def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for folder, dirs, files in os.walk(ROOT / package):
            # an example's own environment (make example-*) is not the project's code: not even walked
            dirs[:] = sorted(d for d in dirs if d not in {".venv", "node_modules"})
            for f in sorted(files):
                if f.endswith(".py"):
                    path = Path(folder) / f
                    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
                    out[name.removesuffix(".__init__")] = path
    return out


@functools.cache
def _tree(path: Path) -> ast.Module:
    """The file's syntax tree, parsed once for all the tests here (they only read it)."""
    return ast.parse(path.read_text())


def imports(path: Path, name: str) -> set[str]:
    """Every module this file imports, at any depth (function-level imports count too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(_tree(path)):
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
    return {m: set(t) for m, t in _local_edges().items()}


@functools.cache
def _local_edges() -> dict[str, set[str]]:
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


def test_the_agent_imports_only_the_harness_and_itself() -> None:
    assert offenders("agent", tuple(p for p in PACKAGES if p not in ("agent", "harness"))) == []


def test_the_engines_never_import_chaos() -> None:
    assert offenders("testbed.engines", ("chaos",)) == []


def _classes() -> list[tuple[str, ast.ClassDef]]:
    return [(name, node) for name, path in modules().items() for node in ast.walk(_tree(path))
            if isinstance(node, ast.ClassDef)]


def _base_names(node: ast.ClassDef) -> set[str]:
    return {b.id if isinstance(b, ast.Name) else b.attr for b in node.bases if isinstance(b, (ast.Name, ast.Attribute))}


#: what the engine protocol and its session define (``testbed.engines.base``: ``Engine``, ``Session``): a class with
#: two or more of them is an engine, or an engine in this process, whatever its name
ENGINE_METHODS = frozenset({"run_turn", "noop_steps", "in_process", "stack_spec", "make_driver", "describe_run"})
#: the classes outside testbed.engines that have them and are not an engine, and why
NOT_ENGINES = {"benchmarks.engines_bench.NoDurability": "the benchmarks' baseline beside the engines "
                                                         "(harness.engines.PLAIN): the agent loop, nothing persisted"}


def _protocol_methods(node: ast.ClassDef) -> set[str]:
    return {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))} & ENGINE_METHODS


def test_an_engine_is_defined_only_in_testbed_engines() -> None:
    """No class outside ``testbed.engines`` is an engine: none subclasses its Engine (or an engine class of it),
    none is named like one (``...Engine``, ``...Backend``), and none implements the engine's or its session's
    protocol (two or more of ``ENGINE_METHODS``) but the baseline ``NOT_ENGINES`` names."""
    inside = [node for name, node in _classes() if name.startswith("testbed.engines")]
    engines = {"Engine"}
    while grown := {node.name for node in inside if _base_names(node) & engines} - engines:
        engines |= grown
    assert {"ReferenceOnTemporal", "OwnAgentOnTemporal", "CheckpointEngine", "DbosEngine", "RestateEngine"} <= engines
    # the structural rule is about real code: it recognises every engine's session and engine class by its methods
    by_methods = {node.name for node in inside if len(_protocol_methods(node)) >= 2}
    assert {"CheckpointSession", "InProcessDbos", "InProcessRestate", "CheckpointEngine", "DbosEngine"} <= by_methods
    outside = {f"{name}.{node.name}": node for name, node in _classes() if not name.startswith("testbed.engines")}
    found = sorted(where for where, node in outside.items() if where not in NOT_ENGINES and (
        node.name.endswith(("Engine", "Backend")) or _base_names(node) & engines or len(_protocol_methods(node)) >= 2))
    assert found == [], "an engine, or an engine's session, is defined in its folder under testbed/engines"
    assert sorted(w for w in NOT_ENGINES if w in outside and len(_protocol_methods(outside[w])) >= 2) == \
        sorted(NOT_ENGINES)  # no stale exception


def test_engine_names_are_listed_only_in_the_registry() -> None:
    """A literal tuple, list, set or dict that holds two or more engine names is a second list of the engines: it
    belongs in ``harness.engines.REGISTRY`` (every tool derives its names, twins and order from there), nowhere
    else. Tests and the examples (agents of their own) may name engines as they like."""
    from harness.engines import PLAIN, REGISTRY

    names = {PLAIN, *(r.name for r in REGISTRY), *(a for r in REGISTRY for a in r.aliases)}
    found = []
    for name, path in modules().items():
        if name == "harness.engines" or name.startswith("examples"):
            continue
        for node in ast.walk(_tree(path)):
            if not isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                continue
            values = {n.value for n in (node.values if isinstance(node, ast.Dict) else node.elts)
                      if isinstance(n, ast.Constant)}
            keys = [n.value if isinstance(n, ast.Constant) else None for n in getattr(node, "keys", [])]
            # a dict keyed by engines (not a record that has a "temporal" field among others)
            if len(values & names) >= 2 or (len(keys) >= 2 and set(keys) <= names):
                found.append(f"{name}:{node.lineno}")
    assert found == []


def test_each_engine_is_a_folder_with_its_engine_module() -> None:
    """An engine is found from file names alone: ``testbed/engines/<folder>/engine.py``, one folder per engine, and
    every registry entry made from one of them."""
    from harness.engines import REGISTRY

    root = Path(__file__).resolve().parent.parent / "testbed" / "engines"
    folders = {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == {"temporal", "byo", "checkpoint", "dbos", "restate"}
    assert all((root / f / "engine.py").exists() for f in folders)
    assert {r.make.split(":")[0] for r in REGISTRY} <= {f"{f}.engine" for f in folders}


def test_a_cluster_is_assembled_only_by_the_stack() -> None:
    """A cluster's parts (the scripted model, the effects service, the fault proxies, the supervised workers, an
    engine's server) are put together in one place, ``testbed/stack.py`` (``stack(spec)``: chaos, ``dah``, the
    benchmarks and the fuzzer all start their clusters there); an engine's folder makes its own server for the
    stack (``Engine.server``) or for its in-process session. Each part's own module may make one in its docstring
    or ``main``; the two micro-benchmarks that measure one part alone are named."""
    parts = {"ScriptedModelServer", "EffectsService", "FaultProxy", "SupervisedWorker", "EmbeddedTemporal",
             "RestateServer", "PostgresServer"}
    alone = {"benchmarks.proxy", "benchmarks.model_planner"}  # a proxy, a model server: measured by themselves
    owners = {"testbed.stack", "testbed.model_server", "testbed.effects_service", "testbed.faults.network",
              "testbed.supervisor"}
    found = sorted(f"{name} makes {node.func.id}" for name, path in modules().items()
                   for node in ast.walk(_tree(path))
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in parts
                   and name not in owners | alone and not name.startswith("testbed.engines"))
    assert found == []


def test_the_stack_special_cases_no_engine() -> None:
    """``testbed/stack.py`` starts every engine the same way, through ``StackSpec.engine`` (``EnginePart``): no line
    of it says "temporal" (so it imports nothing of Temporal's folder nor temporalio, and names no Temporal-only
    thing); Temporal's part in a stack is ``testbed.engines.temporal.cluster.TemporalCluster``."""
    lines = (ROOT / "testbed" / "stack.py").read_text().splitlines()
    assert [f"stack.py:{n}: {line.strip()}" for n, line in enumerate(lines, 1) if "temporal" in line.lower()] == []


#: drivers a target file may name (``harness.driver_api``): their constructor is the driver API, keyword history=
DRIVER_API_DRIVERS = {"testbed.engines.temporal.driver", "testbed.engines.oneshot"}


def test_history_means_only_temporals_event_history() -> None:
    """What a run's clients and nemeses did is its operation log (``OperationLog``, ``oplog``), never a "history":
    code that holds one names nothing ``history`` or ``History``, except the driver API's ``history=`` keyword
    (``harness.driver_api``: drivers already written take it, and a target file may name our own drivers)."""
    bad = []
    for name, path in modules().items():
        tree = _tree(path)
        if name in DRIVER_API_DRIVERS:
            continue
        if name == "harness.operations" or "harness.operations.OperationLog" in imports(path, name):
            bad += [f"{name}:{n.lineno} {getattr(n, 'id', None) or getattr(n, 'attr', None) or n.arg}"
                    for n in ast.walk(tree)
                    if (isinstance(n, ast.Name) and n.id in {"history", "History"})
                    or (isinstance(n, ast.Attribute) and n.attr == "history")
                    or (isinstance(n, ast.arg) and n.arg == "history")]
    assert not bad, f"the operation log called a history: {bad}"


def test_a_worker_command_is_built_only_by_the_engines() -> None:
    """A worker's command line is built in one place per engine, its folder (a ``{python}`` template there, or
    the target file's own for your agent), and every engine's is ``dah worker --durability NAME ...``; only
    ``testbed/worker_process.py`` (the reference's and the checkpoint engine's, shared by several folders) holds
    templates besides."""
    found = []
    for name, path in modules().items():
        if name.startswith(("testbed.engines", "examples")) or name == "testbed.worker_process":
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Tuple) and node.elts and isinstance(node.elts[0], ast.Constant) \
                    and node.elts[0].value == "{python}":
                found.append(f"{name}:{node.lineno}")
    assert found == []


def test_only_the_engines_and_the_servers_start_an_engines_server() -> None:
    """``RestateServer`` and ``PostgresServer`` are made only by the engines (and their own modules): nothing else
    starts an engine's server behind the stack's back."""
    servers = {"RestateServer": "testbed.engines.restate.server", "PostgresServer": "testbed.engines.dbos.postgres"}
    found = sorted(f"{name} calls {node.func.id}" for name, path in modules().items()
                   for node in ast.walk(_tree(path))
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in servers
                   and not name.startswith("testbed.engines") and name != servers[node.func.id])
    assert found == []


def test_the_command_lines_are_the_top_layer() -> None:
    """Only ``cli`` and the packages' ``__main__.py`` (``python -m chaos`` etc.) import ``cli``."""
    found = sorted(f"{m} imports {t}" for m, targets in local_edges().items() if not _in(m, ("cli",))
                   and not m.endswith("__main__") for t in targets if _in(t, ("cli",)))
    assert found == []
    assert {"chaos.__main__", "testbed.__main__"} <= {m for m, t in local_edges().items() if "cli.chaos" in t
                                                     or "cli.dah" in t}


#: the programs of their own outside cli/ that build a command line (not a dah tool's), and why
OWN_PROGRAMS = {
    "agent.envs.browser_service": "the browser service, run in its own container or process",
    "benchmarks.false_timeouts": "a measurement of its own (python -m benchmarks.false_timeouts), not dah-bench's",
    "benchmarks.model_planner": "a measurement of its own (python -m benchmarks.model_planner)",
    "benchmarks.proxy": "a measurement of its own (python -m benchmarks.proxy)",
    "benchmarks.ptc_hostile": "a measurement of its own (python -m benchmarks.ptc_hostile)",
    "benchmarks.recovery_levers": "a measurement of its own (python -m benchmarks.recovery_levers)",
    "harness.driver_api": "python -m harness.driver_api --check, run in a target's own Python (no cli there)",
    "harness.driver_host": "runs a target's driver in the target's own Python (no cli there)",
    "harness.replayer": "replays histories in a target's own Python (no cli there)",
    "testbed.effects_service": "the effects service, a server process of its own",
    "testbed.model_server": "the scripted model, a server process of its own (also dah model-server)",
    "testbed.images": "python -m testbed.images build, a helper that builds the Docker images",
    "testbed.engines.checkpoint.service": "the checkpoint engine's worker process (dah worker --durability checkpoint)",
    "testbed.engines.dbos.agent": "the DBOS engine's worker process",
    "testbed.engines.restate.agent": "the Restate engine's service process",
}
PARSER_CALLS = ("add_argument", "ArgumentParser", "CommandParser")


def test_a_command_line_is_built_only_in_cli() -> None:
    """``add_argument``, ``ArgumentParser`` or ``CommandParser`` called: a command line, which for a dah tool is
    built in ``cli/`` (one module per tool over ``cli.options``); the programs of their own are ``OWN_PROGRAMS``.
    The examples are agents that are not ours."""
    def builds(path: Path) -> bool:
        return any((c.func.id if isinstance(c.func, ast.Name) else getattr(c.func, "attr", "")) in PARSER_CALLS
                   for c in _call_nodes(path))

    building = {m for m, path in modules().items() if builds(path) and not _in(m, ("cli", "examples"))}
    assert sorted(building - set(OWN_PROGRAMS)) == []
    assert sorted(set(OWN_PROGRAMS) - building) == []  # no stale exception
    assert {"cli.dah", "cli.chaos", "cli.bench", "cli.fuzz", "cli.report", "cli.checkpoint", "cli.options"} <= \
        {m for m, path in modules().items() if builds(path)}


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


#: the modules that make run directories: each run's life through ``RunDir.recording`` (chaos runs, benchmark runs,
#: migration-fuzz runs), and the soak's own directory, which ends through the same ``RunDir.end_with``
RUN_DIRECTORY_MAKERS = {"chaos.runner", "chaos.soak", "benchmarks.suite", "migration_fuzz.fuzz"}
#: a module that writes a synthetic run directory for its checkers to read (no run happens)
SYNTHETIC_RUN_DIRECTORIES = {"benchmarks.micro.conftest"}


def test_one_run_lifecycle_makes_every_run_directory() -> None:
    """Every run is made, recorded and ended by one lifecycle (``harness.rundir``: ``RunDir.recording``,
    ``RunDir.end_with``), called by the modules that own a kind of run; no other module begins a ``run.json``."""
    found = []
    for name, path in modules().items():
        if name.split(".")[0] == "harness":
            continue
        text = path.read_text()
        if "RunDir.create(" in text and name not in RUN_DIRECTORY_MAKERS:
            found.append(f"{name} creates a run directory")
        if ".begin(" in text and "RunDir" in text and name not in {"chaos.soak", *SYNTHETIC_RUN_DIRECTORIES}:
            found.append(f"{name} begins a run.json itself (use RunDir.recording)")
    assert found == []


def test_one_results_table() -> None:
    """Every command's results table is ``harness.printable.table``: no module draws a header rule of its own."""
    assert [name for name, path in modules().items()
            if '"-" * len(' in path.read_text() and name != "harness.printable"] == []


# ---------------------------------------------------------------------------------- the verdict, decided once

#: the one module that decides a run's verdict: which checks apply, how they compose, the row, verdict.json
VERDICT_MODULE = "chaos.checker.verdict"
#: names only the verdict module may use: the composition rule and the applicability tables
DECIDING_NAMES = ("compose", "FAULT_CHECKERS", "ENGINE_CHECKERS")


def _names_used(path: Path) -> set[str]:
    """Every name a module reads, imports or calls (``x``, ``m.x``, ``from m import x``)."""
    found = set()
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            found |= {a.name for a in node.names}
    return found


def _calls(path: Path, name: str) -> int:
    return sum(1 for node in ast.walk(_tree(path)) if isinstance(node, ast.Call)
               and name in ((node.func.id,) if isinstance(node.func, ast.Name) else
                            (node.func.attr,) if isinstance(node.func, ast.Attribute) else ()))


def _writes_verdict_json(path: Path) -> bool:
    """Whether a module calls a ``write*`` function or method on ``verdict.json`` (``VERDICT_JSON`` or the name)."""
    for node in ast.walk(_tree(path)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if not func.startswith("write"):
            continue
        for part in ast.walk(ast.Module(body=[ast.Expr(node)], type_ignores=[])):
            if (isinstance(part, ast.Name) and part.id == "VERDICT_JSON") or \
                    (isinstance(part, ast.Constant) and part.value == "verdict.json"):
                return True
    return False


def test_only_the_verdict_module_decides_a_verdict() -> None:
    mods = modules()
    assert VERDICT_MODULE in mods
    deciding = sorted(f"{m} uses {n}" for m, path in mods.items() if m != VERDICT_MODULE
                      for n in DECIDING_NAMES if n in _names_used(path))
    assert deciding == [], "only chaos/checker/verdict.py composes checks and says which apply"
    writers = sorted(m for m, path in mods.items() if _writes_verdict_json(path))
    assert writers == [VERDICT_MODULE]
    # worst (the values' order) serves the checkers and the verdict module; a tool reading a saved verdict asks
    # chaos.checker.verdict.saved_verdict, never re-derives one
    assert sorted(m for m, path in mods.items() if _calls(path, "worst") and m != "harness.verdict"
                  and not m.startswith("chaos.checker")) == []


def test_the_harness_verdict_values_name_no_checker() -> None:
    from chaos.checker import ALL_CHECKERS

    tree = ast.parse((ROOT / "harness" / "verdict.py").read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    words: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words |= set(re.findall(r"\w+", node.value))
        elif isinstance(node, ast.Name):
            words.add(node.id)
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
    assert words & set(ALL_CHECKERS) == set(), "harness/verdict.py is the values only: no checker's name"
    assert offenders("harness.verdict", ("chaos",)) == []


def test_measurements_are_not_checks() -> None:
    # every module of chaos/checker is a check, the list of checks, the run data they read, or the verdict
    from chaos.checker import ALL_CHECKERS

    found = {f.stem for f in (ROOT / "chaos" / "checker").glob("*.py")}
    assert found - set(ALL_CHECKERS) == {"__init__", "run_data", "verdict"}
# -- one place for faults, one reader of the ledger -----------------------------------------------------------------

def _in(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _call_nodes(path: Path) -> list[ast.Call]:
    return [n for n in ast.walk(_tree(path)) if isinstance(n, ast.Call)]


#: the run-time fault switches: arming the model's or the effects service's faults, adding a toxic to a proxy
FAULT_SWITCHES = ("set_model_faults", "set_faults", "add_toxic", "remove_toxic")
#: who may throw them, and why: the fault package; the stack (its ``set_model_faults`` and ``heal``); each service's
#: own admin route applying what was posted to it; the proxy's benchmark, which measures a no-op toxic
FAULT_SWITCH_USERS = ("testbed.faults", "testbed.stack", "testbed.model_server", "testbed.effects_service",
                      "benchmarks.proxy")


def test_faults_are_switched_on_only_from_the_fault_package() -> None:
    found = sorted({f"{m} calls {c.func.attr}" for m, path in modules().items() if not _in(m, FAULT_SWITCH_USERS)
                    for c in _call_nodes(path) if isinstance(c.func, ast.Attribute) and c.func.attr in FAULT_SWITCHES})
    assert found == []
    users = {m for m, path in modules().items() for c in _call_nodes(path)
             if isinstance(c.func, ast.Attribute) and c.func.attr in FAULT_SWITCHES}
    assert {"testbed.faults.nemesis"} <= users  # the rule is about real code: the nemesis throws them


def _worker_signals(path: Path) -> list[str]:
    """``kill``/``terminate``/``pause`` sent to a supervised worker: on ``<x>.process`` or on the process a
    ``with <w>.held() as <name>`` block holds."""
    tree = _tree(path)
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
        for node in _tree(path).body:
            names = [node.name] if isinstance(node, ast.ClassDef) else \
                [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else \
                [node.target.id] if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) else []
            for name in names:
                if name in FAULT_DEFINITIONS:
                    where[name].append(m)
    assert {name: sorted(ms) for name, ms in where.items()} == {n: [m] for n, m in FAULT_DEFINITIONS.items()}


#: who may import sqlite3, and why: the ledger's own API (harness.recording) and the helpers it stands on; the
#: engines' own stores (the checkpoint engine's, DBOS's system database); the benchmark of SQLite's own commit floor
SQLITE_USERS = ("harness.recording", "harness.durable_files", "harness.run_files", "testbed.engines",
                "benchmarks.checkpoint_bench")
#: the ledger's tables, as SQL names them
LEDGER_SQL = re.compile(r"\b(FROM|INTO|UPDATE|JOIN)\s+(executions|effects|applications|crash_points|mutations)\b")


def test_the_ledger_is_read_only_through_the_recording_api() -> None:
    importers = sorted(m for m, path in modules().items() if "sqlite3" in imports(path, m))
    assert [m for m in importers if not _in(m, SQLITE_USERS)] == []
    assert "harness.recording" in importers
    naming = sorted(m for m, path in modules().items() if LEDGER_SQL.search(path.read_text()))
    assert [m for m in naming if m != "harness.recording"] == []
    assert "harness.recording" in naming
