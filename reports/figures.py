"""The report's figures (matplotlib, Agg backend: no display needed), in the one style of ``reports.style``.

Contract: each ``plot_*`` function takes normalised data from
``reports.sources`` / ``reports.tables`` and a directory, saves
``<dir>/<name>.pdf``, ``.png`` and ``.svg`` at the figure's print size
(``style.SINGLE`` or ``style.DOUBLE`` wide), and returns a ``Figure`` record
(name, title, caption) for the report, or None when there is nothing to plot
(``plot_chaos``, ``plot_length`` and ``plot_breakdown``: a list, one figure per question).
Images carry no titles: the caption says what a figure shows. Every axis is
labelled with its unit; integer axes have integer ticks; series with long names
are horizontal bars; a log axis has at least three labelled ticks (``log_ticks``);
a durable/plain pair shares a colour and the loop is the line style; a median or
mean drawn as a bar or point carries its 95 % bootstrap interval as an error bar
(``reports.confidence``). Chaos figures follow Jepsen's conventions: ok blue, fail
red, info orange; a strip above the data names the run's phases, each nemesis fault
(one lane per kind, injection to end) and the supervisor's restarts, and the panel
below shades the same windows; the setup before the warm-up is not drawn.
Length figures mark each continue-as-new (a new run of the workflow).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from reports import ops as opsmod
from reports import style
from reports.sources import ChaosRun
from reports.confidence import bootstrap_ci
from reports.tables import COMPONENTS, column, component_medians, recovery_waits

log = logging.getLogger(__name__)

TYPE_COLOURS = {"ok": "#1f77b4", "fail": "#d62728", "info": "#ff9f1c"}  # Jepsen's
FAULT_COLOURS = {"kill_worker": "#9467bd", "model_outage": "#8c564b", "partition": "#e377c2",
                 "pause_worker": "#7f7f7f", "restart_server": "#bcbd22", "degrade_link": "#17becf",
                 "deploy_fix": "#2ca02c"}
_SPARE = ["#aec7e8", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5"]
COMPONENT_COLOURS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3"]
MODEL = "model"  # the component that is the model's own time, not the loop's overhead


@dataclass
class Figure:
    name: str  # file stem under figures/
    title: str
    caption: str
    wide: bool = False  # drawn style.DOUBLE wide: figure* across both columns


_SUPERSCRIPT = str.maketrans("-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")


def _log_label(v: float) -> str:
    """1.5, 20, 0.001 as written; very small or large values as a power of ten (10⁻⁴), short enough to sit side by
    side, without mathtext."""
    if v <= 0:
        return ""
    if 1e-3 <= v < 1e5:
        return f"{v:g}"
    exp = math.log10(v)
    return f"10{str(round(exp)).translate(_SUPERSCRIPT)}" if abs(exp - round(exp)) < 1e-9 else f"{v:.0e}"


def log_ticks(lo: float, hi: float, room: int = 8) -> list[float]:
    """Labelled ticks of a log axis over [lo, hi]: 1, 1.5, 2, 3, 5, 7 per decade over less than about a decade,
    1, 2, 5 over up to 2.5 decades, every decade (or every other) over more; at most ``room`` of them, and at least
    the two ticks around the range when fewer than three fall inside it (the caller widens the axis to them)."""
    lo, hi = (lo, hi) if lo <= hi else (hi, lo)
    if not (lo > 0 and math.isfinite(lo) and math.isfinite(hi)):
        return []
    decades = math.log10(hi / lo) if hi > lo else 0.0
    for subs in ((1.0, 1.5, 2.0, 3.0, 5.0, 7.0), (1.0, 2.0, 5.0), (1.0, 3.0), (1.0,)):
        if len(subs) * max(decades, 0.3) <= room * 1.2 or subs == (1.0,):
            break
    d0, d1 = math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1
    every = [s * 10.0 ** d for d in range(d0, d1 + 1) for s in subs]
    if subs == (1.0,):
        stride = max(1, math.ceil((decades + 1) / room))
        every = [10.0 ** d for d in range(d0, d1 + 1) if d % stride == 0]
    eps = 1e-9
    inside = [v for v in every if lo * (1 - eps) <= v <= hi * (1 + eps)]
    if len(inside) >= 3:
        return inside
    below = [v for v in every if v < lo * (1 - eps)]
    above = [v for v in every if v > hi * (1 + eps)]
    return ([below[-1]] if below else []) + inside + ([above[0]] if above else [])


def _log(axis: Any, room: int = 8) -> None:
    """Label a log axis with ``log_ticks`` (1, 1.5, 2, 3, 5 s over a narrow range; 1, 2, 5 over a wider one; by
    decades over a wide one), widening it to the ticks around the data when fewer than three fall inside. Call it
    after plotting: it reads the range."""
    lo, hi = sorted(axis.get_view_interval())
    ticks = log_ticks(lo, hi, room)
    if not ticks:
        return
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda v, _: _log_label(v)))
    axis.set_minor_locator(LogLocator(subs="all", numticks=100))
    axis.set_minor_formatter(NullFormatter())
    new_lo, new_hi = min(lo, ticks[0]), max(hi, ticks[-1])
    if (new_lo, new_hi) != (lo, hi):
        if axis is axis.axes.xaxis:
            axis.axes.set_xlim(new_lo, new_hi)
        else:
            axis.axes.set_ylim(new_lo, new_hi)


def _median_err(values: np.ndarray) -> tuple[float, float, float]:
    """The median of ``values`` and its distance to the bootstrap interval's ends (0 when there is none)."""
    x = values[~np.isnan(values)]
    if x.size == 0:
        return math.nan, 0.0, 0.0
    med = float(np.median(x))
    lo, hi = bootstrap_ci(x, "median")
    if math.isnan(lo):
        return med, 0.0, 0.0
    return med, max(med - lo, 0.0), max(hi - med, 0.0)


def _buckets(end_s: float) -> float:
    """Window width: 1 s, wider for long runs so a plot has at most ~300 windows."""
    return float(max(1.0, math.ceil(end_s / 300.0)))


def fault_colour(f: str, seen: dict[str, str]) -> str:
    if f not in seen:
        seen[f] = FAULT_COLOURS.get(f) or _SPARE[len([k for k in seen if k not in FAULT_COLOURS]) % len(_SPARE)]
    return seen[f]


def _phases(run: ChaosRun) -> dict[str, float]:
    return opsmod.phase_times(run.ops, run.record.get("phases") if isinstance(run.record.get("phases"), dict)
                              else None)


def _drawn_range(run: ChaosRun, clients: pd.DataFrame) -> tuple[float, float]:
    """The time range a chaos figure draws: from just before the first client operation, fault or the warm-up
    phase, to the end of the run. The setup before them (servers and workers starting, nothing to see) is left out;
    the axis keeps the run's own clock."""
    phases = _phases(run)
    firsts = [float(clients["invoke_s"].min())] + [w.start_s for w in opsmod.fault_windows(run.ops, run.end_s)]
    firsts += [phases[p] for p in ("warm-up", "faults") if p in phases]
    first = min(t for t in firsts if math.isfinite(t))
    end = max(run.end_s, first + 1e-3)
    pad = max(0.3, 0.02 * (end - first))
    return max(0.0, first - pad), end + 0.5 * pad


def _timeline(ax: Any, run: ChaosRun, colours: dict[str, str], lo: float, hi: float) -> list[str]:
    """The strip above a chaos plot: the run's phases, then one lane per fault kind with each fault's window (from
    its injection to its end, hatched when it had not ended), then the supervisor's worker restarts. The lanes are
    labelled on the y axis, so the figure needs no fault legend. Returns the lanes, top first."""
    lanes: list[str] = ["phase"]
    windows = opsmod.fault_windows(run.ops, run.end_s)
    for w in windows:
        if w.f not in lanes:
            lanes.append(w.f)
    restarts = opsmod.supervisor_restarts(run.ops)
    if restarts:
        lanes.append("worker restart")
    row = {name: len(lanes) - 1 - i for i, name in enumerate(lanes)}  # top lane first
    span = hi - lo
    phases = sorted((t, name) for name, t in _phases(run).items() if math.isfinite(t))
    for n, (t, name) in enumerate(phases):
        end = phases[n + 1][0] if n + 1 < len(phases) else run.end_s
        a, b = max(t, lo), min(end, hi)
        if b <= a:
            continue
        ax.broken_barh([(a, b - a)], (row["phase"] - 0.4, 0.8), facecolor="0.93" if n % 2 else "0.82", lw=0)
        if (b - a) / span > 0.012 * (len(name) + 1):  # room for the name at 7 pt
            ax.text((a + b) / 2, row["phase"], name, ha="center", va="center", fontsize=style.SMALL_PT, color="0.15")
    min_w = 0.004 * span  # an instant fault (a kill) still shows as a mark
    for f in lanes[1:len(lanes) - bool(restarts)]:
        # faults of one kind that overlap (two slow links at once) share the lane in sub-rows, each seen whole
        ends: list[float] = []
        placed = []
        for w in (w for w in windows if w.f == f):
            sub = next((k for k, e in enumerate(ends) if e <= w.start_s), len(ends))
            ends[sub:sub + 1] = [max(w.end_s, w.start_s + min_w)]
            placed.append((w, sub))
        h = 0.8 / len(ends)
        c = fault_colour(f, colours)
        for w, sub in placed:
            ax.broken_barh([(w.start_s, max(w.end_s - w.start_s, min_w))], (row[f] + 0.4 - (sub + 1) * h, h * 0.85),
                           facecolor=c, edgecolor=c, lw=0.6, hatch=None if w.ended else "////",
                           alpha=1.0 if w.ended else 0.5)
    if restarts:
        ax.plot(restarts, [row["worker restart"]] * len(restarts), ls="none", marker="x", ms=4, mew=1.0,
                color="black")
    ax.set_yticks(list(row.values()), list(row.keys()))
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    ax.tick_params(axis="y", length=0)
    ax.tick_params(axis="x", which="both", bottom=False, labelbottom=False)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    return lanes


def _shade(ax: Any, run: ChaosRun, colours: dict[str, str]) -> None:
    """Each fault window lightly shaded on a data panel, in its lane's colour, and a line where it was injected;
    dashed grey lines at the faults and heal phases."""
    for w in opsmod.fault_windows(run.ops, run.end_s):
        c = fault_colour(w.f, colours)
        ax.axvspan(w.start_s, max(w.end_s, w.start_s + 1e-3), color=c, alpha=0.1, lw=0)
        ax.axvline(w.start_s, color=c, lw=0.9)
    phases = _phases(run)
    for name in ("faults", "heal"):
        if name in phases:
            ax.axvline(phases[name], color="0.3", ls="--", lw=0.8)


def _chaos_figure(run: ChaosRun, clients: pd.DataFrame, colours: dict[str, str]) -> tuple[Any, Any, float]:
    """A double-column figure: the timeline strip over a data panel sharing its time axis (setup cropped);
    the figure, the data panel and where the drawn range starts."""
    lo, hi = _drawn_range(run, clients)
    n_lanes = 1 + len({w.f for w in opsmod.fault_windows(run.ops, run.end_s)}) + bool(
        opsmod.supervisor_restarts(run.ops))
    strip = 0.17 * n_lanes + 0.05
    fig, (top, ax) = style.new(style.DOUBLE, 2.3 + strip, nrows=2, sharex=True,
                               gridspec_kw={"height_ratios": [strip, 2.3]})
    fig.get_layout_engine().set(h_pad=0.01, hspace=0.0)
    _timeline(top, run, colours, lo, hi)
    _shade(ax, run, colours)
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=12, steps=[1, 2, 5, 10]))
    ax.set_xlabel("time since run start (s)")
    return fig, ax, lo


def _cropped(run: ChaosRun, lo: float) -> str:
    """What the timeline's phase lane holds, in order, and what the figure leaves out."""
    order = [name for t, name in sorted((t, name) for name, t in _phases(run).items() if math.isfinite(t))
             if t < run.end_s - 1e-3]  # the last phase ("stopped") marks the end: it has no span
    return ((f" Phases, in order: {', '.join(order)}." if order else "")
            + (f" The first {lo:.0f} s of the run (setup: servers and workers starting, no operations) are not "
               f"drawn." if lo >= 1 else ""))


_TIMELINE_NOTE = ("The strip above shows the run's phases, each nemesis fault from injection to end (one lane per kind, "
                  "hatched if it had not ended) and the supervisor's worker restarts (x); the panel shades the same "
                  "fault windows, dashed lines at the faults and heal phases.")


_FLOOR_S = 1e-3  # log axes: a 0 s latency is drawn at 1 ms


def _latency_axis(ax: Any) -> None:
    """The latency panels' y axis: log scale, labelled, with its grid."""
    ax.set_yscale("log")
    ax.margins(y=0.08)
    _log(ax.yaxis)
    ax.set_ylabel("latency (s, log scale)")
    ax.grid(alpha=0.3, which="major")


def _chaos_raw(run: ChaosRun, clients: pd.DataFrame, colours: dict[str, str], out: Path, stem: str) -> Figure:
    """(a) every operation, at its invoke time, by outcome."""
    fig, ax, lo = _chaos_figure(run, clients, colours)
    for kind in ("ok", "fail", "info"):
        sel = clients[(clients["type"] == kind) & clients["completed"]]
        if len(sel):
            ax.scatter(sel["invoke_s"], sel["latency_s"].clip(lower=_FLOOR_S), s=9, color=TYPE_COLOURS[kind],
                       alpha=0.8, lw=0, label=f"{kind} ({len(sel)})", zorder=3)
    never = clients[~clients["completed"]]
    if len(never):
        ax.scatter(never["invoke_s"], never["latency_s"].clip(lower=_FLOOR_S), s=16, marker="^",
                   facecolor="none", edgecolor=TYPE_COLOURS["info"], lw=0.9, zorder=3,
                   label=f"info, never completed ({len(never)})")
    _latency_axis(ax)
    style.legend(ax, outside=True)
    style.save(fig, out, f"{stem}-latency-raw")
    n_never = len(never)
    return Figure(f"{stem}-latency-raw", f"{run.label}: raw latency",
                  f"Every client send_message of `{run.label}`, at its invoke time, by outcome (ok blue, fail "
                  f"red, info orange), latency on a log scale. " + _TIMELINE_NOTE + _cropped(run, lo)
                  + (f" {n_never} operation(s) never completed: drawn as triangles with their latency taken to "
                     f"the end of the run ({run.end_s:.1f} s)." if n_never else ""), wide=True)


def _chaos_quantiles(run: ChaosRun, clients: pd.DataFrame, done: pd.DataFrame, width: float,
                     colours: dict[str, str], out: Path, stem: str) -> Figure:
    """(b) latency quantiles per ``width`` s window, by invoke time."""
    fig, ax, lo = _chaos_figure(run, clients, colours)
    if len(done):
        done = done.assign(bucket=(done["invoke_s"] // width) * width)
        g = done.groupby("bucket")["latency_s"]
        # every window, empty ones as gaps: a line never bridges a window without operations
        index = np.arange(done["bucket"].min(), done["bucket"].max() + width / 2, width)
        q = pd.DataFrame({"p50": g.quantile(0.5), "p95": g.quantile(0.95), "p99": g.quantile(0.99),
                          "max": g.max(), "n": g.size()}).reindex(index, method="nearest", tolerance=width / 4)
        for col, colour, marker, min_n in (("max", "#444444", "v", 1), ("p99", "#ff7f0e", "^", 100),
                                           ("p95", "#2ca02c", "s", 20), ("p50", "#1f77b4", "o", 1)):
            y = q[col].where(q["n"] >= min_n)
            if y.notna().any():
                ax.plot(q.index + width / 2, y.clip(lower=_FLOOR_S), marker=marker, ms=3, lw=1.0, color=colour,
                        label=col, zorder=3)
    _latency_axis(ax)
    h, labels = ax.get_legend_handles_labels()
    order = [labels.index(k) for k in ("p50", "p95", "p99", "max") if k in labels]
    style.legend(ax, [h[i] for i in order], outside=True)
    style.save(fig, out, f"{stem}-latency-quantiles")
    return Figure(f"{stem}-latency-quantiles", f"{run.label}: latency quantiles",
                  f"Latency quantiles of the completed send_message operations of `{run.label}` invoked in "
                  f"each {width:g} s window (log scale): median and maximum of every window, p95 where the "
                  f"window has at least 20 operations and p99 where it has 100; a window without operations "
                  f"is a gap. " + _TIMELINE_NOTE + _cropped(run, lo), wide=True)


def _chaos_rate(run: ChaosRun, clients: pd.DataFrame, done: pd.DataFrame, width: float,
                colours: dict[str, str], out: Path, stem: str) -> Figure:
    """(c) completions per second, per ``width`` s window, by completion time."""
    fig, ax, lo = _chaos_figure(run, clients, colours)
    edges = np.arange(0.0, run.end_s + width, width)
    if len(edges) < 2:
        edges = np.array([0.0, width])
    for kind in ("ok", "fail", "info"):
        t = done.loc[done["type"] == kind, "complete_s"].to_numpy()
        if len(t) == 0:
            continue
        hist, _ = np.histogram(t, bins=edges)
        ax.step(edges, np.append(hist, hist[-1]) / width, where="post", color=TYPE_COLOURS[kind], lw=1.1,
                label=kind, zorder=3)
    ax.set_ylim(bottom=0)
    ax.margins(y=0.1)
    ax.set_ylabel("completions per second")
    ax.grid(alpha=0.3)
    style.legend(ax, outside=True)
    style.save(fig, out, f"{stem}-rate")
    return Figure(f"{stem}-rate", f"{run.label}: throughput",
                  f"Completed send_message operations per second of `{run.label}` ({width:g} s windows, by "
                  f"completion time and outcome). " + _TIMELINE_NOTE + _cropped(run, lo), wide=True)


def plot_chaos(run: ChaosRun, out: Path, stem: str) -> list[Figure]:
    """A chaos run's raw latency, its latency quantiles and its throughput, each over the fault timeline."""
    clients = opsmod.client_ops(run.ops, run.end_s)
    if clients.empty:
        return []
    colours: dict[str, str] = {}  # a fault kind's colour, the same in every figure
    width = _buckets(run.end_s)
    done = clients[clients["completed"]].copy()
    return [_chaos_raw(run, clients, colours, out, stem),
            _chaos_quantiles(run, clients, done, width, colours, out, stem),
            _chaos_rate(run, clients, done, width, colours, out, stem)]


#: The breakdown components as the LaTeX breakdown table heads them.
COMPONENT_LABELS = {"client_rtt": "client RTT", "wft_sched_to_start": "WFT wait", "wft_exec": "WFT exec",
                    "act_sched_to_start": "activity wait", "act_exec - model": "activity exec \u2212 model",
                    "model": "model", "other": "other"}


def breakdown_section(name: str, sections: dict[str, str] | None = None) -> str:
    """The bench section a breakdown series belongs to: the section of the latency series of that name when the
    run has it, else as ``benchmarks`` names them (``durable/<model>/<workload>`` Table 2, ``process/<shape>/
    <workload>`` the overhead section, the rest tuning)."""
    if sections and name in sections:
        return sections[name]
    return "table2" if name.startswith("durable/") else "overhead" if name.startswith("process/") else "tuning"


def _breakdown_label(name: str, section: str) -> str:
    """A bar's label: "reply, mock" for Table 2's durable/mock/reply, "local-model, reply (load 2, round 1)" for
    the overhead section's process/local-model/reply@load2-r1."""
    base, _, suffix = name.partition("@")
    parts = base.split("/")
    if section == "table2" and len(parts) == 3:
        label = f"{parts[2]}, {parts[1]}"
    elif section == "overhead" and len(parts) == 3:
        label = f"{parts[1]}, {parts[2]}"
    else:
        label = base
    if suffix:
        load, _, rnd = suffix.partition("-r")
        label += f" ({'idle' if load == 'idle' else 'load ' + load.removeprefix('load')}, round {rnd})"
    return label


def _stacked_h(ax: Any, y: np.ndarray, meds: list[dict[str, float]], labels: list[str]) -> None:
    """Horizontal bars at ``y``, the median of each component in ``labels`` stacked left to right."""
    left = np.zeros(len(y))
    for (label, _), colour in zip(COMPONENTS, COMPONENT_COLOURS):
        if label not in labels:
            continue
        vals = np.nan_to_num(np.array([m[label] for m in meds]))
        ax.barh(y, vals, 0.65, left=left, color=colour, label=COMPONENT_LABELS[label])
        left += vals


def _client_marks(ax: Any, y: np.ndarray, group: list[dict[str, Any]]) -> None:
    """The median client latency of each series as a black tick across its bar, with its 95 % bootstrap interval."""
    client = [_median_err(column(s["turns"], "client_ms")) for s in group]
    ax.errorbar([c[0] for c in client], y, xerr=[[c[1] for c in client], [c[2] for c in client]], fmt="|", ms=11,
                mew=1.6, color="black", elinewidth=0.8, capsize=2, zorder=3, label="median client latency [95% CI]")


def _bar_axis(ax: Any, y: np.ndarray, labels: list[str], xlabel: str) -> None:
    ax.set_yticks(y, labels)
    ax.set_ylim(len(y) - 0.5, -0.5)  # the first series on top
    ax.set_xlabel(xlabel)
    ax.set_xlim(left=0)
    ax.margins(x=0.08)
    ax.grid(axis="x")


def _breakdown_table2(group: list[dict[str, Any]], out: Path, stem: str) -> Figure:
    """Two panels sharing the series: the whole turn (model and overhead) and the overhead alone, on its own scale:
    the model's time would otherwise dwarf every overhead component."""
    y = np.arange(len(group))
    labels = [_breakdown_label(s["name"], "table2") for s in group]
    meds = [component_medians(s["turns"]) for s in group]
    fig, (whole, over) = style.new(style.DOUBLE, style.bar_height(len(group), style.DOUBLE, 1.3), ncols=2,
                                   sharey=True, width_ratios=[1, 1.3])
    model = np.nan_to_num(np.array([m[MODEL] for m in meds]))
    overhead = np.array([float(np.nansum([v for k, v in m.items() if k != MODEL])) for m in meds])
    whole.barh(y, model, 0.65, color=COMPONENT_COLOURS[[c for c, _ in COMPONENTS].index(MODEL)], label="model")
    whole.barh(y, overhead, 0.65, left=model, color="0.65", label="overhead (the components on the right)")
    _client_marks(whole, y, group)
    _bar_axis(whole, y, labels, "median time per turn (ms)")
    _stacked_h(over, y, meds, [c for c, _ in COMPONENTS if c != MODEL])
    _bar_axis(over, y, labels, "median overhead per turn (ms)")
    over.tick_params(axis="y", labelleft=False)
    style.legend(whole, above=True, loc="upper left", ncols=1)
    style.legend(over, above=True, loc="upper right", ncols=3)
    style.save(fig, out, stem)
    return Figure(stem, "Where a durable turn's time goes", "Table 2's durable series (workload, model), one bar "
                  "each. Left: the median model time and the sum of the medians of the other components (the "
                  "overhead), stacked; the black tick is the median client latency with its 95% bootstrap interval "
                  "(medians of parts need not add up to it). Right: the overhead alone on its own scale, each "
                  "component's median stacked (ms): client RTT, the workflow task's wait (WFT wait) and execution "
                  "(WFT exec), the activities' wait and execution less the model's time, and the rest.", wide=True)


def _breakdown_overhead(group: list[dict[str, Any]], out: Path, stem: str) -> Figure:
    y = np.arange(len(group))
    labels = [_breakdown_label(s["name"], "overhead") for s in group]
    meds = [component_medians(s["turns"]) for s in group]
    fig, ax = style.new(style.DOUBLE, style.bar_height(len(group), style.DOUBLE, 0.8))
    _stacked_h(ax, y, meds, [c for c, _ in COMPONENTS])
    _client_marks(ax, y, group)
    _bar_axis(ax, y, labels, "median time per turn (ms)")
    style.legend(ax, outside=True)
    style.save(fig, out, stem)
    return Figure(stem, "Where the time goes, per deployment shape", "The overhead section's series (worker "
                  "shape, workload; the instant model), one bar each: each component's median stacked (ms), the "
                  "black tick the median client latency with its 95% bootstrap interval.", wide=True)


def plot_breakdown(series: list[dict[str, Any]], out: Path, latency: list[dict[str, Any]] | None = None
                   ) -> list[Figure]:
    """One figure per question: ``breakdown`` for Table 2's durable series, ``breakdown-overhead`` for the overhead
    section's deployment shapes. The tuning series' breakdown is the tuning figure (``plot_tuning``). ``latency``:
    the run's latency series, which say each series' section."""
    sections = {s["name"]: s.get("section", "table2") for s in latency or []}
    groups: dict[str, list[dict[str, Any]]] = {}
    for s in series:
        if s["turns"]:
            groups.setdefault(breakdown_section(s["name"], sections), []).append(s)
    figs = []
    if groups.get("table2"):
        figs.append(_breakdown_table2(groups["table2"], out, "breakdown"))
    if groups.get("overhead"):
        figs.append(_breakdown_overhead(groups["overhead"], out, "breakdown-overhead"))
    return figs


def _tuning_label(s: dict[str, Any]) -> str:
    """The server profile and the worker variant (eager, no-eager, no-sandbox, ...)."""
    variant = s.get("variant") or {True: "eager", False: "no-eager"}.get(s.get("eager"), "?")
    return f"{s.get('server') or '?'} {variant}"


def plot_tuning(series: list[dict[str, Any]], breakdown_series: list[dict[str, Any]] | None, out: Path
                ) -> Figure | None:
    """Horizontal bars, one per tuning series, the stock and tuned server of each worker variant side by side: the
    median client latency, and inside it each breakdown component's median where the run has the breakdown."""
    tuned = [s for s in series if s["section"] == "tuning"]
    if not tuned:
        return None
    def variant(s: dict[str, Any]) -> str:
        return _tuning_label(s).split(" ", 1)[-1]

    variants = list(dict.fromkeys(variant(s) for s in tuned))
    tuned.sort(key=lambda s: variants.index(variant(s)))  # stable: each variant's servers side by side
    by_name = {b["name"]: b for b in breakdown_series or []}
    fig, ax = style.new(style.DOUBLE, style.bar_height(len(tuned), style.DOUBLE, 0.8))
    # a half-bar gap between worker variants
    y = np.array([j + 0.5 * variants.index(variant(s)) for j, s in enumerate(tuned)])
    with_parts = [j for j, s in enumerate(tuned) if s["name"] in by_name]
    if with_parts:
        _stacked_h(ax, y[with_parts], [component_medians(by_name[tuned[j]["name"]]["turns"]) for j in with_parts],
                   [c for c, _ in COMPONENTS])
    med = [_median_err(column(s["turns"], "client_ms")) for s in tuned]
    medians = [0.0 if math.isnan(m[0]) else m[0] for m in med]
    ax.barh(y, medians, 0.65, facecolor="none" if with_parts else style.PALETTE[0], edgecolor="black", lw=0.8,
            label="median client latency")
    ax.errorbar(medians, y, xerr=[[m[1] for m in med], [m[2] for m in med]], fmt="none", ecolor="black",
                elinewidth=0.8, capsize=2, label="95% CI of the median")
    ax.set_yticks(y, [_tuning_label(s) for s in tuned])
    ax.set_ylim(y[-1] + 0.6, -0.6)
    ax.set_xlabel("median client latency per turn (ms; tool workload, mock model)")
    ax.set_xlim(left=0)
    ax.grid(axis="x")
    style.legend(ax, outside=True)
    style.save(fig, out, "tuning")
    return Figure("tuning", "Tuning", "Median client latency per turn (ms) for each tuning series (server "
                  "dynamic-config profile, stock or tuned, for each worker variant: eager activity execution, the "
                  "workflow sandbox, local tools, the worker in its own process), with its 95% bootstrap interval"
                  + ("; where the run has its breakdown, the components' medians are stacked inside the outlined "
                     "total (medians of parts need not add up to it)." if with_parts else "."), wide=True)


def plot_latency_cdf(series: list[dict[str, Any]], out: Path) -> Figure | None:
    t2 = [s for s in series if s["section"] == "table2" and s["turns"]]
    if not t2:
        return None
    fig, ax = style.new(style.SINGLE, 2.6)
    colours: dict[Any, str] = {}
    lo, hi = math.inf, 0.0
    for s in sorted(t2, key=lambda s: (s["workload"], s["model_mode"], s["loop"])):
        x = np.sort(column(s["turns"], "client_ms"))
        colour = style.pair_colour((s["workload"], s["model_mode"], s["model_latency"]), colours)
        ax.ecdf(x, color=colour, ls=style.LOOP_STYLE.get(s["loop"], ":"))
        lo, hi = min(lo, x[0]), max(hi, x[-1])
    wide = lo > 0 and hi / lo > 20
    if wide:
        ax.set_xscale("log")
        _log(ax.xaxis)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("client latency per turn (ms" + (", log scale)" if wide else ")"))
    ax.set_ylabel("fraction of turns")
    ax.grid(which="both")
    handles = [Line2D([], [], color=c, label=f"{w}, {m}") for (w, m, _), c in colours.items()]
    handles += [Line2D([], [], color="0.3", ls=ls, label=loop) for loop, ls in style.LOOP_STYLE.items()]
    style.legend(ax, handles, above=True)
    style.save(fig, out, "latency-cdf")
    return Figure("latency-cdf", "Latency CDF", "Empirical CDF of per-turn client latency of the Table 2 series: "
                  "one colour per workload and model, solid durable, dashed plain" + (", log x axis." if wide else "."))


def _can_boundaries(turns: list[dict[str, Any]]) -> list[float]:
    """Turn positions where a new run of the workflow began (continue-as-new): between turn i-1 and turn i."""
    out = []
    for prev, cur in zip(turns, turns[1:]):
        a, b = prev.get("run_index", math.nan), cur.get("run_index", math.nan)
        if not (math.isnan(a) or math.isnan(b)) and b != a:
            out.append(cur["i"] - 0.5)
    return out


def plot_length(series: list[dict[str, Any]], out: Path) -> list[Figure]:
    if not any(s["turns"] for s in series):
        return []
    figs = []
    colours: dict[Any, str] = {}
    for key, stem, ylabel, title, caption in (
            ("client_ms", "scaling-length", "client latency (ms)", "Latency against conversation length",
             "Client latency of each turn (ms) against the turn number, without and with continue-as-new"),
            ("history_bytes", "scaling-history-bytes", "history size (KiB)", "History size against conversation "
             "length", "Event history size (KiB) of the run that answered each turn, at the end of the turn; "
             "continue-as-new starts a new, small history")):
        fig, ax = style.new(style.SINGLE, 2.4)
        marked = 0
        for s in series:
            t = sorted(s["turns"], key=lambda t: t["i"])
            y = column(t, key) / (1024 if key == "history_bytes" else 1)
            colour = style.pair_colour(s["name"], colours)
            ax.plot(column(t, "i"), y, color=colour, marker="." if len(t) < 80 else None,
                    label=f"{s['name']} ({s.get('continue_as_new') or '?'})")
            for b in _can_boundaries(t):
                ax.axvline(b, color=colour, ls=":", lw=0.7, alpha=0.8)
                marked += 1
        ax.set_xlabel("turn number")
        style.integer_ticks(ax.xaxis)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.margins(y=0.3)
        ax.grid()
        handles = ax.get_legend_handles_labels()[0]
        if marked:
            handles.append(Line2D([], [], color=style.MARK_COLOUR, ls=":", lw=0.7, label="continue-as-new"))
        style.legend(ax, handles, above=True, ncols=1)
        style.save(fig, out, stem)
        figs.append(Figure(stem, title, caption + (f"; dotted lines mark each continue-as-new ({marked})." if marked
                                                   else ".")))
    return figs


def plot_throughput(points: list[dict[str, Any]], out: Path) -> Figure | None:
    pts = [p for p in points if not math.isnan(p["conversations"]) and not math.isnan(p["turns_per_s"])]
    if not pts:
        return None
    fig, ax = style.new(style.SINGLE)
    colours: dict[Any, str] = {}
    for w in sorted({p["workers"] for p in pts}, key=lambda v: (math.isnan(v), v)):
        sel = sorted((p for p in pts if p["workers"] == w or (math.isnan(w) and math.isnan(p["workers"]))),
                     key=lambda p: p["conversations"])
        label = "? workers" if math.isnan(w) else f"{w:g} worker{'s' if w != 1 else ''}"
        ax.plot([p["conversations"] for p in sel], [p["turns_per_s"] for p in sel], marker="o",
                color=style.pair_colour(w, colours), label=label)
    convs = sorted({p["conversations"] for p in pts})
    if min(convs) > 0 and max(convs) / min(convs) >= 8:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(convs, [f"{c:g}" for c in convs])  # the measured counts: whole numbers
    ax.set_xlabel("concurrent conversations")
    ax.set_ylabel("throughput (turns/s)")
    ax.set_ylim(bottom=0)
    ax.grid()
    style.legend(ax, above=True)
    style.save(fig, out, "throughput")
    return Figure("throughput", "Throughput", "Turns per second against the number of concurrent conversations, "
                  "one line per number of worker processes.")


def plot_recovery(points: list[dict[str, Any]], out: Path) -> Figure | None:
    pts = sorted((p for p in points if not math.isnan(p["heartbeat_s"]) and not math.isnan(p["recovery_s"])),
                 key=lambda p: p["heartbeat_s"])
    if not pts:
        return None
    fig, ax = style.new(style.SINGLE, 2.6)
    hb = [p["heartbeat_s"] for p in pts]
    ax.plot(hb, [p["recovery_s"] for p in pts], marker="o", color=style.PALETTE[0], label="measured recovery")
    waits = [recovery_waits(p) for p in pts]
    if any(not math.isnan(w["activity wait_s"]) for w in waits):
        ax.plot(hb, [w["activity wait_s"] for w in waits], marker="s", ls=":", color=style.PALETTE[2],
                label="activity wait")
        ax.plot(hb, [w["workflow task wait_s"] for w in waits], marker="^", ls=":", color=style.PALETTE[5],
                label="workflow task wait")
    top = max(max(hb), max(p["recovery_s"] for p in pts)) * 1.1
    ax.plot([0, top], [0, top], ls="--", color="0.4", label="y = x")
    ax.set_xlim(0, max(hb) * 1.1)
    ax.set_ylim(0, top)
    ax.set_xlabel("activity heartbeat timeout (s)")
    ax.set_ylabel("time added by the kill (s)")
    ax.grid()
    style.legend(ax, above=True)
    style.save(fig, out, "recovery")
    return Figure("recovery", "Recovery", "Time a worker SIGKILL added to a turn whose tool activity was running on "
                  "it (s), against the activity heartbeat timeout (s); the dashed line is y = x. Dotted: the killed "
                  "turn's activity wait (the dead attempt, the heartbeat timeout and the retry backoff) and "
                  "workflow-task wait from its history; a workflow task sent to the killed worker's sticky queue "
                  "waits out the sticky schedule-to-start timeout (10 s) when that worker also held the workflow.")


def plot_resources(doc: dict[str, Any], out: Path) -> Figure | None:
    """Horizontal bars, one group per bench section holding only the processes that ran in it (no empty slots),
    a colour per process; CPU left, memory right."""
    sections = [s for s, procs in doc["sections"].items() if procs]
    if not sections:
        return None
    procs = sorted({p for s in sections for p in doc["sections"][s]})
    colour = {p: COMPONENT_COLOURS[j % len(COMPONENT_COLOURS)] for j, p in enumerate(procs)}
    rows: list[tuple[float, str, str]] = []  # (y, section, process)
    centres, y = [], 0.0
    for s in sections:
        here = [p for p in procs if p in doc["sections"][s]]
        rows += [(y + k, s, p) for k, p in enumerate(here)]
        centres.append(y + (len(here) - 1) / 2)
        y += len(here) + 0.8  # a gap between sections
    fig, axes = style.new(style.DOUBLE, max(style.HEIGHT[style.DOUBLE], 1.0 + 0.12 * y), ncols=2,
                          sharey=True)
    for ax, key, xlabel in ((axes[0], "cpu_mean_pct", "mean CPU (% of one core)"),
                            (axes[1], "rss_max_mb", "peak resident memory (MB)")):
        for p in procs:
            mine = [(r, doc["sections"][s][p].get(key, math.nan)) for r, s, q in rows if q == p]
            ax.barh([r for r, _ in mine], np.nan_to_num([v for _, v in mine]), 0.85, color=colour[p], label=p)
        ax.set_xlabel(xlabel)
        ax.set_xlim(left=0)
        ax.grid(axis="x")
    axes[0].set_yticks(centres, sections)
    axes[0].set_ylim(y - 0.8 + 0.1, -0.6)
    axes[0].tick_params(axis="y", length=0)
    style.legend(axes[0], above=True, loc="upper center", ncols=3)
    style.save(fig, out, "resources")
    return Figure("resources", "Resources", "Left: mean CPU per process (% of one core; 200 % = two cores); right: "
                  "peak resident memory (MB), during each benchmark section (psutil samples); each section shows the "
                  "processes that ran in it.", wide=True)


def _steps_against_floor(ax: Any, points: list[dict[str, Any]], labels: list[str], xlabel: str) -> None:
    """A dot per point on a log axis (a bar's length means nothing on one): each median step (blue circle) or
    durable-write floor (grey square), with the bootstrap 95 % interval of the median where the run kept its
    samples (none: no whisker), and the fastest floor as a dotted line to read every step against."""
    y = np.arange(len(points))
    xerr = np.array([_median_err(np.asarray(p.get("samples_ms") or [], dtype=float))[1:] for p in points]).T
    for measure, colour, marker, label in (("floor", "0.45", "s", "floor: one durable write"),
                                           ("step", style.PALETTE[0], "o", "median step")):
        sel = [j for j, p in enumerate(points) if (p["measure"] == "floor") == (measure == "floor")]
        if sel:
            ax.errorbar([points[j]["p50_ms"] for j in sel], y[sel], xerr=xerr[:, sel] if xerr.any() else None,
                        fmt=marker, color=colour, ms=4.5, ecolor=colour, elinewidth=0.9, capsize=2, label=label)
    floors = [p["p50_ms"] for p in points if p["measure"] == "floor"]
    if floors:
        ax.axvline(min(floors), color="0.45", ls=":", lw=0.9)
    ax.set_yticks(y, labels)
    ax.set_ylim(len(points) - 0.5, -0.5)
    ax.set_xscale("log")
    ax.margins(x=0.1)
    _log(ax.xaxis, room=6)
    ax.set_xlabel(xlabel)
    ax.grid(axis="x")
    ax.grid(axis="y", alpha=0.15)


def plot_checkpoint(points: list[dict[str, Any]], out: Path) -> Figure | None:
    rows = [p for p in points if p.get("measure") in ("floor", "step") and not math.isnan(p["p50_ms"])
            and p["p50_ms"] > 0]
    if not rows:
        return None
    fig, ax = style.new(style.SINGLE, style.bar_height(len(rows), style.SINGLE, 0.6))
    _steps_against_floor(ax, rows, [p["backend"] for p in rows], "median per step (ms, log scale)")
    style.legend(ax, above=True)
    style.save(fig, out, "checkpoint")
    return Figure("checkpoint", "Checkpoint engine", "What a checkpointed step costs: the median of one no-op "
                  "checkpointed step on each engine (blue circles) against the physical floor of one durable "
                  "write on this disk (grey squares; the dotted line is the fastest), log scale, with the "
                  "bootstrap 95 % interval of the median where the run kept its samples. The plain loop's step is "
                  "a bare await.")


def plot_engines(doc: dict[str, Any], out: Path) -> Figure | None:
    """Left: each engine's median turn minus model time per workload and model mode; right: a no-op step's median
    against the disk's floor (log scale). Whiskers: bootstrap 95 % intervals of the medians."""
    from reports.tables import _engine_rank

    series = [s for s in doc["series"] if s["turns"]]
    steps = [p for p in doc["steps"] if not math.isnan(p["p50_ms"]) and p["p50_ms"] > 0]
    if not series and not steps:
        return None
    engines = sorted({s["engine"] for s in series}, key=_engine_rank)
    groups = sorted({(s["workload"], s["model_mode"]) for s in series})
    rows = max(len(engines) * max(1, len(groups)) * 0.6, len(steps))
    fig, (left, right) = style.new(style.DOUBLE, style.bar_height(round(rows), style.DOUBLE, 0.9), ncols=2)
    height = 0.8 / max(1, len(groups))
    y = np.arange(len(engines))
    for j, (workload, mode) in enumerate(groups):
        meds, errs = [], []
        for e in engines:
            s = next((s for s in series if s["engine"] == e and s["workload"] == workload and s["model_mode"] == mode),
                     None)
            over = (column(s["turns"], "client_ms") - column(s["turns"], "model_ms")) if s else np.array([])
            med, lo, hi = _median_err(over)
            meds.append(med)
            errs.append((lo, hi))
        left.barh(y + (j - (len(groups) - 1) / 2) * height, np.nan_to_num(meds), height, label=f"{workload}, {mode}",
                  xerr=np.array(errs).T, ecolor="0.2", capsize=2, color=style.PALETTE[j % len(style.PALETTE)])
    left.set_yticks(y, engines)
    left.set_ylim(len(engines) - 0.5, -0.5)
    left.set_xlabel("median turn minus model (ms)")
    left.set_xlim(left=0)
    left.grid(axis="x")
    style.legend(left, above=True, loc="upper left")
    _steps_against_floor(right, steps, [p["engine"] for p in steps], "median per no-op step (ms, log scale)")
    style.legend(right, above=True, loc="upper right")
    style.save(fig, out, "engines")
    return Figure("engines", "Engines side by side", "The same agent loop on each engine, in one run. Left: the "
                  "median turn minus the time inside model steps, per workload and model mode (what the engine and "
                  "the loop add); right: the median of one no-op durable step on each engine (blue circles) against "
                  "the floor of one durable write on this disk (grey squares, the fastest dotted), log scale. "
                  "Whiskers: bootstrap 95 % intervals of the medians.", wide=True)
