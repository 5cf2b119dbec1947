"""``python -m reports``: a paper-ready report from the saved run directories.

    python -m reports                                   # runs/ -> reports/out/
    python -m reports --runs /data/runs --out /tmp/report
    python -m reports --bench runs/bench/20261122T100000Z
    python -m reports --runs ci-linux/runs ci-mac/runs          # runs from several machines, one report
    python -m reports --bench ci-a/bench ci-b/bench/20261122T100000Z

Also installed as the command dah-report. Progress and warnings go to stderr; the list of files written to stdout.

Reads only saved files (no Temporal, no network), so a copied ``runs/`` can be
reported anywhere. Exit status (``EXIT_STATUS``, also in ``--help``): 0 when the report was written with every
run it found, or without runs that are only incomplete; 1 when it could not be written, or was written without a
run one of whose files is malformed; 2 when a --runs or --bench directory does not exist, every run found was
malformed, or --out is not a folder of yours alone (another user's, writable by others, or a symlink below it:
one line saying which and what to do, nothing written).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from harness.printable import printable
from harness.private import UnsafeFolder
from harness.rundir import RunDirError
from harness.commands import CommandParser, tool
from reports.build import build, out_folder

OUTPUTS = """outputs (under --out):
  report.md, report.html     the report: the verdicts first (a grid of scenario by engine/placement by seed,
                             each cell a link; how many runs are not shown and why, each failing one by its
                             path; each run's diagnoses, safety and liveness where its verdict.json has them),
                             every run that did not pass (its checks, its reproduce command, links to its run
                             directory), then every section (absent ones say how to get data), then provenance
                             (which run each section comes from, every chaos run not shown)
  *.csv                      every table at full precision, with bootstrap CI bounds (table2, breakdown, ...)
  verdicts.csv, verdicts.tex the verdict grid as text: scenario by engine/placement, each cell its seeds' verdicts
  table1.tex, table2.tex,    booktabs LaTeX tables sized for a two-column page (table* where wide, \\small)
  table2_overhead.tex, breakdown.tex
  figures/*.pdf, .png, .svg  every figure at its print size (3.3 in single column or 7 in double), no titles
  preview.tex                every table and PDF figure in a two-column article: `pdflatex preview.tex` checks
                             that they fit (no "Overfull \\hbox")

inputs:
  bench runs                 each report section comes from the newest *complete* bench run that has it, over
                             every <runs>/bench/<stamp>/ (or the --bench directories): a later `--only micro` or
                             an interrupted run never empties the other sections. Runs that did not complete are
                             listed as skipped; a run directory named with --bench is used whatever its status.
  <scenario>/<stamp>/        `make chaos`: one run per scenario, target and engine (run.json's target.name and
                             backend.name), its newest complete run, else its newest, over every --runs root;
                             the others (older, newer but not complete, malformed) counted under the verdicts
  migration_fuzz/<stamp>/    `python -m migration_fuzz` (results.json); latest, else newest
damaged or partial runs are skipped or partly used, with a warning line in the report."""

EXIT_STATUS = """exit status:
  0  the report was written: every run found is in it, or was left out only as incomplete (no run.json or
     operations.jsonl yet) or unreadable here (a file this user cannot open), each named in its warnings
  1  the report could not be written; or it was written without a chaos run, soak or migration fuzz run one of
     whose files is malformed: not JSON or not UTF-8, nested too deep, not an object where one is expected, a
     field of the wrong type, a symlink or not a regular file, over its size bound (one warning line each on
     stderr and in the report, naming the file and the field). A bench run's file that cannot be used is a
     warning only: its sections come from another run, or say they have no data
  2  a --runs or --bench directory does not exist, every run found was malformed, or --out is not a folder of
     yours alone (another user's, writable by others, or a symlink below it: nothing is written)"""


def build_parser() -> argparse.ArgumentParser:
    p = CommandParser(
        prog=tool("reports"),
        description="Build a paper-ready report (Markdown, HTML, CSV, LaTeX tables, PDF/PNG/SVG figures) from "
                    "saved benchmark, chaos and migration-fuzz run directories. Uses the saved files only: no "
                    "Temporal server, no network.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=f"{OUTPUTS}\n\n{EXIT_STATUS}")
    p.add_argument("--runs", type=Path, nargs="+", action="extend", default=None, metavar="DIR",
                   help="directories holding saved runs, e.g. one per CI machine; repeat it or name several "
                        "(default: runs)")
    p.add_argument("--out", type=Path, default=Path("reports/out"), metavar="DIR",
                   help="where to write the report (default: reports/out): a folder of yours that no one else can "
                        "write (a missing one is made; anything else: exit 2, nothing written); only files a "
                        "previous report wrote there are replaced or removed")
    p.add_argument("--bench", type=Path, nargs="+", action="extend", default=None, metavar="DIR",
                   help="benchmark runs to report instead of those under <runs>/bench: each a run directory "
                        "(used whatever its status) or a directory of them (only complete runs used); each "
                        "section comes from the newest of them that has it")
    p.add_argument("-v", "--verbose", action="store_true", help="also print debug messages")
    return p


class _Lines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        prefix = "warning: " if record.levelno >= logging.WARNING else ""
        return printable(f"[reports] {prefix}{record.getMessage()}")  # messages quote run data


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.runs = args.runs or [Path("runs")]  # several --runs add up; none: the default
    for d in args.runs:
        if not d.is_dir():
            print(f"reports: --runs {d}: no such directory (run `make bench`, `make chaos` or "
                  f"`{tool('migration_fuzz')}` first, or pass --runs DIR)", file=sys.stderr)
            return 2
    for d in args.bench or []:
        if not d.is_dir():
            print(f"reports: --bench {d}: no such directory (pass a bench run directory such as "
                  f"runs/bench/<stamp>, or a directory of them such as runs/bench)", file=sys.stderr)
            return 2
    try:
        out_folder(args.out)  # before anything is read or written: the one line, exit 2
    except UnsafeFolder as exc:
        print(printable(f"reports: {exc}"), file=sys.stderr)
        return 2
    # Progress and warnings are the library's log records, printed here as plain lines on stderr (stdout: what
    # was written).
    logger = logging.getLogger("reports")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Lines())
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    logger.propagate = False
    start = time.monotonic()
    try:
        result = build(args.runs, args.out, args.bench)
    except (RunDirError, UnsafeFolder) as exc:  # a malformed file no section could skip, or an --out another
        print(printable(f"reports: {exc}"), file=sys.stderr)  # user could change: one line naming it
        return 2
    except OSError as exc:
        print(f"reports: could not write the report to {args.out}: {exc}", file=sys.stderr)
        return 1
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate
    print(f"\nwrote {len(result.files)} file(s) to {result.out_dir} in {time.monotonic() - start:.1f} s:")
    for f in result.files:
        print(f"  {f}")
    if result.warnings:
        print(f"{len(result.warnings)} warning(s): see the Warnings section of {result.out_dir / 'report.md'}")
    if result.malformed:
        return 2 if result.empty else 1
    if result.empty:
        print(f"reports: no runs found under {' '.join(map(str, args.runs))}; the report says so (run `make bench`, `make chaos` or "
              f"`{tool('migration_fuzz')}` first)")
    return 0


def entry() -> None:
    """The ``dah-report`` console script (``python -m reports``)."""
    raise SystemExit(main())
