"""The report's figures (matplotlib, Agg backend: no display needed), in the one style of ``reports.style``.

Contract: each ``plot_*`` function takes normalised data from
``reports.sources`` / ``reports.tables`` and a directory, saves
``<dir>/<name>.pdf``, ``.png`` and ``.svg`` at the figure's print size
(``style.SINGLE`` or ``style.DOUBLE`` wide), and returns a ``Figure`` record
(name, title, caption) for the report, or None when there is nothing to plot.
Images carry no titles: the caption says what a figure shows. Every axis is
labelled with its unit; integer axes have integer ticks; a durable/plain pair
shares a colour and the loop is the line style; a median or mean drawn as a
bar or point carries its 95 % bootstrap interval as an error bar
(``reports.confidence``). Chaos figures follow Jepsen's conventions: ok blue, fail
red, info orange; each nemesis fault window shaded in a colour per fault kind,
a solid line where it was injected, dashed lines at the faults and heal phases.
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
from matplotlib.patches import Patch
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


def _stack_legend(ax: Any, extra: Any) -> None:
    """Stacked components listed top to bottom, as they are drawn, then ``extra``."""
    h, labels = ax.get_legend_handles_labels()
    comps = [x for x, lab in zip(h, labels) if lab in {c for c, _ in COMPONENTS}][::-1]
    rest = [x for x, lab in zip(h, labels) if lab not in {c for c, _ in COMPONENTS}]
    style.legend(ax, comps + rest + ([extra] if extra is not None else []), outside=True)


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


def plot_chaos(run: ChaosRun, out: Path, stem: str) -> list[Figure]:
    clients = opsmod.client_ops(run.ops, run.end_s)
    if clients.empty:
        return []
    colours: dict[str, str] = {}
    figs = []
    floor = 1e-3  # log axes: a 0 s latency is drawn at 1 ms

    # (a) every operation
    fig, ax, lo = _chaos_figure(run, clients, colours)
    for kind in ("ok", "fail", "info"):
        sel = clients[(clients["type"] == kind) & clients["completed"]]
        if len(sel):
            ax.scatter(sel["invoke_s"], sel["latency_s"].clip(lower=floor), s=9, color=TYPE_COLOURS[kind],
                       alpha=0.8, lw=0, label=f"{kind} ({len(sel)})", zorder=3)
    never = clients[~clients["completed"]]
    if len(never):
        ax.scatter(never["invoke_s"], never["latency_s"].clip(lower=floor), s=16, marker="^",
                   facecolor="none", edgecolor=TYPE_COLOURS["info"], lw=0.9, zorder=3,
                   label=f"info, never completed ({len(never)})")
    ax.set_yscale("log")
    ax.margins(y=0.08)
    _log(ax.yaxis)
    ax.set_ylabel("latency (s, log scale)")
    ax.grid(alpha=0.3, which="major")
    style.legend(ax, outside=True)
    style.save(fig, out, f"{stem}-latency-raw")
    n_never = len(never)
    figs.append(Figure(f"{stem}-latency-raw", f"{run.scenario}: raw latency",
                       f"Every client send_message of `{run.scenario}`, at its invoke time, by outcome (ok blue, fail "
                       f"red, info orange), latency on a log scale. " + _TIMELINE_NOTE + _cropped(run, lo)
                       + (f" {n_never} operation(s) never completed: drawn as triangles with their latency taken to "
                          f"the end of the run ({run.end_s:.1f} s)." if n_never else ""), wide=True))

    # (b) quantiles per window, by invoke time
    width = _buckets(run.end_s)
    done = clients[clients["completed"]].copy()
    fig, ax, lo = _chaos_figure(run, clients, colours)
    if len(done):
        done["bucket"] = (done["invoke_s"] // width) * width
        g = done.groupby("bucket")["latency_s"]
        # every window, empty ones as gaps: a line never bridges a window without operations
        index = np.arange(done["bucket"].min(), done["bucket"].max() + width / 2, width)
        q = pd.DataFrame({"p50": g.quantile(0.5), "p95": g.quantile(0.95), "p99": g.quantile(0.99),
                          "max": g.max(), "n": g.size()}).reindex(index, method="nearest", tolerance=width / 4)
        for col, colour, marker, min_n in (("max", "#444444", "v", 1), ("p99", "#ff7f0e", "^", 100),
                                           ("p95", "#2ca02c", "s", 20), ("p50", "#1f77b4", "o", 1)):
            y = q[col].where(q["n"] >= min_n)
            if y.notna().any():
                ax.plot(q.index + width / 2, y.clip(lower=floor), marker=marker, ms=3, lw=1.0, color=colour,
                        label=col, zorder=3)
    ax.set_yscale("log")
    ax.margins(y=0.08)
    _log(ax.yaxis)
    ax.set_ylabel("latency (s, log scale)")
    ax.grid(alpha=0.3, which="major")
    h, labels = ax.get_legend_handles_labels()
    order = [labels.index(k) for k in ("p50", "p95", "p99", "max") if k in labels]
    style.legend(ax, [h[i] for i in order], outside=True)
    style.save(fig, out, f"{stem}-latency-quantiles")
    figs.append(Figure(f"{stem}-latency-quantiles", f"{run.scenario}: latency quantiles",
                       f"Latency quantiles of the completed send_message operations of `{run.scenario}` invoked in "
                       f"each {width:g} s window (log scale): median and maximum of every window, p95 where the "
                       f"window has at least 20 operations and p99 where it has 100; a window without operations "
                       f"is a gap. " + _TIMELINE_NOTE + _cropped(run, lo), wide=True))

    # (c) completions per second, by completion time
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
    figs.append(Figure(f"{stem}-rate", f"{run.scenario}: throughput",
                       f"Completed send_message operations per second of `{run.scenario}` ({width:g} s windows, by "
                       f"completion time and outcome). " + _TIMELINE_NOTE + _cropped(run, lo), wide=True))
    return figs


def plot_breakdown(series: list[dict[str, Any]], out: Path) -> Figure | None:
    """Two panels: the whole turn (the model's own time and the loop's overhead, with the median client
    latency), and the overhead alone on its own scale, component by component: the model's time would
    otherwise dwarf every overhead component."""
    if not series:
        return None
    fig, (whole, over) = style.new(style.DOUBLE, 2.8, ncols=2, width_ratios=[1, 2])
    x = np.arange(len(series))
    names = [s["name"] for s in series]
    meds = [component_medians(s["turns"]) for s in series]
    model = np.nan_to_num(np.array([m[MODEL] for m in meds]))
    overhead = np.array([float(np.nansum([v for k, v in m.items() if k != MODEL])) for m in meds])
    model_colour = COMPONENT_COLOURS[[label for label, _ in COMPONENTS].index(MODEL)]
    whole.bar(x, model, 0.6, color=model_colour, label="model")
    whole.bar(x, overhead, 0.6, bottom=model, color="0.6", label="overhead (sum of the rest)")
    client = [_median_err(column(s["turns"], "client_ms")) for s in series]
    whole.errorbar(x, [c[0] for c in client], yerr=[[c[1] for c in client], [c[2] for c in client]], fmt="_",
                   ms=14, mew=1.4, color="black", elinewidth=0.8, capsize=2, zorder=3,
                   label="median client latency [95% CI]")
    whole.set_ylabel("median time per turn (ms)")
    style.legend(whole, above=True, loc="upper left", ncols=3)
    bottom = np.zeros(len(series))
    for (label, _), colour in zip(COMPONENTS, COMPONENT_COLOURS):
        if label == MODEL:
            continue
        vals = np.nan_to_num(np.array([m[label] for m in meds]))
        over.bar(x, vals, 0.6, bottom=bottom, color=colour, label=label)
        bottom += vals
    over.set_ylabel("median overhead per turn (ms)")
    for ax in (whole, over):
        ax.set_xticks(x, names, rotation=30 if len(series) > 2 else 0, ha="right" if len(series) > 2 else "center")
        ax.grid(axis="y")
        ax.set_ylim(bottom=0)
        ax.margins(y=0.15)
    _stack_legend(over, None)
    style.save(fig, out, "breakdown")
    return Figure("breakdown", "Latency breakdown", "Where a durable turn's time goes, per series. Left: the median "
                  "model time and the sum of the median overhead components, stacked; the black mark is the median "
                  "client latency with its 95% bootstrap interval (medians of parts need not add up to it exactly). "
                  "Right: the overhead alone on its own scale, each component's median stacked (ms).", wide=True)


def _tuning_label(s: dict[str, Any]) -> str:
    """The server profile and the worker variant (eager, no-eager, no-sandbox, ...)."""
    variant = s.get("variant") or {True: "eager", False: "no-eager"}.get(s.get("eager"), "?")
    return f"{s.get('server') or '?'} {variant}"


def plot_tuning(series: list[dict[str, Any]], breakdown_series: list[dict[str, Any]] | None, out: Path
                ) -> Figure | None:
    tuned = [s for s in series if s["section"] == "tuning"]
    if not tuned:
        return None
    by_name = {b["name"]: b for b in breakdown_series or []}
    fig, ax = style.new(style.DOUBLE, 2.8)
    x = np.arange(len(tuned))
    med = [_median_err(column(s["turns"], "client_ms")) for s in tuned]
    stacked = False
    for j, s in enumerate(tuned):
        if s["name"] in by_name:
            m = component_medians(by_name[s["name"]]["turns"])
            bottom = 0.0
            for (label, _), colour in zip(COMPONENTS, COMPONENT_COLOURS):
                v = 0.0 if math.isnan(m[label]) else m[label]
                ax.bar(j, v, 0.6, bottom=bottom, color=colour, label=label if not stacked else None)
                bottom += v
            stacked = True
    medians = [0.0 if math.isnan(m[0]) else m[0] for m in med]
    ax.bar(x, medians, 0.6, facecolor="none" if stacked else style.PALETTE[0], edgecolor="black", lw=0.8,
           label="median client latency")
    ax.errorbar(x, medians, yerr=[[m[1] for m in med], [m[2] for m in med]], fmt="none", ecolor="black",
                elinewidth=0.8, capsize=2, label="95% CI of the median")
    ax.set_xticks(x, [_tuning_label(s) for s in tuned], rotation=25, ha="right", rotation_mode="anchor")
    ax.set_ylabel("median client latency per turn (ms)")
    ax.set_xlabel("server profile and worker options (tool workload, mock model)")
    ax.set_ylim(bottom=0)
    ax.grid(axis="y")
    _stack_legend(ax, None)
    style.save(fig, out, "tuning")
    return Figure("tuning", "Tuning", "Median client latency per turn (ms) for each tuning series (server "
                  "dynamic-config profile, eager activity execution, workflow sandbox), with its 95% bootstrap "
                  "interval" + ("; where the run has its breakdown, the components' medians are stacked inside the "
                                "outlined total." if stacked else "."), wide=True)


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
    sections = [s for s, procs in doc["sections"].items() if procs]
    if not sections:
        return None
    procs = sorted({p for s in sections for p in doc["sections"][s]})
    fig, axes = style.new(style.DOUBLE, 2.6, ncols=2)
    width = 0.8 / len(procs)
    x = np.arange(len(sections))
    for ax, key, ylabel in ((axes[0], "cpu_mean_pct", "mean CPU (% of one core)"),
                            (axes[1], "rss_max_mb", "peak resident memory (MB)")):
        for j, p in enumerate(procs):
            vals = [doc["sections"][s].get(p, {}).get(key, math.nan) for s in sections]
            ax.bar(x + (j - (len(procs) - 1) / 2) * width, np.nan_to_num(vals), width, label=p,
                   color=COMPONENT_COLOURS[j % len(COMPONENT_COLOURS)])
        ax.set_xticks(x, sections, rotation=30 if len(sections) > 3 else 0, ha="right" if len(sections) > 3
                      else "center")
        ax.set_xlabel("benchmark section")
        ax.set_ylabel(ylabel)
        ax.grid(axis="y")
    style.legend(axes[1], outside=True)
    style.save(fig, out, "resources")
    return Figure("resources", "Resources", "Left: mean CPU per process (% of one core; 200 % = two cores); right: "
                  "peak resident memory (MB), during each benchmark section (psutil samples).", wide=True)


def _steps_against_floor(ax: Any, points: list[dict[str, Any]], labels: list[str], xlabel: str) -> None:
    """Horizontal bars: each point's median step (blue) or durable-write floor (grey), log scale, with the bootstrap
    95 % interval of the median where the run kept its samples (none: no whisker)."""
    colours = ["0.6" if p["measure"] == "floor" else style.PALETTE[0] for p in points]
    xerr = np.array([_median_err(np.asarray(p.get("samples_ms") or [], dtype=float))[1:] for p in points]).T
    ax.barh(labels, [p["p50_ms"] for p in points], color=colours, xerr=xerr if xerr.any() else None, ecolor="0.2",
            capsize=2)
    ax.set_xscale("log")
    _log(ax.xaxis)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.grid(axis="x")


def plot_checkpoint(points: list[dict[str, Any]], out: Path) -> Figure | None:
    rows = [p for p in points if p.get("measure") in ("floor", "step") and not math.isnan(p["p50_ms"])
            and p["p50_ms"] > 0]
    if not rows:
        return None
    fig, ax = style.new(style.SINGLE, 0.6 + 0.25 * len(rows))
    _steps_against_floor(ax, rows, [f"{p['measure']}: {p['backend']}" for p in rows], "median per step (ms)")
    style.save(fig, out, "checkpoint")
    return Figure("checkpoint", "Checkpoint engine", "What a checkpointed step costs: the median of one no-op "
                  "checkpointed step on each engine (blue) against the physical floor of one durable write on "
                  "this disk (grey), log scale, with the bootstrap 95 % interval of the median where the run "
                  "kept its samples. The plain loop's step is a bare await.")


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
    fig, (left, right) = style.new(style.DOUBLE, 2.4, ncols=2)
    width = 0.8 / max(1, len(groups))
    x = np.arange(len(engines))
    for j, (workload, mode) in enumerate(groups):
        meds, errs = [], []
        for e in engines:
            s = next((s for s in series if s["engine"] == e and s["workload"] == workload and s["model_mode"] == mode),
                     None)
            over = (column(s["turns"], "client_ms") - column(s["turns"], "model_ms")) if s else np.array([])
            med, lo, hi = _median_err(over)
            meds.append(med)
            errs.append((lo, hi))
        left.bar(x + (j - (len(groups) - 1) / 2) * width, np.nan_to_num(meds), width, label=f"{workload}, {mode}",
                 yerr=np.array(errs).T, ecolor="0.2", capsize=2, color=style.PALETTE[j % len(style.PALETTE)])
    left.set_xticks(x, engines, rotation=30, ha="right")
    left.set_ylabel("median turn minus model (ms)")
    left.grid(axis="y")
    style.legend(left)
    _steps_against_floor(right, steps, [p["engine"] for p in steps], "median per no-op step (ms)")
    style.save(fig, out, "engines")
    return Figure("engines", "Engines side by side", "The same agent loop on each engine, in one run. Left: the "
                  "median turn minus the time inside model steps, per workload and model mode (what the engine and "
                  "the loop add); right: the median of one no-op durable step on each engine (blue) against the "
                  "floor of one durable write on this disk (grey), log scale. Whiskers: bootstrap 95 % intervals of "
                  "the medians.", wide=True)
