"""Cross-worker migration fuzzing: fan-out agent runs on W worker processes, placement read from histories.

W worker processes (each its own interpreter, SDK client and identity) poll one task queue. Each
iteration runs one parent agent workflow whose scripted model fans out in a shape drawn from the seed:

- ``direct-spawns``: the model emits N parallel ``spawn`` calls (N child workflows);
- ``ptc-spawns``: one ``run_ptc`` program gathers N spawns;
- ``ptc-mixed``: one ``run_ptc`` program gathers ``writes`` file writes and N spawns.

Afterwards the event histories say which worker identity completed each workflow task and ran each
activity, so a child that landed on another worker than the parent task that started it is visible,
as is a workflow whose tasks moved between workers. The invariants: the parent completes with every
child's answer; every child was started once and completed once; every file was written exactly once
according to the effect ledger (and holds the right bytes). With ``chaos`` a random worker is
SIGKILLed mid-iteration (the supervisor restarts it) and the same invariants must hold.
"""

from __future__ import annotations

import asyncio
import random
import shlex
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from agent.contracts import DEFAULT_TOOLS, AgentConfig, AgentInput, AgentResult
from agent.workflow import AgentWorkflow
from harness.event_history import RunRecord, fetch_tree
from harness.faults import NO_FAULTS
from harness.operations import History
from harness.printable import table as format_table
from harness.recording import EffectLedger
from harness.rundir import RunDir, command_line, machine_info
from harness.commands import tool
from testbed.scripted_routes import FUZZ_KINDS, fuzz_file, fuzz_prompt
from testbed.engines.temporal.cluster import TemporalCluster
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
        return f"{self.kind} n={self.n}" + (f" writes={self.writes}" if self.kind == "ptc-mixed" else "")


def shape_for(seed: int, kind: str, max_n: int) -> Shape:
    """The shape of one iteration: a pure function of its seed (so a failure can be replayed alone)."""
    rng = random.Random(seed)
    chosen = rng.choice(KINDS) if kind == "all" else kind
    n = rng.randint(1, max_n)
    writes = rng.randint(1, max_n) if chosen == "ptc-mixed" else 0
    return Shape(chosen, n, writes)


def fuzz_config(max_n: int) -> AgentConfig:
    """The chaos suite's timeouts (a killed worker's work moves on within seconds), with fan-out tools."""
    from testbed.engines.workload import chaos_agent_config

    cfg = chaos_agent_config()
    cfg.model = "scripted:migration"
    cfg.tools = [*DEFAULT_TOOLS, "spawn", "wait", "run_ptc"]
    cfg.max_children, cfg.max_depth = max(8, max_n), 1
    return cfg


@dataclass
class Placement:
    """Where one workflow's work ran, by worker identity (``w2-1``: worker slot 2, first process)."""

    workflow_id: str
    workflow_tasks: list[str]
    activities: list[tuple[str, str]]  # (activity type, identity that ran its last attempt)
    started_by: str = ""  # for a child: the parent workflow task that started it

    @property
    def moved(self) -> bool:
        return len(set(self.workflow_tasks)) > 1

    @property
    def first_worker(self) -> str:
        return self.workflow_tasks[0] if self.workflow_tasks else ""


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
    def cross_children(self) -> int:
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


def check_iteration(shape: Shape, workflow_id: str, tag: str, result: AgentResult | None, error: str | None,
                    tree: dict[str, list[RunRecord]], ledger: EffectLedger, workspace: Path) -> list[str]:
    """Every invariant an iteration must keep; an empty list means it held."""
    problems: list[str] = []
    if error is not None:
        problems.append(f"parent did not complete: {error}")
    root = tree.get(workflow_id, [])
    if not root or root[-1].status != "completed":
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
    reply = (result.reply or "") if result else ""
    for k in range(1, shape.n + 1):
        expected = f"{k} + {k} = {2 * k}"
        if result is not None and expected not in reply:
            problems.append(f"the parent's answer lacks the child answer {expected!r}")
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
        """The options for ``run.json``: the connection as its redacted dump (no secret is ever written)."""
        out = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items() if k != "connection"}
        out["temporal"] = self.connection.redacted() if self.external else {"address": "embedded"}
        return out

    def validate(self) -> None:
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


def _cluster_flags(opts: FuzzOptions) -> dict[str, Any]:
    """An external cluster's address and namespace (its TLS and API key come from the environment or a profile)."""
    if not opts.external:
        return {}
    return {"--address": opts.connection.address, "--namespace": opts.connection.namespace}


def reproduce_command(opts: FuzzOptions, seed: int, shape: Shape) -> str:
    return (f"{tool('migration_fuzz')} --seed {seed} --iterations 1 --kind {shape.kind} --max-n {opts.max_n} "
            f"--workers {opts.workers}" + (" --chaos" if opts.chaos else "")
            + "".join(f" {flag} {shlex.quote(value)}" for flag, value in _cluster_flags(opts).items()))


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
        "--chaos": opts.chaos, "--concurrency": opts.concurrency, "--out": str(opts.out), **_cluster_flags(opts)})


async def run_fuzz(opts: FuzzOptions, say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Start the cluster (testbed.stack), run every iteration, check it; the run directory (harness.rundir)
    gets ``run.json``, ``operations.jsonl``, ``results.json`` and ``table.txt``. Its life is the one every run
    has (``RunDir.recording``): ``running`` from the start, then ``complete``, or ``interrupted`` /
    ``terminated`` / ``failed`` with the error and its traceback in ``logs/runner-error.txt``."""
    from testbed.engines.workload import DEFAULT_TIMEOUTS, TIMEOUTS
    from testbed.model_server import LatencyModel
    from testbed.stack import StackSpec, stack
    from testbed.worker_process import reference_worker

    opts.validate()
    run = RunDir.create(opts.out / FUZZ_FOLDER)
    with run.recording("migration_fuzz", "migration_fuzz", seed=opts.seed, reproduce=reproduce_run(opts),
                       options=opts.record()) as rec:
        run.update(machine=await asyncio.to_thread(machine_info, temporal_binary_or_none()))
        started = time.monotonic()  # the cluster's start, the iterations and the checks: what the rates count
        history = History(run.operations)
        rec.before_ending = history.close
        task_queue, stamp = "migration-fuzz", run.path.name
        if opts.external:  # a shared cluster: this run's own task queue and workflow ids
            tag = uuid.uuid4().hex[:8]
            task_queue, stamp = f"{task_queue}-{tag}", f"{stamp}-{tag}"

        def worker(name: str, at: Any) -> Any:
            return reference_worker(at.address, task_queue, at.model_url, run.state, namespace=at.namespace,
                                    identity_prefix=name, warm_line="WARM", log_dir=run.logs, env=at.env)

        # external: nothing starts a server; the workers reach the cluster through the proxy
        cluster = (TemporalCluster(opts.connection, quiet=True) if opts.external else
                   TemporalCluster(db=run.state / "temporal.db", quiet=True))
        spec = StackSpec(state_dir=run.state, logs_dir=run.logs, engine=cluster,
                         model_latency=LatencyModel.parse(opts.model_latency), seed=opts.seed, proxies=True,
                         worker_processes=opts.workers, make_worker=worker, history=history)
        where = (f"connecting to {opts.connection.address} (namespace {opts.connection.namespace}), starting"
                 if opts.external else "starting Temporal,")
        say(f"{where} the scripted model and {opts.workers} worker processes in {run.path}")
        rec.doing = "cluster"
        async with stack(spec) as s:
            ledger = EffectLedger(s.settings.resolved_ledger_path, faults=NO_FAULTS)
            # the chaos suite's workflow task timeout for the parent (and so its children): a task a killed worker
            # held moves on after it
            iteration = Iteration(opts, s, history, ledger, fuzz_config(opts.max_n), task_queue, stamp,
                                  timedelta(seconds=TIMEOUTS[DEFAULT_TIMEOUTS].workflow_task_timeout_s), say)
            ready = time.monotonic() - started
            say(f"workers ready after {ready:.1f} s; running {opts.iterations} iteration(s)"
                + (f", {opts.concurrency} at a time" if opts.concurrency > 1 else ""))
            rec.doing = "iterations"
            slots = asyncio.Semaphore(opts.concurrency)

            async def one(i: int) -> IterationResult:
                async with slots:
                    return await iteration.run(i)

            results = sorted(await asyncio.gather(*(one(i) for i in range(opts.iterations))), key=lambda r: r.index)
            iterating = time.monotonic() - started - ready
            ledger.close()
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
    """One fuzz iteration on the running cluster: a parent workflow of the seed's shape, a worker killed during
    it (``chaos``), then its event histories read and every invariant checked (``check_iteration``)."""

    opts: FuzzOptions
    stack: Any  # testbed.stack.Stack
    history: History
    ledger: EffectLedger
    config: AgentConfig
    task_queue: str
    stamp: str
    task_timeout: timedelta
    say: Callable[[str], None]

    async def run(self, i: int) -> IterationResult:
        from testbed.engines.temporal.in_flight import TemporalInFlight
        from testbed.faults.nemesis import NemesisContext

        opts, history, client = self.opts, self.history, self.stack.client
        seed = opts.seed + i
        shape = shape_for(seed, opts.kind, opts.max_n)
        tag = f"i{i}s{seed}"
        workflow_id = f"fuzz-{self.stamp}-{tag}"
        t0 = time.monotonic()
        kills: list[dict[str, Any]] = []
        done = asyncio.Event()
        chaos_task = None
        if opts.chaos:
            ctx = NemesisContext(self.stack, history, [], random.Random(seed * 7919), observer=TemporalInFlight())
            chaos_task = asyncio.create_task(_kill_during(ctx, kills, done))
        op = history.invoke("client", "fuzz_iteration", {"index": i, "seed": seed, **asdict(shape)})
        result: AgentResult | None = None
        error = None
        try:
            handle = await client.start_workflow(
                AgentWorkflow.run, AgentInput(config=self.config, prompt=fuzz_prompt(shape.kind, shape.n,
                                                                                     shape.writes, tag)),
                id=workflow_id, task_queue=self.task_queue, task_timeout=self.task_timeout)
            result = await asyncio.wait_for(handle.result(), opts.iteration_timeout_s)
        except Exception as exc:  # recorded as a violation; the next iteration still runs
            error = f"{type(exc).__name__}: {exc}"
        finally:
            done.set()
            if chaos_task is not None:
                await chaos_task
        seconds = time.monotonic() - t0
        try:
            tree = await fetch_tree(client, workflow_id)
        except Exception as exc:
            tree = {}
            error = error or f"history unavailable: {exc}"
        violations = check_iteration(shape, workflow_id, tag, result, error, tree, self.ledger,
                                     self.stack.workspace(workflow_id))
        root = tree.get(workflow_id)
        res = IterationResult(i, seed, shape, workflow_id, round(seconds, 3), not violations, violations,
                              parent=_placement(root) if root else None, kills=kills)
        for c in (c for r in (root or []) for c in r.children):
            if c.workflow_id in tree:
                res.children.append(_placement(tree[c.workflow_id], c.initiated_by))
        history.complete(op, "ok" if res.ok else "fail", {"cross_children": res.cross_children,
                                                           "moved": res.moved_workflows},
                         error="; ".join(violations) or None)
        kill_note = f"  killed {kills[0]['identity']}" if kills else ""
        self.say(f"[{i + 1}/{opts.iterations}] {shape.describe():<28} children on another worker "
                 f"{res.cross_children}/{shape.n}, moved {res.moved_workflows}{kill_note}  "
                 f"{'ok' if res.ok else 'VIOLATED'}  {seconds:.1f} s")
        if not res.ok:
            for v in violations:
                self.say(f"    violation: {v}")
            self.say(f"    reproduce: {reproduce_command(opts, seed, shape)}")
        return res


def summarise(results: list[IterationResult]) -> dict[str, dict[str, Any]]:
    families: dict[str, dict[str, Any]] = {}
    for kind in [*KINDS, "all"]:
        rows = [r for r in results if kind == "all" or r.shape.kind == kind]
        if not rows:
            continue
        children = sum(r.shape.n for r in rows)
        workflows = sum(1 + len(r.children) for r in rows)
        activities = [(a, r.parent.first_worker if r.parent else "") for r in rows for p in [r.parent, *r.children]
                      if p is not None for a in p.activities]
        families[kind] = {
            "iterations": len(rows),
            "completed": sum(1 for r in rows if r.parent and not any("parent" in v for v in r.violations)),
            "children": children,
            "cross_worker_children": sum(r.cross_children for r in rows),
            "cross_worker_children_pct": round(100.0 * sum(r.cross_children for r in rows) / children, 1)
            if children else 0.0,
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
    return families


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


def table(summary: dict[str, dict[str, Any]]) -> str:
    """The families' results (``harness.printable.table``): one line per shape family, then all of them."""
    return format_table(TABLE_COLUMNS, legend=LEGEND, rows=([
        kind, s["iterations"], f"{s['completed']}/{s['iterations']}", s["children"],
        f"{s['cross_worker_children']} ({s['cross_worker_children_pct']}%)",
        f"{s['moved_workflows']} ({s['moved_workflows_pct']}%)", f"{s['activities_off_parent_worker_pct']}%",
        s["worker_kills"], s["violations"], s["mean_seconds"]] for kind, s in summary.items()))
