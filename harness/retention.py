"""Retention: which saved runs a runs root keeps, and removing the others (``dah gc``; after every run).

A runs root holds one folder per run group (``RUN_DIRECTORY.md``): a chaos scenario (``kill_mid_turn``,
``kill_mid_turn@dbos``), a soak (``soak-<scenario>``), ``bench``, ``migration_fuzz``; each holds one run
directory per run, named by its UTC stamp. Per group the root keeps the newest ``keep`` runs (default
``DEFAULT_KEEP``, or ``DAH_KEEP_RUNS``) and every run that did not pass; a run beyond them is removed. A run is
**never** removed when it is:

* what the group's ``latest`` points at;
* named by a soak's ``soak.json``, a summary (``summary.json`` in a soak's directory, ``*summary.json`` at the
  runs root: the suite's, ``chaos-engines-summary.json``) or a report (``report.md`` in a report directory):
  as long as that soak, summary or report is there;
* the newest complete benchmark run holding a result file (``latency.json``, ``micro.json``, ...): the report
  takes each section from the newest complete run that has it;
* still being written (``run.json`` says ``running``, or there is no ``run.json`` yet), or unreadable;
* not a pass (``verdict.json`` not ``pass``, or not ``complete``; a soak not ``all_passed``; a migration fuzz
  whose invariants did not hold), unless ``include_failed``.

Nothing is followed through a link: a group or run that is a symlink is left alone, and so is anything whose name
is not a run's (``YYYYMMDDTHHMMSSZ`` or ``...Z-N``). A run directory is data: what it says is read through
``harness.rundir`` (bounded, no symlinks), and a path it names only ever protects a run, never leads anywhere. A
run is removed through a descriptor of its group opened without following links, so nothing outside the runs
root is ever removed.

Standard library only.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from harness import run_files
from harness.run_files import RefusedPath
from harness.rundir import LATEST, RUN_JSON, STAMP_FORMAT, VERDICT_JSON, RunDir, RunDirError, read_json

#: runs kept per group, besides the protected ones (``DAH_KEEP_RUNS``, ``--keep-runs``, ``dah gc --keep``)
DEFAULT_KEEP = 20
KEEP_ENV = "DAH_KEEP_RUNS"
#: ``--keep-runs all`` / ``DAH_KEEP_RUNS=all``: nothing is removed after a run
KEEP_ALL = "all"
#: a run directory's name: its UTC stamp, with ``-N`` for the N-th run started in that second
RUN_NAME = re.compile(r"(\d{8}T\d{6}Z)(?:-([0-9]{1,3}))?")
#: a run named in a report or summary: ``<group>/<stamp>``
_NAMED_RUN = re.compile(r"([A-Za-z0-9_.@+-]+)[/\\](\d{8}T\d{6}Z(?:-[0-9]{1,3})?)(?![0-9A-Za-z-])")
#: the files of a run directory, or of a runs root, that name other runs (``RUN_DIRECTORY.md``)
SOAK_JSON, SUMMARY_SUFFIX, REPORT = "soak.json", "summary.json", "report.md"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def parse_keep(text: str) -> int | None:
    """``N`` (0 or more runs kept per group) or ``all`` (None: keep everything); ValueError naming what is
    allowed."""
    value = text.strip().lower()
    if value == KEEP_ALL:
        return None
    if not value.isdigit():
        raise ValueError(f"must be a number of runs kept per runs folder (0 or more), or {KEEP_ALL!r} to keep every run")
    return int(value)


def default_keep(environ: Mapping[str, str] | None = None) -> int | None:
    """``DAH_KEEP_RUNS`` (N, or ``all``: None), else ``DEFAULT_KEEP``; ValueError naming the variable."""
    value = (os.environ if environ is None else environ).get(KEEP_ENV, "")
    if not value:
        return DEFAULT_KEEP
    try:
        return parse_keep(value)
    except ValueError as exc:
        raise ValueError(f"{KEEP_ENV}={value!r}: {exc}") from None


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """``7d``, ``12h``, ``30m``, ``90s``, ``2w`` (or several: ``1d12h``); ValueError naming what is allowed."""
    value = text.strip().lower()
    parts = _DURATION.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ValueError("must be a duration such as 7d, 12h, 30m, 90s or 2w (or 1d12h)")
    return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in parts))


def stamp_time(name: str) -> datetime | None:
    """When a run named ``name`` started (its UTC stamp), or None if the name is not a run's."""
    m = RUN_NAME.fullmatch(name)
    if not m:
        return None
    try:
        return datetime.strptime(m.group(1), STAMP_FORMAT).replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def _order(name: str) -> tuple[str, int]:
    """Oldest first: the stamp, then ``-2`` after the unsuffixed one and ``-10`` after ``-9``."""
    m = RUN_NAME.fullmatch(name)
    return (m.group(1), int(m.group(2) or 1)) if m else (name, 0)


@dataclass
class Run:
    """One run directory of a group, and what retention made of it."""

    group: str
    name: str
    path: Path
    started: datetime
    #: pass, or why it is not one (``fail``, ``unknown``, ``status interrupted``, ...)
    outcome: str
    #: why it stays; None: it is removed
    kept_because: str | None = None
    bytes: int = 0

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"


@dataclass
class Plan:
    """What a collection would do: every run looked at, each either kept (with why) or removed."""

    root: Path
    runs: list[Run] = field(default_factory=list)
    #: things that were not looked at or could not be read, one line each (never a reason to remove anything)
    notes: list[str] = field(default_factory=list)

    @property
    def removed(self) -> list[Run]:
        return [r for r in self.runs if r.kept_because is None]

    @property
    def kept(self) -> list[Run]:
        return [r for r in self.runs if r.kept_because is not None]


def plan(root: Path, keep: int | None = DEFAULT_KEEP, *, older_than: timedelta | None = None,
         include_failed: bool = False, groups: Iterable[str] | None = None, reports: Iterable[Path] = (),
         now: datetime | None = None) -> Plan:
    """Which runs under ``root`` go: in each group (``groups``: only these; None: every group), a run not among
    the newest ``keep`` (None: keep all), older than ``older_than`` (None: any age), that passed (or any
    outcome, with ``include_failed``) and is protected by nothing in this module's docstring. ``reports``:
    report directories whose ``report.md`` protects the runs it names. Reads only; nothing is removed."""
    root = Path(root).resolve()  # the root as the user named it (runs -> /data/runs works); nothing below is followed
    now = now or datetime.now(timezone.utc)
    result = Plan(root)
    if not _real_dir(root):
        result.notes.append(f"{root}: not a directory")
        return result
    wanted = None if groups is None else set(groups)
    named: dict[tuple[str, str], str] = {}  # (group, run) -> the file that names it
    all_runs: dict[str, list[Run]] = {}
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_symlink():
            continue
        if entry.is_dir(follow_symlinks=False):
            runs = _group_runs(root, entry.name, result)
            if runs:
                all_runs[entry.name] = runs
        elif entry.is_file(follow_symlinks=False) and entry.name.endswith(SUMMARY_SUFFIX):
            _names_in_summary(root, entry.name, named, result)
    for runs in all_runs.values():
        for run in runs:
            for name in (SOAK_JSON, SUMMARY_SUFFIX):
                _names_in_summary(run.path, name, named, result)
    for report in reports:
        _names_in_report(Path(report), named, result)
    for group, runs in all_runs.items():
        if wanted is not None and group not in wanted:
            continue
        for run in runs:
            run.outcome = _outcome(run.path)
        _decide(root / group, runs, named, keep, older_than, include_failed, now)
        result.runs += runs
    return result


def _real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _group_runs(root: Path, group: str, result: Plan) -> list[Run]:
    """The run directories of ``root/group`` (real directories named as runs), oldest first (their outcomes not
    read yet)."""
    folder = root / group
    runs = []
    try:
        entries = list(os.scandir(folder))
    except OSError as exc:
        result.notes.append(f"{folder}: not read ({exc.strerror or exc})")
        return []
    for entry in entries:
        started = stamp_time(entry.name)
        if started is None or entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
            continue
        runs.append(Run(group, entry.name, folder / entry.name, started, ""))
    return sorted(runs, key=lambda r: _order(r.name))


#: outcomes that mean the run may still be written to (never removed, whatever the options)
RUNNING, NO_RECORD, UNREADABLE = "running", "no run.json yet", "unreadable"


def _outcome(path: Path) -> str:
    """``pass``, or what the run is instead: its verdict, its status, ``running``, ``no run.json yet``,
    ``unreadable``."""
    run = RunDir(path)
    try:
        if not os.path.lexists(run.file(RUN_JSON)):
            return NO_RECORD
        record = run.read_run()
        status = record.get("status")
        if status in (None, "running"):
            return RUNNING
        if status != "complete":
            return f"status {status}"
        kind = record.get("kind")
        if kind == "chaos":
            verdict = run.read_verdict()
            if not isinstance(verdict, dict):
                return "unchecked"
            checks = verdict.get("checks") or []
            worst = verdict.get("verdict")
            if worst == "pass" and any(not isinstance(c, dict) or c.get("verdict") not in ("pass", "not_applicable")
                                       for c in checks):
                worst = "unknown"  # a check that did not pass: never read better than the checks
            return str(worst)
        if kind == "soak":
            doc = read_json(path / SOAK_JSON)
            return "pass" if isinstance(doc, dict) and doc.get("all_passed") is True else "not every seed passed"
        if kind == "migration_fuzz":
            doc = read_json(path / "results.json")
            return "pass" if isinstance(doc, dict) and doc.get("invariants_held") is True else "invariants broken"
        if kind == "bench":
            return "pass"
        return f"kind {kind}"
    except (OSError, RunDirError, RefusedPath):
        return UNREADABLE


def _names_in_summary(folder: Path, name: str, named: dict[tuple[str, str], str], result: Plan) -> None:
    """The runs a soak's ``soak.json`` or a summary names in its ``runs[].run_dir``: each by its last two parts
    (``<group>/<run>``), never followed."""
    if not os.path.lexists(folder / name):
        return
    try:
        doc = read_json(folder / name)
    except (OSError, RunDirError, RefusedPath) as exc:
        result.notes.append(f"{folder / name}: not read ({exc}); the runs it names are not known")
        return
    rows = doc.get("runs") if isinstance(doc, dict) else None
    for row in rows if isinstance(rows, list) else []:
        where = row.get("run_dir") if isinstance(row, dict) else None
        if isinstance(where, str):
            parts = where.replace("\\", "/").rstrip("/").split("/")
            if len(parts) >= 2:
                named.setdefault((parts[-2], parts[-1]), str(folder / name))


def _names_in_report(report_dir: Path, named: dict[tuple[str, str], str], result: Plan) -> None:
    """The runs a built report names (its provenance: ``runs/<group>/<run>``)."""
    try:
        text = run_files.read_bytes(report_dir, REPORT, run_files.JSON_LIMIT).decode("utf-8", "replace")
    except FileNotFoundError:
        return
    except (OSError, RefusedPath) as exc:
        result.notes.append(f"{report_dir / REPORT}: not read ({exc}); the runs it names are not known")
        return
    for group, run in _NAMED_RUN.findall(text):
        named.setdefault((group, run), str(report_dir / REPORT))


def _decide(folder: Path, runs: list[Run], named: dict[tuple[str, str], str], keep: int | None,
            older_than: timedelta | None, include_failed: bool, now: datetime) -> None:
    """Set each run's ``kept_because`` (None: removed); ``runs`` oldest first."""
    try:
        latest = os.readlink(folder / LATEST)
    except OSError:
        latest = None
    newest_with = _newest_with_each_result(runs)
    for i, run in enumerate(reversed(runs)):
        by = named.get((run.group, run.name))
        if run.outcome in (RUNNING, NO_RECORD, UNREADABLE):
            run.kept_because = run.outcome if run.outcome != RUNNING else "still running"
        elif latest is not None and latest.rstrip("/") == run.name:
            run.kept_because = LATEST
        elif by:
            run.kept_because = f"named by {by}"
        elif run.name in newest_with:
            run.kept_because = f"the newest complete run with {newest_with[run.name]}"
        elif not run.passed and not include_failed:
            run.kept_because = f"not a pass: {run.outcome}"
        elif keep is None or i < keep:
            run.kept_because = "among the newest" + (f" {keep}" if keep is not None else "")
        elif older_than is not None and now - run.started < older_than:
            run.kept_because = "newer than --older-than"


def _newest_with_each_result(runs: list[Run]) -> dict[str, str]:
    """For a benchmark group: run name -> the result files it is the newest complete run to hold."""
    out: dict[str, list[str]] = {}
    seen: set[str] = set()
    for run in reversed(runs):
        if not run.passed:
            continue
        try:
            record = RunDir(run.path).read_run()
            if record.get("kind") != "bench":
                return {}
            files = sorted(run_files.entries(run.path))
        except (OSError, RunDirError, RefusedPath):
            continue
        for f in files:
            if f.endswith(".json") and f not in (RUN_JSON, VERDICT_JSON) and f not in seen:
                seen.add(f)
                out.setdefault(run.name, []).append(f)
    return {name: ", ".join(files) for name, files in out.items()}


# ------------------------------------------------------------------------------------------------- removing


def size(run: Run) -> int:
    """The bytes ``run`` takes on disk (as ``du`` counts them), links not followed."""
    total = 0
    try:
        gfd = os.open(run.path.parent, _DIR_FLAGS)
    except OSError:
        return 0
    try:
        for _, _, files, dfd in os.fwalk(run.name, dir_fd=gfd, follow_symlinks=False):
            total += os.fstat(dfd).st_blocks * 512
            for f in files:
                try:
                    total += os.lstat(f, dir_fd=dfd).st_blocks * 512
                except OSError:
                    pass
    finally:
        os.close(gfd)
    return total


def measure(result: Plan) -> None:
    """Fill in each removed run's ``bytes``."""
    for run in result.removed:
        run.bytes = size(run)


def remove(result: Plan) -> list[str]:
    """Remove every run ``result`` does not keep; the problems, one line each (a run that could not be removed
    stays). Each run is re-read first: one that changed since the plan (a re-check made it fail, a run started
    writing) stays."""
    problems = []
    for run in result.removed:
        if _outcome(run.path) != run.outcome:
            run.kept_because = "changed while collecting"
            continue
        try:
            gfd = os.open(run.path.parent, _DIR_FLAGS)  # the group itself, never through a link
        except OSError as exc:
            problems.append(f"{run.path}: not removed ({exc.strerror or exc})")
            run.kept_because = "could not be removed"
            continue
        try:
            if not stat.S_ISDIR(os.stat(run.name, dir_fd=gfd, follow_symlinks=False).st_mode):
                raise NotADirectoryError(run.name)
            shutil.rmtree(run.name, dir_fd=gfd)  # never follows a link below it (descriptor-based on Linux)
        except OSError as exc:
            problems.append(f"{run.path}: not (wholly) removed ({exc.strerror or exc})")
            run.kept_because = "could not be removed"
        finally:
            os.close(gfd)
    return problems


def human_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"


def summary_line(result: Plan, *, dry_run: bool) -> str:
    """``removed 3 run(s) (162.0 MB) in 2 group(s); kept 41 (20 newest, 18 not passed, 3 latest/named)``."""
    gone = result.removed
    kept = result.kept
    by: dict[str, int] = {}
    for r in kept:
        reason = r.kept_because or ""
        key = ("newest" if reason.startswith("among the newest") else "not passed" if reason.startswith("not a pass")
               else "latest" if reason == LATEST else "named" if reason.startswith("named by")
               else "newest with a result" if reason.startswith("the newest complete") else reason)
        by[key] = by.get(key, 0) + 1
    verb = "would remove" if dry_run else "removed"
    groups = len({r.group for r in gone})
    return (f"{verb} {len(gone)} run(s) ({human_bytes(sum(r.bytes for r in gone))}) in {groups} group(s) under "
            f"{result.root}; kept {len(kept)}" + (f" ({', '.join(f'{n} {k}' for k, n in sorted(by.items()))})"
                                                 if by else ""))


def groups_written_since(root: Path, since: datetime) -> list[str]:
    """The groups under ``root`` with a run started at or after ``since`` (to the second): the ones a command that
    started then wrote into."""
    floor = since.replace(microsecond=0)
    out = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        if entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            names = [e.name for e in os.scandir(entry.path)]
        except OSError:
            continue
        if any((t := stamp_time(n)) is not None and t >= floor for n in names):
            out.append(entry.name)
    return sorted(out)


def prune_after_run(root: Path, since: datetime, keep: int | None, reports: Iterable[Path] = ()) -> Plan | None:
    """After a command that started at ``since`` wrote runs under ``root``: the groups it wrote into keep their
    newest ``keep`` runs (and every protected one); None when ``keep`` is None (``all``) or it wrote nothing.
    Never raises for a run directory's sake: what could not be read is kept, and problems are ``notes``."""
    if keep is None:
        return None
    groups = groups_written_since(Path(root), since)
    if not groups:
        return None
    result = plan(root, keep, groups=groups, reports=reports)
    measure(result)
    result.notes += remove(result)
    return result


def describe_plan(result: Plan, *, dry_run: bool, verbose: bool = False) -> list[str]:
    """The lines ``dah gc`` prints: every run removed (or kept, with ``verbose``), and the notes."""
    verb = "would remove" if dry_run else "removed"
    lines = []
    for run in result.runs:
        if run.kept_because is None:
            lines.append(f"{verb} {run.path}  {human_bytes(run.bytes)}  ({run.outcome})")
        elif verbose:
            lines.append(f"kept {run.path}  ({run.kept_because})")
    return lines + [f"note: {n}" for n in result.notes]
