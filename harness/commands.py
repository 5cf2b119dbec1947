"""How the tools meet a person at the command line: the one argument parser every command uses, and the commands
they print.

* ``CommandParser``: the parser of every command (dah, dah-chaos, dah-bench, dah-fuzz, dah-report and their
  subcommands). A usage error is one line naming the bad value and what is allowed (an unknown name: its closest
  matches, not every name), then ``see: PROG --help``; exit 2. No usage dump: the message is what a user needs.
* ``unknown(what, bad, known)``: that one line for names that are not among the known ones.
* ``tool(package)``: how a printed command (a reproduce command, a help text, an error's advice) runs one of the
  tools from here, so it runs as printed: ``.venv/bin/dah-chaos`` in a checkout after ``make``, ``dah-chaos`` where
  the venv is activated. ``runnable(text)`` rewrites a help text's ``python -m PACKAGE`` so.
* What every command does around its work, the tools in ``cli/`` and the programs of their own alike: ``own_out``
  (``--out`` checked before anything is written), ``runs_root``, ``progress`` (on stderr), ``UsageError``.

Standard library only, as the rest of ``harness``: every tool imports it, the report included.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.printable import printable

#: the console scripts ([project.scripts] in pyproject.toml), by the package each runs as ``python -m``
SCRIPTS = {"testbed": "dah", "chaos": "dah-chaos", "benchmarks": "dah-bench", "migration_fuzz": "dah-fuzz",
           "reports": "dah-report"}


def tool(package: str, cwd: Path | None = None) -> str:
    """How a printed command runs one of the tools from here, as a shell word: its console script by name when
    that name on PATH is this interpreter's (an activated venv), else by path (``.venv/bin/dah-chaos`` in a
    checkout after ``make``); ``PYTHON -m package`` where no script is installed. Paths under the working
    directory (``cwd``, default the current one) print relative to it."""
    def shown(path: Path) -> str:
        try:
            path = path.relative_to(cwd or Path.cwd())
        except ValueError:
            return shlex.quote(str(path))
        return shlex.quote(str(path) if path.parent != Path(".") else f"./{path}")

    bin_dir = Path(sys.executable).parent
    script = bin_dir / SCRIPTS.get(package, package)
    if script.is_file():
        on_path = shutil.which(script.name)
        return script.name if on_path and Path(on_path).parent == bin_dir else shown(script)
    return f"{shown(Path(sys.executable))} -m {package}"


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
        close = difflib.get_close_matches(name, pool, n=3, cutoff=0.5)  # below that, a guess misleads
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


def whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def positive(text: str) -> int:
    value = whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


# -- what every command does around its work (the tools in cli/ and the programs of their own in the packages)

RUNS = Path("runs")
#: the report directory whose report.md protects the runs it names (python -m reports' default --out)
REPORT_DIR = Path("reports/out")


class UsageError(Exception):
    """A bad input the user can fix; the message names it and what to do."""


def own_out(out: Path, *folders: str) -> Path:
    """``--out`` checked before a command writes anything: a folder of the invoking user's alone
    (``harness.private.own_folder``: made if missing), and each of ``folders`` under it that is there already a
    folder of theirs too, not a symlink (``own_subfolder``, nothing made). ``UnsafeFolder`` (a ValueError: the
    one line to print, then exit 2) if not. The real path of ``out``."""
    from harness.private import own_folder, own_subfolder

    real = own_folder(out)
    for folder in folders:
        own_subfolder(real, folder, create=False)
    return real


def runs_root(out: Path, folder: str, prog: str) -> Path:
    """The runs root ``--out`` names, for a command whose own folder under it is ``folder``.

    ``--out`` used to name that folder itself for some commands (``--out runs/bench``): a root whose last part
    is the folder's name is taken in that old sense (the same directory as before), with a note."""
    if out.name == folder:
        print(f"{prog}: --out {out} (the {folder} folder itself) is deprecated; use --out {out.parent} (the runs "
              f"root; {folder}/ is added)", file=sys.stderr, flush=True)  # stderr: stdout stays the results
        return out.parent
    return out


def progress(start: float | None = None) -> Callable[[str], None]:
    """A progress printer: ``[  12.3s] message`` lines on stderr, seconds since ``start`` (default now); the message
    ``printable`` (it may quote run data)."""
    started = time.monotonic() if start is None else start

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {printable(message)}", file=sys.stderr, flush=True)
    return say
