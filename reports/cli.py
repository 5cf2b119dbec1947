"""``python -m reports``: a paper-ready report from the saved run directories.

    python -m reports                                   # runs/ -> reports/out/
    python -m reports --runs /data/runs --out /tmp/report
    python -m reports --bench runs/bench/20261122T100000Z

Also installed as the command dah-report. Progress and warnings go to stderr; the list of files written to stdout.

Reads only saved files (no Temporal, no network), so a copied ``runs/`` can be
reported anywhere. Exit status: 0 when the report was written (also when there
was nothing to report, or some runs were skipped: the report says which), 2
when --runs or --bench does not exist, 1 when the report could not be written.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from reports.build import build

OUTPUTS = """outputs (under --out):
  report.md, report.html     the report: provenance, then every section (absent ones say how to get data)
  *.csv                      every table at full precision (table1, table2, table2_overhead, breakdown, ...)
  table1.tex, table2.tex,    booktabs LaTeX tables
  table2_overhead.tex, breakdown.tex
  figures/*.png, *.svg       every figure, PNG (150 dpi) and SVG

inputs (under --runs):
  bench/<stamp>/             `make bench` (RUN_DIRECTORY.md); --bench, else bench/latest, else newest
  <scenario>/<stamp>/        `make chaos` (run.json, operations.jsonl, verdict.json); <scenario>/latest, else newest
  migration_fuzz/<stamp>/    `python -m migration_fuzz` (results.json); latest, else newest
damaged or partial runs are skipped or partly used, with a warning line in the report."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m reports",
        description="Build a paper-ready report (Markdown, HTML, CSV, LaTeX tables, PNG and SVG figures) from "
                    "saved benchmark, chaos and migration-fuzz run directories. Uses the saved files only: no "
                    "Temporal server, no network.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=OUTPUTS)
    p.add_argument("--runs", type=Path, default=Path("runs"), metavar="DIR",
                   help="directory holding the saved runs (default: runs)")
    p.add_argument("--out", type=Path, default=Path("reports/out"), metavar="DIR",
                   help="where to write the report (default: reports/out); only files a previous report wrote "
                        "there are replaced or removed")
    p.add_argument("--bench", type=Path, default=None, metavar="RUN_DIR",
                   help="the benchmark run to report (default: <runs>/bench/latest, else the newest "
                        "<runs>/bench/<stamp> with a run.json)")
    p.add_argument("-v", "--verbose", action="store_true", help="also print debug messages")
    return p


class _Lines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        prefix = "warning: " if record.levelno >= logging.WARNING else ""
        return f"[reports] {prefix}{record.getMessage()}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.runs.is_dir():
        print(f"reports: --runs {args.runs}: no such directory (run `make bench`, `make chaos` or "
              f"`python -m migration_fuzz` first, or pass --runs DIR)", file=sys.stderr)
        return 2
    if args.bench is not None and not args.bench.is_dir():
        print(f"reports: --bench {args.bench}: no such directory", file=sys.stderr)
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
    if result.empty:
        print(f"reports: no runs found under {args.runs}; the report says so (run `make bench`, `make chaos` or "
              f"`python -m migration_fuzz` first)")
    return 0


def entry() -> None:
    """The ``dah-report`` console script (``python -m reports``)."""
    raise SystemExit(main())
