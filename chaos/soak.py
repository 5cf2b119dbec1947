"""``python -m chaos soak SCENARIO --seeds 1-100``: one scenario over many seeds, ``--parallel`` at a time.

The soak is a caller of the runner: each seed is an ordinary run (``chaos.runner.run_captured``) with its own
run directory under ``--out`` and its own cluster, exactly as ``python -m chaos run SCENARIO --seed N`` makes it;
seeds start in their order, ``--parallel`` of them side by side (default: two per core, at most 4, ``chaos.suite``). A run that raises
(a worker dying at setup, a port clash, a harness bug) is recorded ``failed`` in its own run directory and
counts as ``error``; the soak goes on. Ctrl-C (or SIGTERM) stops it, keeping what it did.

The soak's own run directory, ``<out>/soak-<scenario>/<UTC stamp>/`` (kind ``soak``), holds ``run.json`` and
``soak.json``: one row per seed finished (in the seeds' order), and the verdict distribution, rewritten after every seed
(``RUN_DIRECTORY.md``), and the CI files (``chaos.ci``): ``summary.json`` and ``junit.xml`` (or where
``--summary`` / ``--junit`` say). The exit status is 0 only when every seed passed.
"""

from __future__ import annotations

import copy
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from chaos import ci
from chaos.generator import schedule
from chaos.runner import ERROR, Outcome, run_captured, run_folder, skip_reason, unavailable_nemeses
from chaos.seeds import format_seeds
from harness.printable import printable
from harness.rundir import SCHEMA, RunDir, command_line, machine_info
from harness.commands import own_out, progress, tool
from harness.verdict import FAIL, PASS, UNKNOWN
from testbed.engines.temporal.cluster import WarmTemporal

#: the verdicts a soak counts, in the order it shows them
OUTCOMES = (PASS, FAIL, UNKNOWN, ERROR)
SOAK_JSON = "soak.json"
SOAK_PREFIX = "soak-"
DEFAULT_SEEDS = "1-20"


def distribution(outcomes: list[Outcome]) -> dict[str, int]:
    return {v: sum(1 for o in outcomes if o.verdict == v) for v in OUTCOMES}


def tally(outcomes: list[Outcome]) -> str:
    """``3 pass, 1 fail, 0 unknown, 0 error``."""
    return ", ".join(f"{n} {v}" for v, n in distribution(outcomes).items())


def percentages(outcomes: list[Outcome]) -> dict[str, float]:
    total = len(outcomes)
    return {v: round(100.0 * n / total, 1) if total else 0.0 for v, n in distribution(outcomes).items()}


class SoakRecord:
    """The soak's run directory: ``run.json`` (kind ``soak``) and ``soak.json``, rewritten after every seed."""

    def __init__(self, out_root: Path, label: str, seeds: list[int], reproduce: str, ci_files: dict[str, Any],
                 **fields: Any) -> None:
        from testbed.engines.temporal.server import temporal_binary_or_none

        self.label, self.seeds, self.outcomes = label, seeds, []
        self.interrupted_seeds: list[int] = []
        self.started = time.monotonic()
        self.dir = RunDir.create(Path(out_root) / f"{SOAK_PREFIX}{label}")
        self.ci = ci.CiRecord("soak", f"chaos soak {label}", [(label, s) for s in seeds],
                              ci_files.get("summary") or self.dir.path / ci.SOAK_SUMMARY,
                              ci_files.get("junit") or self.dir.path / ci.SOAK_JUNIT,
                              ci_files.get("shard"), ci_files.get("all_items"))
        self.dir.begin("soak", label, seed=seeds[0], seeds=seeds, reproduce=reproduce,
                       machine=machine_info(temporal_binary_or_none()), **fields)
        self.save()

    @property
    def path(self) -> Path:
        return self.dir.path

    def add(self, outcome: Outcome) -> None:
        """A seed ended; the outcomes stay in the soak's seed order, however the seeds side by side finished."""
        self.outcomes.append(outcome)
        self.outcomes.sort(key=lambda o: self.seeds.index(o.seed))
        self.ci.ended(outcome)
        self.save()

    def save(self) -> None:
        done = len(self.outcomes)
        self.dir.write_json(SOAK_JSON, {
            "schema": SCHEMA, "scenario": self.label, "status": self.dir.run.get("status"), "seeds": self.seeds,
            "done": done, "wall_s": round(time.monotonic() - self.started, 1),
            "distribution": distribution(self.outcomes), "percent": percentages(self.outcomes),
            "all_passed": bool(done) and done == len(self.seeds) and all(o.verdict == PASS for o in self.outcomes),
            "interrupted_seeds": self.interrupted_seeds,
            "runs": [o.as_row() for o in self.outcomes]})

    def finish(self, exc: BaseException | None = None) -> None:
        """The soak ended: ``complete``, or as ``exc`` ends a run (``RunDir.end_with``: stopped, or failed)
        during ``interrupted_seeds``; its CI files say the same."""
        wall_s = time.monotonic() - self.started
        if exc is None:
            self.dir.finish("complete", wall_s)
        else:
            self.dir.end_with(exc, wall_s, during(self.interrupted_seeds) or None)
        self.ci.finish(self.dir.run["status"])
        self.save()


def during(seeds: list[int]) -> str:
    """``seed 3``, ``seeds 3, 4``: the seeds that were running (``""``: none)."""
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}" if seeds else ""


def summary(label: str, seeds: list[int], outcomes: list[Outcome], wall_s: float, soak_dir: Path,
            interrupted_seeds: list[int] | None = None, how: str = "interrupted") -> str:
    """The verdict distribution, then every seed that did not pass: what went wrong, how to reproduce, where (each
    line ``printable``).
    ``how``: how the soak was stopped during ``interrupted_seeds`` (``interrupted``, ``terminated``)."""
    dist, pct = distribution(outcomes), percentages(outcomes)
    done = len(outcomes)
    lines = [f"soak {label}: {done} of {len(seeds)} seed(s) in {wall_s:.0f}s"
             + (f" ({how} during {during(interrupted_seeds)})" if interrupted_seeds else ""), ""]
    lines.append(f"  {'verdict':<8} {'seeds':>5} {'%':>6}")
    for v in OUTCOMES:
        lines.append(f"  {v:<8} {dist[v]:>5} {pct[v]:>6.1f}")
    bad = [o for o in outcomes if o.verdict != PASS]
    if bad:
        lines += ["", f"{len(bad)} seed(s) not passed:"]
        for o in bad:
            lines.append(f"  seed {o.seed}: {o.verdict}")
            lines += [f"    {line}" for line in o.lines()]
            lines.append(f"    reproduce: {o.reproduce}")
            lines.append(f"    run dir:   {o.run_dir if o.run_dir else '(none: it failed before it had one)'}")
    elif done == len(seeds):
        lines += ["", f"every seed passed ({done}/{done})"]
    elif done:
        lines += ["", f"every seed that finished passed ({done}); {len(seeds) - done} did not run to the end"]
    lines += ["", f"soak summary: {soak_dir / SOAK_JSON}"]
    return "\n".join(printable(line) for line in lines)


#: faults aimed at the server itself (``chaos.generator``'s menu): a run with one has a server of its own
SERVER_FAULTS = {("restart_server", None), ("partition", "temporal")}


def seed_needs_own_cluster(engine: Any, scenario: Any, seed: int) -> bool:
    """Whether this seed's schedule (``chaos.generator.schedule``, as the run will draw it) restarts or partitions
    the server: it runs on a cluster of its own, not on the lane's warm one."""
    events = schedule(scenario.events, scenario.random_events, scenario.fault_s, seed, unavailable_nemeses(engine))
    return any((e.op, None) in SERVER_FAULTS or (e.op, e.args.get("link")) in SERVER_FAULTS for e in events)


async def soak(label: str, scenario: Any, engine: Any, seeds: list[int], out_root: Path, *,
               reproduce: str, say: Callable[[str], None], verbose: bool = False,
               ci_files: dict[str, Any] | None = None, parallel: int = 1, warm: bool = True) -> int:
    """Run ``scenario`` once per seed, ``parallel`` seeds at a time (``chaos.suite.in_lanes``), taken in order;
    print progress and the summary; 0 only if every seed passed. Ctrl-C (SIGTERM): the soak's directory ends
    ``interrupted`` (``terminated``) with the seeds it finished, the summary is printed and the interrupt
    propagates. ``ci_files``: ``summary`` and ``junit`` paths (default: in the soak's directory), ``shard``
    (``K/N``) and ``all_items`` (every shard's seeds), for ``chaos.ci``."""
    from chaos.suite import in_lanes, warm_fork_server

    warm = warm and not engine.own_cluster_because()
    record = SoakRecord(out_root, label, seeds, reproduce, ci_files or {}, scenario=asdict(scenario),
                        backend=engine.record(), parallel=parallel, warm_cluster=warm)
    say(f"soak {label}: {len(seeds)} seed(s)" + (f", {parallel} at a time" if parallel > 1 else "")
        + (", on warm Temporal servers" if warm else "") + f" -> {record.path}")
    warm_fork_server([engine])
    running: dict[int, int] = {}  # seed -> its place in the soak (1-based), while it runs
    servers = [WarmTemporal(record.dir.logs / f"temporal-lane{n + 1}.log") for n in range(max(1, parallel))]

    async def one(lane: int, i: int, seed: int) -> None:
        running[seed] = i
        say(f"seed {i}/{len(seeds)} (seed {seed}): {label} starting")
        own = seed_needs_own_cluster(engine, scenario, seed)
        # a copy per run: an engine keeps a run's own fields (ReferenceOnTemporal's readiness check)
        o = await run_captured(label, scenario, copy.copy(engine), seed=seed, out_root=out_root,
                               progress=say if verbose else (lambda s: None),
                               on_run_dir=lambda p: record.ci.running(label, seed, p),
                               **({"cluster": servers[lane]} if warm and not own else {}))
        record.add(o)
        del running[seed]
        say(f"seed {i}/{len(seeds)} (seed {seed}): {o.verdict.upper()} in {o.wall_s:.0f}s -> "
            f"{o.run_dir or '(no run directory)'}   [{tally(record.outcomes)}]")
        for line in o.lines():
            say(f"  seed {seed} {line}")

    try:
        try:
            await in_lanes(seeds, parallel, one)
        finally:
            for server in servers:
                await server.close()
    except BaseException as exc:
        record.interrupted_seeds = sorted(running, key=running.__getitem__)
        record.finish(exc)
        print()
        print(summary(label, seeds, record.outcomes, time.monotonic() - record.started, record.path,
                      record.interrupted_seeds, record.dir.run["status"]), flush=True)
        print(f"CI files: {record.ci.paths()}", flush=True)
        raise
    record.finish()
    print()
    print(summary(label, seeds, record.outcomes, time.monotonic() - record.started, record.path), flush=True)
    print(f"CI files: {record.ci.paths()}", flush=True)
    return 0 if all(o.verdict == PASS for o in record.outcomes) else 1


async def run_soak(args: Any, target: Any, connection: Any = None) -> int:
    """``python -m chaos soak``: the scenario ``args`` names, on its backend (``chaos.suite.jobs``), over the seeds
    of this CI shard (``--shard``); ValueError if its cluster cannot have its faults."""
    from chaos.suite import jobs

    [(label, scenario, engine)] = jobs(args, target, connection)
    if why := skip_reason(engine, scenario):
        raise ValueError(f"{label}: skipped: {why}")
    seeds = ci.shard(args.seeds, *args.shard) if args.shard else args.seeds
    spec = f"{args.shard[0]}/{args.shard[1]}" if args.shard else None
    if not seeds:
        print(f"{tool('chaos')} soak: shard {spec}: none of seeds {format_seeds(args.seeds)} fall to this shard "
              "(more shards than seeds); nothing to do", file=sys.stderr)
        return 0
    if spec:
        print(f"shard {spec}: seeds {format_seeds(seeds)} of {format_seeds(args.seeds)}", file=sys.stderr, flush=True)
    own_out(args.out, f"{SOAK_PREFIX}{label}", run_folder(scenario, engine))  # UnsafeFolder before anything starts
    reproduce = command_line(f"{tool('chaos')} soak", {"--seeds": format_seeds(seeds), **engine.reproduce(),
                                                      "--model-latency": args.model_latency},
                             [label])
    return await soak(label, scenario, engine, seeds, args.out, reproduce=reproduce,
                      say=progress(time.monotonic()), verbose=args.verbose,
                      ci_files={"summary": args.summary, "junit": args.junit, "shard": spec,
                                "all_items": [(label, s) for s in args.seeds]}, parallel=args.parallel,
                      warm=not args.cluster_per_seed)
