"""Finding and loading saved run directories: the report's only input.

Layout (``RUN_DIRECTORY.md``; read through ``harness.rundir``, either schema)::

    <runs>/bench/<stamp>/run.json + latency.json, breakdown.json, ... (any may be missing)
    <runs>/<scenario>/<stamp>/run.json + operations.jsonl + verdict.json   (chaos runs)
    <runs>/migration_fuzz/<stamp>/run.json + results.json
    <runs>/soak-<scenario>/<stamp>/run.json + soak.json                     (``python -m chaos soak``)

Which bench run is used, per report section: the newest (by its run.json
``started``) *complete* bench run that has the section's data, among the bench
runs under every ``<runs>/bench/`` (or the ``bench_dirs`` given: each a run
directory, or a directory of run directories such as ``runs/bench``). So a
later ``--only micro`` run, an interrupted run or a run copied in from another
machine never empties the sections it did not measure. A discovered run whose
status is not ``complete`` (running, interrupted, failed, ...) is never used:
it is listed in ``Sources.bench_skipped`` with its status. A run directory
named itself in ``bench_dirs`` is used whatever its status (the report shows
the status beside every section taken from it, and warns).

Chaos runs: one per scenario, target (run.json ``target.name``) and engine
(``backend.name``), over every runs root: that group's newest complete run
(what ``latest`` points at when one target runs a scenario), else its newest
run; newest by run.json ``started``, else by directory name. A group whose
chosen run is unusable falls back to the next one, and says so. Every other
chaos run directory found is in ``Sources.left_out`` with why (an older run of
its group, a newer one that did not complete, malformed, incomplete) and its
verdict, so the report counts what it does not show; a soak seed's run
directory is shown as that seed. Migration fuzz and soaks: the ``latest``
symlink's target, else the newest stamp directory by name, per root; the
newest over the roots.

Contract: ``load(runs_dirs, bench_dirs)`` never raises on damaged data. Each run
directory or file it could not use, or used only in part, adds one line to
``Sources.warnings`` ("skipped <path>: <reason>" / "partly used <path>:
<reason>"), which the report prints verbatim. What it returns is normalised
for ``tables`` and ``figures``: series are dicts with string ``name`` and a
``turns`` list of dicts whose numeric fields are floats (NaN when missing);
``points`` are lists of dicts; a chaos run's ``verdict`` is pass only when its
run was checked (a verdict with a summary) and every check passed (``chaos.checker.verdict``'s rules).
verdict.json's optional ``diagnoses`` (each with a string ``line``) and ``safety`` and ``liveness`` verdicts
are carried as read (an unrecognised side verdict as unknown); absent, they are empty.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any

from chaos.checker.verdict import saved_verdict, table_row
from harness import operations as hist
from harness import run_files, rundir
from harness.rundir import RUN_JSON, VERDICT_JSON, RunDir, RunDirError
from harness.run_files import RefusedPath
from harness.verdict import CheckResult
from reports import ops as opsmod

log = logging.getLogger(__name__)

# bench file stem -> the benchmark sections (`python -m benchmarks --only ...`) whose data it holds
BENCH_FILES: dict[str, tuple[str, ...]] = {
    "latency": ("table2", "tuning", "overhead"),
    "breakdown": ("breakdown",),
    "length": ("length",),
    "throughput": ("throughput",),
    "recovery": ("recovery",),
    "resources": ("resources",),
    "micro": ("micro",),
    "checkpoint_backend": ("checkpoint",),
    "engines": ("engines",),
    "scale": ("scale",),
}
NOT_CHAOS = {"bench", "migration_fuzz"}
#: ``python -m chaos soak``'s own run directories: <runs>/soak-<scenario>/<stamp>/soak.json
SOAK_PREFIX, SOAK_JSON = "soak-", "soak.json"


class Unusable(Exception):
    """A run directory or file that cannot be used; the message is the reason."""


class Malformed(Unusable):
    """A file that is not what RUN_DIRECTORY.md says (``harness.rundir.RunDirError``: the file, the field, what
    was expected; not an object where one is expected; a symlink, not a regular file or over its bound:
    ``harness.run_files.RefusedPath``): its run is skipped, and ``python -m reports`` exits non-zero. A run that is
    only incomplete (a file not written yet) is ``Unusable``: skipped, and the exit status stays 0."""


#: the report's bench sections, in report order, and the file stem holding each one's data
BENCH_SECTIONS = ["table2", "tuning", "overhead", "breakdown", "length", "throughput", "recovery", "resources", "micro",
                  "checkpoint", "engines", "scale"]
SECTION_FILE = {sec: stem for stem, secs in BENCH_FILES.items() for sec in secs}


@dataclass
class BenchRun:
    path: Path
    record: dict[str, Any]  # its run.json
    data: dict[str, Any] = field(default_factory=dict)  # file stem -> normalised content
    missing: list[str] = field(default_factory=list)  # file stems absent or unusable
    named: bool = False  # named itself on the command line (used whatever its status)
    warnings: list[str] = field(default_factory=list)  # problems with its files; reported only if it is used

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    @property
    def status(self) -> str:
        return str(self.record.get("status") or "unknown")

    @property
    def profile(self) -> str:
        return str(self.record.get("profile") or "?")

    @property
    def durability(self) -> str:
        """The durable loop it measured (``--durability``): temporal unless its configuration says otherwise."""
        cfg = self.record.get("config") if isinstance(self.record.get("config"), dict) else {}
        return str(cfg.get("durability") or self.record.get("durability") or "temporal")

    @property
    def started(self) -> str:
        return str(self.record.get("started") or stamp_time(self.path.name))

    @property
    def when(self) -> datetime:
        return run_time(self.record, self.path)

    @property
    def sections(self) -> list[str]:
        """The report sections this run has data for."""
        out = []
        lat = self.data.get("latency") or []
        for sec in BENCH_SECTIONS:
            stem = SECTION_FILE[sec]
            if stem == "latency":
                if any(s["section"] == sec for s in lat):
                    out.append(sec)
            elif self.data.get(stem):
                out.append(sec)
        return out


@dataclass
class Skipped:
    """A bench run not used: its status is not complete, or it could not be read."""
    path: Path
    status: str
    reason: str


@dataclass
class ChaosRun:
    scenario: str
    path: Path
    record: dict[str, Any]  # its run.json
    ops: list[hist.Op]
    verdict: str  # pass | fail | unknown
    verdict_note: str  # why, when not read straight from the checks
    summary: dict[str, Any]
    summary_from_history: bool  # True: the run was never checked; counts recomputed from its operation log
    checks: list[dict[str, Any]]
    end_s: float
    recovery_parts: dict[str, Any] = field(default_factory=dict)  # verdict.json's (chaos.recovery.recovery_parts)
    diagnoses: list[dict[str, Any]] = field(default_factory=list)  # verdict.json's, each with a string ``line``
    sides: dict[str, str] = field(default_factory=dict)  # side ("safety", "liveness") -> its verdict, where recorded
    label: str = ""  # how the report names it: its scenario, with its target when another run shown has that scenario

    def __post_init__(self) -> None:
        self.label = self.label or self.scenario


#: why a chaos run directory found is not shown (``LeftOut.why``)
OLDER, UNFINISHED, MALFORMED, INCOMPLETE = "older", "unfinished", "malformed", "incomplete"


@dataclass
class LeftOut:
    """A chaos run directory found and not shown: the report counts it, so that no run, failing or not, is hidden
    without a word."""
    path: Path
    scenario: str  # its run.json's name (a run whose run.json could not be read: its folder's name)
    why: str  # OLDER (than its group's run shown), UNFINISHED (newer, not complete), MALFORMED, INCOMPLETE
    verdict: str  # pass | fail | unknown, as its verdict.json says (unknown when that could not be read)


@dataclass
class FuzzRun:
    path: Path
    results: dict[str, Any]
    families: dict[str, dict[str, Any]]


@dataclass
class SoakRun:
    scenario: str
    path: Path
    record: dict[str, Any]  # its run.json
    soak: dict[str, Any]  # its soak.json
    runs: list[dict[str, Any]]  # soak.json's rows that have an integer seed and a verdict; ``path``: its run directory,
    # ``recovery``, ``diagnoses`` and ``sides``: from its verdict.json (``_seed_verdict``)


@dataclass
class Sources:
    runs_dirs: list[Path]
    bench_runs: list[BenchRun] = field(default_factory=list)  # usable bench runs, newest first
    bench_skipped: list[Skipped] = field(default_factory=list)
    chaos: list[ChaosRun] = field(default_factory=list)
    fuzz: FuzzRun | None = None
    soaks: list[SoakRun] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: one line per run skipped because a file of it is malformed (``Malformed``)
    malformed: list[str] = field(default_factory=list)
    #: every chaos run directory found that is not shown, neither as a chaos run nor as a soak's seed
    left_out: list[LeftOut] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.bench_runs and not self.chaos and self.fuzz is None and not self.soaks

    def bench_for(self, section: str) -> BenchRun | None:
        """The bench run a report section's data comes from: the newest usable run that has it."""
        return next((r for r in self.bench_runs if section in r.sections), None)

    @property
    def bench_used(self) -> list[BenchRun]:
        """The bench runs at least one section comes from, newest first."""
        used = {id(r) for r in (self.bench_for(sec) for sec in BENCH_SECTIONS) if r is not None}
        return [r for r in self.bench_runs if id(r) in used]

    def warn(self, message: str) -> None:
        log.warning(message)
        self.warnings.append(message)

    def skip(self, path: Path, why: Unusable) -> None:
        """A run not used, and why (a ``Malformed`` one also counted in ``malformed``)."""
        self.warn(f"skipped {path}: {why}")
        if isinstance(why, Malformed):
            self.malformed.append(str(why))


def stamp_time(name: str) -> str:
    """A run directory's UTC timestamp name as ISO 8601, or the name itself if it is not one."""
    name = re.sub(r"Z-\d+$", "Z", name)  # a second run in the same second: <stamp>-2
    # Seconds before microseconds: "%S%f" would read 225624 as 22:56:02.4.
    for fmt in ("%Y%m%dT%H%M%SZ", "%Y%m%dT%H%M%S%fZ", "%Y%m%d-%H%M%S", "%Y%m%dT%H%M%S"):
        try:
            return datetime.strptime(name, fmt).replace(tzinfo=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        except ValueError:
            continue
    return name


def run_time(record: dict[str, Any], path: Path) -> datetime:
    """When a run started (run.json's ``started``, else its directory name), for "newest"."""
    for text in (record.get("started"), stamp_time(path.name).replace(" UTC", "Z")):
        try:
            t = datetime.fromisoformat(str(text).replace(" ", "T"))
            return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    return datetime.min.replace(tzinfo=timezone.utc)


def _expect(value: Any, kinds: str, file: Path, field: str | None = None) -> Any:
    """``harness.rundir.expect``: ``value`` if it is of ``kinds``, else ``Malformed`` naming the file and field."""
    try:
        return rundir.expect(value, kinds, file, field)
    except RunDirError as exc:
        raise Malformed(str(exc)) from None


def read_json(path: Path, allow_nan: bool = False) -> Any:
    """``harness.rundir.read_json`` (no symlink, bounded, validated), its errors as ``Unusable`` (``Malformed``
    for a file that is not what RUN_DIRECTORY.md says); ``allow_nan``: benchmark statistics (NaN for an empty
    sample)."""
    try:
        return rundir.read_json(path, allow_nan=allow_nan)
    except FileNotFoundError:
        raise Unusable(f"no {path.name}") from None
    except (RefusedPath, RunDirError) as exc:
        raise Malformed(str(exc)) from None
    except OSError as exc:
        raise Unusable(f"{path.name} cannot be read ({exc})") from None


def _real_dir(path: Path) -> bool:
    """A directory, not a symlink to one: below the roots the user gave, nothing is followed."""
    return path.is_dir() and not path.is_symlink()


def _is_run(path: Path, marker: str) -> bool:
    """A run directory of the kind ``marker`` names (its run.json, or a schema-1 journal.json, counts: a reader of
    older run directories)."""
    if marker == RUN_JSON:
        return (path / RUN_JSON).exists() or (path / "journal.json").exists()
    return (path / marker).exists()


def _record(path: Path) -> tuple[dict[str, Any], str]:
    """A run's run.json (schema 1: its journal.json) and the file's name; raises Unusable."""
    run = RunDir(path)
    name = run.file(RUN_JSON).name
    _expect(read_json(run.file(RUN_JSON)), "an object", run.file(RUN_JSON))
    try:
        return run.read_run(), name
    except RunDirError as exc:
        raise Malformed(str(exc)) from None


def _candidates(parent: Path, marker: str) -> list[Path]:
    """The kind's run directories, best first: the `latest` symlink's target, then the others newest first."""
    out: list[Path] = []
    latest = parent / "latest"
    if latest.is_symlink() or latest.is_dir():
        target = latest.resolve()
        # Only a sibling (runs/x/<stamp>, or a copy named latest), shown under its own name: a `latest` that
        # leads anywhere else is not followed.
        if target.parent == parent.resolve() and _real_dir(parent / target.name):
            out.append(parent / target.name)
    stamps = sorted((p for p in parent.iterdir() if _real_dir(p) and not p.name.startswith(".")
                     and _is_run(p, marker)), key=lambda p: p.name, reverse=True)
    out += [p for p in stamps if not out or p.resolve() != out[0].resolve()]
    return out


def _num(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    return float(value)


def _series(doc: Any, required: tuple[str, ...], numeric: tuple[str, ...], where: str,
            sources: BenchRun) -> list[dict[str, Any]]:
    """Validated ``{"series": [...]}``: bad series are dropped, turns lacking a required number are dropped."""
    if not isinstance(doc, dict) or not isinstance(doc.get("series"), list):
        raise Unusable("no 'series' list")
    out = []
    for n, s in enumerate(doc["series"]):
        if not isinstance(s, dict) or not isinstance(s.get("name"), str) or not isinstance(s.get("turns"), list):
            sources.warn(f"partly used {where}: series #{n} has no name or no turns; skipped it")
            continue
        turns, dropped = [], 0
        for t in s["turns"]:
            if not isinstance(t, dict) or any(math.isnan(_num(t.get(k))) for k in required):
                dropped += 1
                continue
            turns.append({**t, **{k: _num(t.get(k)) for k in numeric}})
        if dropped:
            sources.warn(f"partly used {where}: series {s['name']}: {dropped} turn(s) without "
                         f"{'/'.join(required)} skipped")
        out.append({**s, "turns": turns})
    return out


def _points(doc: Any, numeric: tuple[str, ...]) -> list[dict[str, Any]]:
    if not isinstance(doc, dict) or not isinstance(doc.get("points"), list):
        raise Unusable("no 'points' list")
    return [{**p, **{k: _num(p.get(k)) for k in numeric}} for p in doc["points"] if isinstance(p, dict)]


#: the numbers of a scale point (``benchmarks/scale.py``) the report reads
SCALE_NUMBERS = ("conversations", "messages_per_conversation", "max_history_events", "messages", "events", "runs",
                 "longest_chain_events", "wall_s", "harness_cpu_s", "harness_cpu_ms_per_message", "peak_rss_mib",
                 "report_rss_mib", "check_s", "replay_s", "replay_ms_per_history", "run_dir_bytes", "report_s")


def _normalise_bench(stem: str, doc: Any, where: str, sources: BenchRun) -> Any:
    if stem == "latency":
        series = _series(doc, ("i", "client_ms"), ("i", "client_ms", "model_ms"), where, sources)
        for s in series:
            s.setdefault("section", "table2")
            for key in ("loop", "model_mode", "workload", "model_latency"):
                s[key] = str(s.get(key) or "?")
        return series
    if stem == "breakdown":
        num = ("i", "client_ms", "server_ms", "client_rtt_ms", "wft_sched_to_start_ms", "wft_exec_ms",
               "act_sched_to_start_ms", "act_exec_ms", "model_ms", "other_ms", "wft_count", "act_count")
        return _series(doc, ("client_ms",), num, where, sources)
    if stem == "length":
        return _series(doc, ("i",), ("i", "client_ms", "history_bytes", "history_events", "run_index"), where,
                       sources)
    if stem == "throughput":
        return _points(doc, ("workers", "conversations", "turns_per_conversation", "turns", "wall_s", "turns_per_s",
                             "p50_ms", "p95_ms", "errors"))
    if stem == "recovery":
        return _points(doc, ("heartbeat_s", "tool_s", "baseline_ms", "killed_ms", "recovery_s", "kill_after_s"))
    if stem == "checkpoint_backend":
        return _points(doc, ("n", "p50_ms", "mean_ms", "p95_ms", "vs_floor"))
    if stem == "engines":
        if not isinstance(doc, dict) or not isinstance(doc.get("series"), list) or not isinstance(doc.get("steps"), list):
            raise Unusable("no 'series' and 'steps' lists")
        series = _series({"series": doc["series"]}, ("i", "client_ms"), ("i", "client_ms", "model_ms"), where, sources)
        for s in series:
            for key in ("engine", "model_mode", "workload", "model_latency"):
                s[key] = str(s.get(key) or "?")
        num = ("n", "p50_ms", "mean_ms", "p95_ms", "vs_floor")
        steps = [{**p, "measure": measure, **{k: _num(p.get(k)) for k in num}}
                 for measure, key in (("floor", "floor"), ("step", "steps"))
                 for p in doc.get(key) or [] if isinstance(p, dict)]
        return {"series": series, "steps": steps, "configs": doc.get("configs") or {},
                "unavailable": doc.get("unavailable") or {}, "engines": doc.get("engines") or []}
    if stem == "scale":
        points = _points(doc, SCALE_NUMBERS)
        for p in points:
            for key in ("checker_s", "measurement_s"):
                p[key] = {str(k): _num(v) for k, v in p[key].items()} if isinstance(p.get(key), dict) else {}
            p["verdict"] = str(p.get("verdict") or "?")
        return {"points": points, "fits": doc.get("fits") if isinstance(doc.get("fits"), dict) else {},
                "acceptance": doc.get("acceptance") if isinstance(doc.get("acceptance"), dict) else {}}
    if stem == "resources":
        if not isinstance(doc, dict) or not isinstance(doc.get("sections"), dict):
            raise Unusable("no 'sections' object")
        keys = ("cpu_mean_pct", "cpu_max_pct", "rss_mean_mb", "rss_max_mb", "samples")
        sections = {str(sec): {str(proc): {k: _num(v.get(k)) for k in keys}
                               for proc, v in procs.items() if isinstance(v, dict)}
                    for sec, procs in doc["sections"].items() if isinstance(procs, dict)}
        return {"interval_s": doc.get("interval_s"), "sections": sections}
    if stem == "micro":
        if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
            raise Unusable("no 'benchmarks' list (not pytest-benchmark --benchmark-json output?)")
        out = [b for b in doc["benchmarks"] if isinstance(b, dict) and isinstance(b.get("stats"), dict)]
        return {"benchmarks": out, "machine_info": doc.get("machine_info") or {}, "datetime": doc.get("datetime"),
                "version": doc.get("version")}
    raise AssertionError(stem)


def _load_bench(path: Path, named: bool = False) -> BenchRun:
    """A bench run and whatever of its data files can be used; problems go to its ``warnings``."""
    run = BenchRun(path, {}, named=named)
    try:
        record, name = _record(path)
        run.record = record
        if record.get("kind", "bench") != "bench":
            run.warn(f"partly used {path}: {name} kind is {record.get('kind')!r}, not 'bench'")
    except Unusable as exc:
        run.warn(f"partly used {path}: {exc}; no provenance for this bench run")
    for stem in BENCH_FILES:
        file = path / f"{stem}.json"
        if not file.exists():
            run.missing.append(stem)
            continue
        try:
            run.data[stem] = _normalise_bench(stem, read_json(file, allow_nan=True), str(file), run)
        except Unusable as exc:
            run.warn(f"skipped {file}: {exc}")
            run.missing.append(stem)
    return run


def _is_bench_run(path: Path) -> bool:
    return _is_run(path, RUN_JSON) or any((path / f"{stem}.json").exists() for stem in BENCH_FILES)


def _bench_dirs(parent: Path) -> list[Path]:
    """The run directories in a directory of bench runs (``latest`` and hidden ones aside)."""
    return sorted(p for p in parent.iterdir() if _real_dir(p) and not p.name.startswith(".")
                  and _is_bench_run(p))


def _find_bench(runs_dirs: list[Path], bench_dirs: list[Path] | None, sources: Sources) -> None:
    """Every bench run: those named (a run directory, or a directory of them), else those under <runs>/bench."""
    found: list[tuple[Path, bool]] = []
    if bench_dirs:
        for d in bench_dirs:
            if _is_bench_run(d):
                found.append((d, True))
            else:
                runs = _bench_dirs(d)
                if not runs:
                    sources.warn(f"skipped {d}: neither a bench run directory (no run.json) nor a directory of them")
                found += [(p, False) for p in runs]
    else:
        found = [(p, False) for root in runs_dirs if _real_dir(root / "bench") for p in _bench_dirs(root / "bench")]
    seen: set[Path] = set()
    runs = []
    for path, named in found:
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        run = _load_bench(path, named)
        if run.status != "complete" and not named:
            why = {"running": "still running, or killed before it could record its end",
                   "unknown": "its run.json has no status"}.get(run.status, "did not complete")
            sources.bench_skipped.append(Skipped(path, run.status, why))
        elif not run.sections:
            sources.bench_skipped.append(Skipped(path, run.status, "no usable section data"))
            for w in run.warnings:
                sources.warn(w)
        else:
            runs.append(run)
    sources.bench_runs = sorted(runs, key=lambda r: (r.when, r.path.name), reverse=True)
    for run in sources.bench_used:
        for w in run.warnings:
            sources.warn(w)
        if run.status != "complete":
            sources.warn(f"using {run.path} although its status is {run.status} (named on the command line): its "
                         f"sections may be partial")


def _load_history(path: Path, where: Path, sources: Sources) -> list[hist.Op]:
    try:
        ops = hist.load(path)
        bad = 0
    except RefusedPath as exc:
        raise Malformed(str(exc)) from None
    except (ValueError, TypeError):
        # A crash can leave a half-written last line: use every line that parses.
        ops, bad = [], 0
        with run_files.open_binary(path.parent, path.name, run_files.OPERATIONS_LIMIT) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    ops.append(hist.parse_op(line, f"{path}:{n}"))
                except ValueError:
                    bad += 1
    good = [op for op in ops if isinstance(op.time, (int, float)) and math.isfinite(op.time)]
    bad += len(ops) - len(good)
    if bad:
        sources.warn(f"partly used {where}: {path.name} has {bad} damaged line(s), skipped")
    return good


def _verdict(checked: dict[str, Any] | None, record: dict[str, Any]) -> tuple[str, str, list[dict[str, Any]]]:
    """The run's verdict from what its checkers wrote (verdict.json; schema 1: its journal); ``record`` (run.json)
    says how a run that was never checked ended (``terminated during settle``)."""
    status = record.get("status")
    how = str(status) if status in ("interrupted", "terminated", "failed", "running") else "interrupted"
    if record.get("stopped_during"):
        how += f" during {record['stopped_during']}"
    checks = (checked or {}).get("checks")
    if not isinstance(checks, list) or not checks:
        return "unknown", f"{how}: the run was never checked", []
    checks = [c for c in checks if isinstance(c, dict)]
    if not isinstance(checked.get("summary"), dict):
        return "unknown", f"{how}: no summary among its checks", checks
    # A hand-edited or stale record never reads better than its checks.
    return saved_verdict([CheckResult.from_dict(c) for c in checks], checked.get("verdict")), "", checks


def scenario_name(record: dict[str, Any], folder: str) -> str:
    """A chaos run's scenario as its run.json names it (an older run's: its scenario's name, else its folder's)."""
    scen = record.get("scenario") if isinstance(record.get("scenario"), dict) else {}
    return str(record.get("name") or scen.get("name") or folder)


def _name_of(record: dict[str, Any], part: str) -> str:
    """run.json's ``<part>.name`` (``target``: the agent under test, ``backend``: its engine); "" when absent."""
    value = record.get(part)
    return str(value.get("name") or "") if isinstance(value, dict) else ""


#: the words verdict.json's ``safety`` and ``liveness`` may hold (``not_applicable`` read as ``not applicable``)
SIDES = ("safety", "liveness")
SIDE_VERDICTS = ("pass", "fail", "unknown", "not applicable")


def _diagnosis(checked: dict[str, Any], where: Path,
               sources: Sources) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """verdict.json's ``diagnoses`` that have a string ``line``, and its ``safety`` and ``liveness`` verdicts (one
    that is not a verdict reads as unknown, never pass); what cannot be used is a "partly used" warning."""
    raw = checked.get("diagnoses") or []
    if not isinstance(raw, list):
        sources.warn(f"partly used {where}: {VERDICT_JSON} field 'diagnoses' is not a list; not shown")
        raw = []
    diagnoses = [d for d in raw if isinstance(d, dict) and isinstance(d.get("line"), str)]
    if len(diagnoses) < len(raw):
        sources.warn(f"partly used {where}: {len(raw) - len(diagnoses)} of the {len(raw)} diagnoses in "
                     f"{VERDICT_JSON} have no 'line'; not shown")
    sides = {}
    for side in SIDES:
        value = checked.get(side)
        if value is None:
            continue
        value = "not applicable" if value == "not_applicable" else value
        if value not in SIDE_VERDICTS:
            sources.warn(f"partly used {where}: {VERDICT_JSON} field {side!r} is {value!r}, not one of "
                         f"{', '.join(SIDE_VERDICTS)}; shown as unknown")
            value = "unknown"
        sides[side] = value
    return diagnoses, sides


@dataclass
class _Found:
    """A chaos run directory found, read only as far as choosing among its group's runs needs."""
    path: Path
    folder: str  # its scenario folder's name
    record: dict[str, Any]  # its run.json
    verdict: str  # as its verdict.json says (``_verdict``)

    @property
    def scenario(self) -> str:
        return scenario_name(self.record, self.folder)

    @property
    def group(self) -> tuple[str, str, str]:
        """Its scenario, target and engine: the report shows one run of each group."""
        return self.scenario, _name_of(self.record, "target"), _name_of(self.record, "backend")

    @property
    def rank(self) -> tuple[bool, datetime, str]:
        """Greater is shown first: a complete run before the others (``latest``'s rule), then the newest."""
        return self.record.get("status") == "complete", run_time(self.record, self.path), self.path.name


def _load_chaos(found: _Found, sources: Sources) -> ChaosRun:
    record, path = found.record, found.path
    run = RunDir(path)
    if not run.operations.is_file():
        raise Unusable(f"no {run.operations.name}")
    ops = _load_history(run.operations, path, sources)
    phases = record.get("phases") if isinstance(record.get("phases"), dict) else {}
    end_s = opsmod.end_of_run(ops, phases)
    try:
        checked = run.read_verdict()
    except (OSError, ValueError):
        sources.warn(f"partly used {path}: {VERDICT_JSON} is damaged; the run counts as unchecked")
        checked = None
    checked = checked if isinstance(checked, dict) else None
    verdict, note, checks = _verdict(checked, record)
    summary = checked.get("summary") if checked and isinstance(checked.get("summary"), dict) else None
    from_history = summary is None
    if summary is None:
        nemesis = len(opsmod.fault_windows(ops, end_s))
        summary = table_row(found.scenario, ops, [], verdict=verdict, faults_scheduled=nemesis)
    parts = checked.get("recovery_parts") if checked else None
    diagnoses, sides = _diagnosis(checked, path, sources) if checked else ([], {})
    return ChaosRun(found.scenario, path, record, ops, verdict, note, summary, from_history, checks, end_s,
                    parts if isinstance(parts, dict) else {}, diagnoses, sides)


def _leave_out(path: Path, scenario: str, why: Unusable, verdict: str, sources: Sources) -> None:
    """A chaos run that cannot be used: skipped with a warning, and counted among those left out."""
    sources.skip(path, why)
    sources.left_out.append(LeftOut(path, scenario, MALFORMED if isinstance(why, Malformed) else INCOMPLETE,
                                    verdict))


def _find_chaos(runs_dir: Path, sources: Sources, found: list[_Found]) -> None:
    """Every chaos run directory under ``runs_dir`` (``<scenario>/<stamp>``) whose run.json can be read, into
    ``found``; the others are left out (``_leave_out``)."""
    for scen_dir in sorted(p for p in runs_dir.iterdir() if _real_dir(p) and p.name not in NOT_CHAOS
                           and not p.name.startswith((".", SOAK_PREFIX))):
        for path in sorted(p for p in scen_dir.iterdir() if _real_dir(p) and not p.name.startswith(".")
                           and (_is_run(p, RUN_JSON) or RunDir(p).operations.exists())):
            try:
                record, _ = _record(path)
            except Unusable as exc:
                _leave_out(path, scen_dir.name, exc, "unknown", sources)
                continue
            try:
                checked = RunDir(path).read_verdict()
            except (OSError, ValueError):
                checked = None  # said when the run is shown (``_load_chaos``)
            verdict, _, _ = _verdict(checked if isinstance(checked, dict) else None, record)
            found.append(_Found(path, scen_dir.name, record, verdict))


def _choose_chaos(found: list[_Found], sources: Sources) -> None:
    """Of each group's runs (scenario, target, engine; over every root), the best usable one into ``chaos``; the
    others into ``left_out``. Runs shown with the same scenario are labelled with their target (and engine)."""
    groups: dict[tuple[str, str, str], list[_Found]] = {}
    for f in found:
        groups.setdefault(f.group, []).append(f)
    shown: dict[tuple[str, str, str], ChaosRun] = {}
    for group, runs in sorted(groups.items()):
        ranked = sorted(runs, key=lambda f: f.rank, reverse=True)
        for n, f in enumerate(ranked):
            try:
                run = _load_chaos(f, sources)
            except Unusable as exc:
                _leave_out(f.path, f.scenario, exc, f.verdict, sources)
                continue
            if n:
                sources.notes.append(f"{f.scenario}: using {f.path} because {n} run(s) ranked before it (complete, "
                                     f"or newer) could not be used")
            newest = (f.rank[1], f.path.name)
            sources.left_out += [LeftOut(o.path, o.scenario, OLDER if (o.rank[1], o.path.name) < newest
                                         else UNFINISHED, o.verdict) for o in ranked[n + 1:]]
            shown[group] = run
            break
    for (scenario, target, engine), run in shown.items():
        if sum(1 for other in shown if other[0] == scenario) > 1:
            run.label = f"{scenario} ({', '.join(x for x in (target, engine) if x and x != 'target') or '?'})"
    sources.chaos = list(shown.values())


def _find_fuzz(runs_dir: Path, sources: Sources) -> None:
    parent = runs_dir / "migration_fuzz"
    if not _real_dir(parent):
        return
    for path in _candidates(parent, "results.json"):
        try:
            results = _expect(read_json(path / "results.json"), "an object", path / "results.json")
            _expect(results.get("families"), "an object", path / "results.json", "families")
        except Unusable as exc:
            sources.skip(path, exc)
            continue
        families = {str(k): v for k, v in results["families"].items() if isinstance(v, dict)}
        sources.fuzz = FuzzRun(path, results, families)
        return


def _find_soaks(runs_dir: Path, sources: Sources) -> None:
    """Each scenario's soak: ``latest`` (a soak that ran every seed), else the newest with a soak.json."""
    for parent in sorted(p for p in runs_dir.iterdir() if _real_dir(p) and p.name.startswith(SOAK_PREFIX)):
        for path in _candidates(parent, SOAK_JSON):
            try:
                doc = _expect(read_json(path / SOAK_JSON), "an object", path / SOAK_JSON)
                _expect(doc.get("runs"), "a list", path / SOAK_JSON, "runs")
                try:
                    record, _ = _record(path)
                except Unusable as exc:
                    sources.warn(f"partly used {path}: {exc}")
                    record = {}
            except Unusable as exc:
                sources.skip(path, exc)
                continue
            rows = [r for r in doc["runs"] if isinstance(r, dict) and isinstance(r.get("seed"), int)
                    and isinstance(r.get("verdict"), str)]
            if len(rows) < len(doc["runs"]):
                sources.warn(f"partly used {path}: {len(doc['runs']) - len(rows)} damaged row(s) in {SOAK_JSON}")
            name = str(doc.get("scenario") or parent.name.removeprefix(SOAK_PREFIX))
            for r in rows:  # each seed's run beside the soak's folder (its name from the tree, not from soak.json)
                r["path"] = _seed_run_dir(r, runs_dir / parent.name.removeprefix(SOAK_PREFIX))
                r["recovery"], r["diagnoses"], r["sides"] = _seed_verdict(r["path"], sources)
            sources.soaks.append(SoakRun(name, path, record, doc, rows))
            break


def _seed_run_dir(row: dict[str, Any], scenario_dir: Path) -> Path | None:
    """A soak seed's run directory: the one of the name soak.json's ``run_dir`` ends in, under ``scenario_dir`` (the
    soak's scenario folder in the same runs root), when it is a real directory there. soak.json is run data: a path
    it names elsewhere is never followed. None when there is none."""
    where = row.get("run_dir")
    name = PurePosixPath(where.replace("\\", "/")).name if isinstance(where, str) else ""
    if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z_.-]*", name) or not _real_dir(scenario_dir):
        return None
    path = scenario_dir / name
    return path if _real_dir(path) else None


def _seed_verdict(path: Path | None,
                  sources: Sources) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, str]]:
    """A soak seed's recovery and its parts, diagnoses and side verdicts (``_diagnosis``), from its run's
    verdict.json (``path``: ``_seed_run_dir``); empty when there is none to read."""
    if path is None:
        return {}, [], {}
    try:
        verdict = RunDir(path).read_verdict()
    except (OSError, ValueError, RunDirError, RefusedPath):
        return {}, [], {}
    if not isinstance(verdict, dict):
        return {}, [], {}
    rec, parts = verdict.get("recovery"), verdict.get("recovery_parts")
    return ({"worst_s": rec.get("worst_s") if isinstance(rec, dict) else None,
             "held_s": parts.get("held_s") if isinstance(parts, dict) else None,
             "parts": parts.get("parts") if isinstance(parts, dict) else None}, *_diagnosis(verdict, path, sources))


def _newest(runs: list[Any], what: str, sources: Sources) -> Any:
    """Of one kind's runs found under several roots, the newest (by directory name, a UTC stamp); notes the rest."""
    best = max(runs, key=lambda r: r.path.name)
    for r in runs:
        if r is not best:
            sources.notes.append(f"{what}: using {best.path}, the newest of the runs roots; not {r.path}")
    return best


def load(runs_dirs: Path | list[Path], bench_dirs: Path | list[Path] | None = None) -> Sources:
    """Every usable run under ``runs_dirs`` (each must exist), bench runs from ``bench_dirs`` when given;
    problems become warnings, never exceptions."""
    roots = [runs_dirs] if isinstance(runs_dirs, Path) else list(runs_dirs)
    benches = [bench_dirs] if isinstance(bench_dirs, Path) else bench_dirs
    sources = Sources(roots)
    try:
        _find_bench(roots, benches, sources)
    except OSError as exc:
        sources.warn(f"skipped the bench runs: {exc}")
    chaos: list[_Found] = []
    soaks: dict[str, list[SoakRun]] = {}
    fuzz: list[FuzzRun] = []
    for root in roots:
        one = Sources([root])
        for what, find in (("chaos", lambda r, s: _find_chaos(r, s, chaos)), ("migration_fuzz", _find_fuzz),
                           ("soak", _find_soaks)):
            try:
                find(root, one)
            except OSError as exc:
                one.warn(f"skipped the {what} runs under {root}: {exc}")
        sources.warnings += one.warnings
        sources.malformed += one.malformed
        sources.left_out += one.left_out
        for r in one.soaks:
            soaks.setdefault(r.scenario, []).append(r)
        fuzz += [one.fuzz] if one.fuzz else []
    _choose_chaos(chaos, sources)
    sources.soaks = [_newest(runs, f"soak {name}", sources) for name, runs in sorted(soaks.items())]
    sources.fuzz = _newest(fuzz, "migration_fuzz", sources) if fuzz else None
    seeds = {os.path.abspath(r["path"]) for soak in sources.soaks for r in soak.runs if r.get("path") is not None}
    sources.left_out = [x for x in sources.left_out if os.path.abspath(x.path) not in seeds]  # shown as seeds
    return sources


def safe_name(text: str) -> str:
    """A file-name-safe form of a scenario or series name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "unnamed"
