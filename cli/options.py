"""The options every command spells the same way (docs/commands.md, "One interface across the commands").

    --durability {temporal,checkpoint,dbos,dbos-postgres,restate}   the agent's durability engine (dah,
                                         python -m chaos; python -m benchmarks: temporal and checkpoint)
    --model-latency SPEC                 the scripted model's response latency, one grammar
                                         (testbed.model_server.add_model_latency)
    --out DIR                            the runs root (default runs/); each command writes into its own folder
                                         under it: runs/<scenario>/, runs/bench/, runs/migration_fuzz/. It must be
                                         a folder of the user's alone, and the folders under it too (``own_out``)
    --keep-runs N|all                    after the command, each folder it wrote into keeps its newest N runs and
                                         every protected one (default $DAH_KEEP_RUNS, else 20; all: remove nothing;
                                         ``harness.retention``, ``dah gc``)
    progress                             on stderr (``progress``); results tables and machine output on stdout
    usage errors                         one line naming the bad value and what is allowed (an unknown name: the
                                         closest known ones), then "see: PROG --help"; exit 2
                                         (``harness.commands.CommandParser``, the parser of every command)

Each concept has one flag: the old spellings (``--backend``, ``--latency``, ``--durability journal``) are gone, and
argparse refuses them.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.printable import printable
from harness.engines import HOME, names as engine_names

DURABILITY = engine_names()  # the engines, by name (harness.engines.REGISTRY)
RUNS = Path("runs")


def deprecated(prog: str, old: str, new: str) -> None:
    """The one-line note an old spelling gets (on stderr: stdout stays the command's results)."""
    print(f"{prog}: {old} is deprecated; use {new}", file=sys.stderr, flush=True)


def add_durability(parser: Any, *, help: str, choices: Sequence[str] = DURABILITY) -> argparse.Action:
    """``--durability {temporal,checkpoint,...}`` (default temporal); ``choices``: the engines this command
    supports (default all). ``parser`` may be an argument group."""
    return parser.add_argument("--durability", choices=choices, default=HOME,
                               metavar="{" + ",".join(choices) + "}", help=help)


def add_out(parser: Any, folder: str, default: Path = RUNS) -> argparse.Action:
    """``--out DIR``: the runs root, as for every command; this one writes into DIR/<folder>/."""
    return parser.add_argument("--out", type=Path, default=default, metavar="DIR",
                               help=f"the runs root: this command writes into DIR/{folder}/ (default {default}/)")


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


def _keep(text: str) -> str:
    from harness.retention import parse_keep

    try:
        parse_keep(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    return text


def add_keep_runs(parser: Any) -> argparse.Action:
    """``--keep-runs N|all``: the retention of the runs this command writes (``prune_runs`` after it)."""
    from harness.retention import DEFAULT_KEEP, KEEP_ENV

    return parser.add_argument("--keep-runs", type=_keep, default=None, metavar="N|all",
                               help=f"afterwards, each runs folder this command wrote into keeps its newest N runs, "
                                    f"every run that did not pass, latest and every run a soak, summary or report "
                                    f"names; the others are removed (default ${KEEP_ENV}, else {DEFAULT_KEEP}; "
                                    f"all: remove nothing; dah gc does it by hand)")


#: the report directory whose report.md protects the runs it names (python -m reports' default --out)
REPORT_DIR = Path("reports/out")


def prune_runs(out: Path, since: datetime, keep_runs: str | None) -> None:
    """After a command that started at ``since`` (UTC) wrote runs under the runs root ``out``: the folders it wrote
    into keep their newest ``keep_runs`` (``--keep-runs`` as given: ``N`` or ``all``; None: ``$DAH_KEEP_RUNS``,
    else 20) and every protected run (``harness.retention``). One line on stderr when it removed anything; a
    problem is a line too, never the command's failure."""
    from harness.retention import default_keep, human_bytes, parse_keep, prune_after_run

    try:
        keep = default_keep() if keep_runs is None else parse_keep(keep_runs)
        result = prune_after_run(out, since, keep, (REPORT_DIR,))
    except (OSError, ValueError) as exc:
        print(f"runs not pruned: {exc}", file=sys.stderr, flush=True)
        return
    if result is None:
        return
    gone = result.removed
    if gone:
        print(printable(f"pruned {len(gone)} older run(s) ({human_bytes(sum(r.bytes for r in gone))}) of "
                        f"{', '.join(sorted({r.group for r in gone}))} under {result.root}: each keeps its newest "
                        f"{keep}, latest, and every run not passed or named by a soak, summary or report "
                        "(--keep-runs all keeps every run)"), file=sys.stderr, flush=True)
    for note in result.notes:
        print(printable(f"prune: {note}"), file=sys.stderr, flush=True)


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

    latency = LatencyModel.parse(args.model_latency)  # checked by the parser (cli.options)
    faults = []
    for spec in args.fault:
        try:
            faults.append(FaultRule.parse(spec))
        except ValueError as exc:
            raise UsageError(f"--fault: {exc}") from None
    return latency, faults


def connection(args: argparse.Namespace, *, embedded_default: bool = True) -> Any:
    """The Temporal connection: the flags over the environment over a temporal.toml profile (testbed.engines.temporal.connection)."""
    from testbed.engines.temporal.connection import connection_from_args

    try:
        return connection_from_args(args, embedded_default=embedded_default)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
