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

from harness import retention
from harness.printable import printable
from harness.commands import REPORT_DIR, RUNS, UsageError


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
