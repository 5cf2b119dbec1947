"""The scale section's tables and figure (``dah-bench --only scale``, ``benchmarks/scale.py``): the harness's own
cost per size, the time of each check per size, and how each measure grows with the messages sent.

Kept apart from ``reports.tables`` and ``reports.figures`` (each already several hundred lines); built the same way
(``Table``, ``Figure``, ``reports.style``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from reports import style
from reports.figures import Figure
from reports.tables import DASH, Table

#: the figure's panels: (the point's field, its axis label, the fit's key in scale.json, a scale for the values)
PANELS = (("wall_s", "wall time (s)", "wall_s~messages", 1.0),
          ("harness_cpu_s", "harness CPU (s)", "harness_cpu_s~messages", 1.0),
          ("peak_rss_mib", "peak RSS (MiB)", "peak_rss_mib~messages", 1.0),
          ("check_s", "check (s)", "check_s~messages", 1.0),
          ("replay_s", "replay (s)", "replay_s~messages", 1.0),
          ("report_s", "report build (s)", "report_s~messages", 1.0),
          ("run_dir_bytes", "run directory (MiB)", "run_dir_bytes~messages", 2.0**-20))


def _size(p: dict[str, Any]) -> str:
    can = f", continue-as-new every {int(p['max_history_events'])} events" if p.get("max_history_events") else ""
    return f"{int(p['conversations'])} x {int(p['messages_per_conversation'])}{can}"


def table(data: dict[str, Any]) -> Table | None:
    """One row per size: what it ran and what it cost the harness."""
    points = data["points"]
    if not points:
        return None
    rows = [{"size": _size(p), "messages": p["messages"], "events": p["events"], "histories": p["runs"],
             "longest chain": p["longest_chain_events"], "wall s": p["wall_s"],
             "CPU ms/msg": p["harness_cpu_ms_per_message"], "peak RSS MiB": max(p["peak_rss_mib"],
                                                                              p.get("report_rss_mib") or 0.0),
             "check s": p["check_s"], "replay ms/history": p["replay_ms_per_history"],
             "run dir MiB": p["run_dir_bytes"] / 2**20, "report s": p["report_s"], "verdict": p["verdict"]}
            for p in points]
    return Table("scale", "The harness's own cost at production shape: kill_mid_turn per size (conversations x "
                          "messages each, at least), one run each. CPU is the harness's (this process and the "
                          "replayer; not the Temporal server's, not the workers'), per message sent; peak RSS the "
                          "harness process's, the report's build included; check is the whole check of the run "
                          "(every checker and measurement); replay per saved history (one run of a chain each).",
                 pd.DataFrame(rows), {"messages": "d", "events": "d", "histories": "d", "longest chain": "d",
                                      "wall s": ".0f", "CPU ms/msg": ".2f", "peak RSS MiB": ".0f", "check s": ".2f",
                                      "replay ms/history": ".1f", "run dir MiB": ".1f", "report s": ".1f"})


def checks_table(data: dict[str, Any]) -> Table | None:
    """Each check's and measurement's seconds per size (columns: the sizes' messages)."""
    points = data["points"]
    names = list(dict.fromkeys(n for p in points for n in (p.get("checker_s") or {})))
    measures = list(dict.fromkeys(n for p in points for n in (p.get("measurement_s") or {})))
    if not names:
        return None
    rows = [{"check": n, **{f"{int(p['messages'])} msgs": (p.get("checker_s") or {}).get(n, math.nan)
                            for p in points}} for n in names]
    rows += [{"check": f"({n})", **{f"{int(p['messages'])} msgs": (p.get("measurement_s") or {}).get(n, math.nan)
                                    for p in points}} for n in measures]
    df = pd.DataFrame(rows)
    return Table("scale_checks", "Seconds each check took, per size (by the messages it sent); measurements that "
                                 "decide nothing in parentheses.", df,
                 {c: ".3f" for c in df.columns if c != "check"})


def fits_table(data: dict[str, Any]) -> Table | None:
    """The least-squares fit of each measure against the messages (or the history events), and its exponent."""
    fits = data.get("fits") or {}
    rows = []
    for key, f in fits.items():
        if not isinstance(f, dict) or f.get("slope") is None:
            continue
        measure, _, x = key.partition("~")
        rows.append({"measure": measure, "against": x, "slope": f["slope"], "intercept": f["intercept"],
                     "R²": f["r2"], "exponent": f.get("exponent") if f.get("exponent") is not None else math.nan,
                     "sizes": f["n"]})
    if not rows:
        return None
    return Table("scale_fits", "How each measure grows: least squares y = intercept + slope x over the sizes, its R², "
                               "and the exponent of the log-log fit (y ~ x^exponent: 1 linear, 2 quadratic; below 1 "
                               "a fixed cost dominates).",
                 pd.DataFrame(rows), {"slope": ".3g", "intercept": ".3g", "R²": ".3f", "exponent": ".2f",
                                      "sizes": "d"})


def acceptance_lines(data: dict[str, Any]) -> list[str]:
    a = data.get("acceptance") or {}
    if not a.get("compared"):
        return ["acceptance: fewer than two kill_mid_turn sizes ran"]
    small, large = a["compared"]
    return [f"checks at {large} / at {small}: {a['checks_ratio'] if a['checks_ratio'] is not None else DASH}x "
            f"(at most {a['checks_ratio_limit']:g}x)",
            f"harness CPU per message at {large} / at {small}: {a['cpu_per_message_ratio']}x "
            f"(at most {a['cpu_per_message_ratio_limit']:g}x)",
            f"peak RSS: {a['max_rss_mib']:.0f} MiB (under {a['rss_limit_mib']:.0f} MiB)",
            f"verdicts: {', '.join(a['verdicts'])}; acceptance {'met' if a['met'] else 'NOT met'}"]


def plot(data: dict[str, Any], out: Path) -> Figure | None:
    """Each measure against the messages sent, one panel each, with its fitted line and R²; the continue-as-new
    size drawn hollow."""
    points = sorted(data["points"], key=lambda p: p["messages"])
    if len(points) < 2:
        return None
    fig, axes = style.new(style.DOUBLE, 3.6, ncols=4, nrows=2)
    flat = list(np.ravel(axes))
    x = np.array([p["messages"] for p in points], dtype=float)
    chain = np.array([bool(p.get("max_history_events")) for p in points])
    for ax, (key, label, fit_key, unit) in zip(flat, PANELS):
        y = np.array([p.get(key) if p.get(key) is not None else math.nan for p in points], dtype=float) * unit
        ax.plot(x[~chain], y[~chain], "o", color=style.PALETTE[0], ms=4, label="kill_mid_turn")
        if chain.any():
            ax.plot(x[chain], y[chain], "o", mfc="none", color=style.PALETTE[1], ms=4, label="continue-as-new")
        f = (data.get("fits") or {}).get(fit_key) or {}
        top = np.nanmax(y) if np.isfinite(y).any() else 1.0
        if f.get("slope") is not None:
            xs = np.linspace(0, x.max() * 1.05, 50)
            line = (f["intercept"] + f["slope"] * xs) * unit
            ax.plot(xs, line, "-", color=style.MARK_COLOUR, lw=0.8, label="least squares")
            top = max(top, float(line.max()))
            ax.text(0.03, 0.97, f"R² {f['r2']:.2f}, exponent {_exp(f)}",
                    transform=ax.transAxes, va="top", fontsize=style.SMALL_PT)
        ax.set_ylabel(label)
        ax.set_xlim(left=0)
        ax.set_ylim(0, top * 1.35 or 1.0)  # room above the data for the fit's line of text
        ax.grid()
    for ax in flat[4:]:
        ax.set_xlabel("messages sent")
    legend_ax = flat[len(PANELS)] if len(flat) > len(PANELS) else None
    if legend_ax is not None:
        handles, labels = flat[0].get_legend_handles_labels()
        legend_ax.axis("off")
        legend_ax.legend(handles, labels, loc="center", frameon=False)
    style.save(fig, out, "scale")
    return Figure("scale", "The harness's cost against the work",
                  "Each measure of the scale section against the messages the run sent (kill_mid_turn at each size "
                  "filled, the continue-as-new size hollow), with its least-squares line, R² and log-log exponent "
                  "(1: linear).", wide=True)


def _exp(f: dict[str, Any]) -> str:
    return f"{f['exponent']:.2f}" if f.get("exponent") is not None else "?"
