"""The one figure style of the report: sizes, fonts, colours, line styles, and how figures are saved.

Every figure of ``reports.figures`` is made with ``new()`` and saved with
``save()``, so they all look alike and all print well in a paper:

* Sizes are the print sizes of a two-column paper: ``SINGLE`` (3.3 in, one
  column) and ``DOUBLE`` (7 in, ``figure*`` across both). A figure drawn at
  its print size needs no scaling in LaTeX (``\\includegraphics[width=\\columnwidth]``),
  so the fonts below are the fonts on paper: 8 pt text, 7 pt ticks and
  legends, never smaller.
* No titles inside images: the caption is in the Markdown/LaTeX.
* A durable/plain pair shares a colour (``pair_colour``); the loop is the line
  style (``LOOP_STYLE``: durable solid, plain dashed).
* Integer axes (turns, workers, conversations) get integer ticks (``integer_ticks``).
* Every figure is written as PDF (for pdflatex), PNG (200 dpi, for screens) and SVG (for
  the HTML report), with no dates inside, so rebuilding the same data gives the
  same SVG and PDF files.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: the report is built on CI machines and servers
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

log = logging.getLogger(__name__)

SINGLE = 3.3  # in: one column of a two-column paper (\columnwidth)
DOUBLE = 7.0  # in: both columns (\textwidth, figure*)
HEIGHT = {SINGLE: 2.3, DOUBLE: 2.6}  # in, the default height for each width
FONT_PT = 8.0  # labels
SMALL_PT = 7.0  # ticks, legends, annotations: the smallest text in any figure
PNG_DPI = 200  # for the Markdown report on screen; print uses the PDF
FORMATS = ("pdf", "png", "svg")

#: The loop is the line style; the colour belongs to the workload/model pair.
LOOP_STYLE = {"durable": "-", "plain": "--"}
#: Colour-blind-safe palette (Okabe-Ito), one colour per durable/plain pair or per series.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
#: Continue-as-new boundaries and other events on a time/turn axis.
MARK_COLOUR = "0.35"

RC = {
    "font.size": FONT_PT,
    "axes.titlesize": FONT_PT,
    "axes.labelsize": FONT_PT,
    "xtick.labelsize": SMALL_PT,
    "ytick.labelsize": SMALL_PT,
    "legend.fontsize": SMALL_PT,
    "legend.title_fontsize": SMALL_PT,
    "axes.linewidth": 0.6,
    "lines.linewidth": 1.1,
    "lines.markersize": 3.5,
    "grid.linewidth": 0.4,
    "grid.alpha": 0.35,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "legend.frameon": False,
    "svg.hashsalt": "reports",  # stable SVG ids
    "pdf.fonttype": 42,  # TrueType in the PDF: selectable text, accepted by paper submission systems
    "figure.constrained_layout.use": True,
}
plt.rcParams.update(RC)


def new(width: float = SINGLE, height: float | None = None, ncols: int = 1, nrows: int = 1, **kw: Any
        ) -> tuple[plt.Figure, Any]:
    """A figure at its print size (``SINGLE`` or ``DOUBLE`` wide) and its axes."""
    assert width in (SINGLE, DOUBLE), width
    return plt.subplots(nrows, ncols, figsize=(width, height or HEIGHT[width]), **kw)


def bar_height(n: int, width: float = SINGLE, extra: float = 0.9) -> float:
    """The height (in) of a horizontal-bar figure with ``n`` bars: ``extra`` for the axis and legend, and a
    row per bar that fits a 7 pt label."""
    return max(HEIGHT[width], extra + 0.2 * n)


def save(fig: plt.Figure, out: Path, name: str) -> None:
    """``<out>/<name>.pdf``, ``.png`` and ``.svg``; closes the figure. Tick labels drawn over one another are
    logged as a warning naming the figure: the figure needs fewer ticks or horizontal bars."""
    out.mkdir(parents=True, exist_ok=True)
    for fmt in FORMATS:
        meta = {"pdf": {"CreationDate": None, "ModDate": None}, "svg": {"Date": None}}.get(fmt)
        fig.savefig(out / f"{name}.{fmt}", dpi=PNG_DPI if fmt == "png" else None, metadata=meta)
    clashes = overlapping_labels(fig)
    if clashes:
        log.warning("figure %s: tick labels overlap (%d pairs), e.g. %s", name, len(clashes), clashes[0])
    plt.close(fig)
    log.debug("figure %s", name)


def overlapping_labels(fig: plt.Figure) -> list[str]:
    """Pairs of tick labels on one axis that are drawn over each other, as "y: 'a' / 'b'"."""
    renderer = fig.canvas.get_renderer()
    found = []
    for ax in fig.axes:
        for axis_name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in axis.get_ticklabels()
                     if t.get_visible() and t.get_text()]
            for n, (a_text, a) in enumerate(boxes):
                for b_text, b in boxes[n + 1:]:
                    both = Bbox.intersection(a, b)
                    if both is not None and both.width * both.height > 1.0:  # pixels: touching is not overlapping
                        found.append(f"{axis_name}: {a_text!r} / {b_text!r}")
    return found


def pair_colour(key: Any, seen: dict[Any, str]) -> str:
    """The colour of ``key`` (e.g. a (workload, model) pair): the next palette colour the first time."""
    if key not in seen:
        seen[key] = PALETTE[len(seen) % len(PALETTE)]
    return seen[key]


def integer_ticks(axis: Any) -> None:
    """Ticks at whole numbers only: for turns, workers, conversations."""
    axis.set_major_locator(MaxNLocator(integer=True))


def legend(ax: Any, handles: list[Any] | None = None, outside: bool = False, above: bool = False,
           **kw: Any) -> None:
    """The axes' legend in the style: small, frameless; ``outside`` puts it right of the axes (wide figures),
    ``above`` above them in two columns (single-column figures: it never hides data)."""
    h = handles if handles is not None else ax.get_legend_handles_labels()[0]
    if not h:
        return
    if outside:
        kw = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), **kw}
    elif above:
        # A figure legend in constrained layout's "outside" place: the axes shrink to make room for it.
        loc = kw.pop("loc", "upper center")
        ax.figure.legend(handles=h, loc=f"outside {loc}", handlelength=2.2, **{"ncols": 2, **kw})
        return
    ax.legend(handles=h, handlelength=2.2, borderaxespad=0.3, **kw)
