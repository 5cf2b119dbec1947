"""The options every command spells the same way (docs/commands.md, "One interface across the commands").

    --durability {temporal,checkpoint,dbos,dbos-postgres,restate}   the agent's durability engine (dah,
                                         python -m chaos; python -m benchmarks: temporal and checkpoint)
    --model-latency SPEC                 the scripted model's response latency, one grammar
                                         (testbed.model_server.add_model_latency)
    --out DIR                            the runs root (default runs/); each command writes into its own folder
                                         under it: runs/<scenario>/, runs/bench/, runs/migration_fuzz/
    progress                             on stderr (``progress``); results tables and machine output on stdout
    usage errors                         one line naming the bad value and what is allowed (an unknown name: the
                                         closest known ones), then "see PROG --help"; exit 2 (``CommandParser``)

Each concept has one flag: the old spellings (``--backend``, ``--latency``, ``--durability journal``) are gone, and
argparse refuses them.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.printable import printable
from harness.rundir import tool
from testbed.engines import ENGINES

DURABILITY = tuple(ENGINES)  # the engines, by name (testbed.engines.ENGINES)
RUNS = Path("runs")


#: what an argparse ``type`` converter's name means, for "invalid int value: 'abc'"
_TYPES = {"int": "a whole number", "float": "a number", "Path": "a path"}
#: names listed in full up to this many; past it, the closest matches and where the full list is
LIST_ALL_UP_TO = 12


def unknown(what: str, bad: Sequence[str], known: Sequence[str], listed_by: str = "",
            suggest: Callable[[str], Sequence[str]] | None = None) -> str:
    """The one-line message for names that are not among ``known``: each bad name with its closest known ones
    (difflib; among ``suggest(name)`` if given), then every known name when they are few, else how many there are
    and ``listed_by`` (the command that lists them)."""
    known = [str(k) for k in known]
    if not bad:
        return f"no {what} given; {_allowed(what, known, listed_by)}"
    parts = []
    for name in bad:
        pool = list(suggest(name)) if suggest else known
        close = difflib.get_close_matches(name, pool, n=3, cutoff=0.5) or difflib.get_close_matches(
            name, pool, n=2, cutoff=0.3)
        parts.append(f"unknown {what} {name!r}" + (f" (did you mean {' or '.join(close)}?)" if close else ""))
    return "; ".join(parts) + f"; {_allowed(what, known, listed_by)}"


def _allowed(what: str, known: Sequence[str], listed_by: str) -> str:
    if len(known) <= LIST_ALL_UP_TO or not listed_by:
        return f"{what}s are {', '.join(known)}"
    return f"{len(known)} {what}s: {listed_by} lists them"


def runnable(text: str) -> str:
    """``text`` (a help text, an epilog) with each ``python -m PACKAGE`` as it runs from here (``harness.rundir.tool``:
    ``.venv/bin/dah-chaos`` in a checkout after ``make``), so the commands it prints run as printed."""
    return re.sub(r"python -m ([A-Za-z_][\w.]*)", lambda m: tool(m[1]), text)


class CommandParser(argparse.ArgumentParser):
    """The parser of every command (dah, dah-chaos, dah-bench, dah-fuzz, dah-report and their subcommands): a usage
    error is one line naming the bad value and what is allowed, then where the help is; exit 2. No usage dump: the
    message is what a user needs, and ``--help`` is one command away. Subparsers are of this class too."""

    #: for an unknown choice with many choices: the command that lists them (e.g. "dah-chaos list")
    choices_listed_by: str = ""
    #: the parser (this or a subparser) that parsed last: an unrecognized argument is reported by the subcommand
    _innermost: CommandParser | None = None

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        CommandParser._innermost = self
        return super().parse_known_args(args, namespace)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            if isinstance(action, argparse._SubParsersAction):  # "unknown command 'x'", with no "COMMAND:" before it
                raise argparse.ArgumentError(None, unknown("command", [value], list(action.choices)))
            raise argparse.ArgumentError(action, unknown("value", [value], list(action.choices), self.choices_listed_by))

    def error(self, message: str) -> None:  # type: ignore[override]
        message, parser = _plain(message), self
        if message.startswith("unrecognized arguments: "):  # the subcommand that was given them reports them
            parser = next((p for p in _parsers(self) if p is CommandParser._innermost), self)
            message = parser._unrecognized(message.removeprefix("unrecognized arguments: ").split())
        parser.exit(2, printable(f"{parser.prog}: error: {message}") + f"\nsee: {parser.prog} --help\n")

    def _unrecognized(self, extras: list[str]) -> str:
        options = sorted({o for a in self._actions for o in a.option_strings})
        flags = [e for e in extras if e.startswith("-")]
        parts = []
        for extra in flags or extras:  # an unknown flag's value is not news
            flag = extra.split("=", 1)[0]
            close = difflib.get_close_matches(flag, options, n=3, cutoff=0.6) if flag.startswith("-") else []
            parts.append(f"unknown argument {extra!r}" + (f" (did you mean {' or '.join(close)}?)" if close else ""))
        return "; ".join(parts)


def _plain(message: str) -> str:
    """argparse's wording, made to name what is allowed: "argument --seed: invalid int value: 'abc'" becomes
    "--seed 'abc': not a whole number"."""
    found = re.fullmatch(r"argument (\S+): invalid (\w+) value: (.*)", message)
    if found and found[2] in _TYPES:
        flag = found[1].split("/")[-1]
        return f"{flag} {found[3]}: not {_TYPES[found[2]]}"
    return re.sub(r"^argument (\S+): ", lambda m: m[1].split("/")[-1] + ": ", message)


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser and every subparser below it."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += _parsers(sub)
    return found


def deprecated(prog: str, old: str, new: str) -> None:
    """The one-line note an old spelling gets (on stderr: stdout stays the command's results)."""
    print(f"{prog}: {old} is deprecated; use {new}", file=sys.stderr, flush=True)


def add_durability(parser: Any, *, help: str, choices: Sequence[str] = DURABILITY) -> argparse.Action:
    """``--durability {temporal,checkpoint,...}`` (default temporal); ``choices``: the engines this command
    supports (default all). ``parser`` may be an argument group."""
    return parser.add_argument("--durability", choices=choices, default="temporal",
                               metavar="{" + ",".join(choices) + "}", help=help)


def add_out(parser: Any, folder: str, default: Path = RUNS) -> argparse.Action:
    """``--out DIR``: the runs root, as for every command; this one writes into DIR/<folder>/."""
    return parser.add_argument("--out", type=Path, default=default, metavar="DIR",
                               help=f"the runs root: this command writes into DIR/{folder}/ (default {default}/)")


def runs_root(out: Path, folder: str, prog: str) -> Path:
    """The runs root ``--out`` names, for a command whose own folder under it is ``folder``.

    ``--out`` used to name that folder itself for some commands (``--out runs/bench``): a root whose last part
    is the folder's name is taken in that old sense (the same directory as before), with a note."""
    if out.name == folder:
        deprecated(prog, f"--out {out} (the {folder} folder itself)",
                   f"--out {out.parent} (the runs root; {folder}/ is added)")
        return out.parent
    return out


def progress(start: float | None = None) -> Callable[[str], None]:
    """A progress printer: ``[  12.3s] message`` lines on stderr, seconds since ``start`` (default now); the message
    ``printable`` (it may quote run data)."""
    started = time.monotonic() if start is None else start

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {printable(message)}", file=sys.stderr, flush=True)
    return say


class UsageError(Exception):
    """A bad input the user can fix; the message names it and what to do."""


def model_knobs(args: argparse.Namespace) -> tuple[Any, list[Any]]:
    """The scripted model's ``--model-latency`` and ``--fault`` rules; UsageError naming a bad rule."""
    from testbed.faults.model import FaultRule
    from testbed.model_server import LatencyModel

    latency = LatencyModel.parse(args.model_latency)  # checked by the parser (testbed.cli_options)
    faults = []
    for spec in args.fault:
        try:
            faults.append(FaultRule.parse(spec))
        except ValueError as exc:
            raise UsageError(f"--fault: {exc}") from None
    return latency, faults


def connection(args: argparse.Namespace, *, embedded_default: bool = True) -> Any:
    """The Temporal connection: the flags over the environment over a temporal.toml profile (testbed.connection)."""
    from testbed.connection import connection_from_args

    try:
        return connection_from_args(args, embedded_default=embedded_default)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
