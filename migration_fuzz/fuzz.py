"""Cross-worker migration fuzzing: agent runs on W worker processes of an engine, and where each piece ran.

W worker processes of the engine (``--durability``, started as a chaos run starts them: its ``stack_spec``) share
its work. Each iteration runs one agent run whose scripted model acts in a shape drawn from the seed:

- ``direct-spawns``: the model emits N parallel ``spawn`` calls (N child workflows);
- ``ptc-spawns``: one ``run_ptc`` program gathers N spawns;
- ``ptc-mixed``: one ``run_ptc`` program gathers ``writes`` file writes and N spawns;
- ``writes``: the model emits N parallel ``write_file`` calls; the only shape without spawn and run_ptc
  (``Engine.workflow_tools``), so the one every engine runs.

Afterwards the event histories say which worker identity completed each workflow task and ran each activity,
so a child that landed on another worker than the parent task that started it is visible, as is a workflow
whose tasks moved between workers; on an engine without them the effect ledger says which worker ran each step
(model call, tool call), and the rest is not observed. The invariants: the run completes with the expected
answer; every child was started once and completed once; every file was written exactly once according to the
effect ledger (and holds the right bytes). With ``chaos`` a random worker is SIGKILLed mid-iteration (the
supervisor restarts it) and the same invariants must hold.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import shlex
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.contracts import DEFAULT_TOOLS, WORKFLOW_NATIVE_TOOLS
from harness.engines import HOME
from harness.event_history import RunRecord
from harness.faults import NO_FAULTS
from harness.operations import History
from harness.printable import table as format_table
from harness.recording import EffectLedger
from harness.rundir import RunDir, command_line, machine_info
from harness.commands import tool
from testbed.engines import make_engine
from testbed.scripted_routes import FUZZ_FAN_OUT, FUZZ_KINDS, fuzz_answer, fuzz_file, fuzz_prompt
from testbed.engines.temporal.server import temporal_binary_or_none

KINDS = FUZZ_KINDS
#: a run's folder under the runs root (--out): runs/migration_fuzz/<stamp>/
FUZZ_FOLDER = "migration_fuzz"


@dataclass(frozen=True)
class Shape:
    kind: str
    n: int  # children
    writes: int  # file writes (ptc-mixed only)

    def describe(self) -> str:
        if self.kind == "writes":
            return f"writes n={self.writes}"
        return f"{self.kind} n={self.n}" + (f" writes={self.writes}" if self.kind == "ptc-mixed" else "")


def families(engine: Any) -> tuple[str, ...]:
    """The shape families ``engine`` can run: the fan-out ones need its workflow tools (spawn, run_ptc)."""
    return KINDS if engine.workflow_tools else ("writes",)


def drawn(engine: Any) -> tuple[str, ...]:
    """What ``--kind all`` draws from: the fan-out families where the engine has them (the draws they always
    had), else ``writes``."""
    return FUZZ_FAN_OUT if engine.workflow_tools else ("writes",)


def shape_for(seed: int, kind: str, max_n: int, pool: tuple[str, ...] = FUZZ_FAN_OUT) -> Shape:
    """The shape of one iteration: a pure function of its seed (so a failure can be replayed alone); ``all``
    draws its family from ``pool``."""
    rng = random.Random(seed)
    chosen = rng.choice(pool) if kind == "all" else kind
    n = rng.randint(1, max_n)
    if chosen == "writes":  # no children: n file writes
        return Shape(chosen, 0, n)
    writes = rng.randint(1, max_n) if chosen == "ptc-mixed" else 0
    return Shape(chosen, n, writes)


def fuzz_config(driver: Any, engine: Any, max_n: int) -> None:
    """The driver's agent config (the chaos suite's timeouts: a killed worker's work moves on within seconds)
    made the fuzz's: its scripted route, and the fan-out tools where the engine has them."""
    cfg = driver.config
    cfg.model = "scripted:migration"
    cfg.tools = [*DEFAULT_TOOLS, *(WORKFLOW_NATIVE_TOOLS if engine.workflow_tools else ())]
    cfg.max_children, cfg.max_depth = max(8, max_n), 1


@dataclass
class Placement:
    """Where one run's work ran, by worker identity (``w2-1``: worker slot 2, first process): its workflow tasks
    and activities by Temporal's event histories, or, on an engine without them, its steps by the effect ledger
    (``workflow_tasks`` None: not observed)."""

    workflow_id: str
    workflow_tasks: list[str] | None
    activities: list[tuple[str, str]]  # (activity type or step's tool, identity that ran its last attempt)
    started_by: str = ""  # for a child: the parent workflow task that started it
    step_attempts: list[str] = field(default_factory=list)  # without workflow tasks: each step attempt's worker

    @property
    def workers(self) -> list[str]:
        """Who ran its work, in order: its workflow tasks, or, where those are not observed, its step attempts."""
        return self.workflow_tasks if self.workflow_tasks is not None else self.step_attempts

    @property
    def moved(self) -> bool:
        return len(set(self.workers)) > 1

    @property
    def first_worker(self) -> str:
        return self.workers[0] if self.workers else ""


@dataclass
class IterationResult:
    index: int
    seed: int
    shape: Shape
    workflow_id: str
    seconds: float
    ok: bool
    violations: list[str]
    parent: Placement | None = None
    children: list[Placement] = field(default_factory=list)
    kills: list[dict[str, Any]] = field(default_factory=list)

    @property
    def cross_children(self) -> int | None:
        """Children that started on another worker than the parent task that started them (None: not observed)."""
        if self.parent is None or self.parent.workflow_tasks is None:
            return None
        return sum(1 for c in self.children if c.first_worker and c.first_worker != c.started_by)

    @property
    def moved_workflows(self) -> int:
        return sum(1 for p in [self.parent, *self.children] if p is not None and p.moved)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = asdict(self.shape)
        d["cross_children"] = self.cross_children
        d["moved_workflows"] = self.moved_workflows
        return d


def _placement(runs: list[RunRecord], started_by: str = "") -> Placement:
    return Placement(
        workflow_id=runs[0].workflow_id,
        workflow_tasks=[w for r in runs for w in r.workflow_task_workers],
        activities=[(a.activity_type, a.worker) for r in runs for a in r.activities],
        started_by=started_by,
    )


def ledger_placement(ledger: EffectLedger, run_id: str) -> Placement:
    """Where a run's steps ran, by the effect ledger (each model call and tool call records its worker): every
    attempt, and the last attempt of each step, in the order they began."""
    executions = ledger.executions(run_id)
    last = {e["activity_id"]: (e["tool"], e["worker"]) for e in executions}
    return Placement(run_id, None, list(last.values()), step_attempts=[e["worker"] for e in executions])


def check_iteration(shape: Shape, workflow_id: str, tag: str, reply: str | None, error: str | None,
                    tree: dict[str, list[RunRecord]] | None, ledger: EffectLedger, workspace: Path) -> list[str]:
    """Every invariant an iteration must keep; an empty list means it held. ``reply``: the run's answer (None: it
    gave none); ``tree``: its event histories (None: the engine keeps none; its children are not observed)."""
    problems: list[str] = []
    if error is not None:
        problems.append(f"parent did not complete: {error}")
    root = (tree or {}).get(workflow_id, [])
    if tree is not None and (not root or root[-1].status != "completed"):
        problems.append(f"parent ended {root[-1].status if root else 'unknown'}")
    children = [c for r in root for c in r.children]
    ids = [c.workflow_id for c in children]
    if len(children) != shape.n:
        problems.append(f"{len(children)} children started; the shape has {shape.n}")
    if len(set(ids)) != len(ids):
        problems.append(f"a child was started twice: {ids}")
    for c in children:
        chain = tree.get(c.workflow_id)
        if c.outcome != "completed" or not chain or chain[-1].status != "completed":
            problems.append(f"child {c.workflow_id} ended {c.outcome} (its own history: "
                            f"{chain[-1].status if chain else 'missing'})")
        elif sum(1 for r in chain if r.status == "completed") != 1:
            problems.append(f"child {c.workflow_id} completed {sum(1 for r in chain if r.status == 'completed')} times")
    for k in range(1, shape.n + 1):
        expected = f"{k} + {k} = {2 * k}"
        if reply is not None and expected not in reply:
            problems.append(f"the parent's answer lacks the child answer {expected!r}")
    if shape.kind == "writes" and reply is not None and reply != fuzz_answer(tag, shape.writes):
        problems.append(f"the answer is {reply[:200]!r}, not {fuzz_answer(tag, shape.writes)!r}")
    # Effects: every file written exactly once (ledger), with the right bytes (disk).
    applications = [a for wid in [workflow_id, *ids] for a in ledger.applications(wid)]
    for j in range(1, shape.writes + 1):
        path, content = fuzz_file(tag, j)
        applied = [a for a in applications if a["tool"] == "write_file" and a["target"] == path]
        if len(applied) != 1:
            problems.append(f"{path} was applied {len(applied)} times according to the ledger (expected 1)")
        target = workspace / path
        if not target.is_file() or target.read_text() != content:
            problems.append(f"{path} is missing or holds the wrong content")
    for wid in [workflow_id, *ids]:
        summary = ledger.summary(wid)
        if summary.duplicated_effects or summary.pending_effects:
            problems.append(f"effect ledger of {wid}: {summary.as_dict()}")
    return problems


@dataclass
class FuzzOptions:
    durability: str = HOME  # the engine (harness.engines.REGISTRY)
    iterations: int = 10
    workers: int = 3
    max_n: int = 5
    kind: str = "all"
    seed: int = 0
    chaos: bool = False
    out: Path = Path("runs")  # the runs root: a run is written to out/migration_fuzz/<stamp>/
    iteration_timeout_s: float = 120.0
    model_latency: str = "fixed:20"
    concurrency: int = 1  # iterations in flight at once (each its own parent workflow; kills hit whichever is running)
    connection: Any = None  # testbed.engines.temporal.connection.TemporalConnection of an external cluster (None: the embedded server)

    @property
    def external(self) -> bool:
        return self.connection is not None and not self.connection.embedded

    def record(self) -> dict[str, Any]:
        """The options for ``run.json``: the connection as its redacted dump (no secret is ever written); None on
        an engine without Temporal."""
        out = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items() if k != "connection"}
        out["temporal"] = self.connection.redacted() if self.external else {"address": "embedded"}
        if self.engine().record().get("temporal", {}) is None:
            out["temporal"] = None
        return out

    def engine(self) -> Any:
        """The engine the run is on (``testbed.engines.make_engine``); ValueError naming the engines."""
        return make_engine(self.durability, connection=self.connection)

    def validate(self) -> None:
        engine = self.engine()
        if self.external and not engine.external:
            raise ValueError(f"--address {self.connection.address}: the {engine.name} engine has no Temporal cluster "
                             f"to reach; drop --address (and TEMPORAL_ADDRESS), or use --durability {HOME}")
        if self.kind != "all" and self.kind in KINDS and self.kind not in families(engine):
            raise ValueError(f"--kind {self.kind}: the {engine.name} engine has no spawn or run_ptc; "
                             f"its families: {', '.join(families(engine))}")
        if self.iterations < 1:
            raise ValueError(f"--iterations {self.iterations}: must be at least 1")
        if not 1 <= self.concurrency <= 32:
            raise ValueError(f"--concurrency {self.concurrency}: must be between 1 and 32")
        if not 1 <= self.workers <= 16:
            raise ValueError(f"--workers {self.workers}: must be between 1 and 16")
        if not 1 <= self.max_n <= 20:
            raise ValueError(f"--max-n {self.max_n}: must be between 1 and 20")
        if self.kind != "all" and self.kind not in KINDS:
            raise ValueError(f"--kind {self.kind!r}: must be 'all' or one of {', '.join(KINDS)}")
        if self.chaos and self.workers < 2:
            raise ValueError("--chaos needs at least 2 workers (one is killed at a time)")


def reproduce_command(opts: FuzzOptions, seed: int, shape: Shape) -> str:
    return (f"{tool('migration_fuzz')} --seed {seed} --iterations 1 --kind {shape.kind} --max-n {opts.max_n} "
            f"--workers {opts.workers}" + (" --chaos" if opts.chaos else "")
            + "".join(f" {flag} {shlex.quote(str(value))}" for flag, value in opts.engine().reproduce().items()))


async def _kill_during(ctx: Any, kills: list[dict[str, Any]], done: asyncio.Event) -> None:
    """Chaos: after a random delay, SIGKILL one random worker (the supervisor restarts it)."""
    from testbed.faults.nemesis import kill_worker

    await asyncio.sleep(ctx.rng.uniform(0.05, 0.8))
    if done.is_set():
        return
    kill = await kill_worker(ctx, when="any", down_s=0.0)
    kills.append({"worker": kill["worker"], "identity": kill["identity"], "at": round(ctx.history.now(), 3)})


def reproduce_run(opts: FuzzOptions) -> str:
    """The command line of this whole run, every option explicit."""
    return command_line(tool("migration_fuzz"), {
        "--iterations": opts.iterations, "--workers": opts.workers, "--max-n": opts.max_n, "--kind": opts.kind,
        "--seed": opts.seed, "--model-latency": opts.model_latency, "--iteration-timeout": opts.iteration_timeout_s,
        "--chaos": opts.chaos, "--concurrency": opts.concurrency, "--out": str(opts.out), **opts.engine().reproduce()})


def fuzz_scenario(opts: FuzzOptions) -> Any:
    """What the engine builds the cluster and the driver from (``testbed.engines.base.Scenario``), as for a chaos
    run: ``workers`` worker processes, the model's latency, the chaos suite's timeouts; no load of its own (the
    iterations are the load)."""
    from chaos.scenarios import ChaosScenario, ClusterSpec
    from testbed.engines.workload import Workload

    return ChaosScenario("migration-fuzz", "cross-worker migration fuzzing", workload=Workload(conversations=0),
                         cluster=ClusterSpec(workers=opts.workers, model_latency=opts.model_latency))


async def run_fuzz(opts: FuzzOptions, say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Start the engine's cluster as a chaos run does (its ``stack_spec``, ``testbed.stack``), run every iteration
    through its driver, check it; the run directory (harness.rundir) gets ``run.json``, ``operations.jsonl``,
    ``results.json`` and ``table.txt``. Its life is the one every run has (``RunDir.recording``): ``running`` from
    the start, then ``complete``, or ``interrupted`` / ``terminated`` / ``failed`` with the error and its traceback
    in ``logs/runner-error.txt``."""
    from testbed.stack import stack

    opts.validate()
    engine = opts.engine()
    run = RunDir.create(opts.out / FUZZ_FOLDER)
    with run.recording("migration_fuzz", "migration_fuzz", seed=opts.seed, reproduce=reproduce_run(opts),
                       options=opts.record()) as rec:
        run.update(machine=await asyncio.to_thread(machine_info, temporal_binary_or_none()), backend=engine.record())
        started = time.monotonic()  # the cluster's start, the iterations and the checks: what the rates count
        history = History(run.operations)
        rec.before_ending = history.close
        # a shared cluster: this run's own workflow ids (and task queue: Engine.task_queue)
        stamp = f"{run.path.name}-{uuid.uuid4().hex[:8]}" if engine.external else run.path.name
        scenario = fuzz_scenario(opts)
        spec = engine.stack_spec(scenario, run, opts.seed, history, False)
        where = (f"connecting to {engine.connection.address} (namespace {engine.connection.namespace}), starting"
                 if engine.external else f"starting {engine.name},")
        n = spec.worker_processes
        say(f"{where} the scripted model and {n} worker processes in {run.path}"
            + (f" ({engine.name} runs {n} whatever --workers asks)" if n != opts.workers else ""))
        rec.doing = "cluster"
        async with stack(spec) as s:
            driver = engine.make_driver(s, history, scenario, opts.seed)
            driver = await driver if inspect.isawaitable(driver) else driver
            fuzz_config(driver, engine, opts.max_n)
            ledger = EffectLedger(s.settings.resolved_ledger_path, faults=NO_FAULTS)
            iteration = Iteration(opts, engine, s, driver, history, ledger, stamp, say)
            ready = time.monotonic() - started
            say(f"workers ready after {ready:.1f} s; running {opts.iterations} iteration(s)"
                + (f", {opts.concurrency} at a time" if opts.concurrency > 1 else ""))
            rec.doing = "iterations"
            slots = asyncio.Semaphore(opts.concurrency)

            async def one(i: int) -> IterationResult:
                async with slots:
                    return await iteration.run(i)

            try:
                results = sorted(await asyncio.gather(*(one(i) for i in range(opts.iterations))),
                                 key=lambda r: r.index)
            finally:
                await driver.finish()  # it drove no conversation: this closes its client
                ledger.close()
            iterating = time.monotonic() - started - ready
        history.close()
        wall = time.monotonic() - started
        summary = summarise(results)
        report = {
            "options": run.run["options"],
            "run_dir": str(run.path),
            "wall_seconds": round(wall, 1),
            "startup_seconds": round(ready, 1),
            "iterations_per_minute": round(len(results) * 60.0 / iterating, 1) if iterating > 0 else None,
            "iterations_per_minute_overall": round(len(results) * 60.0 / wall, 1) if wall > 0 else None,
            "families": summary,
            "iterations": [r.as_dict() for r in results],
            "invariants_held": all(r.ok for r in results),
        }
        run.write_json("results.json", report)
        (run.path / "table.txt").write_text(table(summary) + "\n")
    return report


@dataclass
class Iteration:
    """One fuzz iteration on the running cluster: a run of the seed's shape submitted through the engine's
    driver, a worker killed during it (``chaos``), then where its work ran read from the engine's records and
    every invariant checked (``check_iteration``)."""

    opts: FuzzOptions
    engine: Any  # testbed.engines.base.Engine
    stack: Any  # testbed.stack.Stack
    driver: Any  # the engine's driver: submit, wait
    history: History
    ledger: EffectLedger
    stamp: str
    say: Callable[[str], None]

    async def run(self, i: int) -> IterationResult:
        from testbed.faults.nemesis import NemesisContext

        opts, history = self.opts, self.history
        seed = opts.seed + i
        shape = shape_for(seed, opts.kind, opts.max_n, drawn(self.engine))
        tag = f"i{i}s{seed}"
        workflow_id = f"fuzz-{self.stamp}-{tag}"
        t0 = time.monotonic()
        kills: list[dict[str, Any]] = []
        done = asyncio.Event()
        chaos_task = None
        if opts.chaos:
            ctx = NemesisContext(self.stack, history, [], random.Random(seed * 7919),
                                 **self.engine.aiming(self.stack, self.driver))
            chaos_task = asyncio.create_task(_kill_during(ctx, kills, done))
        op = history.invoke("client", "fuzz_iteration", {"index": i, "seed": seed, **asdict(shape)})
        reply: str | None = None
        error = None
        try:
            # the run's workspace is its own: its id's
            await self.driver.submit(workflow_id, fuzz_prompt(shape.kind, shape.n, shape.writes, tag), workflow_id)
            reply = (await self.driver.wait(workflow_id, opts.iteration_timeout_s)).get("reply") or ""
        except Exception as exc:  # recorded as a violation; the next iteration still runs
            error = f"{type(exc).__name__}: {exc}"
        finally:
            done.set()
            if chaos_task is not None:
                await chaos_task
        seconds = time.monotonic() - t0
        tree: dict[str, list[RunRecord]] | None
        try:
            tree = await self.engine.run_tree(self.stack, workflow_id)
        except Exception as exc:
            tree = {}
            error = error or f"history unavailable: {exc}"
        violations = check_iteration(shape, workflow_id, tag, reply, error, tree, self.ledger,
                                     self.stack.workspace(workflow_id))
        res = IterationResult(i, seed, shape, workflow_id, round(seconds, 3), not violations, violations, kills=kills)
        if tree is None:  # no event histories: where its steps ran, by the ledger
            res.parent = ledger_placement(self.ledger, workflow_id)
        elif root := tree.get(workflow_id):
            res.parent = _placement(root)
            for c in (c for r in root for c in r.children):
                if c.workflow_id in tree:
                    res.children.append(_placement(tree[c.workflow_id], c.initiated_by))
        history.complete(op, "ok" if res.ok else "fail", {"cross_children": res.cross_children,
                                                           "moved": res.moved_workflows},
                         error="; ".join(violations) or None)
        kill_note = f"  killed {kills[0]['identity']}" if kills else ""
        crossed = NOT_OBSERVED if res.cross_children is None else f"{res.cross_children}/{shape.n}"
        self.say(f"[{i + 1}/{opts.iterations}] {shape.describe():<28} children on another worker "
                 f"{crossed}, moved {res.moved_workflows}{kill_note}  "
                 f"{'ok' if res.ok else 'VIOLATED'}  {seconds:.1f} s")
        if not res.ok:
            for v in violations:
                self.say(f"    violation: {v}")
            self.say(f"    reproduce: {reproduce_command(opts, seed, shape)}")
        return res


def summarise(results: list[IterationResult]) -> dict[str, dict[str, Any]]:
    """Per family, then all: the placement counts (None where not observed) and the invariants."""
    summary: dict[str, dict[str, Any]] = {}
    for kind in [*KINDS, "all"]:
        rows = [r for r in results if kind == "all" or r.shape.kind == kind]
        if not rows:
            continue
        children = sum(r.shape.n for r in rows)
        workflows = sum(1 + len(r.children) for r in rows)
        activities = [(a, r.parent.first_worker if r.parent else "") for r in rows for p in [r.parent, *r.children]
                      if p is not None for a in p.activities]
        crossed = [r.cross_children for r in rows]
        observed = None not in crossed
        summary[kind] = {
            "iterations": len(rows),
            "completed": sum(1 for r in rows if r.parent and not any("parent" in v for v in r.violations)),
            "children": children,
            "cross_worker_children": sum(c or 0 for c in crossed) if observed else None,
            "cross_worker_children_pct": (round(100.0 * sum(c or 0 for c in crossed) / children, 1)
                                          if children else 0.0) if observed else None,
            "moved_workflows": sum(r.moved_workflows for r in rows),
            "moved_workflows_pct": round(100.0 * sum(r.moved_workflows for r in rows) / workflows, 1)
            if workflows else 0.0,
            "activities_off_parent_worker_pct": round(
                100.0 * sum(1 for (_, w), pw in activities if w and w != pw) / len(activities), 1)
            if activities else 0.0,
            "worker_kills": sum(len(r.kills) for r in rows),
            "violations": sum(len(r.violations) for r in rows),
            "mean_seconds": round(sum(r.seconds for r in rows) / len(rows), 2),
        }
    return summary


TABLE_COLUMNS = [("family", 14), ("iters", 6), ("completed", 10), ("children", 9), ("cross-worker", 13),
                 ("moved wf", 10), ("acts off parent", 16), ("kills", 6), ("violations", 11), ("mean s", 7)]


#: what the table's columns mean, printed under it
LEGEND = [("completed", "C/N: parent runs that completed, of N iterations"),
          ("children", "child workflows (subagents) started"),
          ("cross-worker", "children whose first workflow task ran on another worker than the parent task that "
                           "started them"),
          ("moved wf", "workflows (parents and children) whose workflow tasks ran on more than one worker"),
          ("acts off parent", "activities whose last attempt ran on another worker than the parent's first task"),
          ("kills", "workers SIGKILLed (--chaos)"),
          ("violations", "broken invariants: a child not completed once, a file not written once")]
#: printed under the legend when the engine keeps no event histories
NOT_OBSERVED = "not observed"
NOT_OBSERVED_LEGEND = (NOT_OBSERVED, "the engine keeps no event histories, so which worker ran a run's workflow "
                                     "tasks is unknown; moved wf and acts off parent count its steps instead (each "
                                     "model and tool call attempt: the effect ledger names its worker)")


def table(summary: dict[str, dict[str, Any]]) -> str:
    """The families' results (``harness.printable.table``): one line per shape family, then all of them."""
    unobserved = any(s["cross_worker_children"] is None for s in summary.values())
    return format_table(TABLE_COLUMNS, legend=[*LEGEND, *([NOT_OBSERVED_LEGEND] if unobserved else [])], rows=([
        kind, s["iterations"], f"{s['completed']}/{s['iterations']}", s["children"],
        NOT_OBSERVED if s["cross_worker_children"] is None
        else f"{s['cross_worker_children']} ({s['cross_worker_children_pct']}%)",
        f"{s['moved_workflows']} ({s['moved_workflows_pct']}%)", f"{s['activities_off_parent_worker_pct']}%",
        s["worker_kills"], s["violations"], s["mean_seconds"]] for kind, s in summary.items()))
