"""The report's tables: pandas DataFrames, and their CSV, LaTeX, Markdown and HTML forms.

Contract: each builder takes normalised data from ``reports.sources`` and
returns a ``Table`` (or None when there is nothing to tabulate). ``Table.df``
holds full-precision values and is what goes into ``<name>.csv``; the text
forms round numbers with ``Table.formats`` (column -> format spec), right-align
them, and show a missing value as an em dash ("---" in LaTeX). Columns in
``Table.hide`` are in the CSV only.

Statistics: latencies are milliseconds; ``sd`` is the sample standard
deviation (n - 1); percentiles use linear interpolation (numpy's default), so
p50 is the median. Micro-benchmark times are converted from seconds to µs.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from harness.engines import PLAIN, canonical, rank as engine_rank
from harness.percentiles import floor_ratio_spreads, median_floor_ratio, summarise
from harness.printable import printable
from reports.sources import ChaosRun, FuzzRun, SoakRun
from reports.confidence import FEW_FOR_P99, bootstrap_ci, with_ci

DASH = "—"


@dataclass
class Table:
    name: str  # file stem: <name>.csv, <name>.tex
    caption: str
    df: pd.DataFrame
    formats: dict[str, str] = field(default_factory=dict)  # column -> format spec; these columns are right-aligned
    hide: tuple[str, ...] = ()  # CSV-only columns
    colspec: dict[str, str] = field(default_factory=dict)  # LaTeX column type overrides, e.g. p{4cm}
    saved: bool = True  # False: shown in the report only, no CSV
    headers: dict[str, str] = field(default_factory=dict)  # column -> its header in the text forms (with units)
    display: tuple[str, ...] = ()  # columns of text made for reading (e.g. "47.8 [45.1, 50.2]"): not in the CSV
    tex_cols: tuple[str, ...] = ()  # the columns of the LaTeX table (default: every shown column)
    tex_headers: dict[str, str] = field(default_factory=dict)  # LaTeX header overrides; a newline breaks the header
    wide: bool = False  # LaTeX: table* (both columns of a two-column page)
    notes: list[str] = field(default_factory=list)  # footnotes under the table (e.g. what a mark means)
    anchors: list[str] = field(default_factory=list)  # each row's id, for links from elsewhere in the report
    links: dict[str, list[str | None]] = field(default_factory=dict)  # column -> each row's link (a relative href)

    @property
    def label(self) -> str:
        return f"tab:{self.name.replace('_', '-')}"

    @property
    def shown(self) -> list[str]:
        return [c for c in self.df.columns if c not in self.hide]

    def header(self, column: str) -> str:
        return self.headers.get(column, column)

    @property
    def csv(self) -> pd.DataFrame:
        """The full-precision data: every column but the display-only ones."""
        return self.df[[c for c in self.df.columns if c not in self.display]]

    @property
    def full_caption(self) -> str:
        return " ".join([self.caption, *self.notes])


# ---------------------------------------------------------------- formatting

# After "_" and "@" a line may break (``\allowbreak``): identifiers such as kill_mid_turn@checkpoint fit a narrow
# p{} column; in other columns nothing breaks.
_LATEX = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_\allowbreak{}", "@": r"@\allowbreak{}",
          "{": r"\{", "}": r"\}",
          "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
          "—": "---", "·": r"$\cdot$", "–": "--", "µ": r"\textmu{}", "×": r"$\times$", "−": "-", "≥": r"$\geq$", "≤": r"$\leq$"}


def latex_escape(text: Any) -> str:
    return "".join(_LATEX.get(c, c) for c in printable(text))


#: Markdown's syntax characters (emphasis, a code span, a table cell) and HTML's, as literal text
_MARKDOWN = {"\\": "\\\\", "`": "\\`", "*": "\\*", "|": "\\|", "<": "&lt;", ">": "&gt;", "&": "&amp;",
             '"': "&quot;"}
#: the brackets that make a link or an image (``](``, ``][``, a reference definition's ``[`` at a line's start);
#: others stay as they are, for intervals such as [0.5, 0.6]
_LINK = re.compile(r"^\[|\](?=[(\[])")


def markdown_escape(text: Any) -> str:
    """``text`` as literal Markdown: no HTML, link, image, emphasis or code span can start in it and it stays on one
    line (a newline is a space), so run data placed in report.md shows as the characters it holds."""
    escaped = "".join(_MARKDOWN.get(c, c) for c in printable(str(text).replace("\n", " ")))
    return _LINK.sub(lambda m: "\\" + m.group(), escaped)


#: what a spreadsheet reads as a formula at the start of a cell (CSV injection)
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _not_a_formula(value: Any) -> Any:
    if not isinstance(value, str) or not value.startswith(_FORMULA):
        return value
    try:
        float(value)
        return value  # a number such as -1.5 is data, not a formula
    except ValueError:
        return "'" + value


def spreadsheet_safe(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` for a CSV file: every text cell ``printable`` (run data: a name with a control character or a lone
    surrogate, which UTF-8 cannot hold, is shown escaped), and one a spreadsheet would run as a formula
    (``=cmd|...``) starts with ``'``."""
    def cell(value: Any) -> Any:
        return _not_a_formula(printable(value) if isinstance(value, str) else value)

    return df.apply(lambda c: c if pd.api.types.is_numeric_dtype(c) else c.map(cell))


def _missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):  # lists and other containers are not "missing"
        return False


def cell(value: Any, fmt: str | None) -> str:
    """One value as text: the column's format for numbers, str() otherwise, DASH when missing."""
    if _missing(value):
        return DASH
    if fmt and isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        if not math.isfinite(float(value)):  # Infinity read from a run's files has no integer form
            return str(float(value))
        if fmt == "d":
            return f"{int(round(float(value))):d}"
        return format(value, fmt)
    return str(value)


def _rows(t: Table, cols: list[str] | None = None) -> list[list[str]]:
    return [[cell(row[c], t.formats.get(c)) for c in cols or t.shown] for _, row in t.df.iterrows()]


def markdown(t: Table) -> str:
    cols = t.shown

    lines = ["| " + " | ".join(markdown_escape(t.header(c)) for c in cols) + " |",
             "|" + "|".join("---:" if c in t.formats else ":---" for c in cols) + "|"]
    for i, r in enumerate(_rows(t)):
        texts = [_markdown_link(markdown_escape(v), _link(t, c, i)) for c, v in zip(cols, r)]
        if t.anchors:
            texts[0] = f'<a id="{html.escape(t.anchors[i])}"></a>{texts[0]}'
        lines.append("| " + " | ".join(texts) + " |")
    return "\n".join(lines)


def _link(t: Table, column: str, row: int) -> str | None:
    hrefs = t.links.get(column) or []
    return hrefs[row] if row < len(hrefs) else None


def _markdown_link(text: str, href: str | None) -> str:
    """``text`` (already escaped) as a link to ``href`` (a relative path or ``#anchor`` the report made)."""
    if not href:
        return text
    return f"[{text}]({href.replace(' ', '%20').replace('(', '%28').replace(')', '%29')})"


def _tex_header(text: str, align: str) -> str:
    """A header cell; a newline in ``text`` stacks its lines (a nested tabular: no extra LaTeX package)."""
    lines = [latex_escape(x) for x in str(text).split("\n")]
    if len(lines) == 1:
        return lines[0]
    # "\\{}": a line that starts with "[" (e.g. "[95% CI]") must not be read as \\'s optional argument
    return rf"\begin{{tabular}}[b]{{@{{}}{align}@{{}}}}" + r" \\{} ".join(lines) + r"\end{tabular}"


def latex(t: Table, size: str = r"\small") -> str:
    """A booktabs table meant to fit a two-column page: ``table`` (one column) or ``table*`` (both) when
    ``t.wide``, ``size`` (\\small) type, 4 pt column gaps, the caption above."""
    cols = list(t.tex_cols) or t.shown
    aligns = [t.colspec.get(c, "r" if c in t.formats else "l") for c in cols]
    env = "table*" if t.wide else "table"
    heads = [_tex_header(t.tex_headers.get(c, t.header(c)), "r" if a == "r" else "l") for c, a in zip(cols, aligns)]
    out = [rf"\begin{{{env}}}[t]", r"\centering"]
    if size:
        out.append(size)
    out += [r"\setlength{\tabcolsep}{4pt}", rf"\caption{{{latex_escape(t.full_caption)}}}", rf"\label{{{t.label}}}",
            rf"\begin{{tabular}}{{@{{}}{' '.join(aligns)}@{{}}}}", r"\toprule", " & ".join(heads) + r" \\",
            r"\midrule"]
    out += [" & ".join(latex_escape("---" if v == DASH else v) for v in r) + r" \\" for r in _rows(t, cols)]
    out += [r"\bottomrule", r"\end{tabular}", rf"\end{{{env}}}", ""]
    return "\n".join(out)


def html_table(t: Table) -> str:
    cols = t.shown
    head = "".join(f'<th class="{"num" if c in t.formats else "txt"}">{html.escape(printable(t.header(c)))}</th>'
                   for c in cols)
    body = "".join((f'<tr id="{html.escape(t.anchors[i])}">' if t.anchors else "<tr>")
                   + "".join(f'<td class="{"num" if c in t.formats else "txt"}">'
                             f"{_html_link(breakable(html.escape(printable(v))), _link(t, c, i))}</td>"
                             for c, v in zip(cols, r)) + "</tr>\n"
                   for i, r in enumerate(_rows(t)))
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>"


def breakable(escaped: str) -> str:
    """Escaped HTML text with a line-break opportunity after each ``_``, ``@`` and ``/`` between name characters:
    an identifier such as kill_mid_turn@checkpoint or a path wraps in a narrow column instead of widening the
    page (an escaped ``&lt;/`` stays as it is)."""
    return re.sub(r"([_@]|(?<=[\w.-])/(?=[\w.-]))", r"\1<wbr>", escaped)


def _html_link(text: str, href: str | None) -> str:
    return f'<a href="{html.escape(href)}">{text}</a>' if href else text


# ---------------------------------------------------------------- statistics

def column(turns: list[dict[str, Any]], key: str) -> np.ndarray:
    return np.asarray([t.get(key, math.nan) for t in turns], dtype=float)


def _median(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(np.median(x)) if x.size else math.nan


def model_label(s: dict[str, Any]) -> str:
    return f"{s['model_mode']} ({s['model_latency']})"


MS = ".1f"
STAT_COLS = ["mean", "sd", "min", "max", "p50", "p95", "p99"]


# ---------------------------------------------------------------- Table 2 and overhead

def _few_p99(n: int) -> bool:
    return 0 < n < FEW_FOR_P99


def _ci_columns(x: np.ndarray, name: str, statistic: str, point: float) -> dict[str, Any]:
    """``<name> CI low``/``high`` (CSV) and ``<name> [95% CI]`` (display) for ``statistic`` of ``x``."""
    lo, hi = bootstrap_ci(x, statistic)
    return {f"{name} CI low": lo, f"{name} CI high": hi, f"{name} [95% CI]": with_ci(point, (lo, hi))}


P99_NOTE = (f"* p99 of fewer than {FEW_FOR_P99} turns: interpolated between the largest few values (close to "
            f"the maximum), not a tail estimate.")
CI_NOTE = ("Brackets: 95% percentile-bootstrap confidence interval (2000 resamples, fixed seed; none for fewer than "
           "5 turns).")


def _p99_cells(df: pd.DataFrame) -> tuple[pd.Series, list[str]]:
    """The p99 column as text, marked ``*`` where it comes from few turns; and the note saying what that means."""
    few = [_few_p99(int(n)) for n in df["n"]]
    text = pd.Series([cell(v, MS) + ("*" if f and not _missing(v) else "") for v, f in zip(df["p99"], few)],
                     index=df.index)
    return text, [P99_NOTE] if any(few) else []


def table2(series: list[dict[str, Any]]) -> Table | None:
    rows = []
    for s in (s for s in series if s["section"] == "table2"):
        x = column(s["turns"], "client_ms")
        st = summarise(x)
        rows.append({"Series": s["name"], "Loop": s["loop"].capitalize(), "Model": model_label(s),
                     "Workload": s["workload"], **st, **_ci_columns(x, "mean", "mean", st["mean"]),
                     **_ci_columns(x, "median", "median", st["p50"])})
    if not rows:
        return None
    df = pd.DataFrame(rows).sort_values(["Workload", "Model", "Loop"], kind="stable").reset_index(drop=True)
    df["p99 (ms)"], notes = _p99_cells(df)
    cols = ["Series", "Workload", "Model", "Loop", "n", "mean [95% CI]", "median [95% CI]", "sd", "min", "p95",
            "p99 (ms)", "max", "mean", "mean CI low", "mean CI high", "p50", "median CI low", "median CI high", "p99"]
    df = df[cols]
    return Table("table2", "Per-turn client latency (ms), durable (Temporal workflow) and plain (asyncio) agent "
                 "loops; warm-up turns excluded. " + CI_NOTE, df,
                 {"n": "d", **{c: MS for c in STAT_COLS}, "mean [95% CI]": "", "median [95% CI]": "",
                  "p99 (ms)": ""},
                 hide=("Series", "mean", "mean CI low", "mean CI high", "p50", "median CI low", "median CI high",
                       "p99"),
                 headers={"mean [95% CI]": "mean (ms) [95% CI]", "median [95% CI]": "median (ms) [95% CI]",
                          "sd": "sd (ms)", "min": "min (ms)", "p95": "p95 (ms)", "max": "max (ms)"},
                 display=("mean [95% CI]", "median [95% CI]", "p99 (ms)"),
                 tex_cols=("Workload", "Model", "Loop", "n", "mean [95% CI]", "median [95% CI]", "sd", "p95",
                           "p99 (ms)", "max"), colspec={"Model": "p{2.6cm}"},
                 tex_headers={"mean [95% CI]": "mean (ms)\n[95% CI]", "median [95% CI]": "median (ms)\n[95% CI]",
                              "sd": "sd\n(ms)", "min": "min\n(ms)", "p95": "p95\n(ms)", "p99 (ms)": "p99\n(ms)",
                              "max": "max\n(ms)"},
                 wide=True, notes=notes)


def table2_overhead(series: list[dict[str, Any]]) -> tuple[Table | None, list[str]]:
    """Durable against plain per (workload, model mode, model latency); also the problems found pairing them."""
    problems: list[str] = []
    groups: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for s in (s for s in series if s["section"] == "table2"):
        key = (s["workload"], s["model_mode"], s["model_latency"])
        if s["loop"] in groups.setdefault(key, {}):
            problems.append(f"table2: two {s['loop']} series for {key}; using {groups[key][s['loop']]['name']}")
            continue
        groups[key][s["loop"]] = s
    rows = []
    for (workload, mode, lat), by in sorted(groups.items()):
        d, p = by.get("durable"), by.get("plain")
        if d is None or p is None:
            problems.append(f"table2: no {'plain' if d else 'durable'} series to compare with for "
                            f"{workload}/{mode} ({lat})")
            continue
        dc, pc = column(d["turns"], "client_ms"), column(p["turns"], "client_ms")
        plain_by_i = {t["i"]: t["client_ms"] for t in p["turns"]}
        # Pair turns by their index i; a turn missing from either series is left out of the per-turn ratio.
        ratios = [t["client_ms"] / plain_by_i[t["i"]] for t in d["turns"]
                  if t["i"] in plain_by_i and plain_by_i[t["i"]] > 0]
        d_over = dc - column(d["turns"], "model_ms")
        p_over = pc - column(p["turns"], "model_ms")
        dm, pm = float(np.mean(dc)), float(np.mean(pc))
        do = float(np.nanmean(d_over)) if not np.isnan(d_over).all() else math.nan
        po = float(np.nanmean(p_over)) if not np.isnan(p_over).all() else math.nan
        rows.append({"Workload": workload, "Model": f"{mode} ({lat})", "Durable": d["name"], "Plain": p["name"],
                     "paired turns": len(ratios), "durable mean": dm, "plain mean": pm,
                     "ratio of means": dm / pm if pm > 0 else math.nan,
                     "median turn ratio": float(np.median(ratios)) if ratios else math.nan,
                     "difference": dm - pm, "durable overhead": do, "plain overhead": po,
                     "overhead difference": do - po})
    if not rows:
        return None, problems
    fm = {"paired turns": "d", "ratio of means": ".2f", "median turn ratio": ".2f"}
    fm |= {c: MS for c in ("durable mean", "plain mean", "difference", "durable overhead", "plain overhead",
                           "overhead difference")}
    return Table("table2_overhead", "Durable against plain: means (ms), ratio of means, median of per-turn ratios "
                 "(turns paired by index), difference of means (ms), and loop overhead = mean(client_ms - model_ms) "
                 "(ms).", pd.DataFrame(rows), fm, hide=("Durable", "Plain"),
                 headers={c: f"{c} (ms)" for c in fm if fm[c] == MS},
                 tex_cols=("Workload", "Model", "durable mean", "plain mean", "ratio of means", "median turn ratio",
                           "durable overhead", "plain overhead", "overhead difference"),
                 colspec={"Model": "p{2.6cm}"},
                 tex_headers={"durable mean": "durable\nmean\n(ms)", "plain mean": "plain\nmean\n(ms)",
                              "ratio of means": "ratio\nof\nmeans", "median turn ratio": "median\nturn\nratio",
                              "durable overhead": "durable\noverhead\n(ms)",
                              "plain overhead": "plain\noverhead\n(ms)",
                              "overhead difference": "overhead\ndifference\n(ms)"},
                 wide=True), problems


# ---------------------------------------------------------------- breakdown and tuning

# (label, how to get it from a breakdown turn)
COMPONENTS: list[tuple[str, Any]] = [
    ("client_rtt", lambda t: column(t, "client_rtt_ms")),
    ("wft_sched_to_start", lambda t: column(t, "wft_sched_to_start_ms")),
    ("wft_exec", lambda t: column(t, "wft_exec_ms")),
    ("act_sched_to_start", lambda t: column(t, "act_sched_to_start_ms")),
    ("act_exec - model", lambda t: column(t, "act_exec_ms") - np.nan_to_num(column(t, "model_ms"))),
    ("model", lambda t: column(t, "model_ms")),
    ("other", lambda t: column(t, "other_ms")),
]


def component_medians(turns: list[dict[str, Any]]) -> dict[str, float]:
    return {label: _median(get(turns)) for label, get in COMPONENTS}


def breakdown(series: list[dict[str, Any]]) -> Table | None:
    rows = []
    for s in series:
        t = s["turns"]
        comps = component_medians(t)
        client = column(t, "client_ms")
        med = _median(client)
        rows.append({"Series": s["name"], "n": len(t), "client": med, **_ci_columns(client, "client", "median", med),
                     "server": _median(column(t, "server_ms")), **comps,
                     "sum of components": float(np.nansum(list(comps.values())))})
    if not rows:
        return None
    cols = ["n", "client", "server", *(c for c, _ in COMPONENTS), "sum of components"]
    df = pd.DataFrame(rows)[["Series", "n", "client [95% CI]", *cols[1:], "client CI low", "client CI high"]]
    return Table("breakdown", "Where a durable turn's time goes: median per turn of each component (ms), from the "
                 "Temporal event histories. Medians do not add up exactly to the median client latency. " + CI_NOTE,
                 df, {**{c: ("d" if c == "n" else MS) for c in cols}, "client [95% CI]": ""},
                 hide=("client", "client CI low", "client CI high"), display=("client [95% CI]",),
                 headers={"client [95% CI]": "client (ms) [95% CI]"} | {c: f"{c} (ms)" for c in cols[1:]},
                 tex_headers={"client [95% CI]": "client (ms)\n[95% CI]", "server": "server\n(ms)",
                              "client_rtt": "client\nRTT", "wft_sched_to_start": "WFT\nwait",
                              "wft_exec": "WFT\nexec", "act_sched_to_start": "activity\nwait",
                              "act_exec - model": "activity exec\n- model", "model": "model\n(ms)",
                              "other": "other\n(ms)", "sum of components": "sum\n(ms)"},
                 wide=True)


def tuning(series: list[dict[str, Any]], breakdown_series: list[dict[str, Any]] | None) -> Table | None:
    tuned = [s for s in series if s["section"] == "tuning"]
    if not tuned:
        return None
    by_name = {b["name"]: b for b in breakdown_series or []}
    # The baseline is the untuned setup: the stock server with the SDK's default worker options.
    base = next((s for s in tuned if s.get("server") == "stock" and s.get("variant", "eager") == "eager"
                 and s.get("eager", True)), tuned[0])
    base_median = _median(column(base["turns"], "client_ms"))
    rows = []
    for s in tuned:
        x = column(s["turns"], "client_ms")
        st = summarise(x)
        comps = component_medians(by_name[s["name"]]["turns"]) if s["name"] in by_name else {}
        rows.append({"Series": s["name"], "Server": s.get("server") or DASH,
                     "Worker": s.get("variant") or DASH,
                     "Eager": {True: "on", False: "off"}.get(s.get("eager"), DASH),
                     "Sandbox": {True: "on", False: "off"}.get(s.get("sandbox"), DASH), "Workload": s["workload"],
                     "n": st["n"], **_ci_columns(x, "median", "median", st["p50"]), "median": st["p50"],
                     "mean": st["mean"], "p95": st["p95"],
                     "vs baseline": st["p50"] / base_median if base_median > 0 else math.nan,
                     **{f"median {k}": v for k, v in comps.items()}})
    df = pd.DataFrame(rows)
    hide = tuple(c for c in df.columns if c.startswith("median ") and c != "median [95% CI]") + ("median",)
    return Table("tuning", f"Tuning: client latency (ms) per server profile and worker options (eager activities, "
                 f"workflow sandbox); 'vs baseline' is the median relative to {base['name']}. " + CI_NOTE, df,
                 {"n": "d", "median [95% CI]": "", "median": MS, "mean": MS, "p95": MS, "vs baseline": ".2f",
                  **{c: MS for c in hide}},
                 hide=hide, display=("median [95% CI]",),
                 headers={"median [95% CI]": "median (ms) [95% CI]", "mean": "mean (ms)", "p95": "p95 (ms)"})


def overhead(series: list[dict[str, Any]], breakdown_series: list[dict[str, Any]] | None) -> Table | None:
    """The overhead section: per configuration and workload (and round and load, when the run repeated it), the
    durable overhead per turn (client minus the model's own), the floor of the same number of dispatches beside
    it, their ratio, and where the time went."""
    mine = [s for s in series if s["section"] == "overhead"]
    if not mine:
        return None
    by_name = {b["name"]: b for b in breakdown_series or []}
    floors = {s["name"]: _median(column(s["turns"], "client_ms")) for s in mine if s.get("loop") == "floor"}
    # runs before the pairing measured one floor per shape after every agent series: found by shape
    shapes = {(s.get("floor_activities"), s.get("floor_local")): floors[s["name"]]
              for s in mine if s.get("loop") == "floor"}
    rows = []
    for s in mine:
        t = s["turns"]
        over = _median(column(t, "client_ms") - np.nan_to_num(column(t, "model_ms")))
        tags = {"load": int(s.get("load_processes") or 0), "round": int(s.get("round") or 1)}
        if s.get("loop") == "floor":
            shape = f"{s['floor_activities']} trivial activit{'y' if s['floor_activities'] == 1 else 'ies'}"
            rows.append({"Series": s["name"], "Configuration": "floor", "Workload": shape, **tags, "n": len(t),
                         "overhead p50": over, "floor p50": math.nan, "above floor": math.nan,
                         "vs floor": math.nan})
            continue
        if "floor" in s:  # paired turn by turn: the ratio is the median of the per-turn ratios
            floor = floors.get(s["floor"], math.nan) if s["floor"] else math.nan
            ratio = median_floor_ratio(t)
        else:
            steps = 1 if s["workload"] == "reply" else 3
            # a tool turn's three steps (two model calls, the calculator): a floor only where all are alike
            local_model, local_tool = bool(s.get("local_model")), bool(s.get("local_tools"))
            shape = None if steps == 3 and local_model != local_tool else (steps, local_model)
            floor = shapes.get(shape, math.nan) if shape else math.nan
            ratio = over / floor
        comps = component_medians(by_name[s["name"]]["turns"]) if s["name"] in by_name else {}
        rows.append({"Series": s["name"], "Configuration": s.get("variant") or DASH, "Workload": s["workload"],
                     **tags, "n": len(t), "overhead p50": over, "floor p50": floor, "above floor": over - floor,
                     "vs floor": ratio, **{f"median {k}": v for k, v in comps.items()}})
    df = pd.DataFrame(rows)
    hide = tuple(c for c in df.columns if c.startswith("median "))
    if df["load"].eq(0).all() and df["round"].eq(1).all():
        hide += ("load", "round")
    return Table("overhead", "Durable overhead per turn with the worker in its own process (ms, median of serial "
                 "turns, instant model): client latency minus the model's own, per agent configuration (model calls "
                 "and tools dispatched or local activities); 'floor' is an Update running the same number of trivial "
                 "activities, all dispatched or all local like the turn's steps (none for a mix), on the same server, "
                 "its turns interleaved with the agent's (agent, floor, agent, floor, ...); 'vs floor' is the median "
                 "of the per-turn ratios overhead / floor (a run from before the interleaving measured the floors "
                 "after every agent series: the ratio of the two medians). 'load': CPU-bound processes beside the "
                 "round.", df,
                 {"n": "d", "load": "d", "round": "d", "overhead p50": MS, "floor p50": MS, "above floor": MS,
                  "vs floor": ".2f", **{c: MS for c in hide if c.startswith("median ")}},
                 hide=hide)


def overhead_spread(series: list[dict[str, Any]]) -> Table | None:
    """The overhead section's ratios over its rounds, idle and with CPU-bound processes beside it."""
    spreads = floor_ratio_spreads([s for s in series if s["section"] == "overhead"])
    if not spreads:
        return None
    df = pd.DataFrame([{"Series": s["series"], "Floor": s["floor"], "load": s["load_processes"], "rounds": s["n"],
                        "median": s["median"], "q1": s["q1"], "q3": s["q3"], "min": s["min"], "max": s["max"]}
                       for s in spreads])
    return Table("overhead_spread", "Overhead / floor over the section's rounds (--overhead-rounds), per load "
                 "(CPU-bound processes beside the round, --overhead-load): each round's figure is the median of its "
                 "per-turn ratios, each agent turn paired with the floor turn measured right after it; median, "
                 "quartiles and range of the rounds' figures.", df,
                 {"load": "d", "rounds": "d", **{c: ".2f" for c in ("median", "q1", "q3", "min", "max")}})


# ---------------------------------------------------------------- scaling, throughput, recovery, resources, micro

def length_turns(series: list[dict[str, Any]]) -> pd.DataFrame:
    rows = [{"series": s["name"], "continue_as_new": s.get("continue_as_new"), **{k: t.get(k) for k in
            ("i", "client_ms", "history_bytes", "history_events", "run_index")}} for s in series for t in s["turns"]]
    return pd.DataFrame(rows, columns=["series", "continue_as_new", "i", "client_ms", "history_bytes",
                                       "history_events", "run_index"])


def length(series: list[dict[str, Any]]) -> Table | None:
    rows = []
    for s in series:
        t = sorted(s["turns"], key=lambda t: t["i"])
        if not t:
            continue
        k = max(1, len(t) // 10)
        runs = {x.get("run_index") for x in t if not math.isnan(x.get("run_index", math.nan))}
        rows.append({"Series": s["name"], "Continue-as-new": s.get("continue_as_new") or DASH, "turns": len(t),
                     "runs": len(runs) or math.nan, "median first 10% (ms)": _median(column(t[:k], "client_ms")),
                     "median last 10% (ms)": _median(column(t[-k:], "client_ms")),
                     "max history (KiB)": np.nanmax(column(t, "history_bytes")) / 1024
                     if not np.isnan(column(t, "history_bytes")).all() else math.nan,
                     "max events": np.nanmax(column(t, "history_events"))
                     if not np.isnan(column(t, "history_events")).all() else math.nan})
    if not rows:
        return None
    return Table("length", "Latency and history size against conversation length: median client latency over the "
                 "first and last tenth of the turns, and the largest history of a single run.", pd.DataFrame(rows),
                 {"turns": "d", "runs": "d", "median first 10% (ms)": MS, "median last 10% (ms)": MS,
                  "max history (KiB)": ".1f", "max events": "d"})


def throughput(points: list[dict[str, Any]]) -> Table | None:
    cols = ["workers", "conversations", "turns_per_conversation", "turns", "wall_s", "turns_per_s", "p50_ms",
            "p95_ms", "errors"]
    if not points:
        return None
    df = pd.DataFrame([{c: p.get(c) for c in cols} for p in points], columns=cols)
    df = df.sort_values(["workers", "conversations"], kind="stable").reset_index(drop=True)
    return Table("throughput", "Throughput: turns per second against concurrent conversations and worker processes. "
                 "Each row is one measurement (turns over one wall-clock window), so it has no confidence "
                 "interval; repeat the run to see its spread.",
                 df, {"workers": "d", "conversations": "d", "turns_per_conversation": "d", "turns": "d",
                      "wall_s": ".1f", "turns_per_s": ".1f", "p50_ms": MS, "p95_ms": MS, "errors": "d"})


def recovery(points: list[dict[str, Any]]) -> Table | None:
    cols = ["heartbeat_s", "tool_s", "kill_after_s", "baseline_ms", "killed_ms", "recovery_s", "killed_worker"]
    if not points:
        return None
    df = pd.DataFrame([{**{c: p.get(c) for c in cols}, **recovery_waits(p)} for p in points],
                      columns=[*cols, "activity wait_s", "workflow task wait_s"])
    df = df.sort_values("heartbeat_s", kind="stable").reset_index(drop=True)
    df["recovery - heartbeat_s"] = df["recovery_s"] - df["heartbeat_s"]
    return Table("recovery", "Recovery after a worker SIGKILL: time the kill added to a turn whose tool activity "
                 "ran on the killed worker, against the activity heartbeat timeout. From the killed turn's history: "
                 "activity wait = scheduled to (last attempt) started (the dead attempt, the heartbeat timeout and "
                 "the retry backoff); workflow task wait = time workflow tasks waited for a worker (a task sent to "
                 "the dead worker's sticky queue waits for its schedule-to-start timeout).", df,
                 {"heartbeat_s": ".1f", "tool_s": ".1f", "kill_after_s": ".1f", "baseline_ms": MS, "killed_ms": MS,
                  "recovery_s": ".2f", "recovery - heartbeat_s": ".2f", "activity wait_s": ".2f",
                  "workflow task wait_s": ".2f"})


def checkpoint(points: list[dict[str, Any]]) -> Table | None:
    """One row per point; the p50 and the mean with their bootstrap 95 % intervals where the run saved the
    samples (``samples_ms``; runs before it: the points alone)."""
    if not points:
        return None
    rows = []
    for p in points:
        x = np.asarray(p.get("samples_ms") or [], dtype=float)
        row = {c: p.get(c) for c in ("measure", "backend", "n")}
        for name, statistic, key in (("p50", "median", "p50_ms"), ("mean", "mean", "mean_ms")):
            point = _num_or_nan(p.get(key))
            row[key] = point
            row.update(_ci_columns(x, name, statistic, point))  # no samples: no interval (NaN)
        row["p95_ms"], row["vs_floor"] = _num_or_nan(p.get("p95_ms")), _num_or_nan(p.get("vs_floor"))
        rows.append(row)
    df = pd.DataFrame(rows)
    for name in ("p50", "mean"):  # three decimals: a step is a fraction of a millisecond
        df[f"{name} [95% CI]"] = [with_ci(pt, (lo, hi), ".3f") for pt, lo, hi in
                                  zip(df[f"{name}_ms"], df[f"{name} CI low"], df[f"{name} CI high"])]
    cols = ["measure", "backend", "n", "p50 [95% CI]", "mean [95% CI]", "p95_ms", "vs_floor",
            "p50_ms", "p50 CI low", "p50 CI high", "mean_ms", "mean CI low", "mean CI high"]
    return Table("checkpoint", "The checkpoint engine against the plain loop and Temporal, in one run. floor: one "
                 "fsync'd SQLite commit (WAL, synchronous=FULL, one-row insert) and a raw write + fsync; step: a "
                 "no-op checkpointed step (vs_floor = p50 / the SQLite floor); turn: one prompt answered by the "
                 "reference agent (model, calculator, model; scripted model, no added latency). Bootstrap 95 % "
                 "intervals of the p50 and the mean.", df[cols],
                 {"n": "d", "p50 [95% CI]": "", "mean [95% CI]": "", "p95_ms": ".3f", "vs_floor": ".2f",
                  "p50_ms": ".3f", "mean_ms": ".3f"},
                 hide=("p50_ms", "p50 CI low", "p50 CI high", "mean_ms", "mean CI low", "mean CI high"),
                 display=("p50 [95% CI]", "mean [95% CI]"),
                 headers={"p50 [95% CI]": "p50 (ms) [95% CI]", "mean [95% CI]": "mean (ms) [95% CI]",
                          "p95_ms": "p95 (ms)"},
                 tex_headers={"p50 [95% CI]": "p50 (ms)\n[95% CI]", "mean [95% CI]": "mean (ms)\n[95% CI]",
                              "p95_ms": "p95 (ms)", "vs_floor": "vs floor"},
                 wide=True)


def recovery_waits(point: dict[str, Any]) -> dict[str, float]:
    """The killed turn's activity and workflow-task waits (s), from its breakdown; NaN when not recorded."""
    turn = point.get("killed_turn") or {}
    return {"activity wait_s": turn.get("act_sched_to_start_ms", math.nan) / 1000.0,
            "workflow task wait_s": turn.get("wft_sched_to_start_ms", math.nan) / 1000.0}


RESOURCE_COLS = ["cpu_mean_pct", "cpu_max_pct", "rss_mean_mb", "rss_max_mb", "samples"]


def resources(doc: dict[str, Any]) -> Table | None:
    rows = [{"section": sec, "process": proc, **vals} for sec, procs in doc["sections"].items()
            for proc, vals in procs.items()]
    if not rows:
        return None
    return Table("resources", "CPU (% of one core) and resident memory (MB) of each process during each benchmark "
                 f"section, sampled every {doc.get('interval_s') or '?'} s.",
                 pd.DataFrame(rows, columns=["section", "process", *RESOURCE_COLS]),
                 {"cpu_mean_pct": ".1f", "cpu_max_pct": ".1f", "rss_mean_mb": ".1f", "rss_max_mb": ".1f",
                  "samples": "d"})


def micro(doc: dict[str, Any]) -> Table | None:
    rows = []
    for b in doc["benchmarks"]:
        st = b["stats"]
        us = {k: _num_or_nan(st.get(k)) * 1e6 for k in ("min", "median", "mean", "stddev", "max")}
        rows.append({"name": str(b.get("name", "?")), "fullname": str(b.get("fullname", "")),
                     "rounds": _num_or_nan(st.get("rounds")), **{f"{k} (µs)": v for k, v in us.items()},
                     "ops/s": _num_or_nan(st.get("ops"))})
    if not rows:
        return None
    df = pd.DataFrame(rows)
    return Table("micro", "Micro-benchmarks (pytest-benchmark): time per call in µs.", df,
                 {"rounds": "d", **{c: ".2f" for c in df.columns if c.endswith("(µs)")}, "ops/s": ",.0f"},
                 hide=("fullname",))


def _num_or_nan(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


# ---------------------------------------------------------------- Table 1 and migration fuzz

def checked(run: ChaosRun) -> str:
    """The checker names, each non-pass one marked with its verdict."""
    parts = []
    for c in run.checks:
        v = c.get("verdict")
        name = str(c.get("name", "?"))
        label = {"fail": "FAIL", "not_applicable": "not applicable"}.get(v, "unknown")
        if v == "not_applicable" and str(c.get("summary", "")).startswith("declared:"):
            label = str(c["summary"])[:120]  # the target's own word (effects = "none"), not the harness's
        parts.append(name if v == "pass" else f"{name} ({label})")
    return ", ".join(parts) if parts else "not checked"


def outcome(run: ChaosRun) -> str:
    label = {"pass": "pass", "fail": "FAIL"}.get(run.verdict, "unknown")
    return f"{label} ({run.verdict_note})" if run.verdict_note else label


def table1(runs: list[ChaosRun]) -> Table | None:
    if not runs:
        return None
    rows = []
    for r in runs:
        s = r.summary
        scen = r.record.get("scenario") if isinstance(r.record.get("scenario"), dict) else {}
        rec = s.get("recovery_s")

        def seconds(key: str) -> float:
            value = s.get(key)
            return float(value) if isinstance(value, (int, float)) else math.nan

        rows.append({"Scenario": r.label, "Fault": str(scen.get("description") or DASH), "Checked": checked(r),
                     "Outcome": outcome(r), "Faults landed": str(s.get("faults", "?")),
                     "Timeouts": str(scen.get("timeouts") or DASH),
                     "Recovery (s)": float(rec) if isinstance(rec, (int, float)) else math.nan,
                     "Model call held (s)": seconds("model_rec_s"), "Tool held (s)": seconds("tool_rec_s"),
                     "Workflow task held (s)": seconds("wft_rec_s"),
                     "Duplicated effects": str(s.get("dup_effects", "?")), "ok": s.get("ok"),
                     "fail": s.get("fail"), "info": s.get("info"), "Run": str(r.path)})
    return Table("table1", "Fault scenarios: the fault injected, the checks run on the saved run (non-pass marked), "
                 "the verdict, the timeouts profile (fast or the untuned defaults; SCENARIO~defaults runs the same "
                 "faults under the defaults), recovery (longest time from the end of a fault to the next "
                 "acknowledged message), how long a fault held a model call, a tool and a workflow task up (the "
                 "worst over the run, from the fault or from a replacement polling; empty: nothing of that kind was "
                 "held), duplicated side effects, and client operation outcomes.", pd.DataFrame(rows),
                 {"Recovery (s)": ".1f", "Model call held (s)": ".2f", "Tool held (s)": ".2f",
                  "Workflow task held (s)": ".2f", "Duplicated effects": "", "Faults landed": "", "ok": "d",
                  "fail": "d", "info": "d"}, hide=("Run",),
                 colspec={"Scenario": "p{1.8cm}", "Fault": "p{2.6cm}", "Checked": "p{2.4cm}", "Outcome": "p{1.4cm}"},
                 tex_cols=("Scenario", "Fault", "Checked", "Outcome", "Faults landed", "Recovery (s)",
                           "Model call held (s)", "Tool held (s)", "Workflow task held (s)", "Duplicated effects",
                           "ok", "fail", "info"),
                 tex_headers={"Faults landed": "faults\nlanded", "Recovery (s)": "recov-\nery\n(s)",
                              "Model call held (s)": "model\nheld\n(s)", "Tool held (s)": "tool\nheld\n(s)",
                              "Workflow task held (s)": "WFT\nheld\n(s)", "Duplicated effects": "dup.\neffects"},
                 wide=True)


#: chaos.recovery.PARTS, as the report heads them
RECOVERY_PARTS = {"detection_s": "Detection (s)", "no_worker_s": "No worker (s)", "backoff_s": "Backoff (s)", "sticky_wait_s": "Sticky wait (s)",
                  "replay_s": "Replay (s)", "turn_s": "Turn (s)", "client_delivery_s": "Client delivery (s)",
                  "before_send_s": "Before send (s)"}
_PARTS_CAPTION = ("detection (the work sat on the dead worker until a heartbeat or workflow task timeout), no worker "
                  "(every worker was down until a replacement polled), backoff "
                  "(the retry's backoff and dispatch), sticky wait (a workflow task on the dead worker's sticky "
                  "queue), replay (the next workflow task, on another worker), turn (the turn's own work), client "
                  "delivery (the server held the reply, or had lost the message, and the client did not know yet), "
                  "before send (the conversation had not sent the message yet)")


def recovery_parts(runs: list[ChaosRun]) -> Table | None:
    """Each chaos run's recovery (the worst wait from a fault's end to a correct answer) cut into its parts."""
    rows = []
    for r in runs:
        parts = r.recovery_parts.get("parts") if isinstance(r.recovery_parts.get("parts"), dict) else None
        if parts is None:
            continue
        rows.append({"Scenario": r.label, "Recovery (s)": _seconds(r.recovery_parts.get("total_s")),
                     **{head: _seconds(parts.get(key)) for key, head in RECOVERY_PARTS.items()}})
    if not rows:
        return None
    return Table("recovery_parts", "Recovery, part by part: each run's worst wait from a fault's end to a correct "
                 "answer (wall clock), cut into " + _PARTS_CAPTION + ". The parts add up to the wait.",
                 pd.DataFrame(rows), {c: ".2f" for c in ["Recovery (s)", *RECOVERY_PARTS.values()]})


def soak_recovery(run: SoakRun) -> Table | None:
    """A soak's recovery over its seeds (p50, p95, max) and each part's mean, from each seed's verdict.json."""
    measured = [r["recovery"] for r in run.runs if isinstance(r.get("recovery"), dict)
                and isinstance(r["recovery"].get("worst_s"), (int, float))]
    if not measured:
        return None
    rec = [float(m["worst_s"]) for m in measured]
    stats = summarise(rec)
    held = summarise([float(m["held_s"]) for m in measured if isinstance(m.get("held_s"), (int, float))])
    row = {"seeds": len(rec), "p50 (s)": stats["p50"], "p95 (s)": stats["p95"], "max (s)": stats["max"],
           "held p50 (s)": held["p50"], "held p95 (s)": held["p95"]}
    for key, head in RECOVERY_PARTS.items():
        values = [float(m["parts"][key]) for m in measured if isinstance(m.get("parts"), dict)
                  and isinstance(m["parts"].get(key), (int, float))]
        row[f"mean {head[0].lower()}{head[1:]}"] = summarise(values)["mean"]
    return Table(f"soak-{run.scenario}-recovery", f"Soak of {run.scenario}: recovery over its seeds (each seed's "
                 "worst wait from a fault's end to a correct answer), held (the same wait from when the message "
                 "was sent, if later) and the mean of each part: " + _PARTS_CAPTION
                 + ".", pd.DataFrame([row]), {c: "d" if c == "seeds" else ".2f" for c in row}, saved=False)


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else math.nan


FUZZ_COLS = ["iterations", "completed", "children", "cross_worker_children", "cross_worker_children_pct",
             "moved_workflows", "moved_workflows_pct", "activities_off_parent_worker_pct", "worker_kills",
             "violations", "mean_seconds"]


def migration_fuzz(run: FuzzRun) -> Table | None:
    rows = [{"family": k, **{c: v.get(c) for c in FUZZ_COLS}} for k, v in run.families.items()]
    if not rows:
        return None
    fm = {c: "d" for c in FUZZ_COLS} | {c: ".1f" for c in FUZZ_COLS if c.endswith("_pct")} | {"mean_seconds": ".2f"}
    return Table("migration_fuzz", "Cross-worker migration fuzzing: per shape family, how often children and "
                 "activities ran on another worker than their parent, and invariant violations.",
                 pd.DataFrame(rows, columns=["family", *FUZZ_COLS]), fm)


def checks_table(run: ChaosRun) -> Table | None:
    if not run.checks:
        return None
    rows = [{"check": str(c.get("name", "?")), "verdict": str(c.get("verdict", "?")),
             "summary": str(c.get("summary", ""))} for c in run.checks]
    return Table(f"checks-{run.label}", f"Checks of {run.label}.", pd.DataFrame(rows), saved=False)


# ---------------------------------------------------------------- soaks

SOAK_VERDICTS = ("pass", "fail", "unknown", "error")


def soak_distribution(run: SoakRun) -> Table:
    """Seeds per verdict, counted from the soak's rows (not from its stored counts, which a reader cannot check)."""
    n = len(run.runs)
    rows = [{"verdict": v, "seeds": sum(1 for r in run.runs if r["verdict"] == v),
             "%": 100.0 * sum(1 for r in run.runs if r["verdict"] == v) / n if n else math.nan}
            for v in SOAK_VERDICTS]
    other = n - sum(r["seeds"] for r in rows)
    if other:
        rows.append({"verdict": "other", "seeds": other, "%": 100.0 * other / n})
    return Table(f"soak-{run.scenario}", f"Soak of {run.scenario}: seeds per verdict.", pd.DataFrame(rows),
                 {"seeds": "d", "%": ".1f"}, saved=False)


def soak_seeds(run: SoakRun, anchors: list[str], run_links: list[str | None],
               failure_links: list[str | None]) -> Table:
    """Every seed the soak finished: its verdict, what went wrong (the error, or each failing/unknown check), its
    wall time and recovery, and its run directory. Row ``i`` is ``run.runs[i]``: its id ``anchors[i]``, its run
    directory's link ``run_links[i]`` and, if it did not pass, its entry among the failures ``failure_links[i]``
    (an anchor, without ``#``)."""
    rows = []
    for r in run.runs:
        why = [f"error: {r['error']}"] if r.get("error") else [
            f"{c.get('check', '?')}: {c.get('verdict', '?')}: {c.get('summary', '')}"
            for c in (r.get("non_pass") or []) if isinstance(c, dict)]
        rec = r.get("recovery") if isinstance(r.get("recovery"), dict) else {}
        rows.append({"seed": r["seed"], "verdict": r["verdict"], "what went wrong": "; ".join(why) or DASH,
                     "wall (s)": _seconds(r.get("wall_s")), "recovery (s)": _seconds(rec.get("worst_s")),
                     "run": r["path"].name if r.get("path") else DASH})
    return Table(f"soak-{run.scenario}-seeds", f"Soak of {run.scenario}: every seed that finished (a seed that did "
                 "not pass links to its entry among the failures, with its reproduce command).", pd.DataFrame(rows),
                 {"seed": "d", "wall (s)": ".1f", "recovery (s)": ".1f"}, saved=False, anchors=anchors,
                 links={"run": run_links, "verdict": [f"#{a}" if a else None for a in failure_links]})


# ---------------------------------------------------------------- engines side by side

def _engine_rank(name: str) -> int:
    return engine_rank(name, first=(PLAIN,))


def engines_turns(doc: dict[str, Any]) -> Table | None:
    """Table 2 per engine: per-turn latency, and the turn minus the time inside model steps (what the engine and
    the loop cost), each median with its bootstrap interval."""
    rows = []
    for s in doc["series"]:
        x = column(s["turns"], "client_ms")
        over = x - column(s["turns"], "model_ms")
        st = summarise(x)
        rows.append({"Engine": canonical(s["engine"]), "Workload": s["workload"], "Model": model_label(s), "n": st["n"],
                     **_ci_columns(x, "median", "median", st["p50"]), "p95": st["p95"],
                     **_ci_columns(over, "minus model", "median", float(np.nanmedian(over)) if over.size else math.nan),
                     "p50": st["p50"], "minus model p50": float(np.nanmedian(over)) if over.size else math.nan,
                     "_rank": _engine_rank(s["engine"])})
    if not rows:
        return None
    df = pd.DataFrame(rows).sort_values(["Workload", "Model", "_rank"], kind="stable").reset_index(drop=True)
    cols = ["Workload", "Model", "Engine", "n", "median [95% CI]", "p95", "minus model [95% CI]",
            "p50", "median CI low", "median CI high", "minus model p50", "minus model CI low", "minus model CI high"]
    return Table("engines_turns", "The same agent loop on each engine, one run: per-turn client latency (ms) of a "
                 "one-shot run per turn (warm-up turns excluded), and the turn minus the time spent inside model "
                 "steps (the effect ledger's model-call executions: the model and its client library), which is what "
                 "the engine and the loop cost. Engines ran one after another in one process, with the same seeded "
                 "model latencies. " + CI_NOTE, df[cols],
                 {"n": "d", "median [95% CI]": "", "p95": MS, "minus model [95% CI]": "", "p50": MS,
                  "minus model p50": MS},
                 hide=("p50", "median CI low", "median CI high", "minus model p50", "minus model CI low",
                       "minus model CI high"),
                 display=("median [95% CI]", "minus model [95% CI]"),
                 headers={"median [95% CI]": "median (ms) [95% CI]", "p95": "p95 (ms)",
                          "minus model [95% CI]": "minus model (ms) [95% CI]"},
                 tex_headers={"median [95% CI]": "median (ms)\n[95% CI]", "p95": "p95\n(ms)",
                              "minus model [95% CI]": "minus model (ms)\n[95% CI]"},
                 colspec={"Model": "p{2.6cm}"}, wide=True)


def engines_steps(doc: dict[str, Any]) -> Table | None:
    """A no-op step on each engine against the disk's floor, with each engine's durability settings."""
    rows = []
    for p in doc["steps"]:
        x = np.asarray(p.get("samples_ms") or [], dtype=float)
        point = _num_or_nan(p.get("p50_ms"))
        name = canonical(p.get("engine") or "?")
        config = (doc["configs"].get(p.get("engine")) or doc["configs"].get(name) or {}) if p["measure"] == "step" else {}
        rows.append({"measure": p["measure"], "engine": name, "n": p.get("n"), "p50_ms": point,
                     **_ci_columns(x, "p50", "median", point), "p95_ms": _num_or_nan(p.get("p95_ms")),
                     "vs_floor": _num_or_nan(p.get("vs_floor")), "durability": _durability(config)})
    if not rows:
        return None
    df = pd.DataFrame(rows)
    for row in df.index:  # three decimals: a step may be a fraction of a millisecond
        df.loc[row, "p50 [95% CI]"] = with_ci(df.loc[row, "p50_ms"], (df.loc[row, "p50 CI low"],
                                                                      df.loc[row, "p50 CI high"]), ".3f")
    cols = ["measure", "engine", "n", "p50 [95% CI]", "p95_ms", "vs_floor", "durability", "p50_ms", "p50 CI low",
            "p50 CI high"]
    notes = [f"{name}: not measured ({why})" for name, why in doc["unavailable"].items()]
    return Table("engines_steps", "What one durable step costs on each engine: a no-op step (nothing but the "
                 "engine's bookkeeping), against the floor of one durable write on this disk (floor: one fsync'd "
                 "SQLite commit, WAL, synchronous=FULL; and a raw write + fsync); vs_floor = p50 / the SQLite floor. "
                 "durability: the settings each engine ran with, as read from it.", df[cols],
                 {"n": "d", "p50 [95% CI]": "", "p95_ms": ".3f", "vs_floor": ".2f", "p50_ms": ".3f"},
                 hide=("p50_ms", "p50 CI low", "p50 CI high"), display=("p50 [95% CI]",),
                 headers={"p50 [95% CI]": "p50 (ms) [95% CI]", "p95_ms": "p95 (ms)"},
                 colspec={"durability": "p{6cm}"}, wide=True, notes=notes)


#: what the durability cell leaves out: where things were (paths, addresses), not how durable they were
NOT_DURABILITY = ("path", "url", "base_dir", "binary", "admin_url", "ingress_url", "endpoint")


def _durability(config: dict[str, Any]) -> str:
    """An engine's durability settings in one cell, in its own words: its ``durability`` settings (found at the
    top or one level down, e.g. a server's), else the top-level items of its configuration."""
    found = config.get("durability")
    if not isinstance(found, dict):
        found = next((v["durability"] for v in config.values() if isinstance(v, dict)
                      and isinstance(v.get("durability"), dict)), None)
    items = found if isinstance(found, dict) else config
    return "; ".join(f"{k}: {v}" for k, v in items.items()
                     if not isinstance(v, (dict, list)) and k not in NOT_DURABILITY)
