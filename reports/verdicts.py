"""The report's lead: which scenario passed or failed on which engine, placement and seed, and why each one that did
not pass did not.

Contract: ``runs(sources, anchors)`` lists every chaos run the report read (``Sources.chaos``, one per scenario) and
every seed of every soak (``Sources.soaks``) as a ``VerdictRun``: its scenario (without the ``@engine`` its name may
carry), its column (engine and worker placement, from run.json's ``backend``; with the machine's label when the runs
come from more than one machine), its seed, its verdict as its run dir says it (pass, fail, unknown, error; anything
else is unknown, never pass), the checks that did not pass, its reproduce command as recorded, and its run directory
(only one the report read), and what its verdict.json adds where present: its diagnoses (cause and fix, one line
each) and its safety and liveness verdicts. ``grid`` lays them out; each cell links inside the report: a run that did
not pass to its entry among the failures (``failure_anchor``), one that passed to its details (``detail_anchor``).
``machine_groups`` states each machine and its versions once. ``left_out_line`` and ``left_out_table`` count and list
the chaos runs found and not shown (``Sources.left_out``), naming every one that failed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.engines import rank as engine_rank
from reports.document import Chip, Grid, GridRow
from reports.sources import (INCOMPLETE, MALFORMED, OLDER, UNFINISHED, ChaosRun, LeftOut, SoakRun, Sources,
                             safe_name)
from reports.tables import DASH, Table

#: each verdict's words in the report (FAIL in capitals: the one a reader looks for)
WORDS = {"pass": "pass", "fail": "FAIL", "unknown": "unknown", "error": "error"}
#: a run's diagnoses shown in the report; the rest are counted ("+N more")
DIAGNOSES_SHOWN = 10


def machine_text(m: Any) -> str:
    if not isinstance(m, dict) or not m:
        return "unknown"
    parts = [f"{m['cores']} cores" if m.get("cores") else None,
             f"{m['memory_gb']} GB RAM" if m.get("memory_gb") else None, m.get("cpu"), m.get("platform")]
    return ", ".join(str(p) for p in parts if p) or "unknown"


def versions_text(m: Any) -> str:
    if not isinstance(m, dict):
        return "unknown"
    parts = [f"Python {m['python']}" if m.get("python") else None,
             f"temporalio {m['temporalio']}" if m.get("temporalio") else None,
             str(m["temporal_cli"]) if m.get("temporal_cli") else None]
    return ", ".join(p for p in parts if p) or "unknown"


def _about_line(d: dict[str, Any]) -> str:
    """``about: line`` (the harness's lines already begin with what they are about: not said twice), bounded."""
    about, line = str(d.get("about") or "?")[:60], str(d["line"])[:1200]
    return line if line.startswith(f"{about}: ") else f"{about}: {line}"


@dataclass
class MachineGroup:
    """Runs that ran on one machine with one set of versions."""
    label: str  # "A", "B", ...: only shown when there is more than one group
    machine: str
    versions: str
    runs: list[str] = field(default_factory=list)  # what ran there: scenario names, "soak of X"


def machine_groups(sources: Sources) -> list[MachineGroup]:
    """The machines (and versions) the chaos runs and soaks ran on, in the order they are first met."""
    groups: dict[tuple[str, str], MachineGroup] = {}
    for what, record in [(r.label, r.record) for r in sources.chaos] + [
            (f"soak of {s.scenario}", s.record) for s in sources.soaks]:
        m = record.get("machine")
        key = (machine_text(m), versions_text(m))
        if key not in groups:
            groups[key] = MachineGroup(chr(ord("A") + len(groups)) if len(groups) < 26 else str(len(groups) + 1),
                                       *key)
        groups[key].runs.append(what)
    return list(groups.values())


def group_of(record: dict[str, Any], groups: list[MachineGroup]) -> str:
    m = record.get("machine")
    key = (machine_text(m), versions_text(m))
    return next((g.label for g in groups if (g.machine, g.versions) == key), "?")


@dataclass
class VerdictRun:
    """One run in the grid: a chaos run, or one seed of a soak."""
    scenario: str  # the row's scenario, without @engine
    column: str  # engine · placement (· machine X)
    seed: int | None
    verdict: str  # pass | fail | unknown | error
    note: str  # why it is unknown, when the verdict did not come from its checks; a planted bug
    problems: list[tuple[str, str, str]]  # (check, verdict, summary) of each check that did not pass
    reproduce: str
    path: Path | None  # its run directory (None: a soak seed that failed before it had one)
    soak: SoakRun | None = None
    detail_anchor: str = ""  # its details in the report
    failure_anchor: str = ""  # its entry among the failures (runs that did not pass)
    diagnoses: list[dict[str, Any]] = field(default_factory=list)  # verdict.json's, each with a string ``line``
    sides: dict[str, str] = field(default_factory=dict)  # "safety", "liveness" -> its verdict, where recorded
    diagnoses_anchor: str = ""  # its diagnoses in the report (when it has any)

    @property
    def word(self) -> str:
        return WORDS.get(self.verdict, "unknown")

    @property
    def sides_text(self) -> str:
        """``safety pass, liveness FAIL`` ("" when verdict.json has neither)."""
        return ", ".join(f"{side} {WORDS.get(v, v)}" for side, v in self.sides.items())

    @property
    def diagnosis_lines(self) -> list[str]:
        """Its diagnoses as the report lists them: what each is about and its line, the first ``DIAGNOSES_SHOWN``,
        then how many more."""
        lines = [_about_line(d) for d in self.diagnoses[:DIAGNOSES_SHOWN]]
        more = len(self.diagnoses) - DIAGNOSES_SHOWN
        return lines + ([f"+{more} more (in its verdict.json)"] if more > 0 else [])

    @property
    def href(self) -> str:
        return "#" + (self.failure_anchor if self.verdict != "pass" else self.detail_anchor)


class Anchors:
    """Unique ids for the report's HTML and Markdown, made from run names (never clashing, whatever the names)."""

    def __init__(self) -> None:
        self.used: set[str] = set()
        self.by_key: dict[tuple[str, ...], str] = {}

    def __call__(self, *key: str) -> str:
        if key not in self.by_key:
            base = safe_name("-".join(key)).lower()
            name, n = base, 2
            while name in self.used:
                name, n = f"{base}-{n}", n + 1
            self.used.add(name)
            self.by_key[key] = name
        return self.by_key[key]


def column_of(record: dict[str, Any], name: str) -> str:
    """Engine and placement as run.json's ``backend`` says (an older run: the @engine of its name)."""
    backend = record.get("backend") if isinstance(record.get("backend"), dict) else {}
    engine = backend.get("name") or (name.split("@", 1)[1].split("~", 1)[0] if "@" in name else None)
    if engine == "target":
        target = record.get("target") if isinstance(record.get("target"), dict) else {}
        engine = f"target {target.get('name')}" if target.get("name") else "target"
    placement = backend.get("workers")
    text = " · ".join(str(p) for p in (engine or "engine not recorded", placement) if p)
    return text


def scenario_of(name: str) -> str:
    """The scenario without its engine: kill_mid_turn@checkpoint~defaults -> kill_mid_turn~defaults."""
    return re.sub(r"@[^~]*", "", name) or name


def planted_note(record: dict[str, Any]) -> str:
    """A run with a planted bug (``chaos planted``) is meant to fail: say which bug, so a FAIL reads as caught."""
    scen = record.get("scenario") if isinstance(record.get("scenario"), dict) else {}
    cluster = scen.get("cluster") if isinstance(scen.get("cluster"), dict) else {}
    bugs = [str(m) for m in cluster.get("mutations") or [] if isinstance(m, str)]
    return f"planted bug {', '.join(bugs)}: must not pass" if bugs else ""


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _chaos_run(run: ChaosRun, column: str, anchors: Anchors) -> VerdictRun:
    problems = [(str(c.get("name", "?")), str(c.get("verdict", "?")), str(c.get("summary", "")))
                for c in run.checks if c.get("verdict") in ("fail", "unknown")]
    notes = [n for n in (run.verdict_note, planted_note(run.record)) if n]
    key = (run.path.parent.name, run.path.name)
    return VerdictRun(scenario_of(run.scenario), column, _int(run.record.get("seed")),
                      run.verdict if run.verdict in WORDS else "unknown", "; ".join(notes), problems,
                      str(run.record.get("reproduce") or "?"), run.path, detail_anchor=anchors("run", *key),
                      failure_anchor=anchors("failed", *key), diagnoses=run.diagnoses, sides=run.sides,
                      diagnoses_anchor=anchors("diagnoses", *key))


def _soak_seed(soak: SoakRun, row: dict[str, Any], column: str, anchors: Anchors) -> VerdictRun:
    verdict = row["verdict"] if row["verdict"] in WORDS else "unknown"
    problems = [(str(c.get("check", "?")), str(c.get("verdict", "?")), str(c.get("summary", "")))
                for c in row.get("non_pass") or [] if isinstance(c, dict)]
    if row.get("error"):
        problems.insert(0, ("error", "error", str(row["error"])))
    note = planted_note(soak.record)
    if verdict != row["verdict"]:
        note = "; ".join(n for n in (f"soak.json says {row['verdict']!r}, not a verdict", note) if n)
    key = (soak.path.parent.name, soak.path.name, str(row["seed"]))
    return VerdictRun(scenario_of(soak.scenario), column, row["seed"], verdict, note, problems,
                      str(row.get("reproduce") or "?"), row.get("path"), soak=soak,
                      detail_anchor=anchors("seed", *key), failure_anchor=anchors("failed", *key),
                      diagnoses=row.get("diagnoses") or [], sides=row.get("sides") or {},
                      diagnoses_anchor=anchors("diagnoses", *key))


def runs(sources: Sources, anchors: Anchors) -> list[VerdictRun]:
    """Every chaos run and soak seed the report read, scenario by scenario (soaks after the single runs)."""
    groups = machine_groups(sources)

    def column(record: dict[str, Any], name: str) -> str:
        col = column_of(record, name)
        return f"{col} · machine {group_of(record, groups)}" if len(groups) > 1 else col

    # A scenario's newest run may be a soak's seed (the soak moved ``latest``): it is shown once, as that seed.
    seeds = {(os.path.abspath(row["path"]), row["verdict"]) for soak in sources.soaks for row in soak.runs
             if row.get("path") is not None}
    out = [_chaos_run(r, column(r.record, r.scenario), anchors) for r in sources.chaos
           if (os.path.abspath(r.path), r.verdict) not in seeds]
    for soak in sources.soaks:
        col = column(soak.record, soak.scenario)
        out += [_soak_seed(soak, row, col, anchors) for row in soak.runs]
    return out


def tally(items: list[VerdictRun]) -> str:
    """``3 pass, 1 FAIL, 1 unknown`` (verdicts with no run left out)."""
    counts = {v: sum(1 for r in items if r.verdict == v) for v in WORDS}
    return ", ".join(f"{n} {WORDS[v]}" for v, n in counts.items() if n) or "no runs"


def _columns(items: list[VerdictRun]) -> list[str]:
    cols = list(dict.fromkeys(r.column for r in items))
    return sorted(cols, key=lambda c: (engine_rank(c.split(" · ")[0]), cols.index(c)))


def _rows(items: list[VerdictRun]) -> list[tuple[str, list[VerdictRun]]]:
    """The grid's rows, by scenario: its single runs, then its soaks' seeds (a scenario's soaks, one per engine,
    share a row, each in its column)."""
    out = []
    for scenario in sorted(dict.fromkeys(r.scenario for r in items)):
        for soaked, label in ((False, scenario), (True, f"{scenario} (soak)")):
            mine = [r for r in items if r.scenario == scenario and (r.soak is not None) == soaked]
            if mine:
                out.append((label, mine))
    return out


def grid(items: list[VerdictRun]) -> Grid:
    """Rows: scenarios (a soak: a row of small cells, one per seed); columns: engine and placement."""
    rows: list[GridRow] = []
    for label, mine in _rows(items):
        if mine[0].soak is None:
            note = "; ".join(dict.fromkeys(r.note for r in mine if r.note.startswith("planted bug")))
        else:
            soaks = {id(r.soak): r.soak for r in mine}  # a SoakRun is not hashable
            asked = sum(len(s.soak["seeds"]) if isinstance(s.soak.get("seeds"), list) else 0 for s in soaks.values())
            note = f"{len(mine)} of {asked or '?'} seeds: {tally(mine)}"
        rows.append(GridRow(label, note, {}))
        for r in mine:
            seed = r.seed if r.seed is not None else "?"
            sides = f" ({r.sides_text})" if r.sides else ""
            text = f"{seed} {r.word}" if r.soak is not None else f"seed {seed}: {r.word}{sides}"
            rows[-1].cells.setdefault(r.column, []).append(Chip(text, r.verdict, r.href, _title(r)))
    return Grid("Scenario", _columns(items), rows)


def table(items: list[VerdictRun]) -> Table:
    """The grid as text, for ``verdicts.csv`` and ``verdicts.tex``: each cell its runs' seeds and verdicts; a soak's
    cell its tally and the seeds that did not pass (a hundred seeds stay one line)."""
    columns = _columns(items)
    rows = []
    for label, mine in _rows(items):
        line = {"Scenario": label}
        for col in columns:
            here = [r for r in mine if r.column == col]
            bad = [r for r in here if r.verdict != "pass"]
            if not here:
                line[col] = DASH
            elif here[0].soak is not None:
                line[col] = tally(here) + (f" (seed{'s' if len(bad) > 1 else ''} "
                                           f"{', '.join(str(r.seed) for r in bad)})" if bad else "")
            else:
                line[col] = ", ".join(f"seed {r.seed if r.seed is not None else '?'}: {r.word}" for r in here)
        rows.append(line)
    return Table("verdicts", "Verdicts: each scenario on each engine and worker placement, by seed (a soak: its "
                 "tally and the seeds that did not pass). FAIL: a check saw its property break; unknown: the checks "
                 "could not tell; error: the run itself broke.", pd.DataFrame(rows, columns=["Scenario", *columns]),
                 colspec={c: "p{2.6cm}" for c in columns}, wide=len(columns) > 2)


def _title(r: VerdictRun) -> str:
    sides = f" ({r.sides_text})" if r.sides else ""
    first = f"; {r.problems[0][0]}: {r.problems[0][2]}" if r.problems else ""
    return f"{r.scenario} on {r.column}, seed {r.seed}: {r.word}{sides}{first}"[:300]


#: each reason a chaos run found is not shown: the line's words (``{s}``: the plural's s) and the table's
LEFT_OUT = {OLDER: ("older run{s} of the same scenario and target", "not shown",
                    "older than the run shown of its scenario and target"),
            UNFINISHED: ("newer run{s} of the same scenario and target that did not complete", "not shown",
                         "newer than the run shown of its scenario and target, and did not complete"),
            MALFORMED: ("malformed run{s}", "left out", "malformed: see its warning"),
            INCOMPLETE: ("incomplete or unreadable run{s}", "left out", "incomplete or unreadable: see its warning")}
#: paths named in the line, per reason; the rest are counted (every one is in ``left_out_table``)
PATHS_NAMED = 5


def _paths(runs: list[LeftOut]) -> str:
    named = ", ".join(f"`{r.path}`" for r in runs[:PATHS_NAMED])
    return named + (f" and {len(runs) - PATHS_NAMED} more" if len(runs) > PATHS_NAMED else "")


def left_out_line(left: list[LeftOut]) -> str:
    """The chaos runs found and not shown, in one line: how many for each reason, and, by their paths, those that
    failed (a malformed or incomplete one by its path whatever its verdict)."""
    parts = []
    for why, (what, verb, _) in LEFT_OUT.items():
        mine = [r for r in left if r.why == why]
        if not mine:
            continue
        text = f"{len(mine)} {what.format(s='' if len(mine) == 1 else 's')} {'is' if len(mine) == 1 else 'are'} {verb}"
        if why in (MALFORMED, INCOMPLETE):
            parts.append(f"{text}: {_paths(mine)}")
            continue
        failed = [r for r in mine if r.verdict == "fail"]
        unknown = sum(1 for r in mine if r.verdict not in ("pass", "fail"))
        if len(mine) == 1:
            parts.append(text + (f", it failed: {_paths(failed)}" if failed else ", its verdict unknown" if unknown
                                 else ""))
        else:
            parts.append(text + (f", {len(failed)} of them failed: {_paths(failed)}" if failed else "")
                         + (f", {unknown} of them unknown" if unknown else ""))
    return "; ".join(parts)


def left_out_table(left: list[LeftOut]) -> Table:
    """Every chaos run found and not shown: its directory, scenario, why and verdict."""
    rows = [{"Run": str(r.path), "Scenario": r.scenario, "Not shown because": LEFT_OUT[r.why][2],
             "Verdict": WORDS.get(r.verdict, "unknown")}
            for r in sorted(left, key=lambda r: (r.scenario, str(r.path)))]
    return Table("not-shown", "The chaos runs found and not shown in this report (its verdicts and sections show one "
                 "run of each scenario, target and engine: the newest complete one, else the newest).",
                 pd.DataFrame(rows), saved=False)
