"""One interface across the commands (cli/options.py): the same concept has the same flag, the same value
grammar and the same meaning in dah, python -m chaos, -m benchmarks, -m migration_fuzz, -m reports and the model
server; old spellings are refused; progress goes to stderr; every tool is installed as a
command. The parsers are built in-process (no Temporal): a few seconds."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.bench import build_parser as bench_parser
from cli.chaos import build_parser as chaos_parser
from cli.fuzz import build_parser as fuzz_parser
from cli.report import build_parser as reports_parser
from cli.dah import build_parser as dah_parser
from harness.commands import SCRIPTS, tool
from cli.options import DURABILITY
from harness.commands import progress, runs_root
from testbed.model_server import LATENCY_GRAMMAR, build_arg_parser as model_server_parser

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {"dah": dah_parser, "python -m chaos": chaos_parser, "python -m benchmarks": bench_parser,
            "python -m migration_fuzz": fuzz_parser, "python -m reports": reports_parser,
            "python -m testbed.model_server": model_server_parser}
#: the commands that write runs: --out is the runs root, runs/ by default
WRITERS = {"python -m chaos run", "python -m chaos suite", "python -m chaos soak", "python -m chaos rerun",
           "python -m benchmarks", "python -m migration_fuzz"}


def parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command and subcommand parser, by its name."""
    def walk(name: str, parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, p in action.choices.items():
                    yield from walk(f"{name} {sub}", p)
    for name, build in COMMANDS.items():
        yield from walk(name, build())


def visible(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]


def test_every_help_renders_and_each_concept_has_one_flag() -> None:
    seen: dict[str, set[str]] = {"durability": set(), "model_latency": set(), "out": set(), "keep_runs": set()}
    for name, parser in parsers():
        parser.format_help()  # every --help renders
        for action in visible(parser):
            flags = set(action.option_strings)
            assert not flags & {"--latency", "--backend"}, f"{name}: {flags}: an old spelling shown in --help"
            if action.dest == "durability":
                seen["durability"].add(name)
                # every command spells it the same; each lists the backends it supports (of DURABILITY, in its order)
                assert flags == {"--durability"} and action.metavar == "{" + ",".join(action.choices) + "}", name
                assert list(action.choices) == [d for d in DURABILITY if d in action.choices], name
                assert action.default == "temporal", name
            if action.dest == "model_latency":
                seen["model_latency"].add(name)
                assert flags == {"--model-latency"} and action.metavar == "SPEC", name
                assert LATENCY_GRAMMAR in action.help and "(default " in action.help, name
            if "--out" in flags and name in WRITERS:
                seen["out"].add(name)
                assert action.default == Path("runs") and "the runs root" in action.help, name
            if action.dest == "placement":
                assert flags == {"--placement"}, name
            if action.dest == "keep_runs":  # the retention of what a writer wrote (harness/retention.py)
                seen["keep_runs"].add(name)
                assert flags == {"--keep-runs"} and action.metavar == "N|all" and "DAH_KEEP_RUNS" in action.help, name
    assert seen["durability"] >= {"dah run", "dah demo", "python -m chaos run", "python -m chaos soak",
                                  "python -m benchmarks"}
    assert seen["model_latency"] >= {"dah run", "dah demo", "dah worker", "python -m chaos run", "python -m chaos soak",
                                     "python -m benchmarks", "python -m migration_fuzz",
                                     "python -m testbed.model_server"}
    assert seen["out"] == WRITERS
    assert seen["keep_runs"] == WRITERS


@pytest.mark.parametrize(("build", "old", "new", "dest", "value"), [
    (bench_parser, ["--backend", "checkpoint"], ["--durability", "checkpoint"], "durability", "checkpoint"),
    (bench_parser, ["--durability", "journal"], ["--durability", "checkpoint"], "durability", "checkpoint"),
    (bench_parser, ["--only", "journal"], ["--only", "checkpoint"], "only", ("checkpoint",)),
    (lambda: dah_parser(), ["run", "hi", "--backend", "checkpoint"], ["run", "hi", "--durability", "checkpoint"],
     "durability", "checkpoint"),
    (lambda: dah_parser(), ["run", "hi", "--durability", "journal"], ["run", "hi", "--durability", "checkpoint"],
     "durability", "checkpoint"),
    (lambda: dah_parser(), ["run", "hi", "--latency", "fixed:5"], ["run", "hi", "--model-latency", "fixed:5"],
     "model_latency", "fixed:5"),
    (lambda: dah_parser(), ["worker", "--latency", "7"], ["worker", "--model-latency", "7"], "model_latency", "7"),
    (model_server_parser, ["--latency", "uniform:1,2"], ["--model-latency", "uniform:1,2"], "model_latency",
     "uniform:1,2"),
    (chaos_parser, ["run", "kill_idle", "--backend", "docker"], ["run", "kill_idle", "--placement", "docker"],
     "placement", "docker"),
    (chaos_parser, ["soak", "kill_idle", "--durability", "journal"], ["soak", "kill_idle", "--durability",
                                                                      "checkpoint"], "durability", "checkpoint"),
])
def test_an_old_spelling_is_refused(build, old: list[str], new: list[str], dest: str, value: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The flags' and values' old spellings are gone: a one-line usage error (exit 2), nothing on stdout."""
    assert getattr(build().parse_args(new), dest) == value
    assert capsys.readouterr() == ("", "")
    with pytest.raises(SystemExit) as exited:
        build().parse_args(old)
    assert exited.value.code == 2
    refused = capsys.readouterr()
    assert refused.out == "" and "error: " in refused.err and len(refused.err.splitlines()) <= 2
    assert (f"unknown argument {old[-2]!r}" in refused.err
            or f"{old[-2]}: unknown " in refused.err and repr(old[-1]) in refused.err), refused.err


def test_an_old_scenario_suffix_is_refused() -> None:
    """``SCENARIO@journal`` was ``SCENARIO@checkpoint``: now an unknown scenario."""
    from chaos.suite import jobs as _jobs

    assert len(_jobs(chaos_parser().parse_args(["run", "kill_mid_turn@checkpoint"]), None)) == 1
    with pytest.raises(ValueError, match="unknown scenario.*kill_mid_turn@journal"):
        _jobs(chaos_parser().parse_args(["run", "kill_mid_turn@journal"]), None)


def test_bad_values_are_refused_naming_the_flag_and_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    for build, argv, needle in [(bench_parser, ["--durability", "sqlite"], "'sqlite'; values are temporal, checkpoint"),
                                (chaos_parser, ["run", "kill_idle", "--placement", "vm"], "'vm'; values are process, docker"),
                                (fuzz_parser, ["--model-latency", "gamma:1"], "unknown kind 'gamma'"),
                                (chaos_parser, ["run", "kill_idle", "--model-latency", "fixed:-1"], ">= 0")]:
        with pytest.raises(SystemExit) as exited:
            build().parse_args(argv)
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert argv[-2] in err and needle in err, err


def test_chaos_model_latency_replaces_the_scenario_default_only_when_given() -> None:
    from chaos.suite import jobs as _jobs
    from chaos.scenarios import SCENARIOS

    [(_, scenario, _)] = _jobs(chaos_parser().parse_args(["run", "kill_mid_turn"]), None)
    assert scenario == SCENARIOS["kill_mid_turn"]  # its own latency (fixed:500): unchanged
    [(_, scenario, _)] = _jobs(chaos_parser().parse_args(["run", "kill_mid_turn", "--model-latency", "fixed:7"]), None)
    assert scenario.cluster.model_latency == "fixed:7" and scenario.name == "kill_mid_turn"


def test_out_is_the_runs_root_and_an_old_folder_out_keeps_its_place(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert runs_root(tmp_path, "bench", "bench") == tmp_path
    assert capsys.readouterr().err == ""
    assert runs_root(tmp_path / "bench", "bench", "bench") == tmp_path  # the same runs/bench/<stamp> as before
    assert "is deprecated; use --out " in capsys.readouterr().err


def test_progress_goes_to_stderr_only(capsys: pytest.CaptureFixture[str]) -> None:
    say = progress()
    say("scenario 1/2: kill_idle")
    out, err = capsys.readouterr()
    assert out == "" and err.endswith("] scenario 1/2: kill_idle\n") and err.startswith("[")


@pytest.mark.parametrize(("script", "package"), [(s, p) for p, s in SCRIPTS.items()])
def test_every_tool_is_an_installed_command(script: str, package: str) -> None:
    """Its usage line names it as it runs from the checkout (``.venv/bin/dah-chaos``, or ``dah-chaos`` on PATH)."""
    usage = f"usage: {tool(package, ROOT)} "
    path = Path(sys.executable).parent / script
    assert path.exists(), f"{path}: not installed (pip install -e . installs [project.scripts])"
    done = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(usage)


@pytest.mark.parametrize("module", ["agent", "agent.journal"])
def test_the_old_module_spellings_of_dah_are_gone(module: str) -> None:
    """``python -m agent`` and ``python -m agent.journal`` were ``dah`` and ``dah checkpoint``: no longer commands."""
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode != 0 and done.stdout == ""
