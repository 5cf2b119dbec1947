"""Chaos in CI: shards, the summary JSON, JUnit XML, and merging what several CI jobs ran.

* ``shard(items, k, n)``: the items (scenario x seed) CI job ``k`` of ``n`` runs. Round-robin over the items in
  their canonical order (the suite's scenario order, then the seeds): the same split on every machine, each
  item in exactly one shard, shard sizes within one of each other.
* ``CiRecord``: what a suite or a soak writes for CI while it runs: the summary JSON and the JUnit XML,
  rewritten after every run, so a job stopped by its timeout (SIGTERM) still leaves both, saying which runs
  did not finish and which never started.
* ``merge(dirs)``: ``python -m chaos summary DIR [DIR ...]`` (``summary_command``): the summaries and run
  directories gathered from several CI jobs (their artefacts) as one summary, with every planned run that is
  missing or incomplete named.

The summary JSON (``kind`` ``chaos-summary``; RUN_DIRECTORY.md) has one row per planned run: ``scenario``,
``seed``, ``verdict`` (pass, fail, unknown, error), ``status`` (complete, failed, interrupted, terminated,
running, not_run, missing, skipped: not run because its cluster cannot have its faults, e.g. a
server restart on an external cluster; never a pass, never a failure), ``checkers`` (checker -> verdict), ``non_pass``, ``wall_s``, ``run_dir`` (relative
to the summary file's directory, so the pair can be moved together), ``reproduce`` and ``error``.

Standard library only (with ``harness``).
"""

from __future__ import annotations

import os
import re
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.durable_files import write_atomic
from harness.printable import printable
from harness.printable import table as format_table
from harness.run_files import RefusedPath
from harness.rundir import LATEST, RUN_JSON, SCHEMA, STOPPED, RunDir, RunDirError, describe, expect, expect_fields, read_json, utc_now, write_json
from harness.commands import tool
from chaos.checker.verdict import saved_verdict
from harness.verdict import FAIL, PASS, UNKNOWN, CheckResult

ERROR = "error"
SUMMARY_KIND = "chaos-summary"
#: the default files a suite writes under its --out, and a soak in its own directory
SUITE_SUMMARY, SUITE_JUNIT = "suite-summary.json", "suite-junit.xml"
SOAK_SUMMARY, SOAK_JUNIT = "summary.json", "junit.xml"
#: a planned run that has not ended (yet): never started, or absent from every input of a merge
NOT_RUN, MISSING = "not_run", "missing"
#: a run directory whose files are malformed or cannot be read: an error, never a pass
UNREADABLE = "unreadable"
#: a planned run its cluster cannot have (a server restart of an external cluster): neither pass nor failure
SKIPPED = "skipped"
#: directories a search for runs and summaries need not enter: a run directory's own, and ``latest`` (a
#: symlink, but a copy of the run it points at once a CI artefact upload has followed it)
_NOT_RUNS = {"state", "logs", "event_histories", "histories", LATEST}


# --------------------------------------------------------------------------------------------------- shards


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> (2, 4); ValueError naming what is wrong."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not m:
        raise ValueError(f"--shard {text!r}: write K/N, e.g. 2/4 (job 2 of 4)")
    k, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 1 <= k <= n:
        raise ValueError(f"--shard {text!r}: K must be 1 to N (N at least 1), e.g. 1/4 ... 4/4")
    return k, n


def shard(items: Sequence[Any], k: int, n: int) -> list[Any]:
    """The items shard ``k`` of ``n`` runs: every ``n``-th one from the ``k``-th, in their order."""
    return list(items[k - 1::n])


# -------------------------------------------------------------------------------------------------- rows


def key(row: dict[str, Any]) -> tuple[str, int]:
    return str(row.get("scenario")), int(row.get("seed", 0))


def planned_row(scenario: str, seed: int, status: str = NOT_RUN, reproduce: str = "") -> dict[str, Any]:
    """A planned run with no result: never started (``not_run``) or not found (``missing``)."""
    return {"scenario": scenario, "seed": seed, "verdict": UNKNOWN, "status": status, "checkers": {},
            "non_pass": [], "wall_s": None, "run_dir": None, "reproduce": reproduce, "error": None}


def outcome_row(o: Any) -> dict[str, Any]:
    """A row from a suite's or soak's ``Outcome`` (``chaos.runner``): a run that ended, one way or another."""
    return {"scenario": o.label, "seed": o.seed, "verdict": o.verdict,
            "status": "failed" if o.verdict == ERROR else "complete",
            "checkers": {c.name: c.verdict for c in o.checks},
            "non_pass": [{"check": c.name, "verdict": c.verdict, "summary": c.summary} for c in o.non_pass],
            "wall_s": round(o.wall_s, 1), "run_dir": str(o.run_dir) if o.run_dir else None,
            "reproduce": o.reproduce, "error": o.error, **dict(getattr(o, "properties", None) or {}),
            "diagnoses": list(getattr(o, "diagnoses", None) or [])}


def run_dir_row(path: Path) -> dict[str, Any] | None:
    """A row read from a chaos run directory's own files (None: not a chaos run directory). The verdict is
    ``verdict.json``'s (``chaos.checker.verdict.saved_verdict``: never better than its checks), ``error`` for a run that
    failed, ``unknown`` for one never checked; the status is ``run.json``'s."""
    run = RunDir(path)
    try:
        record = run.read_run()
        checked = run.read_verdict()
    except (RunDirError, RefusedPath, OSError) as exc:
        why = exc if isinstance(exc, (RunDirError, RefusedPath)) else f"{path}: {exc.strerror or exc}"
        return {**planned_row(path.parent.name, 0, UNREADABLE), "verdict": ERROR, "run_dir": str(path),
                "error": f"unreadable: {why}"}
    if not isinstance(record, dict) or record.get("kind", "chaos") != "chaos" or not (record or run.operations.exists()):
        return None
    status = str(record.get("status") or "running")
    checks = [CheckResult.from_dict(c) for c in (checked or {}).get("checks") or []]
    if status == "failed":
        verdict = ERROR
    elif checks:
        verdict = saved_verdict(checks, (checked or {}).get("verdict"))
    else:
        verdict = UNKNOWN
    error = record.get("error")
    if status == "running":
        error = "still running, or killed outright (SIGKILL): it never recorded an end"
    elif status in STOPPED:  # e.g. "terminated during faults: never checked"
        during = record.get("stopped_during")
        error = status + (f" during {during}" if during else "") + ("" if checks else ": never checked")
    seed = record.get("seed")
    return {"scenario": str(record.get("name") or path.parent.name), "seed": seed if isinstance(seed, int) else 0,
            "verdict": verdict, "status": status, "checkers": {c.name: c.verdict for c in checks},
            "non_pass": [{"check": c.name, "verdict": c.verdict, "summary": c.summary} for c in checks
                         if c.verdict in (FAIL, UNKNOWN)],
            "wall_s": record.get("wall_s"), "run_dir": str(path), "reproduce": record.get("reproduce") or "",
            "error": error, "started": record.get("started"),
            **{k: str(checked[k]) for k in ("safety", "liveness") if isinstance(checked, dict) and k in checked},
            "diagnoses": [str(d.get("line")) for d in (checked or {}).get("diagnoses") or [] if isinstance(d, dict)]}


def passed(row: dict[str, Any]) -> bool:
    return row.get("verdict") == PASS and row.get("status") == "complete"


def incomplete(row: dict[str, Any]) -> bool:
    """A run that did not end with a verdict of its own: stopped, never started, not found, still running (a
    skipped one was never meant to run)."""
    return row.get("status") not in ("complete", "failed", SKIPPED, UNREADABLE)


def skipped(row: dict[str, Any]) -> bool:
    return row.get("status") == SKIPPED


def totals(rows: list[dict[str, Any]]) -> dict[str, int]:
    out = {v: sum(1 for r in rows if r.get("verdict") == v and not incomplete(r)) for v in (PASS, FAIL, UNKNOWN, ERROR)}
    out["incomplete"] = sum(1 for r in rows if incomplete(r))
    out[SKIPPED] = sum(1 for r in rows if skipped(r))
    return out


def reason(row: dict[str, Any]) -> str:
    """One line: why this run did not pass."""
    if skipped(row):
        return f"skipped: {row.get('error') or '?'}"
    if incomplete(row):
        what = {NOT_RUN: "not run: the run stopped before it started",
                MISSING: "missing: planned, but no input has its run"}.get(row["status"])
        return what or (row.get("error") or row["status"])
    if row.get("verdict") == ERROR:
        lines = (row.get("error") or "").strip().splitlines()
        return f"error: {lines[0] if lines else '?'}"
    bad = row.get("non_pass") or []
    if not bad:
        return str(row.get("verdict"))
    return f"{row['verdict']}: " + "; ".join(f"{c['check']}: {c['verdict']}: {c['summary']}" for c in bad)


# ----------------------------------------------------------------------------------------- files: summary


def _relative(path: str | None, base: Path) -> str | None:
    if not path:
        return None
    return os.path.relpath(Path(path).resolve(), base.resolve())


def summary_doc(rows: list[dict[str, Any]], *, command: str, status: str, wall_s: float, base: Path,
                shard_spec: str | None = None, all_items: list[tuple[str, int]] | None = None,
                extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary JSON's content; ``run_dir`` relative to ``base`` (the summary file's directory)."""
    return {"schema": SCHEMA, "kind": SUMMARY_KIND, "command": command, "status": status,
            "written": utc_now(), "wall_s": round(wall_s, 1), "shard": shard_spec,
            "all_items": [list(i) for i in all_items] if shard_spec and all_items is not None else None,
            "totals": totals(rows), "all_passed": any(passed(r) for r in rows) and all(passed(r) or skipped(r) for r in rows),
            **(extra or {}),
            "runs": [{**{k: v for k, v in r.items() if k != "started"}, "run_dir": _relative(r.get("run_dir"), base)}
                     for r in rows]}


def junit_xml(rows: list[dict[str, Any]], suite_name: str, wall_s: float, base: Path) -> bytes:
    """JUnit XML: one testcase per run; fail/unknown (and incomplete) a ``failure`` with the failing checkers and
    the reproduce command, an error an ``error``, a run never started ``skipped``."""
    root = ET.Element("testsuites", name="chaos")
    counts = {"failures": 0, "errors": 0, "skipped": 0}
    suite = ET.SubElement(root, "testsuite", name=suite_name, timestamp=utc_now(), time=f"{wall_s:.1f}")
    for r in rows:
        case = ET.SubElement(suite, "testcase", classname=f"chaos.{r['scenario']}",
                             name=f"{r['scenario']} seed {r['seed']}", time=f"{float(r.get('wall_s') or 0):.1f}")
        run_dir = _relative(r.get("run_dir"), base)
        body = "\n".join(line for line in (
            *(f"{c['check']}: {c['verdict']}: {c['summary']}" for c in r.get("non_pass") or []),
            *([r["error"]] if r.get("error") else []),
            *([f"safety: {r['safety']}; liveness: {r['liveness']}"] if r.get("safety") and r.get("liveness") else []),
            *(f"diagnosis: {d}" for d in r.get("diagnoses") or []),
            f"reproduce: {r.get('reproduce') or '(unknown)'}",
            f"run dir: {run_dir or '(none)'}") if line)
        if r.get("safety") or r.get("liveness"):  # the two verdicts apart, for a CI that gates on one
            props = ET.SubElement(case, "properties")
            for name in ("safety", "liveness"):
                if r.get(name):
                    ET.SubElement(props, "property", name=name, value=str(r[name]))
        if r.get("status") in (NOT_RUN, SKIPPED):
            ET.SubElement(case, "skipped", message=reason(r))
            counts["skipped"] += 1
        elif passed(r):
            ET.SubElement(case, "system-out").text = body
        elif r.get("verdict") == ERROR and not incomplete(r):
            ET.SubElement(case, "error", message=reason(r)[:500], type=ERROR).text = body
            counts["errors"] += 1
        else:
            kind = r["status"] if incomplete(r) else r["verdict"]
            ET.SubElement(case, "failure", message=reason(r)[:500], type=kind).text = body
            counts["failures"] += 1
    for element in (root, suite):
        element.set("tests", str(len(rows)))
        for name, n in counts.items():
            element.set(name, str(n))
    for element in root.iter():  # run data may hold anything; XML 1.0 cannot hold most controls, even escaped
        element.text = None if element.text is None else printable(element.text, keep="\n\t")
        for name, value in element.attrib.items():
            element.set(name, printable(value, keep="\n\t"))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def write_outputs(rows: list[dict[str, Any]], summary_path: Path | None, junit_path: Path | None, *,
                  command: str, status: str, wall_s: float, suite_name: str, **fields: Any) -> None:
    """Write the summary JSON and the JUnit XML (atomically; either may be None: not written)."""
    if summary_path is not None:
        summary_path.parent.mkdir(parents=True, exist_ok=True)
        write_json(summary_path, summary_doc(rows, command=command, status=status, wall_s=wall_s,
                                             base=summary_path.parent, **fields))
    if junit_path is not None:
        junit_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(junit_path, junit_xml(rows, suite_name, wall_s, junit_path.parent))


@dataclass
class CiRecord:
    """A suite's or soak's CI files, rewritten as it goes: every planned run, each with its result once it ended,
    ``running`` (with its run directory) while it runs, ``not_run`` before it starts."""

    command: str
    suite_name: str
    planned: list[tuple[str, int]]
    summary_path: Path | None
    junit_path: Path | None
    shard_spec: str | None = None
    all_items: list[tuple[str, int]] | None = None

    def __post_init__(self) -> None:
        self.started = time.monotonic()
        self.rows: dict[tuple[str, int], dict[str, Any]] = {i: planned_row(*i) for i in self.planned}
        self.status = "running"

    def running(self, scenario: str, seed: int, run_dir: Path) -> None:
        self.rows[(scenario, seed)] = {**planned_row(scenario, seed, "running"), "run_dir": str(run_dir)}
        self.save()

    def skipped(self, scenario: str, seed: int, why: str) -> None:
        """A planned run its cluster cannot have: JUnit ``skipped``, never a pass."""
        self.rows[(scenario, seed)] = {**planned_row(scenario, seed, SKIPPED), "verdict": SKIPPED, "error": why}
        self.save()

    def ended(self, outcome: Any) -> None:
        self.rows[(outcome.label, outcome.seed)] = outcome_row(outcome)
        self.save()

    def finish(self, status: str) -> None:
        """The suite or soak ended: ``complete``, or stopped (a run under way then is re-read from its directory,
        which says how it ended)."""
        self.status = status
        for k, row in self.rows.items():
            if row["status"] == "running" and row.get("run_dir"):
                self.rows[k] = run_dir_row(Path(row["run_dir"])) or row
        self.save()

    def save(self) -> None:
        write_outputs(list(self.rows.values()), self.summary_path, self.junit_path, command=self.command,
                      status=self.status, wall_s=time.monotonic() - self.started, suite_name=self.suite_name,
                      shard_spec=self.shard_spec, all_items=self.all_items)

    def paths(self) -> str:
        return ", ".join(str(p) for p in (self.summary_path, self.junit_path) if p is not None)


# ------------------------------------------------------------------------------------------------- merging


@dataclass
class Merged:
    rows: list[dict[str, Any]]
    notes: list[str]
    sources: list[str]
    #: one line per malformed run directory or summary (its rows are errors; a summary's are left out)
    unreadable: list[str]


def _walk(root: Path) -> tuple[list[Path], list[Path]]:
    """(summary files, chaos run directories) under ``root`` (itself included)."""
    summaries: list[Path] = []
    runs: list[Path] = []
    for here, dirs, files in os.walk(root, followlinks=False):
        path = Path(here)
        if (RUN_JSON in files or "journal.json" in files) and run_dir_row(path) is not None:
            runs.append(path)  # a chaos run directory: nothing further inside
            dirs[:] = []
            continue
        dirs[:] = sorted(d for d in dirs if d not in _NOT_RUNS and not d.startswith(".")
                         and not (path / d).is_symlink())
        for f in sorted(files):
            if f.endswith("summary.json"):
                try:
                    doc = read_json(path / f)
                except (OSError, ValueError):
                    continue
                if isinstance(doc, dict) and doc.get("kind") == SUMMARY_KIND and doc.get("command") != "summary":
                    summaries.append(path / f)
    return summaries, runs


def merge(inputs: Iterable[Path]) -> Merged:
    """Every planned run of every suite or soak summary under ``inputs``, each read from its run directory
    when it is there; an input with no summary contributes every chaos run directory under it (the newest of
    each scenario and seed). A planned run found nowhere is ``missing``; so is every run of a shard whose
    summary is absent (when another shard of the same split says what it held)."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    notes: list[str] = []
    sources: list[str] = []
    unreadable: list[str] = []
    splits: dict[tuple[tuple[str, int], ...], dict[str, Any]] = {}  # the items of a split -> shards seen

    def take(row: dict[str, Any], where: str) -> None:
        k = key(row)
        old = rows.get(k)
        if old is not None and old.get("run_dir") and row.get("run_dir") and old["run_dir"] != row["run_dir"]:
            newer = max(old, row, key=lambda r: str(r.get("started") or ""))
            notes.append(f"{k[0]} seed {k[1]}: two runs ({old['run_dir']}, {row['run_dir']}); using the newer, "
                         f"{newer['run_dir']}")
            rows[k] = newer
        elif old is None or old.get("run_dir") is None:
            rows[k] = row

    # Each input resolved once; a run directory a summary names is read only if it lies inside one of them.
    roots = [root.resolve() for root in inputs]
    for root in roots:
        summaries, runs = _walk(root)
        listed: set[Path] = set()
        unreadable += [row["error"] for p in runs if (row := run_dir_row(p)) and row["status"] == UNREADABLE]
        for s in summaries:
            try:
                doc = _summary_doc(s)
            except (OSError, RunDirError, RefusedPath) as exc:
                unreadable.append(f"unreadable: {exc}")
                continue
            sources.append(str(s))
            if doc.get("status") != "complete":
                notes.append(f"{s}: the {doc.get('command', 'suite')} ended {doc.get('status')}, not complete")
            for r in doc.get("runs") or []:
                if not isinstance(r, dict) or "scenario" not in r:
                    continue
                path = (s.parent / r["run_dir"]).resolve() if r.get("run_dir") else None
                among = path is not None and path.is_dir() and any(path.is_relative_to(root) for root in roots)
                found = run_dir_row(path) if among else None
                if path is not None:
                    listed.add(path)
                if found is None:
                    found = {**planned_row(str(r["scenario"]), int(r.get("seed", 0)), str(r.get("status") or MISSING)),
                             **{k: r.get(k) for k in ("verdict", "checkers", "non_pass", "wall_s", "reproduce",
                                                      "error", "safety", "liveness", "diagnoses")
                                if r.get(k) is not None}}
                    if path is not None:
                        why = "is not among the inputs" if not among else "has no chaos run.json"
                        found["error"] = f"{found.get('error') or ''} (its run directory {path} {why})".strip()
                take(found, str(s))
            if doc.get("shard") and isinstance(doc.get("all_items"), list):
                items = tuple((str(a), int(b)) for a, b in doc["all_items"])
                k, n = parse_shard(doc["shard"])
                splits.setdefault(items, {"n": n, "seen": set()})["seen"].add(k)
        if summaries:
            unlisted = [p for p in runs if p.resolve() not in listed]
            if unlisted:
                notes.append(f"{root}: {len(unlisted)} run director{'y' if len(unlisted) == 1 else 'ies'} not in "
                             "any summary there, left out")
        else:
            sources.append(str(root))
            newest: dict[tuple[str, int], dict[str, Any]] = {}
            for p in runs:
                row = run_dir_row(p)
                if row is not None and str(row.get("started") or "") >= str(newest.get(key(row), {}).get("started")
                                                                                 or ""):
                    newest[key(row)] = row
            for row in newest.values():
                take(row, str(root))
    for items, split in splits.items():
        absent = [k for k in range(1, split["n"] + 1) if k not in split["seen"]]
        for k in absent:
            notes.append(f"shard {k}/{split['n']}: no summary among the inputs; its runs are missing")
            for item in shard(list(items), k, split["n"]):
                rows.setdefault(item, planned_row(*item, MISSING))
    return Merged(sorted(rows.values(), key=key), notes, sources, unreadable)


#: a summary's fields as ``merge`` reads them, and each of its runs' (``planned_row``)
_SUMMARY_FIELDS = {"status": "a string or null", "command": "a string or null", "runs": "a list or null",
                   "shard": "a string or null", "all_items": "a list or null"}
_SUMMARY_RUN_FIELDS = {"scenario": "a string", "seed": "an integer", "run_dir": "a string or null",
                       "status": "a string or null", "verdict": "a string or null", "checkers": "an object or null",
                       "non_pass": "a list or null", "wall_s": "a number or null", "reproduce": "a string or null",
                       "error": "a string or null", "safety": "a string or null", "liveness": "a string or null",
                       "diagnoses": "a list or null"}


def _summary_doc(path: Path) -> dict[str, Any]:
    """A suite's or soak's summary JSON as ``merge`` reads it, or ``RunDirError`` naming the field."""
    doc = expect(read_json(path), "an object", path)
    expect_fields(doc, _SUMMARY_FIELDS, path)
    for i, r in enumerate(doc.get("runs") or []):
        expect_fields(expect(r, "an object", path, f"runs[{i}]"), _SUMMARY_RUN_FIELDS, path, f"runs[{i}].")
    if doc.get("shard"):
        try:
            parse_shard(doc["shard"])
        except ValueError:
            raise RunDirError(path, "K/N", describe(doc["shard"]), "shard") from None
    for i, item in enumerate(doc.get("all_items") or []):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], int)
                and not isinstance(item[1], bool)):
            raise RunDirError(path, "[scenario, seed]", describe(item), f"all_items[{i}]")
    return doc


#: the merged verdict table's columns (``harness.printable.table``)
MERGED_COLUMNS = [("scenario", 34), ("seed", 5, ">"), ("verdict", 8), ("status", 11), ("wall_s", 7, ">"),
                  ("run dir", 0)]


def table(rows: list[dict[str, Any]]) -> str:
    """The merged verdict table: one line per run."""
    return format_table(MERGED_COLUMNS, ([r["scenario"], r["seed"], r["verdict"], r["status"],
                                          f"{r['wall_s']:.0f}" if isinstance(r.get("wall_s"), (int, float)) else "-",
                                          r.get("run_dir") or "-"] for r in rows))


def summary_command(dirs: list[Path], summary_path: Path, junit_path: Path) -> int:
    """``python -m chaos summary DIR ...``: merge CI jobs' runs, print the table and what did not pass, write the
    merged summary JSON and JUnit XML; 0 only if every planned run passed, 2 if nothing could be read. Verdicts
    are read as the run directories wrote them, not authenticated: re-check with ``chaos check`` where untrusted."""
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        print(f"{tool('chaos')} summary: not a directory: {', '.join(missing)}; give run roots (runs/), artefact "
              "folders or run directories", file=sys.stderr)
        return 2
    merged = merge(dirs)
    if not merged.rows:
        for problem in merged.unreadable or [f"no chaos runs or suite/soak summaries under "
                                             f"{', '.join(map(str, dirs))}"]:
            print(f"{tool('chaos')} summary: {problem}", file=sys.stderr)
        return 2
    rows = merged.rows
    print(table(rows))
    t = totals(rows)
    print(f"\n{len(rows)} run(s) from {len(merged.sources)} source(s): "
          + ", ".join(f"{n} {v}" for v, n in t.items()))
    bad = [r for r in rows if not passed(r) and not skipped(r)]
    for r in bad:
        print(printable(f"  {r['scenario']} seed {r['seed']}: {reason(r)}"
                        + (f"; reproduce with: {r['reproduce']}" if r.get("reproduce") else "")))
    unfinished = [r for r in rows if incomplete(r)]
    if unfinished:
        print(printable(f"incomplete: {len(unfinished)} run(s) did not finish: "
                        + ", ".join(f"{r['scenario']} seed {r['seed']} ({r['status']})" for r in unfinished)))
    for note in merged.notes:
        print(printable(f"note: {note}"))
    for problem in merged.unreadable:  # each counted above as not passed: never a pass
        print(printable(f"{tool('chaos')} summary: {problem}"), file=sys.stderr)
    write_outputs(rows, summary_path, junit_path, command="summary", status="complete", wall_s=sum(
        float(r.get("wall_s") or 0) for r in rows), suite_name="chaos (merged)", extra={"sources": merged.sources,
                                                                                     "notes": merged.notes})
    print(f"CI files: {summary_path}, {junit_path}")
    if all(r["status"] == UNREADABLE for r in rows):
        return 2  # nothing readable at all
    return 0 if not bad and not merged.unreadable and any(passed(r) for r in rows) else 1
