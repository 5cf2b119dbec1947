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

After a run, suite, soak or rerun, each runs folder it wrote into keeps its newest 20 runs (--keep-runs N|all,
$DAH_KEEP_RUNS) besides latest and every run that did not pass or that a soak, summary or report names; dah gc
collects by hand (docs/commands.md, "Keeping runs").

Progress goes to stderr; the results table to stdout. Also installed as the command dah-chaos.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from chaos import ci, saved, soak, suite
from testbed.engines.workload import DEFAULT_TIMEOUTS, TIMEOUTS
from chaos.scenarios import SCENARIOS
from chaos.soak import DEFAULT_SEEDS
from chaos.suite import SUITE_ENGINES, twins
from harness.engines import HOME, described
from harness.engines import names as engine_names
from harness.printable import printable
from harness.rundir import stop_on_sigterm
from harness.commands import CommandParser, own_out, runnable, tool, unknown as _unknown
from cli.options import add_connection_arguments, add_durability, add_keep_runs, add_out, prune_runs
from testbed.model_server import add_model_latency


def _engines(text: str) -> tuple[str, ...]:
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    known = engine_names()
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise argparse.ArgumentTypeError(_unknown("engine", bad, known))
    return names


def _connection(args: argparse.Namespace) -> Any:
    """The Temporal cluster the run, suite, soak or rerun attacks (None: the embedded server; ValueError naming a
    bad setting): the connection flags over $TEMPORAL_* over a temporal.toml profile (testbed.engines.temporal.connection)."""
    from testbed.engines.temporal.connection import connection_from_args

    connection = connection_from_args(args)
    if connection.embedded:
        return None
    print(f"Temporal: external cluster {connection.address}, namespace {connection.namespace} (nothing starts or "
          f"stops a server; scenarios that need the embedded one are skipped)", file=sys.stderr)
    if getattr(args, "ui", False):
        print("--ui: no Web UI is started for an external cluster; use the cluster's own", file=sys.stderr)
    return connection


def _timeouts(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in TIMEOUTS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"{_unknown('timeouts profile', unknown, list(TIMEOUTS))} (comma-separated)")
    return list(dict.fromkeys(names))


def _shard(text: str) -> tuple[int, int]:
    from chaos.ci import parse_shard

    try:
        return parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seeds(text: str) -> list[int]:
    from chaos.seeds import parse_seeds

    try:
        return parse_seeds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _out_and_target(p: argparse.ArgumentParser, parallel: int | None = None, what: str = "scenarios",
                    per_core: bool = False) -> None:
    add_out(p, "<scenario>")
    add_keep_runs(p)
    if parallel is not None:
        p.add_argument("--parallel", type=int, default=parallel,
                       help=f"{what} run at once, each its own cluster (default {parallel}"
                            + (f": two per core, at most {suite.MAX_PARALLEL}" if per_core else "") + ")")
    p.add_argument("--target", type=Path, help="a target TOML file: your own agent (default: the reference "
                                               "agent; see docs/your-agent.md)")


def _count(text: str, most: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= most:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number from 1 to {most}")
    return value


def _load_options(p: argparse.ArgumentParser) -> None:
    from chaos.scenarios import SCENARIO_BOUNDS

    p.add_argument("--conversations", type=lambda t: _count(t, SCENARIO_BOUNDS["conversations"]), metavar="N",
                   help="conversations at once (default: each scenario's own, usually 3)")
    p.add_argument("--messages", type=lambda t: _count(t, SCENARIO_BOUNDS["messages"]), metavar="M",
                   help="messages each conversation sends at least (default: each scenario's own, usually 4)")


def _common(p: argparse.ArgumentParser, parallel: int, per_core: bool = False) -> None:
    p.add_argument("--seed", type=int, default=1, help="seed of the schedule, the load and the model (default 1)")
    _out_and_target(p, parallel, per_core=per_core)
    _load_options(p)


def _ci_options(p: argparse.ArgumentParser, what: str) -> None:
    from chaos import ci

    items = "scenario x seed runs" if what == "suite" else "seeds"
    where = "OUT/" if what == "suite" else "the soak's own directory, "
    summary, junit = (ci.SUITE_SUMMARY, ci.SUITE_JUNIT) if what == "suite" else (ci.SOAK_SUMMARY, ci.SOAK_JUNIT)
    p.add_argument("--shard", type=_shard, metavar="K/N",
                   help=f"run only CI job K's share of the {items}, of N jobs (e.g. 2/4): the same split on "
                        f"every machine, each run in exactly one shard; merge with {tool('chaos')} summary")
    p.add_argument("--summary", type=Path, metavar="PATH",
                   help=f"the summary JSON, one row per run (default: {where}{summary})")
    p.add_argument("--junit", type=Path, metavar="PATH",
                   help=f"the JUnit XML, one testcase per run (default: {where}{junit})")


def _placement_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--placement", choices=("process", "docker"), default="process", metavar="{process,docker}",
                   help="where workers run: local processes (default) or Docker containers (needs an engine; "
                        "the checkpoint engine's workers stay processes)")
    p.add_argument("--image", help="--placement docker: an image with the worker installed (default: dah-worker, "
                                   "built from this checkout and this machine's files: " + tool("testbed.images") + ")")


def _gate_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gate", choices=("all", "safety", "liveness"), default="all",
                   help="what a run must pass for exit status 0: all its checks (default); safety: nothing lost, "
                        "doubled or wrong, a late reply allowed; liveness: every reply in time (the late check, "
                        "and waits after the heal). verdict.json records both apart")
    p.add_argument("--lint-fails", action="store_true",
                   help="a run whose event histories show a risky durability setting (the lint's findings, listed "
                        "after each run) does not pass either (default: the lint only informs)")


def _engine_options(p: argparse.ArgumentParser) -> None:
    _placement_options(p)
    p.add_argument("--timeouts", type=_timeouts, default=[DEFAULT_TIMEOUTS], metavar="PROFILE[,PROFILE]",
                   help="how fast the agent notices a dead worker (Temporal): "
                        + "; ".join(f"{t.name}: {t.description}" for t in TIMEOUTS.values())
                        + f" (default {DEFAULT_TIMEOUTS}). Two, comma-separated, run every scenario under each, "
                          "side by side in one table (e.g. fast,defaults)")
    add_durability(p, help="the agent's durability engine: " + described(
        lambda name: "scenarios " + ", ".join(twins(name)) if name != HOME else ""))
    add_model_latency(p, default=None, default_text="each scenario's own: fixed:100, fixed:150 for "
                                                    "kill_mid_turn's aimed kills, or fixed:500 where a drain or a "
                                                    "local activity's kill must land mid-call")


def _cluster(p: argparse.ArgumentParser) -> None:
    add_connection_arguments(p, embedded_default=True)
    _network_option(p)


def _network_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--network", choices=("private", "shared"), default="private",
                   help="private (default, where the platform allows it): the run's servers and workers in a network "
                        "namespace of their own, which no other local user can reach; shared: on this machine's "
                        "loopback (for workers that must reach other hosts; Temporal's and Restate's ports are then "
                        "open to local users while the run lasts). An external cluster or Docker workers are always "
                        "shared")


def _enter_network(args: argparse.Namespace, connection: Any, docker: bool = False) -> None:
    """Before anything starts: the run's own network (``testbed.isolation``), unless the command was called
    in-process (``main``: a test's process stays where it is) or the run cannot have one; one line says which."""
    if not _PRIVATE_NETWORK:
        return
    from testbed import isolation

    why = ("--network shared" if getattr(args, "network", "private") == "shared" else
           "an external cluster is reached over this machine's network" if connection is not None else
           "Docker workers run on the Docker engine's network" if docker else None)
    print(isolation.enter_private_network(why, ui=getattr(args, "ui", False)).line(), file=sys.stderr, flush=True)


#: set by ``entry`` (the command as run from a shell): runs move into a private network first
_PRIVATE_NETWORK: list[bool] = []


def _run_command(sub: Any) -> None:
    p = sub.add_parser("run", help="run named scenarios (or 'all')")
    p.add_argument("scenarios", nargs="+", help=f"names: {', '.join(SCENARIOS)}, or 'all'")
    _common(p, 1)
    p.add_argument("--ui", action="store_true", help="start the Temporal Web UI and print its address, to watch")
    _gate_option(p)
    _engine_options(p)
    _cluster(p)


def _suite_command(sub: Any) -> None:
    p = sub.add_parser("suite", help="the CI suite: every named scenario; exit 1 on any fail, unknown or error")
    _common(p, suite.default_parallel(), per_core=True)
    p.add_argument("--seeds", type=_seeds, metavar="SEEDS",
                   help="run every scenario on each of these seeds (e.g. 1-3; default: --seed)")
    p.add_argument("--engines", type=_engines, default=SUITE_ENGINES, metavar="ENGINES",
                   help=f"whose scenarios, comma-separated: {HOME} (every named scenario), "
                        + ", ".join(n for n in engine_names() if n != HOME) + " (each its twins); default "
                        + ",".join(SUITE_ENGINES) + ". make chaos-engines: --engines "
                        + ",".join(n for n in engine_names() if n not in SUITE_ENGINES))
    _ci_options(p, "suite")
    _gate_option(p)
    _placement_options(p)
    _cluster(p)


def _soak_command(sub: Any) -> None:
    p = sub.add_parser("soak", help="one scenario over many seeds, --parallel at a time, in their order; the "
                                    "verdict distribution; exit 1 unless every seed passed")
    p.add_argument("scenarios", nargs=1, metavar="SCENARIO", help=f"a name: {', '.join(SCENARIOS)}")
    p.add_argument("--seeds", type=_seeds, default=_seeds(DEFAULT_SEEDS),
                   help=f"the seeds: ranges and single seeds, e.g. 1-100 or 1-20,25,30-32 (default {DEFAULT_SEEDS})")
    _out_and_target(p, suite.default_parallel(), "seeds", per_core=True)
    _load_options(p)
    p.add_argument("--cluster-per-seed", action="store_true",
                   help="start and stop a Temporal server for every seed (default: the reference agent's seeds "
                        "share one warm server per --parallel lane, each seed with its own task queue, workers, "
                        "model server and proxies, its workflows terminated at its end; seeds that restart or "
                        "partition the server always have their own)")
    _engine_options(p)
    _cluster(p)
    _ci_options(p, "soak")


def _summary_command(sub: Any) -> None:
    what = ("merge the run directories and summaries of several CI jobs (or machines) into one verdict table, "
            "summary JSON and JUnit XML; exit 1 unless every planned run passed. Verdicts are read as the run "
            "directories wrote them, not authenticated: where artefacts are not trusted, re-check each run with "
            f"{tool('chaos')} check")
    p = sub.add_parser("summary", help=what, description=what)
    p.add_argument("dirs", nargs="+", type=Path, metavar="DIR",
                   help="run roots (e.g. each job's runs/), downloaded artefact folders, or single run directories")
    p.add_argument("--summary", type=Path, default=Path("chaos-summary.json"),
                   help="the merged summary JSON (default chaos-summary.json)")
    p.add_argument("--junit", type=Path, default=Path("chaos-junit.xml"),
                   help="the merged JUnit XML (default chaos-junit.xml)")


def _planted_command(sub: Any) -> None:
    p = sub.add_parser("planted", help="the planted-bug catalogue: broken agents that must not pass "
                                       f"({tool('chaos')} planted --help)", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)


def _check_command(sub: Any) -> None:
    p = sub.add_parser("check", help="re-run the checkers offline on a saved run directory")
    p.add_argument("run_dir", type=Path, help="e.g. runs/kill_mid_turn/latest")
    p.add_argument("--target", type=Path, help="your target file: the only agent code the replay checker runs for "
                                               "a bring-your-own run, besides the file the run names if you own it "
                                               "and no one else can write it (nothing a run directory names is run)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def _lint_command(sub: Any) -> None:
    from chaos.lint import RULES

    what = ("the risky durability settings saved runs' event histories show (no fault needed): each with its "
            "evidence and its fix")
    p = sub.add_parser("lint", help=what, formatter_class=argparse.RawDescriptionHelpFormatter, description=(
        f"{what}.\n\nrules:\n" + "".join(f"  {rule}: {meaning}\n" for rule, meaning in RULES.items())
        + "\nExit 0 (it informs), 1 with --lint-fails and a finding, 2 for a path that is no run directory. A run "
          "with no saved\nevent histories says so: nothing to lint."))
    p.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR", help="chaos run directories, e.g. "
                                                                            "runs/kill_mid_turn/latest")
    p.add_argument("--lint-fails", action="store_true", help="exit 1 if any run has a finding (default: 0, the "
                                                             "lint only informs)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON, one object per run")


def _rerun_command(sub: Any) -> None:
    p = sub.add_parser("rerun", help="run a saved run's scenario again (its seed, engine and target)")
    p.add_argument("run_dir", type=Path, help="a chaos run directory, e.g. runs/kill_mid_turn/latest")
    p.add_argument("--target", type=Path, help="the target file to run (default: the one the run names, only if "
                                               "you own it and no one else can write it)")
    p.add_argument("--image", help="--placement docker: the worker image to run (never the one the run names; "
                                   "default for the reference agent: dah-worker, built from this checkout)")
    add_out(p, "<scenario>")
    add_keep_runs(p)
    _cluster(p)


def _planted(argv: list[str], before_runs: Callable[[], None]) -> int:
    """``dah-chaos planted``: its own parser (its help lists the catalogue), then ``chaos.planted`` runs it."""
    from chaos.planted import CATALOGUE, EXAMPLE_TARGET, __doc__ as what, run_catalogue, table

    p = CommandParser(prog=f"{tool('chaos')} planted", description=what.split("\n\n")[0])
    p.add_argument("names", nargs="*", help=f"entries to run (default all): {', '.join(b.name for b in CATALOGUE)}")
    add_out(p, "<scenario>")
    p.add_argument("--target", type=Path, default=EXAMPLE_TARGET,
                   help="the third-party agent's target file (default: the example's)")
    p.add_argument("--list", action="store_true", help="list the catalogue and exit")
    args = p.parse_args(argv)
    if args.list:
        for b in CATALOGUE:
            print(f"{b.name:36} {b.agent:12} {b.scenario.name:40} caught by {'/'.join(b.caught_by)}: {b.what}")
        return 0
    unknown = [n for n in args.names if n not in {b.name for b in CATALOGUE}]
    if unknown:
        p.error(f"no planted bug named {', '.join(unknown)}; --list shows them")
    bugs = [b for b in CATALOGUE if not args.names or b.name in args.names]
    try:
        own_out(args.out, *dict.fromkeys(b.scenario.name for b in bugs))  # before any run starts
    except ValueError as exc:  # UnsafeFolder: another user could change the folder
        print(f"{p.prog}: {exc}", file=sys.stderr)
        return 2
    before_runs()  # the command's private network
    rows = asyncio.run(run_catalogue(bugs, args.out, args.target))
    print()
    print(table(rows))
    missed = [r["bug"] for r in rows if not r["caught"]]
    print(f"\n{len(rows) - len(missed)} of {len(rows)} planted bug(s) caught" +
          (f"; NOT caught: {', '.join(missed)}" if missed else ""))
    return 1 if missed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(prog=tool("chaos"), description=runnable(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("list", help="the named scenarios")
    for add in (_run_command, _suite_command, _soak_command, _summary_command, _planted_command, _check_command, _lint_command,
                _rerun_command):
        add(sub)
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
        print(printable(f"{tool('chaos')} {command}: {exc}"), file=sys.stderr)
        return 2


def _main(argv: list[str]) -> int:
    stop_on_sigterm()  # SIGTERM (kill PID, a CI job's timeout) stops a run as Ctrl-C does; it ends terminated
    from agent.env_options import EnvOptionError, check_environment

    try:
        check_environment()
    except EnvOptionError as exc:
        print(f"{tool('chaos')}: {exc}", file=sys.stderr)
        return 2
    if argv[:1] == ["planted"]:
        return _planted(argv[1:], before_runs=lambda: _enter_network(argparse.Namespace(), None))
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prog = f"{tool('chaos')} {args.command}"
    if args.command == "list":
        print("\n".join(suite.scenario_list()))
        return 0
    if args.command == "summary":
        return ci.summary_command(args.dirs, args.summary, args.junit)
    if args.command == "check":
        return saved.check_command(args.run_dir, args.target, args.json)
    if args.command == "lint":
        return saved.lint_command(args.run_dirs, args.lint_fails, args.json)
    started = datetime.now(timezone.utc)

    def pruned(code: int) -> int:
        """Once the command's runs are written: the folders it wrote into keep their newest --keep-runs runs."""
        prune_runs(args.out, started, args.keep_runs)
        return code

    try:
        connection = _connection(args)
        if args.command == "rerun":
            scenario, engine, seed = saved.rerun_job(args.run_dir, connection, args.target, args.image)
            # before anything starts: another user's --out, or a link at its folder, is refused (UnsafeFolder), exit 2
            own_out(args.out, scenario.name + engine.suffix)
            if getattr(engine, "workers", "process") == "docker":
                docker = argparse.Namespace(placement="docker", image=engine.image, target=None)
                if problem := suite.docker_problem(docker):
                    print(f"{prog}: {problem}", file=sys.stderr)
                    return 2
                engine.image = docker.image  # the one built here, if none was given
            _enter_network(args, connection, getattr(engine, "workers", "process") == "docker")
            return pruned(asyncio.run(suite.run_many([(scenario.name + engine.suffix, scenario, engine, seed)],
                                                     args.out)))
        if getattr(args, "parallel", 1) < 1:
            print(f"{prog}: --parallel {args.parallel}: must be 1 or more", file=sys.stderr)
            return 2
        explicit_parallel = any(a == "--parallel" or a.startswith("--parallel=") for a in argv)
        target = suite.load_target_for(args, explicit_parallel)
        # before anything starts (a Docker engine, a cluster): UnsafeFolder, exit 2
        own_out(args.out, *(label for label, *_ in (suite.jobs(args, target, connection) if args.command == "run"
                                                    else [])))
        if problem := suite.docker_problem(args):
            print(f"{prog}: {problem}", file=sys.stderr)
            return 2
        _enter_network(args, connection, getattr(args, "placement", "process") == "docker")
        if args.command == "soak":
            return pruned(asyncio.run(soak.run_soak(args, target, connection)))
        if args.command == "suite":
            args.seeds = args.seeds or [args.seed]
            return pruned(asyncio.run(suite.suite(args, target, connection)))
        jobs = [(*job, args.seed) for job in suite.jobs(args, target, connection)]  # with the image docker_problem set
        return pruned(asyncio.run(suite.run_many(jobs, args.out, args.parallel, getattr(args, "ui", False),
                                                 gate=getattr(args, "gate", "all"),
                                                 lint_fails=getattr(args, "lint_fails", False))))
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        from harness.rundir import stopped_exit_code, stopped_status

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

    _PRIVATE_NETWORK.append(True)
    code = main()
    stop_started_engines()
    exit_now(code)
