"""Usage errors are one line (cli/options.py, ``CommandParser``): the installed commands are run as a user runs
them, with a bad value or a misspelt name, and must answer on stderr in one line naming it and what is allowed (an
unknown name: the closest known ones), then at most where the help is; exit 2; no usage dump. Nothing here starts
Temporal: every case fails before anything starts (a few seconds each)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from cli.bench import build_parser as bench_parser
from cli.chaos import build_parser as chaos_parser
from harness.commands import CommandParser, SCRIPTS, tool, unknown
from cli.fuzz import build_parser as fuzz_parser
from cli.report import build_parser as reports_parser
from cli.dah import build_parser as dah_parser
from cli.checkpoint import build_parser as checkpoint_parser
from testbed.model_server import build_arg_parser as model_server_parser

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

#: (console script, arguments, the bad value as the message must quote it, what it must offer instead)
CASES = [
    ("dah", ["rn"], "'rn'", "run"),
    ("dah", ["demo", "--durability", "temporl"], "'temporl'", "temporal"),
    ("dah", ["run", "--max-attempts", "x"], "'x'", "whole number"),
    ("dah", ["checkpoint", "wroker"], "'wroker'", "worker"),
    ("dah", ["model-server", "--prot", "0"], "'--prot'", "--port"),
    ("dah-chaos", ["run", "kill_mid_turn", "--seed", "abc"], "'abc'", "whole number"),
    ("dah-chaos", ["run", "kill_mid_trn"], "'kill_mid_trn'", "kill_mid_turn"),
    ("dah-chaos", ["run", "kill_mid_turn@dbs"], "'kill_mid_turn@dbs'", "kill_mid_turn@dbos"),
    ("dah-chaos", ["run", "kill_mid_turn", "--sed", "3"], "'--sed'", "--seed"),
    ("dah-chaos", ["suite", "--engines", "dbo"], "'dbo'", "dbos"),
    ("dah-chaos", ["run", "kill_idle", "--timeouts", "fsat"], "'fsat'", "fast"),
    ("dah-chaos", ["chek", "runs"], "'chek'", "check"),
    ("dah-chaos", ["planted", "--lsit"], "'--lsit'", "--list"),
    ("dah-bench", ["--only", "nope"], "'nope'", "sections are table2, tuning"),
    ("dah-bench", ["--only", "tabel2"], "'tabel2'", "table2"),
    ("dah-bench", ["--durability", "dbos"], "'dbos'", "checkpoint"),
    ("dah-fuzz", ["--kind", "ptc-spwns"], "'ptc-spwns'", "ptc-spawns"),
    ("dah-fuzz", ["--iterations", "ten"], "'ten'", "whole number"),
    ("dah-report", ["--rnus", "runs"], "'--rnus'", "--runs"),
]


@pytest.mark.parametrize(("script", "args", "bad", "offered"), CASES, ids=[" ".join([c[0], *c[1]]) for c in CASES])
def test_a_usage_error_is_one_line_naming_the_value_and_what_is_allowed(script: str, args: list[str], bad: str,
                                                                         offered: str) -> None:
    done = subprocess.run([str(BIN / script), *args], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          stdin=subprocess.DEVNULL)
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert 1 <= len(lines) <= 2 and "usage:" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert bad in lines[0] and offered in lines[0], lines[0]
    assert len(lines) == 1 or lines[1].endswith(" --help"), lines
    assert done.stdout == ""


def test_an_unknown_scenario_suggests_the_closest_not_all_of_them() -> None:
    message = unknown("scenario", ["kill_mid_trn"], [f"s{i}" for i in range(30)] + ["kill_mid_turn"], "LIST")
    assert "did you mean kill_mid_turn?" in message and "s17" not in message and "31 scenarios: LIST" in message
    few = unknown("section", ["x"], ["table2", "micro"])
    assert few == "unknown section 'x'; sections are table2, micro"


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _parsers(sub)
    return found


@pytest.mark.parametrize("build", [dah_parser, chaos_parser, bench_parser, fuzz_parser, reports_parser,
                                   checkpoint_parser, model_server_parser])
def test_every_command_and_subcommand_parses_with_the_one_helper(build: object) -> None:
    every = _parsers(build())  # type: ignore[operator]
    assert all(isinstance(p, CommandParser) for p in every), [p.prog for p in every if not isinstance(p, CommandParser)]


def test_a_printed_command_runs_as_printed_from_the_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside an activated venv, the tools print the console script by its path (``.venv/bin/dah-chaos`` from the
    checkout); that path is an installed script."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    for package, script in SCRIPTS.items():
        printed = tool(package)
        assert printed.endswith(script) and (ROOT / printed).is_file() or Path(printed).is_file(), printed
    monkeypatch.setenv("PATH", f"{BIN}:/usr/bin:/bin")  # activated: the bare name runs
    assert tool("chaos") == "dah-chaos"
