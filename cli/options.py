"""The options every command spells the same way (docs/commands.md, "One interface across the commands").

    --durability {temporal,checkpoint,dbos,dbos-postgres,restate}   the agent's durability engine (dah,
                                         python -m chaos; python -m benchmarks: temporal and checkpoint)
    --model-latency SPEC                 the scripted model's response latency, one grammar
                                         (testbed.model_server.add_model_latency)
    --out DIR                            the runs root (default runs/); each command writes into its own folder
                                         under it: runs/<scenario>/, runs/bench/, runs/migration_fuzz/. It must be
                                         a folder of the user's alone, and the folders under it too (``harness.commands.own_out``)
    --keep-runs N|all                    after the command, each folder it wrote into keeps its newest N runs and
                                         every protected one (default $DAH_KEEP_RUNS, else 20; all: remove nothing;
                                         ``harness.retention``, ``dah gc``)
    progress                             on stderr (``harness.commands.progress``); results tables and machine output on stdout
    usage errors                         one line naming the bad value and what is allowed (an unknown name: the
                                         closest known ones), then "see: PROG --help"; exit 2
                                         (``harness.commands.CommandParser``, the parser of every command)

Each concept has one flag: the old spellings (``--backend``, ``--latency``, ``--durability journal``) are gone, and
argparse refuses them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.commands import REPORT_DIR, RUNS
from harness.engines import HOME, names as engine_names
from harness.printable import printable
from testbed.engines.temporal.connection import DEFAULT_ADDRESS

DURABILITY = engine_names()  # the engines, by name (harness.engines.REGISTRY)


def add_durability(parser: Any, *, help: str, choices: Sequence[str] = DURABILITY) -> argparse.Action:
    """``--durability {temporal,checkpoint,...}`` (default temporal); ``choices``: the engines this command
    supports (default all). ``parser`` may be an argument group."""
    return parser.add_argument("--durability", choices=choices, default=HOME,
                               metavar="{" + ",".join(choices) + "}", help=help)


def add_out(parser: Any, folder: str, default: Path = RUNS) -> argparse.Action:
    """``--out DIR``: the runs root, as for every command; this one writes into DIR/<folder>/."""
    return parser.add_argument("--out", type=Path, default=default, metavar="DIR",
                               help=f"the runs root: this command writes into DIR/{folder}/ (default {default}/)")


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


def add_connection_arguments(parser: argparse.ArgumentParser, *, embedded_default: bool) -> None:
    g = parser.add_argument_group(
        "Temporal connection",
        "Flags override the environment (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS*), "
        "which overrides a temporal.toml profile ($TEMPORAL_CONFIG_FILE or ~/.config/temporalio/temporal.toml).")
    default_help = ("default: start an embedded dev server for this command" if embedded_default
                    else f"default: {DEFAULT_ADDRESS}")
    # Every default is None: a setting not given here comes from the environment or the profile.
    g.add_argument("--address", help=f"Temporal frontend HOST:PORT of an existing cluster or Temporal Cloud "
                                     f"({default_help})")
    g.add_argument("--namespace", help="Temporal namespace (default 'default')")
    g.add_argument("--tls", action="store_true", default=None, help="use TLS with the system's root certificates")
    g.add_argument("--tls-cert-path", help="client certificate for mTLS (PEM)")
    g.add_argument("--tls-key-path", help="client private key for mTLS (PEM)")
    g.add_argument("--tls-ca-path", help="server CA certificate (PEM), for private CAs")
    g.add_argument("--tls-server-name", help="server name to verify, if it differs from the address")
    g.add_argument("--api-key", help="Temporal Cloud API key (prefer $TEMPORAL_API_KEY: a flag shows in ps); "
                                     "implies TLS; never printed")
    g.add_argument("--profile", dest="temporal_profile", metavar="NAME",
                   help="the temporal.toml profile to read (default $TEMPORAL_PROFILE or 'default')")
