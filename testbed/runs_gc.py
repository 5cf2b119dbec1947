"""``dah gc``: remove saved runs a runs root no longer needs (``harness.retention`` decides which).

    dah gc --dry-run                  # what would go, and the bytes it would free; nothing removed
    dah gc                            # every runs folder keeps its newest 20 (or $DAH_KEEP_RUNS) and the protected
    dah gc --keep 5 --older-than 7d   # only runs past the newest 5 that are also older than 7 days
    dah gc --include-failed --keep 0 --older-than 30d   # failed runs too, once a month old

Never removed: ``latest``, a run a soak, summary or report names, the newest complete benchmark run with each
result file, a run still running, anything through a symlink, anything not named as a run.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from harness import retention
from harness.printable import printable
from cli.options import REPORT_DIR, RUNS, UsageError


def _duration(text: str) -> Any:
    try:
        return retention.parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: must be a number of runs, 0 or more")
    return int(text)


def add_gc_parser(sub: Any) -> None:
    what = ("Remove saved runs no longer needed. In every runs folder (a scenario, soak-<scenario>, bench, "
            "migration_fuzz) a run is removed when it is past the newest --keep, older than --older-than, passed "
            "(or --include-failed) and protected by nothing. Never removed: latest, a run a soak, summary or "
            "report names, the newest complete benchmark run with each result file, a run still running, "
            "anything through a symlink, anything not named as a run. Chaos, benchmark and migration-fuzz "
            "commands do the same after every run (--keep-runs N|all).")
    p = sub.add_parser("gc", help="remove saved runs no longer needed (--dry-run shows which)", description=what)
    p.add_argument("--runs", type=Path, default=RUNS, metavar="DIR", help=f"the runs root (default {RUNS}/)")
    p.add_argument("--keep", type=_count, default=None, metavar="N",
                   help=f"runs kept per runs folder, newest first (default ${retention.KEEP_ENV}, else "
                        f"{retention.DEFAULT_KEEP})")
    p.add_argument("--older-than", type=_duration, default=None, metavar="DURATION",
                   help="remove only runs started longer ago than this: 7d, 12h, 30m, 90s, 2w (default: any age)")
    p.add_argument("--include-failed", action="store_true",
                   help="also remove runs that did not pass (fail, unknown, interrupted, failed), under the same "
                        "rules (default: they are kept)")
    p.add_argument("--report", type=Path, action="append", default=None, metavar="DIR",
                   help=f"a report directory whose report.md names runs to keep; repeat it (default {REPORT_DIR})")
    p.add_argument("--dry-run", action="store_true", help="print what would be removed and the bytes freed; "
                                                          "remove nothing")
    p.add_argument("--list-kept", action="store_true", help="also print every run kept, and why")
    p.set_defaults(func=cmd_gc)


def cmd_gc(args: argparse.Namespace) -> int:
    if args.runs == RUNS and not os.path.lexists(RUNS):
        print(f"no {RUNS}/ here yet: nothing to remove")
        return 0
    if not args.runs.is_dir():
        raise UsageError(f"--runs {args.runs}: no such directory (the runs root chaos, benchmarks and migration "
                         "fuzz write into; default runs/)")
    if args.keep is None:
        try:
            args.keep = retention.default_keep()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    result = retention.plan(args.runs, args.keep, older_than=args.older_than, include_failed=args.include_failed,
                            reports=args.report or [REPORT_DIR])
    retention.measure(result)
    if not args.dry_run:
        result.notes += retention.remove(result)
    for line in retention.describe_plan(result, dry_run=args.dry_run, verbose=args.list_kept):
        print(printable(line))
    print(printable(retention.summary_line(result, dry_run=args.dry_run)))
    return 0
