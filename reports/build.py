"""Assembling the report: sources in, ``report.md``, ``report.html``, CSV, LaTeX and figures out.

Contract: ``build(runs_dirs, out_dir, bench_dirs)`` reads only saved files
(``reports.sources``), never Temporal or the network. Each bench section
comes from its own run (``Sources.bench_for``: the newest complete run that
has it) and says which, with that run's start time, profile and status; a
section from a ``--quick`` run is marked so, and the report opens with a
banner saying so. Every section is built
on its own: a section whose data is absent says "no data (run ...)", and one
that fails while being built adds a warning line to the report instead of
stopping the build. The report opens with the verdicts (``reports.verdicts``:
the grid, how many chaos runs found are not shown and why, the runs' diagnoses,
then every run that did not pass) and ends with provenance.
Everything is written to a staging directory inside ``out_dir`` and moved into place only when the whole report is built (the
report files last), so a failed build leaves the previous report intact.
Files a previous build wrote that this build did not (listed in
``out_dir/.reports-manifest.json`` with their device, inode and owner, and still
those files) are removed; nothing else in ``out_dir`` is touched. ``out_dir`` must be
the invoking user's alone, and nothing below it is reached through a symlink (``Staging``). Progress is logged (logger ``reports``) at INFO, problems at WARNING.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from harness import run_files
from harness.durable_files import write_atomic
from harness.private import own_folder, own_subfolder
from reports import figures as figs
from reports import scale as rscale
from reports import tables as tab
from reports import verdicts
from reports.document import Doc
from reports.sources import BENCH_SECTIONS, BenchRun, Sources, load, safe_name, stamp_time
from reports.verdicts import machine_text, versions_text

log = logging.getLogger(__name__)

MANIFEST = ".reports-manifest.json"
MANIFEST_LIMIT = 16 * run_files.MiB
FIGURES = "figures"
LATEX_TABLES = {"verdicts": r"\small", "table1": r"\footnotesize", "table2": r"\small", "table2_overhead": r"\small",
                "breakdown": r"\footnotesize"}  # 12 columns: \small overflowed by 9 pt
QUICK = ("a `--quick` run: a few turns per series, meant to prove the pipeline works, not to be cited; run "
         "`dah-bench` (the default profile) for numbers")
TITLE = "Durable agents on Temporal: benchmark and fault-injection report"


@dataclass
class BuildResult:
    out_dir: Path
    files: list[Path]  # every file written, under out_dir
    warnings: list[str]
    empty: bool  # no runs of any kind were found
    malformed: list[str]  # one line per run skipped because a file of it is malformed


def out_folder(out: Path) -> Path:
    """``out`` as a report folder of the invoking user's alone (``harness.private.own_folder``: made if missing),
    its ``figures/`` (if there) not a symlink nor anyone else's; its real path, or ``UnsafeFolder`` naming it."""
    real = own_folder(out)
    own_subfolder(real, FIGURES, create=False)
    return real


class Staging:
    """A temporary directory inside ``out``; ``commit`` moves its files into ``out`` (report files last).

    ``out`` must be a folder of the invoking user's alone (``harness.private.own_folder``: made if missing; else
    ``UnsafeFolder`` before anything is written), and nothing below it is reached through a symlink: its
    subfolders are ``own_subfolder``'s, each file is renamed into place relative to its folder's descriptor (a
    symlink at its name is replaced, never written through), and ``MANIFEST`` records each file written with
    its device, inode and owner, so that a later build removes only files this tool wrote
    (``harness.run_files.remove_written``)."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def __enter__(self) -> Staging:
        self.real = out_folder(self.out)
        self.dir = Path(tempfile.mkdtemp(prefix=".building-", dir=self.real))  # 0700, a fresh name, made exclusively
        return self

    def __exit__(self, *exc: Any) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, rel: str) -> Path:
        p = self.dir / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def write_text(self, rel: str, text: str) -> None:
        self.path(rel).write_text(text, encoding="utf-8")

    def commit(self) -> list[Path]:
        rels = sorted(p.relative_to(self.dir) for p in self.dir.rglob("*") if p.is_file())
        last = [Path("report.html"), Path("report.md")]
        folders: dict[Path, int] = {}
        written = []
        try:
            for folder in sorted({r.parent for r in rels} | {Path()}):
                folders[folder] = _open_folder(own_subfolder(self.real, str(folder)) if folder.parts else self.real)
            # The report files go last: a reader never sees a new report.md whose figures have not arrived yet.
            for rel in [r for r in rels if r not in last] + [r for r in last if r in rels]:
                fd = folders[rel.parent]
                os.replace(self.dir / rel, rel.name, dst_dir_fd=fd)
                written.append({"name": str(rel), **asdict(run_files.identify(fd, rel.name))})
            self._remove_stale({str(r) for r in rels})
            write_atomic(MANIFEST, json.dumps({"schema": 2, "written": written}, indent=1).encode(), fsync=False,
                         dir_fd=folders[Path()])
        finally:
            for fd in folders.values():
                os.close(fd)
        return [self.out / r for r in rels]

    def _remove_stale(self, current: set[str]) -> None:
        """Remove what the previous build wrote and this one did not: only a file the manifest names with its
        device, inode and owner, and that is still that very file. A manifest of an older version (a list of
        names, nothing to tell its files from others put there since) removes nothing."""
        try:
            previous = json.loads(run_files.read_bytes(self.real, MANIFEST, MANIFEST_LIMIT))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:  # RefusedPath: a symlink, not a regular file, too large
            log.warning("%s not read, so no earlier report file is removed: %s", MANIFEST, exc)
            return
        entries = previous.get("written") if isinstance(previous, dict) else previous
        bare = []
        for entry in entries if isinstance(entries, list) else []:
            name = entry.get("name") if isinstance(entry, dict) else entry
            if not isinstance(name, str) or name in current:
                continue
            try:
                written = run_files.FileId(*(entry[k] for k in ("dev", "ino", "uid")))
            except (TypeError, KeyError):  # an older manifest's bare name: nothing says this tool wrote it
                bare.append(name)
                continue
            why = run_files.remove_written(self.real, name, written)
            if why is None:
                log.debug("removed stale %s", name)
            else:
                log.info("left %s in place: %s", name, why)
        if bare:
            log.info("left %d file(s) in place that an earlier version's %s names without their device and inode "
                     "(remove them by hand if they are stale): %s", len(bare), MANIFEST, ", ".join(bare[:10])
                     + (", ..." if len(bare) > 10 else ""))


def _open_folder(path: Path) -> int:
    """A descriptor of the folder ``path`` (one ``own_folder`` or ``own_subfolder`` checked), not through a link."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))


def _source_line(run: BenchRun) -> str:
    """Where a section's data comes from, as its first line."""
    text = (f"Source: `{run.path}`, started {run.started}, profile {run.profile}, durability {run.durability}, "
            f"status **{run.status}**"
            + ("" if run.status == "complete" else " (not a complete run: named on the command line)") + ".")
    if run.profile == "quick":
        text += f" **Quick profile**: {QUICK}."
    return text


class Builder:
    def __init__(self, sources: Sources, staging: Staging) -> None:
        self.src = sources
        self.st = staging
        self.fig_dir = staging.path(f"{FIGURES}/.keep").parent
        self.tex_tables: list[str] = []
        self.figures: list[figs.Figure] = []
        self.anchors = verdicts.Anchors()
        self.verdict_runs = verdicts.runs(sources, self.anchors)
        self.groups = verdicts.machine_groups(sources)

    def warn(self, message: str) -> None:
        self.src.warn(message)

    # ------------------------------------------------------------ output helpers

    def emit_table(self, doc: Doc | None, t: tab.Table | None) -> None:
        """``t`` in ``doc`` (None: in the files only), as CSV if it is saved, as LaTeX if it is one of those."""
        if t is None:
            return
        if doc is not None:
            doc.table(t)
        if t.saved:
            tab.spreadsheet_safe(t.csv).to_csv(self.st.path(f"{t.name}.csv"), index=False)
        if t.name in LATEX_TABLES:
            self.st.write_text(f"{t.name}.tex", tab.latex(t, LATEX_TABLES[t.name]))
            self.tex_tables.append(t.name)

    def emit_figure(self, doc: Doc, f: figs.Figure | None) -> None:
        if f is not None:
            doc.figure(f.name, f.title, f.caption)
            self.figures.append(f)

    def preview(self) -> str:
        """``preview.tex``: a two-column article with every LaTeX table and every figure (PDF) at its print size,
        to check that they fit (``pdflatex preview.tex``, then look for "Overfull \\hbox")."""
        lines = [r"\documentclass[twocolumn]{article}", r"\usepackage[margin=0.75in]{geometry}",
                 r"\usepackage{booktabs}", r"\usepackage{graphicx}",
                 r"\begin{document}", f"\\section*{{{tab.latex_escape(TITLE)}}}", "Preview of the generated tables "
                 r"and figures at their print sizes (\texttt{dah-report})."]
        lines += [rf"\input{{{name}.tex}}" for name in sorted(self.tex_tables, key=list(LATEX_TABLES).index)]
        for n, f in enumerate(self.figures):
            if n and n % 8 == 0:
                lines.append(r"\clearpage")  # flush: LaTeX holds at most 18 floats waiting for a place
            env, width = ("figure*", r"\textwidth") if f.wide else ("figure", r"\columnwidth")
            lines += [rf"\begin{{{env}}}[t]", r"\centering", rf"\includegraphics[width={width}]{{figures/{f.name}.pdf}}",
                      rf"\caption{{{tab.latex_escape(f.caption)}}}", rf"\end{{{env}}}"]
        lines += [r"\clearpage", r"\end{document}", ""]
        return "\n".join(lines)

    def section(self, doc: Doc, title: str, fill: Callable[[Doc], None], level: int = 2,
                anchor: str | None = None) -> None:
        """A heading and its content; a section that fails becomes a warning, not a failed build."""
        sub = Doc()
        sub.heading(level, title, anchor)
        try:
            fill(sub)
        except Exception as exc:  # one bad section must not cost the others
            log.debug("section %s failed", title, exc_info=True)
            self.warn(f"section '{title}' not rendered: {type(exc).__name__}: {exc}")
            sub = Doc()
            sub.heading(level, title, anchor)
            sub.para(f"not rendered: {type(exc).__name__}: {exc}")
        doc.extend(sub)

    def bench_data(self, doc: Doc, stem: str, section: str) -> Any:
        """The data for ``stem`` of the bench run ``section`` comes from (``self.run``), after saying in ``doc``
        which run that is; or None after saying why there is none."""
        run = self.src.bench_for(section)
        self.run = run
        if not self.src.bench_runs:
            doc.para("no data (run `make bench`)")
            return None
        if run is None:
            doc.para(f"no data: no complete bench run has this section (run `dah-bench --only {section}`; "
                     f"the report takes each section from the newest complete run that has it, so the other "
                     f"sections keep their data)")
            return None
        doc.para(_source_line(run))
        return run.data[stem]

    # ------------------------------------------------------------ sections

    def table2(self, doc: Doc) -> None:
        series = self.bench_data(doc, "latency", "table2")
        if series is None:
            return
        t = tab.table2(series)
        if t is None:
            return
        log.info("table 2: %d series", len(t.df))
        cfg = self.run.record.get("config") or {}
        if isinstance(cfg, dict) and cfg.get("warmup_turns") is not None:
            doc.para(f"The first {cfg['warmup_turns']} turn(s) of each series were warm-up and are excluded.")
        self.emit_table(doc, t)
        over, problems = tab.table2_overhead(series)
        for p in problems:
            self.warn(p)
        if over is not None:
            doc.heading(3, "Durable against plain")
            doc.bullets([f"**{r['Workload']}, {r['Model']}**: durable {r['durable mean']:.1f} ms against plain "
                         f"{r['plain mean']:.1f} ms mean: {r['ratio of means']:.2f}x (median per-turn ratio "
                         f"{r['median turn ratio']:.2f}x), +{r['difference']:.1f} ms; loop overhead "
                         f"(client - model) {r['durable overhead']:.1f} ms durable against "
                         f"{r['plain overhead']:.1f} ms plain (+{r['overhead difference']:.1f} ms)"
                         for _, r in over.df.iterrows()])
            self.emit_table(doc, over)
        self.emit_figure(doc, figs.plot_latency_cdf(series, self.fig_dir))

    def breakdown(self, doc: Doc) -> None:
        series = self.bench_data(doc, "breakdown", "breakdown")
        if series is None:
            return
        t = tab.breakdown(series)
        if t is None:
            return
        log.info("breakdown: %d series", len(t.df))
        self.emit_table(doc, t)
        for f in figs.plot_breakdown(series, self.fig_dir, self.run.data.get("latency")):
            self.emit_figure(doc, f)

    def _latency_section(self, doc: Doc, section: str, table: Any, figure: Any = None) -> list[dict[str, Any]]:
        """A section of ``latency.json`` with the breakdown beside it: its table, and its figure if it has one;
        the run's series (none: no data)."""
        series = self.bench_data(doc, "latency", section)
        if series is None:
            return []
        bd = self.run.data.get("breakdown")
        t = table(series, bd)
        if t is None:
            return []
        log.info("%s: %d series", section, len(t.df))
        self.emit_table(doc, t)
        if figure is not None:
            self.emit_figure(doc, figure(series, bd, self.fig_dir))
        return series

    def tuning(self, doc: Doc) -> None:
        self._latency_section(doc, "tuning", tab.tuning, figs.plot_tuning)

    def overhead(self, doc: Doc) -> None:
        series = self._latency_section(doc, "overhead", tab.overhead)
        self.emit_table(doc, tab.overhead_spread(series))

    def length(self, doc: Doc) -> None:
        series = self.bench_data(doc, "length", "length")
        if series is None:
            return
        t = tab.length(series)
        if t is None:
            return
        self.emit_table(doc, t)
        tab.spreadsheet_safe(tab.length_turns(series)).to_csv(self.st.path("length_turns.csv"), index=False)
        doc.para("Per-turn values: `length_turns.csv`.")
        for f in figs.plot_length(series, self.fig_dir):
            self.emit_figure(doc, f)

    def points(self, doc: Doc, stem: str, table: Callable, plot: Callable, section: str | None = None) -> None:
        pts = self.bench_data(doc, stem, section or stem)
        if pts is None:
            return
        t = table(pts)
        if t is None:
            return
        self.emit_table(doc, t)
        self.emit_figure(doc, plot(pts, self.fig_dir))

    def engines(self, doc: Doc) -> None:
        """Table 2 and the per-step cost on every engine of one run, with each engine's configuration."""
        data = self.bench_data(doc, "engines", "engines")
        if data is None:
            return
        for table in (tab.engines_turns(data), tab.engines_steps(data)):
            if table is not None:
                self.emit_table(doc, table)
        self.emit_figure(doc, figs.plot_engines(data, self.fig_dir))
        if data["unavailable"]:
            doc.bullets([f"**{name}** not measured: {why}" for name, why in data["unavailable"].items()])

    def scale(self, doc: Doc) -> None:
        """The scale section: the harness's own cost per size, each check's time, the fits and the figure."""
        data = self.bench_data(doc, "scale", "scale")
        if data is None:
            return
        for table in (rscale.table(data), rscale.checks_table(data), rscale.fits_table(data)):
            self.emit_table(doc, table)
        doc.bullets(rscale.acceptance_lines(data))
        self.emit_figure(doc, rscale.plot(data, self.fig_dir))

    def resources(self, doc: Doc) -> None:
        """CPU and memory per benchmark section: each section's samples from the newest complete run that
        measured that section (a later ``--only`` run replaces only the sections it ran)."""
        if self.bench_data(doc, "resources", "resources") is None:
            return
        merged: dict[str, Any] = {}
        taken: dict[str, BenchRun] = {}
        for run in self.src.bench_runs:
            for sec, procs in (run.data.get("resources") or {}).get("sections", {}).items():
                if procs and sec not in merged:
                    merged[sec], taken[sec] = procs, run
        others = {run.path: run for run in taken.values() if run is not self.run}
        for path, run in others.items():
            doc.para(f"Also from `{path}` (started {run.started}, profile {run.profile}): the samples of "
                     + ", ".join(sec for sec, r in taken.items() if r is run) + "."
                     + (" **Quick profile**: not for citation." if run.profile == "quick" else ""))
        res = {"interval_s": self.run.data["resources"].get("interval_s"), "sections": merged}
        t = tab.resources(res)
        if t is None:
            return
        self.emit_table(doc, t)
        self.emit_figure(doc, figs.plot_resources(res, self.fig_dir))

    def micro(self, doc: Doc) -> None:
        m = self.bench_data(doc, "micro", "micro")
        if m is None:
            return
        t = tab.micro(m)
        if t is None:
            return
        mi = m.get("machine_info") or {}
        cpu = mi.get("cpu") if isinstance(mi.get("cpu"), dict) else {}
        facts = [f"pytest-benchmark {m['version']}" if m.get("version") else None,
                 f"Python {mi['python_version']}" if mi.get("python_version") else None,
                 cpu.get("brand_raw"), str(m["datetime"]) if m.get("datetime") else None]
        if any(facts):
            doc.para("Measured with " + ", ".join(f for f in facts if f) + ".")
        self.emit_table(doc, t)

    def table1(self, doc: Doc) -> None:
        if not self.src.chaos:
            doc.para("no data (run `make chaos`)")
            return
        t = tab.table1(self.src.chaos)
        log.info("table 1: %d scenario(s)", len(t.df))
        unknown = [r.label for r in self.src.chaos if r.verdict == "unknown"]
        failed = [r.label for r in self.src.chaos if r.verdict == "fail"]
        passed = len(self.src.chaos) - len(unknown) - len(failed)
        doc.para(f"{len(self.src.chaos)} scenario(s): {passed} pass, {len(failed)} fail"
                 + (f" ({', '.join(failed)})" if failed else "") + f", {len(unknown)} unknown"
                 + (f" ({', '.join(unknown)})" if unknown else "") + ".")
        self.emit_table(doc, t)
        parts = tab.recovery_parts(self.src.chaos)
        if parts is not None:
            self.emit_table(doc, parts)

    def chaos_runs(self, doc: Doc) -> None:
        if not self.src.chaos:
            doc.para("no data (run `make chaos`)")
            return
        for run in self.src.chaos:
            self.section(doc, run.label, lambda d, run=run: self.chaos_run(d, run), level=3,
                         anchor=self.anchors("run", run.path.parent.name, run.path.name))

    def chaos_run(self, doc: Doc, run: Any) -> None:
        log.info("chaos run %s: %s", run.label, run.path)
        j = run.record
        s = run.summary
        verdict = tab.outcome(run)
        doc.bullets([f"run: `{run.path}` ({stamp_time(run.path.name)}), verdict **{verdict}**"
                     + (f", {verdicts.planted_note(j)}" if verdicts.planted_note(j) else ""),
                     f"engine and placement: {verdicts.column_of(j, run.scenario)}",
                     f"reproduce: `{j.get('reproduce', '?')}` (seed {j.get('seed', '?')})",
                     f"faults landed/injected {s.get('faults', '?')}; client operations ok {s.get('ok', '?')}, "
                     f"fail {s.get('fail', '?')}, info {s.get('info', '?')}; lost {s.get('lost', '?')}; "
                     f"duplicated effects {s.get('dup_effects', '?')}; recovery "
                     f"{s['recovery_s'] if s.get('recovery_s') is not None else '—'} s"
                     + (" (counted from its operation log: the run was never checked)" if run.summary_from_history
                        else "")])
        doc.links("Files", self.run_files(run.path))
        ct = tab.checks_table(run)
        if ct is not None:
            self.emit_table(doc, ct)
        target = run.label.removeprefix(run.scenario)  # "" unless another run shown has its scenario
        made = figs.plot_chaos(run, self.fig_dir, f"chaos-{safe_name(run.path.parent.name)}"
                               + (f"-{safe_name(target)}" if target else ""))
        if not made:
            doc.para("no client operations in its operation log: nothing to plot")
        for f in made:
            self.emit_figure(doc, f)

    def soaks(self, doc: Doc) -> None:
        if not self.src.soaks:
            doc.para("no data (run `dah-chaos soak SCENARIO --seeds 1-100`)")
            return
        for run in self.src.soaks:
            self.section(doc, f"Soak: {run.scenario}", lambda d, run=run: self.soak(d, run), level=3,
                         anchor=self.anchors(run.path.parent.name, run.path.name))

    def soak(self, doc: Doc, run: Any) -> None:
        log.info("soak %s: %s", run.scenario, run.path)
        j, s = run.record, run.soak
        seeds = s.get("seeds") if isinstance(s.get("seeds"), list) else []
        passed = sum(1 for r in run.runs if r["verdict"] == "pass")
        status = j.get("status", s.get("status", "?"))
        stopped = s.get("interrupted_seeds") or ([s["interrupted_seed"]] if s.get("interrupted_seed") is not None
                                                else [])  # an older soak.json names one seed
        doc.bullets([f"run: `{run.path}` ({stamp_time(run.path.name)}), status **{status}**"
                     + (f", interrupted during seed{'s' if len(stopped) > 1 else ''} {', '.join(map(str, stopped))}"
                        if isinstance(stopped, list) and stopped else ""),
                     f"{len(run.runs)} of {len(seeds) or '?'} seed(s) finished, {passed} passed; "
                     f"{s.get('wall_s', '?')} s",
                     f"reproduce: `{j.get('reproduce', '?')}`"])
        self.emit_table(doc, tab.soak_distribution(run))
        recovered = tab.soak_recovery(run)
        if recovered is not None:
            self.emit_table(doc, recovered)
        if not run.runs:
            doc.para("No seed finished.")
            return
        if all(r["verdict"] == "pass" for r in run.runs):
            doc.para("Every seed that finished passed.")
        mine = [v for v in self.verdict_runs if v.soak is run]
        self.emit_table(doc, tab.soak_seeds(run, [v.detail_anchor for v in mine],
                                            [self.rel(v.path) if v.path else None for v in mine],
                                            [v.failure_anchor if v.verdict != "pass" else None for v in mine]))

    def fuzz(self, doc: Doc) -> None:
        run = self.src.fuzz
        if run is None:
            doc.para("no data (run `dah-fuzz`)")
            return
        r = run.results
        held = r.get("invariants_held")
        opts = r.get("options") if isinstance(r.get("options"), dict) else {}
        doc.para(f"Run `{run.path}` ({stamp_time(run.path.name)}), {r.get('wall_seconds', '?')} s, "
                 f"{len(r.get('iterations') or [])} iteration(s); options: "
                 + ", ".join(f"{k}={v}" for k, v in opts.items() if k != "out")
                 + ". Invariants: " + {True: "**all held**", False: "**VIOLATED**"}.get(held, "**unknown**") + ".")
        t = tab.migration_fuzz(run)
        if t is None:
            doc.para("no data: results.json has no families")
            return
        self.emit_table(doc, t)

    # ------------------------------------------------------------ the verdicts, first

    def rel(self, path: Path) -> str:
        """A link from the report's folder to ``path`` (a run directory the report read, or a file in it)."""
        return Path(os.path.relpath(os.path.abspath(path), os.path.abspath(self.st.out))).as_posix()

    def run_files(self, path: Path) -> list[tuple[str, str]]:
        """Links to a run directory the report read and its record files that are there."""
        return [("run directory", self.rel(path) + "/")] + [
            (name, self.rel(path / name)) for name in ("verdict.json", "run.json") if (path / name).is_file()]

    def verdict_grid(self, doc: Doc) -> None:
        """Which scenario passed or failed on which engine, placement and seed; where the runs ran, once."""
        items, left = self.verdict_runs, self.src.left_out
        if not items and not left:
            doc.para("No chaos runs or soaks found (run `make chaos`, or `dah-chaos run SCENARIO`).")
            return
        bad = [r for r in items if r.verdict != "pass"]
        # Every run found is counted: those shown, and those left out, named when they failed.
        doc.para((f"{len(items)} run(s): {verdicts.tally(items)}." if not left else
                  f"{len(items) + len(left)} run(s) found: {len(items)} shown ({verdicts.tally(items)}), "
                  f"{len(left)} not shown.")
                 + (" Each shown that did not pass is listed under Failures, with its checks and reproduce command."
                    if bad else ""))
        if left:
            doc.links(verdicts.left_out_line(left), [("every run not shown", f"#{self.anchors('not-shown')}")])
        if not items:
            return
        doc.grid(verdicts.grid(items))
        self.emit_table(None, verdicts.table(items))  # for a paper: verdicts.csv and verdicts.tex only
        doc.para("Each cell is one run: its seed and verdict (pass, FAIL, unknown: the checks could not tell, "
                 "error: the run itself broke). A run that did not pass links to its failure entry; one that passed "
                 "to its details. Columns: the durability engine and where its workers ran. As text for a paper: "
                 "`verdicts.csv`, `verdicts.tex`.")
        if len(self.groups) == 1:
            g = self.groups[0]
            doc.para(f"Every run above ran on one machine: {g.machine}; {g.versions}.")
        else:
            doc.para("The runs above come from several machines (the columns name them):")
            doc.bullets([f"**machine {g.label}**: {g.machine}; {g.versions} (runs: {', '.join(g.runs)})"
                         for g in self.groups])
        self.diagnoses(doc)

    def diagnoses(self, doc: Doc) -> None:
        """Each run in the grid whose verdict.json diagnoses it: cause and fix, one line each."""
        diagnosed = [r for r in self.verdict_runs if r.diagnoses]
        if not diagnosed:
            return
        doc.heading(3, "Diagnoses: cause and fix")
        for r in diagnosed:
            seed = f"seed {r.seed}" if r.seed is not None else "seed unknown"
            doc.heading(4, f"{r.scenario} on {r.column}, {seed}: {r.word}"
                        + (f" ({r.sides_text})" if r.sides else ""), r.diagnoses_anchor)
            doc.bullets(r.diagnosis_lines)
            doc.links("Its entry", [("failure" if r.verdict != "pass" else "details", r.href)])

    def failures(self, doc: Doc) -> None:
        """Every run that did not pass: what its checks said, how to run it again, where its files are."""
        bad = [r for r in self.verdict_runs if r.verdict != "pass"]
        if not bad:
            failed = sum(1 for r in self.src.left_out if r.verdict == "fail")
            doc.para(("None: every run shown passed." if self.verdict_runs else "No runs shown.")
                     + (f" {failed} run(s) not shown failed: see Verdicts." if failed else ""))
            return
        for r in bad:
            seed = f"seed {r.seed}" if r.seed is not None else "seed unknown"
            doc.heading(3, f"{r.scenario} on {r.column}, {seed}: {r.word}"
                        + (" (a soak seed)" if r.soak is not None else ""), r.failure_anchor)
            if r.note:
                doc.para(r.note[0].upper() + r.note[1:] + ".")
            if r.sides:
                doc.para(f"Safety and liveness, as its verdict.json tells them apart: {r.sides_text}.")
            if r.problems:
                doc.table(tab.Table(f"failed-{r.failure_anchor}", "The checks that did not pass.",
                                    pd.DataFrame([{"check": c, "verdict": v, "summary": s} for c, v, s in r.problems]),
                                    saved=False))
            else:
                doc.para("No check recorded what went wrong.")
            doc.para("Reproduce (the command the run recorded):")
            doc.code(r.reproduce)
            if r.reproduce.startswith("python -m "):  # recorded before runs named the harness's own interpreter
                doc.para("From the harness's checkout, with its own interpreter (the system Python lacks its "
                         f"packages): `.venv/bin/{r.reproduce}`")
            links = self.run_files(r.path) if r.path is not None else []
            doc.links("Files", links + [("details", f"#{r.detail_anchor}")]
                      + ([("diagnoses", f"#{r.diagnoses_anchor}")] if r.diagnoses else []))

    # ------------------------------------------------------------ provenance

    def provenance(self, doc: Doc) -> None:
        src = self.src
        doc.heading(2, "Provenance")
        roots = ", ".join(f"`{r}`" for r in src.runs_dirs)
        doc.para(f"Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S UTC} by `dah-report` from the "
                 f"saved run directories under {roots} (no Temporal server involved).")
        if src.empty:
            doc.para(f"**No runs found under {roots}**: nothing to report yet. Run `make bench`, "
                     "`make chaos` or `dah-fuzz`, then `dah-report` again.")
        if src.bench_runs or src.bench_skipped:
            self.bench_provenance(doc)
        if src.chaos:
            doc.heading(3, "Chaos runs")
            several = len(self.groups) > 1
            rows = [{"Scenario": r.label, "Run": str(r.path), "When": stamp_time(r.path.name),
                     "Status": str(r.record.get("status") or "unknown"), "Seed": r.record.get("seed"),
                     "Wall (s)": r.record.get("wall_s")}
                    | ({"Machine": verdicts.group_of(r.record, self.groups)} if several else {})
                    for r in src.chaos]
            doc.table(tab.Table("provenance-chaos", "The chaos run used for each scenario, target and engine (the "
                                "machine each ran on: under Verdicts).", pd.DataFrame(rows),
                                {"Seed": "d", "Wall (s)": ".1f"}, saved=False))
        if src.left_out:
            doc.heading(3, "Chaos runs not shown", self.anchors("not-shown"))
            doc.table(verdicts.left_out_table(src.left_out))
        if src.fuzz is not None:
            doc.heading(3, "Migration fuzz run")
            doc.bullets([f"run: `{src.fuzz.path}` ({stamp_time(src.fuzz.path.name)})"])

    def bench_provenance(self, doc: Doc) -> None:
        """Which run each bench section comes from; each run used; the runs not used and why."""
        src = self.src
        doc.heading(3, "Benchmark sections and their runs")
        doc.para("Each section comes from the newest complete benchmark run that has it; runs that did not "
                 "complete are never used unless named on the command line.")
        rows = []
        for sec in BENCH_SECTIONS:
            r = src.bench_for(sec)
            rows.append({"Section": sec, "Run": f"{r.path}" if r else "none: no complete run has it",
                         "Started": r.started if r else tab.DASH, "Profile": r.profile if r else tab.DASH,
                         "Durability": r.durability if r else tab.DASH,
                         "Status": r.status if r else tab.DASH})
        doc.table(tab.Table("provenance-bench", "The benchmark run each section of this report comes from.",
                            pd.DataFrame(rows), saved=False))
        for r in src.bench_used:
            j = r.record
            items = [f"started {r.started}, status **{r.status}**, profile {r.profile}"
                     + (" (**quick: not for citation**)" if r.profile == "quick" else "")
                     + f", seed {j.get('seed', '?')}, {j.get('wall_s', '?')} s",
                     f"command: `{j.get('command', '?')}`",
                     f"machine: {machine_text(j.get('machine'))}",
                     f"versions: {versions_text(j.get('machine'))}",
                     "sections used from it: " + ", ".join(s for s in BENCH_SECTIONS if src.bench_for(s) is r)]
            if j.get("error"):
                items.append(f"error: `{j['error']}`")
            cfg = j.get("config")
            if isinstance(cfg, dict) and cfg:
                items.append("config: " + ", ".join(f"{k}={v}" for k, v in cfg.items()))
            sp = j.get("server_profiles")
            if isinstance(sp, dict) and sp:
                items.append("server profiles: " + "; ".join(
                    f"{name}: " + (", ".join(f"{k}={v}" for k, v in (p or {}).items()) or "stock dynamic config")
                    for name, p in sp.items()))
            doc.heading(4, f"Benchmark run `{r.path}`")
            doc.bullets(items)
        unused = [r for r in src.bench_runs if r not in src.bench_used]
        if unused or src.bench_skipped:
            doc.heading(3, "Benchmark runs not used")
            doc.bullets([f"`{r.path}` (status **{r.status}**, started {r.started}): every section it has "
                         f"({', '.join(r.sections)}) comes from a newer run" for r in unused]
                        + [f"`{k.path}` (status **{k.status}**): skipped, {k.reason}" for k in src.bench_skipped])

    # ------------------------------------------------------------ the whole report

    def build(self) -> None:
        body = Doc()
        bench = [
            ("Table 2: per-turn latency, durable against plain", self.table2),
            ("Overhead breakdown", self.breakdown),
            ("Tuning: before and after", self.tuning),
            ("Overhead per turn, the worker in its own process", self.overhead),
            ("Scaling with conversation length", self.length),
            ("Throughput", lambda d: self.points(d, "throughput", tab.throughput, figs.plot_throughput)),
            ("Recovery after a worker kill", lambda d: self.points(d, "recovery", tab.recovery, figs.plot_recovery)),
            ("Resources", self.resources),
            ("Micro-benchmarks", self.micro),
            ("Checkpoint engine against Temporal", lambda d: self.points(d, "checkpoint_backend", tab.checkpoint,
                                                                           figs.plot_checkpoint, "checkpoint")),
            ("Engines side by side", self.engines),
            ("The harness at production shape", self.scale),
        ]
        steps = [
            ("Table 1: fault scenarios", self.table1),
            ("Chaos runs", self.chaos_runs),
            ("Soak runs", self.soaks),
            ("Migration fuzz", self.fuzz),
        ]
        if self.src.bench_runs:
            steps = bench + steps
        else:  # one line for every benchmark section, not one section each saying the same
            body.heading(2, "Benchmarks")
            body.para("no data (run `make bench`) for any of: " + "; ".join(title for title, _ in bench) + ".")
        for title, fill in steps:
            self.section(body, title, fill)
        head = Doc()
        head.heading(1, TITLE)
        quick = [s for s in BENCH_SECTIONS if (r := self.src.bench_for(s)) is not None and r.profile == "quick"]
        if quick:
            head.para(f"**QUICK PROFILE: the sections {', '.join(quick)} come from {QUICK}.**")
        # The verdicts lead; where the data came from follows the results.
        lead = Doc()
        self.section(lead, "Verdicts", self.verdict_grid)
        self.section(lead, "Failures and unknowns", self.failures)
        tail = Doc()
        self.provenance(tail)
        # Built after the sections: they add their own warnings.
        if self.src.warnings:
            tail.heading(2, "Warnings", "warnings")
            tail.bullets([f"`{w}`" if "`" not in w else w for w in self.src.warnings])
            head.links(f"**{len(self.src.warnings)} warning(s)** about the runs read (skipped or partly used)",
                       [("Warnings", "#warnings")])
        if self.src.notes:
            tail.heading(2, "Notes")
            tail.bullets(self.src.notes)
        head.extend(lead)
        head.extend(body)
        head.extend(tail)
        if self.tex_tables or self.figures:
            self.st.write_text("preview.tex", self.preview())
        self.st.write_text("report.html", head.html(TITLE))
        self.st.write_text("report.md", head.markdown())


def build(runs_dirs: Path | list[Path], out_dir: Path, bench_dirs: Path | list[Path] | None = None) -> BuildResult:
    roots = [runs_dirs] if isinstance(runs_dirs, Path) else list(runs_dirs)
    log.info("reading runs from %s", ", ".join(map(str, roots)))
    sources = load(roots, bench_dirs)
    for sec in BENCH_SECTIONS:
        run = sources.bench_for(sec)
        log.info("bench %s: %s", sec, f"{run.path} ({run.status}, profile {run.profile})" if run else "no data")
    for k in sources.bench_skipped:
        log.info("bench run skipped: %s (status %s: %s)", k.path, k.status, k.reason)
    log.info("chaos runs: %d%s", len(sources.chaos),
             f" ({', '.join(r.label for r in sources.chaos)})" if sources.chaos else "")
    if sources.fuzz is not None:
        log.info("migration fuzz run: %s", sources.fuzz.path)
    if sources.soaks:
        log.info("soak runs: %d (%s)", len(sources.soaks), ", ".join(r.scenario for r in sources.soaks))
    with Staging(out_dir) as staging:
        Builder(sources, staging).build()
        log.info("moving the report into %s", out_dir)
        files = staging.commit()
    return BuildResult(out_dir, files, list(sources.warnings), sources.empty, list(sources.malformed))
