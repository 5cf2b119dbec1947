"""Several chaos runs: which runs a command names (scenarios, twins on other engines, timeouts profiles) and
running them side by side, each through the one run lifecycle (``chaos.runner.run_captured``), with the verdict
table at the end.

    jobs(args, ...)       the (label, scenario, backend) a ``run``, ``suite`` or ``soak`` command names
    in_lanes(items, ...)  run items ``--parallel`` at a time, in their order: the one scheduler of the suite and the soak
    run_many(items, ...)  run them (``--parallel`` at a time), each its own cluster; print the table; 0 if all passed
    suite(args, ...)      the CI suite, or one shard of it, with its summary JSON and JUnit XML (``chaos.ci``)

A scenario whose run raises (a worker dying at setup, a port clash, a harness bug) is recorded ``failed`` in its
own run directory and shows as ``error`` in its row; the others go on.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import os
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from chaos import ci
from chaos.checker.verdict import worth_showing
from chaos.runner import run_captured, run_folder, skip_reason
from chaos.scenarios import SCENARIOS, SUITE
from chaos.seeds import format_seeds
from harness.engines import HOME, REGISTRY, registered, split_twin, twin_suffixes
from harness.printable import printable, table as format_table
from harness.rundir import ending_status
from harness.commands import own_out, progress as _progress, tool, unknown as _unknown
from harness.verdict import PASS
from testbed.engines.workload import DEFAULT_TIMEOUTS, TIMEOUTS

COLUMNS = [("scenario", 28), ("faults", 7), ("ok", 4), ("fail", 5), ("info", 5), ("lost", 5), ("late", 5), ("dup_effects", 12),
           ("recovery_s", 11), ("model_rec_s", 12), ("tool_rec_s", 11),
           ("wft_rec_s", 10), ("checked", 8), ("verdict", 8)]
#: what the verdict table's columns mean, printed under it
LEGEND = [("faults", "L/N: of the N faults injected (or tried), L struck work in flight (injection_evidence)"),
          ("ok fail info", "the client's operations: answered / certainly not done / unknown (may or may not have "
                           "happened: a timeout, a lost connection)"),
          ("lost", "acknowledged messages with no correct answer at the end (the lost check)"),
          ("late", "replies that came only after the load settled, while the run waited for them (the late "
                   "check: a liveness failure, not a loss; - the run could not tell)"),
          ("dup_effects", "external effects applied more than once (the effects check; declared: the target "
                          "declares none)"),
          ("recovery_s", "the longest wait after a fault for a conversation's next correct answer, seconds "
                         "(never (N): N never got one)"),
          ("*_rec_s", "the longest time from a fault to the retry of a model call, a tool call, a timed-out "
                      "workflow task, seconds (- none was retried)"),
          ("checked", "P/N: P of the N checks reached pass or fail; the rest were unknown or not applicable"),
          ("?", "no value: the run ended in an error before it was checked")]
#: the most diagnosis lines a run shows in the progress (the rest are in its verdict.json)
MAX_DIAGNOSES = 8
#: a scenario under a timeouts profile other than the default is SCENARIO~PROFILE (e.g. kill_idle~defaults)
TIMEOUTS_SEPARATOR = "~"
#: the most runs ``default_parallel`` puts side by side
MAX_PARALLEL = 4
#: threads a run may keep busy at once (``asyncio.to_thread``: its check, its cluster's stop, a nemesis, a heal)
THREADS_PER_LANE = 4
#: what ``python -m chaos suite`` runs by default: every scenario on Temporal, and the checkpoint engine's twins
SUITE_ENGINES = tuple(r.name for r in REGISTRY if r.suite)


def table(rows: list[dict[str, Any]], with_seed: bool = False) -> str:
    """The verdict table, one row per run (``harness.printable.table``); ``with_seed``: a seed column (a suite
    over several seeds)."""
    columns = [COLUMNS[0], ("seed", 5), *COLUMNS[1:]] if with_seed else COLUMNS
    return format_table(columns, ([r.get(name) for name, _ in columns] for r in rows), legend=LEGEND)


def scenario_list() -> list[str]:
    """``python -m chaos list``: every named scenario, then each engine's twins, one line each, the descriptions
    aligned past the longest name."""
    rows = [(s.name, s.description) for s in SCENARIOS.values()]
    for entry in REGISTRY:
        for name in twins(entry.name) if entry.suffix else ():
            where = f": {entry.stand_in}" if entry.stand_in and name.startswith(("server_", "partition_temporal")) else ""
            rows.append((name + entry.suffix, f"{SCENARIOS[name].description} (on {entry.name}{where})"))
    width = max(len(name) for name, _ in rows)
    return [f"{name:<{width}}  {description}" for name, description in rows]


def docker_problem(args: argparse.Namespace) -> str | None:
    """For --placement docker: an engine (started here if installed and not running) and an image (the reference
    agent's worker image, built from this checkout if missing, unless --image names one). None, or the problem."""
    if getattr(args, "placement", "process") != "docker":
        return None
    from testbed.dockerd import ensure_engine

    engine = ensure_engine()  # an engine started here is stopped when this command exits
    if not engine.available:
        return f"--placement docker: {engine.reason}; --placement process (the default) needs no engine"
    if not args.image:
        if getattr(args, "target", None):
            return "--placement docker with --target needs --image NAME (an image with your agent's worker installed)"
        from testbed.images import ImageBuildError, worker_image

        try:
            args.image = worker_image()
        except ImageBuildError as exc:
            return f"--placement docker: could not build the worker image: {exc}; or pass --image NAME"
    return None


def load_target_for(args: argparse.Namespace, explicit_parallel: bool) -> Any:
    """The target file ``--target`` names, loaded and its driver checked before any run (None: the reference
    agent). One that hard-codes its address runs one scenario at a time: ``--parallel`` drops to 1 (ValueError
    if the user asked for more)."""
    if not getattr(args, "target", None):
        return None
    from testbed.engines.byo.target import check_driver, load_target

    target = load_target(args.target)
    check_driver(target)  # a driver written for another driver API version fails here, before any run
    if target.address and getattr(args, "parallel", 1) > 1:
        if explicit_parallel:
            raise ValueError(f"--parallel {args.parallel}: the target {args.target} hard-codes the address "
                             f"{target.address} (the fault proxy must listen there), so it runs one "
                             "scenario at a time: use --parallel 1")
        print(f"{tool('chaos')} {args.command}: {args.target} hard-codes the address {target.address}: one "
              "scenario at a time", file=sys.stderr)
        args.parallel = 1
    return target


def twins(durability: str) -> list[str]:
    """The scenarios with a twin on ``durability``'s backend."""
    from testbed.engines import make_engine

    return list(make_engine(durability).scenarios or ())


def with_load(scenario: Any, conversations: int | None, messages: int | None) -> Any:
    """``scenario`` with the load a command asks for (``--conversations N --messages M``; None: its own)."""
    load = {k: v for k, v in (("conversations", conversations), ("messages", messages)) if v is not None}
    return dataclasses.replace(scenario, workload=dataclasses.replace(scenario.workload, **load)) if load else scenario


def jobs(args: argparse.Namespace, target: Any, connection: Any = None) -> list[tuple[str, Any, Any]]:
    """(label, scenario, backend) for every scenario asked for, on ``connection``'s cluster (None: the embedded
    server); raises ValueError naming an unknown one."""
    from testbed.engines import make_engine

    durability = getattr(args, "durability", HOME)
    suffix = registered(durability).suffix
    if args.command == "soak" and args.scenarios == ["all"]:
        raise ValueError(f"soak runs one scenario; name it ({tool('chaos')} list names them)")
    if args.command == "suite":
        names = [n for b in getattr(args, "engines", SUITE_ENGINES)
                 for n in ([t + registered(b).suffix for t in twins(b)] if registered(b).suffix else SUITE)]
    elif args.scenarios == ["all"]:
        names = [n + suffix for n in twins(durability)] if suffix else list(SUITE)
    else:
        names = [n + suffix if suffix and split_twin(n)[1] == HOME else n for n in args.scenarios]
    known = [*SCENARIOS, *(n + sfx for sfx, d in twin_suffixes().items() for n in twins(d))]
    pinned = {}  # NAME~PROFILE (as a run under another profile names itself): that profile only
    for i, n in enumerate(names):
        base, sep, profile = n.partition(TIMEOUTS_SEPARATOR)
        if sep:
            if profile not in TIMEOUTS:
                raise ValueError(f"{n}: {_unknown('timeouts profile', [profile], list(TIMEOUTS))}")
            names[i] = base
            pinned[base] = [profile]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(_unknown("scenario", unknown, known, f"{tool('chaos')} list",
                                  suggest=lambda n: known if "@" in n else list(SCENARIOS)))
    jobs = []
    profiles = getattr(args, "timeouts", [DEFAULT_TIMEOUTS])
    latency = getattr(args, "model_latency", None)
    for label in names:
        base, twin_of = split_twin(label)
        twin = twin_of != HOME  # a twin: the timeouts profiles are the home engine's, and do not apply
        engine = make_engine(twin_of, workers=getattr(args, "placement", "process"),
                              image=getattr(args, "image", None), target=target,
                              target_file=getattr(args, "target", None), connection=connection)
        scenario = SCENARIOS[base]
        if latency:  # the scenario's own model latency otherwise; run.json records the one used
            scenario = dataclasses.replace(scenario, cluster=dataclasses.replace(scenario.cluster,
                                                                                 model_latency=latency))
        scenario = with_load(scenario, getattr(args, "conversations", None), getattr(args, "messages", None))
        for profile in ([DEFAULT_TIMEOUTS] if twin else pinned.get(label, profiles)):  # Temporal only
            if profile == DEFAULT_TIMEOUTS:
                jobs.append((label, scenario, engine))
                continue
            name = f"{base}{TIMEOUTS_SEPARATOR}{profile}"  # its own runs/<name>/, its own row
            jobs.append((name, dataclasses.replace(scenario, name=name, timeouts=profile), engine))
    return jobs


def default_parallel() -> int:
    """Runs at once where the user does not say: two per core this process may use, at most ``MAX_PARALLEL`` (the
    runs share this process's one event loop: their loads, nemeses and fault proxies). A run mostly waits (on the
    model's latency, its conversations' think time, the timeouts its faults trip): on 2 cores, 12 kill_mid_turn
    seeds 4 at a time kept every fault on time (the latest 23 ms) and the recovery of 2 at a time (issue 31)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(2 * cores, MAX_PARALLEL))


def warm_fork_server(engines: Any) -> None:
    """Start the fork server (``testbed.forkserver``) now, in the background, if any of ``engines`` forks its workers
    from it: its imports (LiteLLM: seconds) overlap this process's own start and the first cluster's."""
    from testbed import forkserver

    if any(getattr(e, "workers", "process") == "process" and forkserver.can_fork(e.target.worker_command())
           for e in engines):
        forkserver.start_soon()


async def in_lanes(items: list[Any], parallel: int, run_one: Callable[[int, int, Any], Awaitable[None]]) -> None:
    """``await run_one(lane, i, item)`` for each item (``i`` from 1), in their order, at most ``parallel`` at once: a
    lane (0 .. parallel-1) runs one item at a time and takes the next one not yet started when it is done, so it
    can keep what outlives one run (a warm cluster). An exception (Ctrl-C, cancellation) stops every lane: the
    runs under way are stopped (each records how), the items not started never start."""
    todo = iter(enumerate(items, 1))
    lanes = max(1, min(parallel, len(items)))
    if lanes > 1:  # each run hands blocking steps to threads (starts, stops, checks): room for every lane's
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(THREADS_PER_LANE * lanes + 4))

    async def lane(n: int) -> None:
        for i, item in todo:  # one iterator for every lane: each item is taken once, in order
            await run_one(n, i, item)

    tasks = [asyncio.create_task(lane(n)) for n in range(lanes)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run_many(items: list[tuple[str, Any, Any, int]], out: Path, parallel: int = 1, ui: bool = False,
                    record: Any = None, gate: str = "all", lint_fails: bool = False) -> int:
    """``items``: (label, scenario, backend, seed); the table at the end; 1 if any did not pass. ``record``: a
    ``chaos.ci.CiRecord`` told of each run as it starts and ends (the suite's summary JSON and JUnit XML).

    A scenario whose run raises (a worker dying at setup, a port clash, a harness bug) is recorded ``failed`` in
    its own run directory and shows as ``error`` in its row; the others go on. Ctrl-C (SIGTERM) stops them all;
    the record then says which runs were stopped and which never started. ``gate``: what a run must pass for
    the exit status: ``all`` its checks, or only ``safety`` or ``liveness`` (``Outcome.gated``); ``lint_fails``:
    a run whose histories the lint flags does not pass either."""
    own_out(out, *dict.fromkeys(run_folder(s, e) for _, s, e, _ in items))  # UnsafeFolder before any run starts
    start = time.monotonic()
    say = _progress(start)
    results: dict[tuple[str, int], Any] = {}

    skipped = {(label, seed): why for label, scenario, engine, seed in items
               if (why := skip_reason(engine, scenario))}
    for i, (label, _, _, seed) in enumerate(items, 1):
        if (label, seed) in skipped:
            say(f"scenario {i}/{len(items)}: {label}: SKIPPED: {skipped[(label, seed)]}")
            if record is not None:
                record.skipped(label, seed, skipped[(label, seed)])
    warm_fork_server(engine for label, _, engine, seed in items if (label, seed) not in skipped)

    async def one(lane: int, i: int, item: tuple[str, Any, Any, int]) -> None:
        label, scenario, engine, seed = item
        if (label, seed) in skipped:
            return
        say(f"scenario {i}/{len(items)}: {label} (seed {seed})")
        started = (lambda p: record.running(label, seed, p)) if record is not None else (lambda p: None)
        # a copy: an engine keeps a run's own fields (ReferenceOnTemporal's readiness check), and runs side by side
        # may share one engine (a scenario under two timeouts profiles)
        result = await run_captured(label, scenario, copy.copy(engine), seed=seed, out_root=out, progress=say,
                                    ui=ui, on_run_dir=started)
        results[(label, seed)] = result
        if record is not None:
            record.ended(result)
        _say_result(say, label, result)

    try:
        await in_lanes(items, parallel, one)
    except BaseException as exc:
        if record is not None:
            record.finish(ending_status(exc))
        raise
    if record is not None:
        record.finish("complete")
    return _summary([(label, seed) for label, _, _, seed in items], results, skipped, time.monotonic() - start, gate,
                    lint_fails, record)


def _say_result(say: Callable[[str], None], label: str, result: Any) -> None:
    """A finished run's lines of progress: its verdict, what did not pass, its diagnoses and lint findings."""
    if result.error:
        say(f"{label}: ERROR after {result.wall_s:.0f}s -> {result.run_dir}")
        for line in result.lines():
            say(f"  {label} {line}")
        say(f"  {label} reproduce with: {result.reproduce}")
        return
    say(f"{label}: {result.verdict.upper()} in {result.wall_s:.0f}s -> {result.run_dir}")
    for c in result.checks:
        if worth_showing(c):
            say(f"  {label} {c.name}: {c.shown()}")
    for line in result.diagnoses[:MAX_DIAGNOSES]:
        say(f"  {label} diagnosis: {line}")
    if len(result.diagnoses) > MAX_DIAGNOSES:
        say(f"  {label} ... {len(result.diagnoses) - MAX_DIAGNOSES} more diagnoses in {result.run_dir}/verdict.json")
    for line in result.lint:
        say(f"  {label} lint: {line}")


def _summary(keys: list[tuple[str, int]], results: dict[tuple[str, int], Any], skipped: dict[tuple[str, int], str],
             elapsed_s: float, gate: str, lint_fails: bool, record: Any) -> int:
    """The table of a suite's runs, what did not pass and how to reproduce it, skipped runs; the exit status."""
    seeds = list(dict.fromkeys(seed for _, seed in keys))
    failed = [results[k] for k in keys if k in results and results[k].gated(gate, lint_fails) != PASS]
    print()
    print(table([{**results[k].row, "seed": k[1]} if k in results else {"scenario": k[0], "seed": k[1],
                                                                        "verdict": ci.SKIPPED} for k in keys],
                with_seed=len(seeds) > 1))
    print(f"\n{len(keys)} scenario(s) in {elapsed_s:.0f}s (seed{'s' if len(seeds) > 1 else ''} "
          f"{format_seeds(seeds)}); {len(results) - len(failed)} passed, {len(failed)} not passed"
          + (f" (gate: {gate} only)" if gate != "all" else "")
          + (f", {len(skipped)} skipped (not run, not passed)" if skipped else ""))
    for result in failed:
        why = f"error: {result.error_line}" if result.error else result.verdict + (
            f" (safety {result.properties['safety']}, liveness {result.properties['liveness']})"
            if result.properties else "")
        print(printable(f"  {result.label}{f' (seed {result.seed})' if len(seeds) > 1 else ''}: {why}; reproduce "
                        f"with: {result.reproduce}; artefacts in {result.run_dir}"))
    for (label, seed), why in skipped.items():
        print(f"  {label}{f' (seed {seed})' if len(seeds) > 1 else ''}: skipped: {why}")
    if record is not None:
        print(f"CI files: {record.paths()}")
    if not results:
        print("nothing ran: every scenario asked for was skipped", file=sys.stderr)
    return 1 if failed or not results else 0




async def suite(args: argparse.Namespace, target: Any, connection: Any = None) -> int:
    """The suite, or the shard of it ``--shard K/N`` names, with its summary JSON and JUnit XML."""
    everything = [(label, scenario, engine, seed) for seed in args.seeds
                  for label, scenario, engine in jobs(args, target, connection)]
    mine = ci.shard(everything, *args.shard) if args.shard else everything
    spec = f"{args.shard[0]}/{args.shard[1]}" if args.shard else None
    name = f"chaos suite (seeds {format_seeds(args.seeds)}{f', shard {spec}' if spec else ''})"
    record = ci.CiRecord("suite", name, [(label, seed) for label, _, _, seed in mine],
                         args.summary or args.out / ci.SUITE_SUMMARY, args.junit or args.out / ci.SUITE_JUNIT,
                         spec, [(label, seed) for label, _, _, seed in everything])
    own_out(args.out, *dict.fromkeys(run_folder(s, e) for _, s, e, _ in mine))  # before the record is written
    if spec:
        print(f"shard {spec}: {len(mine)} of the suite's {len(everything)} run(s)", file=sys.stderr, flush=True)
    record.save()
    if not mine:
        print(f"shard {spec}: no runs fall to this shard (more shards than runs); nothing to do", file=sys.stderr)
        record.finish("complete")
        return 0
    return await run_many(mine, args.out, args.parallel, record=record, gate=getattr(args, "gate", "all"),
                          lint_fails=getattr(args, "lint_fails", False))
