"""``python -m chaos``: run chaos scenarios, the CI suite, or re-check a saved run.

    python -m chaos list
    python -m chaos run kill_mid_turn [--seed 7] [--durability checkpoint|dbos|dbos-postgres|restate] [--target FILE] [--placement docker --image I]
    python -m chaos suite                     # what `make chaos` runs; exits 1 on any fail, unknown or error
    python -m chaos suite --shard 2/4 --seeds 1-3   # CI job 2 of 4's share; summary JSON + JUnit XML in --out
    python -m chaos summary job1/runs job2/runs ... # merge CI jobs' results: one table, summary JSON, JUnit XML
    python -m chaos soak kill_mid_turn --seeds 1-100    # one scenario over many seeds; the verdict distribution
    python -m chaos planted                   # every planted bug must be caught; the table of who caught it
    python -m chaos check runs/kill_mid_turn/latest     # the checkers again, offline, on a saved run (anywhere)
    python -m chaos rerun runs/mutant/20261122T201530Z  # a run again, from the scenario its run.json saved

Progress goes to stderr; the results table to stdout. Also installed as the command dah-chaos.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from chaos.checker import ENGINE_CHECKERS, FAULT_CHECKERS
from chaos.client import DEFAULT_TIMEOUTS, TIMEOUTS
from chaos.scenarios import SCENARIOS, SUITE
from chaos.soak import DEFAULT_SEEDS
from harness.printable import printable
from harness.rundir import command_line, stop_on_sigterm
from testbed.cli_options import add_durability, add_out
from testbed.cli_options import progress as _progress
from testbed.model_server import add_model_latency

COLUMNS = [("scenario", 28), ("faults", 7), ("ok", 4), ("fail", 5), ("info", 5), ("lost", 5), ("dup_effects", 12),
           ("recovery_s", 11), ("model_rec_s", 12), ("tool_rec_s", 11),
           ("wft_rec_s", 10), ("checked", 8), ("verdict", 8)]
#: a scenario under a timeouts profile other than the default is SCENARIO~PROFILE (e.g. kill_idle~defaults)
TIMEOUTS_SEPARATOR = "~"
#: a scenario's twin on the checkpoint backend is SCENARIO@checkpoint
CHECKPOINT_SUFFIX = "@checkpoint"
#: the backends other than Temporal, by their twins' suffix (SCENARIO@dbos runs SCENARIO on DBOS)
TWIN_SUFFIXES = {CHECKPOINT_SUFFIX: "checkpoint", "@dbos": "dbos", "@dbos-postgres": "dbos-postgres",
                 "@restate": "restate"}


def table(rows: list[dict[str, Any]], with_seed: bool = False) -> str:
    """The verdict table, its cells ``printable``; ``with_seed``: a seed column (a suite over several seeds)."""
    columns = [COLUMNS[0], ("seed", 5), *COLUMNS[1:]] if with_seed else COLUMNS
    header = " ".join(f"{name:<{w}}" for name, w in columns)
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(" ".join(f"{'-' if r.get(name) is None else printable(r.get(name)):<{w}}" for name, w in columns))
    return "\n".join(lines)


#: what "the Temporal server" and "the workers' link to Temporal" of a scenario are on another engine
STAND_INS = {"dbos-postgres": ": the server is PostgreSQL, the link the workers' to it",
             "restate": ": the server is restate-server, the link the server's to the endpoint"}
#: what ``python -m chaos suite`` runs by default: every scenario on Temporal, and the checkpoint backend's twins
SUITE_BACKENDS = ("temporal", "checkpoint")


def _backends(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    known = ("temporal", *TWIN_SUFFIXES.values())
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown backend(s) {', '.join(bad) or '(none given)'}; backends are "
                                         f"{', '.join(known)}")
    return names


def _checkpoint_twins() -> list[str]:
    return _twins("checkpoint")


def _twins(durability: str) -> list[str]:
    """The scenarios with a twin on ``durability``'s backend."""
    from chaos.backends import make_backend

    return list(make_backend(durability).scenarios or ())


def _split_twin(label: str) -> tuple[str, str]:
    """(the scenario, its durability) of a label: ``kill_mid_turn@dbos`` -> (kill_mid_turn, dbos)."""
    for suffix, durability in TWIN_SUFFIXES.items():
        if label.endswith(suffix):
            return label.removesuffix(suffix), durability
    return label, "temporal"


async def _run_many(items: list[tuple[str, Any, Any, int]], out: Path, parallel: int = 1, ui: bool = False,
                    record: Any = None) -> int:
    """``items``: (label, scenario, backend, seed); the table at the end; 1 if any did not pass. ``record``: a
    ``chaos.ci.CiRecord`` told of each run as it starts and ends (the suite's summary JSON and JUnit XML).

    A scenario whose run raises (a worker dying at setup, a port clash, a harness bug) is recorded ``failed`` in
    its own run directory and shows as ``error`` in its row; the others go on. Ctrl-C (SIGTERM) stops them all;
    the record then says which runs were stopped and which never started."""
    from chaos import ci
    from chaos.soak import PASS, format_seeds, run_captured
    from harness.rundir import stopped_status

    start = time.monotonic()
    say = _progress(start)
    results: dict[tuple[str, int], Any] = {}
    slots = asyncio.Semaphore(max(1, parallel))

    skipped = {(label, seed): why for label, scenario, backend, seed in items
               if (why := backend.skip_reason(scenario))}

    async def one(i: int, label: str, scenario: Any, backend: Any, seed: int) -> None:
        if (label, seed) in skipped:
            say(f"scenario {i}/{len(items)}: {label}: SKIPPED: {skipped[(label, seed)]}")
            if record is not None:
                record.skipped(label, seed, skipped[(label, seed)])
            return
        async with slots:
            say(f"scenario {i}/{len(items)}: {label} (seed {seed})")
            started = (lambda p: record.running(label, seed, p)) if record is not None else (lambda p: None)
            result = await run_captured(label, scenario, backend, seed=seed, out_root=out, progress=say, ui=ui,
                                        on_run_dir=started)
            results[(label, seed)] = result
            if record is not None:
                record.ended(result)
            if result.error:
                say(f"{label}: ERROR after {result.wall_s:.0f}s -> {result.run_dir}")
                for line in result.lines():
                    say(f"  {label} {line}")
                say(f"  {label} reproduce with: {result.reproduce}")
                return
            say(f"{label}: {result.verdict.upper()} in {result.wall_s:.0f}s -> {result.run_dir}")
            for c in result.checks:
                if c.verdict != "pass" and not (c.verdict == "not_applicable" and
                                                (c.name in FAULT_CHECKERS or c.name in ENGINE_CHECKERS)):
                    say(f"  {label} {c.name}: {c.verdict}: {c.summary}")

    try:
        await asyncio.gather(*(one(i, *item) for i, item in enumerate(items, 1)))
    except BaseException as exc:
        if record is not None:
            stopped = isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError))
            record.finish(stopped_status() if stopped else "failed")
        raise
    if record is not None:
        record.finish("complete")
    keys = [(label, seed) for label, _, _, seed in items]
    seeds = list(dict.fromkeys(seed for _, seed in keys))
    failed = [results[k] for k in keys if k in results and results[k].verdict != PASS]
    print()
    print(table([{**results[k].row, "seed": k[1]} if k in results else {"scenario": k[0], "seed": k[1],
                                                                        "verdict": ci.SKIPPED} for k in keys],
                with_seed=len(seeds) > 1))
    print(f"\n{len(keys)} scenario(s) in {time.monotonic() - start:.0f}s (seed{'s' if len(seeds) > 1 else ''} "
          f"{format_seeds(seeds)}); {len(results) - len(failed)} passed, {len(failed)} not passed"
          + (f", {len(skipped)} skipped (not run, not passed)" if skipped else ""))
    for result in failed:
        why = f"error: {result.error_line}" if result.error else result.verdict
        print(printable(f"  {result.label}{f' (seed {result.seed})' if len(seeds) > 1 else ''}: {why}; reproduce "
                        f"with: {result.reproduce}; artefacts in {result.run_dir}"))
    for (label, seed), why in skipped.items():
        print(f"  {label}{f' (seed {seed})' if len(seeds) > 1 else ''}: skipped: {why}")
    if record is not None:
        print(f"CI files: {record.paths()}")
    if not results:
        print("nothing ran: every scenario asked for was skipped", file=sys.stderr)
    return 1 if failed or not results else 0


async def _suite(args: argparse.Namespace, target: Any, connection: Any = None) -> int:
    """The suite, or the shard of it ``--shard K/N`` names, with its summary JSON and JUnit XML."""
    from chaos import ci
    from chaos.soak import format_seeds

    everything = [(label, scenario, backend, seed) for seed in args.seeds
                  for label, scenario, backend in _jobs(args, target, connection)]
    mine = ci.shard(everything, *args.shard) if args.shard else everything
    spec = f"{args.shard[0]}/{args.shard[1]}" if args.shard else None
    name = f"chaos suite (seeds {format_seeds(args.seeds)}{f', shard {spec}' if spec else ''})"
    record = ci.CiRecord("suite", name, [(label, seed) for label, _, _, seed in mine],
                         args.summary or args.out / ci.SUITE_SUMMARY, args.junit or args.out / ci.SUITE_JUNIT,
                         spec, [(label, seed) for label, _, _, seed in everything])
    if spec:
        print(f"shard {spec}: {len(mine)} of the suite's {len(everything)} run(s)", file=sys.stderr, flush=True)
    record.save()
    if not mine:
        print(f"shard {spec}: no runs fall to this shard (more shards than runs); nothing to do", file=sys.stderr)
        record.finish("complete")
        return 0
    return await _run_many(mine, args.out, args.parallel, record=record)


async def _soak(args: argparse.Namespace, target: Any, connection: Any = None) -> int:
    from chaos import ci
    from chaos.soak import format_seeds, soak

    [(label, scenario, backend)] = _jobs(args, target, connection)
    if why := backend.skip_reason(scenario):
        raise ValueError(f"{label}: skipped: {why}")
    seeds = ci.shard(args.seeds, *args.shard) if args.shard else args.seeds
    spec = f"{args.shard[0]}/{args.shard[1]}" if args.shard else None
    if not seeds:
        print(f"python -m chaos soak: shard {spec}: none of seeds {format_seeds(args.seeds)} fall to this shard "
              "(more shards than seeds); nothing to do", file=sys.stderr)
        return 0
    if spec:
        print(f"shard {spec}: seeds {format_seeds(seeds)} of {format_seeds(args.seeds)}", file=sys.stderr, flush=True)
    reproduce = command_line("python -m chaos soak", {"--seeds": format_seeds(seeds), **backend.reproduce(),
                                                      "--model-latency": args.model_latency},
                             [label])
    return await soak(label, scenario, backend, seeds, args.out, reproduce=reproduce,
                      say=_progress(time.monotonic()), verbose=args.verbose,
                      ci_files={"summary": args.summary, "junit": args.junit, "shard": spec,
                                "all_items": [(label, s) for s in args.seeds]})


def _jobs(args: argparse.Namespace, target: Any, connection: Any = None) -> list[tuple[str, Any, Any]]:
    """(label, scenario, backend) for every scenario asked for, on ``connection``'s cluster (None: the embedded
    server); raises ValueError naming an unknown one."""
    from chaos.backends import make_backend

    durability = getattr(args, "durability", "temporal")
    suffixes = {d: sfx for sfx, d in TWIN_SUFFIXES.items()}  # backend -> its twins' suffix
    suffix = suffixes.get(durability)
    if args.command == "soak" and args.scenarios == ["all"]:
        raise ValueError("soak runs one scenario; name it (python -m chaos list)")
    if args.command == "suite":
        names = [n for b in getattr(args, "backends", SUITE_BACKENDS)
                 for n in (SUITE if b == "temporal" else [t + suffixes[b] for t in _twins(b)])]
    elif args.scenarios == ["all"]:
        names = [n + suffix for n in _twins(durability)] if suffix else list(SUITE)
    else:
        names = [n + suffix if suffix and _split_twin(n)[1] == "temporal" else n for n in args.scenarios]
    known = [*SCENARIOS, *(n + sfx for sfx, d in TWIN_SUFFIXES.items() for n in _twins(d))]
    pinned = {}  # NAME~PROFILE (as a run under another profile names itself): that profile only
    for i, n in enumerate(names):
        base, sep, profile = n.partition(TIMEOUTS_SEPARATOR)
        if sep:
            if profile not in TIMEOUTS:
                raise ValueError(f"{n}: unknown timeouts profile {profile!r}; profiles are {', '.join(TIMEOUTS)}")
            names[i] = base
            pinned[base] = [profile]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(known)}")
    jobs = []
    profiles = getattr(args, "timeouts", [DEFAULT_TIMEOUTS])
    latency = getattr(args, "model_latency", None)
    for label in names:
        base, twin_of = _split_twin(label)
        checkpoint_twin = twin_of != "temporal"  # no Temporal: its timeouts profiles do not apply
        backend = make_backend(twin_of,
                               getattr(args, "placement", "process"), getattr(args, "image", None), target,
                               getattr(args, "target", None), connection)
        scenario = SCENARIOS[base]
        if latency:  # the scenario's own model latency otherwise; run.json records the one used
            scenario = dataclasses.replace(scenario, cluster=dataclasses.replace(scenario.cluster,
                                                                                 model_latency=latency))
        for profile in ([DEFAULT_TIMEOUTS] if checkpoint_twin else pinned.get(label, profiles)):  # Temporal only
            if profile == DEFAULT_TIMEOUTS:
                jobs.append((label, scenario, backend))
                continue
            name = f"{base}{TIMEOUTS_SEPARATOR}{profile}"  # its own runs/<name>/, its own row
            jobs.append((name, dataclasses.replace(scenario, name=name, timeouts=profile), backend))
    return jobs


def _rerun(run_dir: Path, connection: Any = None, target_path: Path | None = None,
           image: str | None = None) -> tuple[Any, Any, int]:
    """(scenario, backend, seed) as a saved run recorded them, on ``connection``'s cluster (None: the embedded
    server; the saved run's cluster is not reused: its address may not be this machine's to reach).

    The scenario is data (validated); nothing the run names is run unless the user controls it: the target file
    is ``target_path``, or the one run.json names if the user controls it (``chaos.target.load_recorded_target``);
    a Docker worker image is ``image``, or for the reference agent the harness's own (None here: built from this
    checkout); a reference run's workflow must be the reference's or a planted one. ValueError: one line saying
    what to pass."""
    from chaos.backends import make_backend
    from chaos.scenarios import scenario_from_dict
    from chaos.target import load_recorded_target, load_target, reference_workflows
    from harness.rundir import RUN_JSON, RunDir, RunDirError

    record = RunDir(run_dir).read_run()
    if record.get("kind") != "chaos" or "scenario" not in record:
        raise ValueError(f"{run_dir} is not a chaos run directory (no scenario in its run.json)")
    backend = record.get("backend") if isinstance(record.get("backend"), dict) else {}
    again = command_line("python -m chaos rerun", {"--target": "PATH/TO/chaos-target.toml"}, [str(run_dir)])
    recorded_file = backend.get("target_file")
    if target_path is not None:
        target = load_target(target_path)
    elif recorded_file:
        try:
            target = load_recorded_target(str(recorded_file), f"{run_dir}: the target file its run.json names")
        except ValueError as exc:
            raise ValueError(f"{exc}; pass the target file you trust: {again}") from None
        target_path = Path(os.path.realpath(str(recorded_file)))
    else:
        target = None
    workers = backend.get("workers") or "process"
    if workers == "docker" and image is None and (backend.get("image") or target is not None):
        if target is not None:
            raise ValueError(f"{run_dir} ran your agent in Docker image {backend.get('image')!r}; a run directory's "
                             f"image is never run: pass the image you trust with --image NAME ({again} --image NAME)")
        print(f"note: {run_dir} names the image {backend.get('image')!r}; a run directory's image is never run: "
              "using dah-worker built from this checkout (--image NAME for another)", file=sys.stderr)
    try:
        scenario = scenario_from_dict(record["scenario"])
    except (TypeError, KeyError, AttributeError, ValueError) as exc:
        raise RunDirError(Path(run_dir) / RUN_JSON, "a scenario as python -m chaos run records it",
                          f"{type(exc).__name__}: {exc}"[:120], "scenario") from None
    workflow = scenario.cluster.workflow
    if target is None and workflow is not None and (not isinstance(workflow, str)
                                                      or workflow not in reference_workflows()):
        raise ValueError(f"{run_dir}: its scenario's cluster.workflow {str(workflow)[:200]!r} is not the reference "
                         "agent's nor a planted one (testbed.faults.planted); a run directory's code is never run")
    durability = backend.get("name") if backend.get("name") in TWIN_SUFFIXES.values() else "temporal"
    return (scenario, make_backend(durability, workers, image, target, target_path, connection),
            int(record.get("seed", 1)))


def _unfinished(run: Any) -> str | None:
    """What ``chaos check`` says first of a run that did not complete (None: it completed)."""
    record = run.read_run()
    status = record.get("status")
    if status in (None, "complete"):
        return None
    if status == "running":
        return (f"{run.path} says running: it is still running, or was killed outright (SIGKILL, a lost machine) "
                "and never recorded an end")
    during = record.get("stopped_during")
    error = record.get("error")
    return f"{run.path} was {status}" + (f" during {during}" if during else "") + (f" ({error})" if error else "")


def _summary(args: argparse.Namespace) -> int:
    """``python -m chaos summary DIR ...``: merge CI jobs' runs; 0 only if every planned run passed. Verdicts are
    read as the run directories wrote them, not authenticated: re-check with ``chaos check`` where untrusted."""
    from chaos import ci

    missing = [str(d) for d in args.dirs if not d.is_dir()]
    if missing:
        print(f"python -m chaos summary: not a directory: {', '.join(missing)}; give run roots (runs/), artefact "
              "folders or run directories", file=sys.stderr)
        return 2
    merged = ci.merge(args.dirs)
    if not merged.rows:
        for problem in merged.unreadable or [f"no chaos runs or suite/soak summaries under "
                                             f"{', '.join(map(str, args.dirs))}"]:
            print(f"python -m chaos summary: {problem}", file=sys.stderr)
        return 2
    rows = merged.rows
    print(ci.table(rows))
    t = ci.totals(rows)
    print(f"\n{len(rows)} run(s) from {len(merged.sources)} source(s): "
          + ", ".join(f"{n} {v}" for v, n in t.items()))
    bad = [r for r in rows if not ci.passed(r) and not ci.skipped(r)]
    for r in bad:
        print(printable(f"  {r['scenario']} seed {r['seed']}: {ci.reason(r)}"
                        + (f"; reproduce with: {r['reproduce']}" if r.get("reproduce") else "")))
    unfinished = [r for r in rows if ci.incomplete(r)]
    if unfinished:
        print(printable(f"incomplete: {len(unfinished)} run(s) did not finish: "
                        + ", ".join(f"{r['scenario']} seed {r['seed']} ({r['status']})" for r in unfinished)))
    for note in merged.notes:
        print(printable(f"note: {note}"))
    for problem in merged.unreadable:  # each counted above as not passed: never a pass
        print(printable(f"python -m chaos summary: {problem}"), file=sys.stderr)
    ci.write_outputs(rows, args.summary, args.junit, command="summary", status="complete", wall_s=sum(
        float(r.get("wall_s") or 0) for r in rows), suite_name="chaos (merged)", extra={"sources": merged.sources,
                                                                                     "notes": merged.notes})
    print(f"CI files: {args.summary}, {args.junit}")
    if all(r["status"] == ci.UNREADABLE for r in rows):
        return 2  # nothing readable at all
    return 0 if not bad and not merged.unreadable and any(ci.passed(r) for r in rows) else 1


def _connection(args: argparse.Namespace) -> Any:
    """The Temporal cluster the run, suite, soak or rerun attacks (None: the embedded server; ValueError naming a
    bad setting): the connection flags over $TEMPORAL_* over a temporal.toml profile (testbed.connection)."""
    from testbed.connection import connection_from_args

    connection = connection_from_args(args)
    if connection.embedded:
        return None
    print(f"Temporal: external cluster {connection.address}, namespace {connection.namespace} (nothing starts or "
          f"stops a server; scenarios that need the embedded one are skipped)", file=sys.stderr)
    if getattr(args, "ui", False):
        print("--ui: no Web UI is started for an external cluster; use the cluster's own", file=sys.stderr)
    return connection


def _check_engine(args: argparse.Namespace) -> str | None:
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


def _timeouts(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in TIMEOUTS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{text!r}: profiles are {', '.join(TIMEOUTS)} (comma-separated)")
    return list(dict.fromkeys(names))


def _shard(text: str) -> tuple[int, int]:
    from chaos.ci import parse_shard

    try:
        return parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seeds(text: str) -> list[int]:
    from chaos.soak import parse_seeds

    try:
        return parse_seeds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    from testbed.connection import add_connection_arguments

    parser = argparse.ArgumentParser(prog="python -m chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="the named scenarios")

    def out_and_target(p: argparse.ArgumentParser, parallel: int | None = None) -> None:
        add_out(p, "<scenario>")
        if parallel is not None:
            p.add_argument("--parallel", type=int, default=parallel,
                           help=f"scenarios run at once, each its own cluster (default {parallel})")
        p.add_argument("--target", type=Path, help="a target TOML file: your own agent (default: the reference "
                                                   "agent; see chaos/target.py)")

    def common(p: argparse.ArgumentParser, parallel: int) -> None:
        p.add_argument("--seed", type=int, default=1, help="seed of the schedule, the load and the model (default 1)")
        out_and_target(p, parallel)

    def ci_options(p: argparse.ArgumentParser, what: str) -> None:
        from chaos import ci

        items = "scenario x seed runs" if what == "suite" else "seeds"
        where = "OUT/" if what == "suite" else "the soak's own directory, "
        summary, junit = (ci.SUITE_SUMMARY, ci.SUITE_JUNIT) if what == "suite" else (ci.SOAK_SUMMARY, ci.SOAK_JUNIT)
        p.add_argument("--shard", type=_shard, metavar="K/N",
                       help=f"run only CI job K's share of the {items}, of N jobs (e.g. 2/4): the same split on "
                            "every machine, each run in exactly one shard; merge with python -m chaos summary")
        p.add_argument("--summary", type=Path, metavar="PATH",
                       help=f"the summary JSON, one row per run (default: {where}{summary})")
        p.add_argument("--junit", type=Path, metavar="PATH",
                       help=f"the JUnit XML, one testcase per run (default: {where}{junit})")

    def placement_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--placement", choices=("process", "docker"), default="process", metavar="{process,docker}",
                       help="where workers run: local processes (default) or Docker containers (needs an engine; "
                            "the checkpoint backend's workers stay processes)")
        p.add_argument("--image", help="--placement docker: an image with the worker installed (default: dah-worker, "
                                       "built from this checkout and this machine's files: python -m testbed.images)")

    def backend_options(p: argparse.ArgumentParser) -> None:
        placement_options(p)
        p.add_argument("--timeouts", type=_timeouts, default=[DEFAULT_TIMEOUTS], metavar="PROFILE[,PROFILE]",
                       help="how fast the agent notices a dead worker (Temporal backend): "
                            + "; ".join(f"{t.name}: {t.description}" for t in TIMEOUTS.values())
                            + f" (default {DEFAULT_TIMEOUTS}). Two, comma-separated, run every scenario under each, "
                              "side by side in one table (e.g. fast,defaults)")
        add_durability(p, help="the agent's durability backend: temporal (default), checkpoint (the "
                               "step-checkpointed SQLite substrate; scenarios " + ", ".join(_checkpoint_twins()) + "), "
                               "dbos (DBOS Transact on SQLite; " + ", ".join(_twins("dbos")) + "), dbos-postgres "
                               "(on PostgreSQL; also " + ", ".join(sorted(set(_twins("dbos-postgres")) -
                                                                          set(_twins("dbos")))) + ") or restate "
                               "(a Restate server; " + ", ".join(_twins("restate")) + ")")
        add_model_latency(p, default=None, default_text="each scenario's own: fixed:100, or fixed:500 where a kill "
                                                        "must land mid-call")

    def cluster(p: argparse.ArgumentParser) -> None:
        add_connection_arguments(p, embedded_default=True)

    p = sub.add_parser("run", help="run named scenarios (or 'all')")
    p.add_argument("scenarios", nargs="+", help=f"names: {', '.join(SCENARIOS)}, or 'all'")
    common(p, 1)
    p.add_argument("--ui", action="store_true", help="start the Temporal Web UI and print its address, to watch")
    backend_options(p)
    cluster(p)
    p = sub.add_parser("suite", help="the CI suite: every named scenario; exit 1 on any fail, unknown or error")
    common(p, 2)
    p.add_argument("--seeds", type=_seeds, metavar="SEEDS",
                   help="run every scenario on each of these seeds (e.g. 1-3; default: --seed)")
    p.add_argument("--backends", type=_backends, default=SUITE_BACKENDS, metavar="BACKENDS",
                   help="whose scenarios, comma-separated: temporal (every named scenario), checkpoint, dbos, "
                        "dbos-postgres, restate (each its twins); default temporal,checkpoint. make chaos-engines: "
                        "--backends dbos,dbos-postgres,restate")
    ci_options(p, "suite")
    placement_options(p)
    cluster(p)
    p = sub.add_parser("soak", help="one scenario over many seeds, one after another; the verdict distribution; "
                                    "exit 1 unless every seed passed")
    p.add_argument("scenarios", nargs=1, metavar="SCENARIO", help=f"a name: {', '.join(SCENARIOS)}")
    p.add_argument("--seeds", type=_seeds, default=_seeds(DEFAULT_SEEDS),
                   help=f"the seeds: ranges and single seeds, e.g. 1-100 or 1-20,25,30-32 (default {DEFAULT_SEEDS})")
    out_and_target(p)
    backend_options(p)
    cluster(p)
    ci_options(p, "soak")
    what = ("merge the run directories and summaries of several CI jobs (or machines) into one verdict table, "
            "summary JSON and JUnit XML; exit 1 unless every planned run passed. Verdicts are read as the run "
            "directories wrote them, not authenticated: where artefacts are not trusted, re-check each run with "
            "python -m chaos check")
    p = sub.add_parser("summary", help=what, description=what)
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR",
                   help="run roots (e.g. each job's runs/), downloaded artefact folders, or single run directories")
    p.add_argument("--summary", type=Path, default=Path("chaos-summary.json"),
                   help="the merged summary JSON (default chaos-summary.json)")
    p.add_argument("--junit", type=Path, default=Path("chaos-junit.xml"),
                   help="the merged JUnit XML (default chaos-junit.xml)")
    p = sub.add_parser("planted", help="the planted-bug catalogue: broken agents that must not pass "
                                       "(python -m chaos planted --help)", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p = sub.add_parser("check", help="re-run the checkers offline on a saved run directory")
    p.add_argument("run_dir", type=Path, help="e.g. runs/kill_mid_turn/latest")
    p.add_argument("--target", type=Path, help="your target file: the only agent code the replay checker runs for "
                                               "a bring-your-own run, besides the file the run names if you own it "
                                               "and no one else can write it (nothing a run directory names is run)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p = sub.add_parser("rerun", help="run a saved run's scenario again (its seed, backend and target)")
    p.add_argument("run_dir", type=Path, help="a chaos run directory, e.g. runs/kill_mid_turn/latest")
    p.add_argument("--target", type=Path, help="the target file to run (default: the one the run names, only if "
                                               "you own it and no one else can write it)")
    p.add_argument("--image", help="--placement docker: the worker image to run (never the one the run names; "
                                   "default for the reference agent: dah-worker, built from this checkout)")
    add_out(p, "<scenario>")
    cluster(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command's exit status; a malformed run directory, or a file in it that is not read (outside it, a
    symlink, not a regular file, too large), is one line naming the file and why, exit 2."""
    from harness.run_files import RefusedPath
    from harness.rundir import RunDirError

    argv = sys.argv[1:] if argv is None else argv
    try:
        return _main(argv)
    except (RunDirError, RefusedPath) as exc:
        command = next((a for a in argv if not a.startswith("-")), "")
        print(printable(f"python -m chaos {command}: {exc}"), file=sys.stderr)
        return 2


def _main(argv: list[str]) -> int:
    stop_on_sigterm()  # SIGTERM (kill PID, a CI job's timeout) stops a run as Ctrl-C does; it ends terminated
    from agent.env_options import EnvOptionError, check_environment

    try:
        check_environment()
    except EnvOptionError as exc:
        print(f"python -m chaos: {exc}", file=sys.stderr)
        return 2
    if argv[:1] == ["planted"]:
        from chaos.planted import main as planted

        return planted(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prog = f"python -m chaos {args.command}"
    if args.command == "list":
        for s in SCENARIOS.values():
            print(f"{s.name:<30} {s.description}")
        for suffix, durability in TWIN_SUFFIXES.items():
            for name in _twins(durability):
                where = STAND_INS.get(durability, "") if name.startswith(("server_", "partition_temporal")) else ""
                print(f"{name + suffix:<30} {SCENARIOS[name].description} (on {durability}{where})")
        return 0
    if args.command == "summary":
        return _summary(args)
    if args.command == "check":
        from chaos.runner import check

        run_dir = args.run_dir.resolve()
        from harness.rundir import RunDir

        if not RunDir(run_dir).operations.exists():
            print(f"{prog}: {args.run_dir} has no operations.jsonl (nor a history.jsonl); give a run directory "
                  "such as runs/<scenario>/latest", file=sys.stderr)
            return 2
        unfinished = _unfinished(RunDir(run_dir))
        if unfinished and not RunDir(run_dir).conversations.exists():
            # Stopped before its final read: the checkers would only report the files it never wrote.
            if args.json:
                print(json.dumps({"verdict": "unknown", "status": RunDir(run_dir).read_run().get("status"),
                                  "note": unfinished, "checks": []}))
            else:
                print(f"{printable(unfinished)}; it stopped before its final read (no conversations.json), so "
                      f"there is nothing to check\n\nverdict: unknown")
            return 1
        if unfinished:
            print(f"note: {printable(unfinished)}; checking what it recorded", file=sys.stderr)
        given = None
        if args.target:
            from chaos.target import load_target

            try:
                given = load_target(args.target)
            except ValueError as exc:
                print(f"{prog}: {exc}", file=sys.stderr)
                return 2
        verdict, checks, _ = check(run_dir, given)
        if args.json:
            print(json.dumps({"verdict": verdict, "checks": [c.as_dict() for c in checks]}, default=str))
        else:
            for c in checks:
                print(f"{printable(c.name):<20} {printable(c.verdict):<15} {printable(c.summary)}")
            print(f"\nverdict: {verdict}")
        return 0 if verdict == "pass" else 1
    try:
        connection = _connection(args)
        if args.command == "rerun":
            scenario, backend, seed = _rerun(args.run_dir, connection, args.target, args.image)
            if getattr(backend, "workers", "process") == "docker":
                docker = argparse.Namespace(placement="docker", image=backend.image, target=None)
                problem = _check_engine(docker)
                if problem:
                    print(f"{prog}: {problem}", file=sys.stderr)
                    return 2
                backend.image = docker.image  # the one built here, if none was given
            return asyncio.run(_run_many([(scenario.name + backend.suffix, scenario, backend, seed)], args.out))
        if getattr(args, "parallel", 1) < 1:
            print(f"{prog}: --parallel {args.parallel}: must be 1 or more", file=sys.stderr)
            return 2
        target = None
        if args.target:
            from chaos.target import check_driver, load_target

            target = load_target(args.target)
            check_driver(target)  # a driver written for another driver API version fails here, before any run
            if target.address and getattr(args, "parallel", 1) > 1:
                if any(a == "--parallel" or a.startswith("--parallel=") for a in argv):
                    raise ValueError(f"--parallel {args.parallel}: the target {args.target} hard-codes the address "
                                     f"{target.address} (the fault proxy must listen there), so it runs one "
                                     "scenario at a time: use --parallel 1")
                print(f"{prog}: {args.target} hard-codes the address {target.address}: one scenario at a time",
                      file=sys.stderr)
                args.parallel = 1
        problem = _check_engine(args)
        if problem:
            print(f"{prog}: {problem}", file=sys.stderr)
            return 2
        if args.command == "soak":
            return asyncio.run(_soak(args, target, connection))
        if args.command == "suite":
            args.seeds = args.seeds or [args.seed]
            return asyncio.run(_suite(args, target, connection))
        jobs = [(*job, args.seed) for job in _jobs(args, target, connection)]
        return asyncio.run(_run_many(jobs, args.out, args.parallel, getattr(args, "ui", False)))
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        from harness.rundir import stopped_exit_code, stopped_status

        from chaos import ci

        status = stopped_status()
        print(f"\n{status}; the cluster was stopped; partial runs are in {args.out} (status {status})"
              + (f"; the suite's summary: {args.summary or args.out / ci.SUITE_SUMMARY}" if args.command == "suite"
                 else ""), file=sys.stderr)
        return stopped_exit_code()


def entry() -> None:
    """``python -m chaos`` and the ``dah-chaos`` console script: ``main``, then leave through ``os._exit`` (no
    atexit hooks: a worker thread left behind by a client library cannot hold the exit), after stopping any
    Docker engine this process started. Not in ``main``: a caller of ``main`` in the same process (a test) may
    own an engine it started earlier."""
    from harness.exit import exit_now
    from testbed.dockerd import stop_started_engines

    code = main()
    stop_started_engines()
    exit_now(code)
