"""Run data made safe to show: a name, summary or error read from a run directory may hold any character.

``printable(text)`` replaces every character that could act on a terminal, reorder what a reader sees, or make an
XML 1.0 document not well-formed with a visible escape (``\\x1b``, ``\\u202e``), so the text still shows what it
held. The CLIs print run data through it; the JUnit writer (``chaos.ci``) and the report (``reports``) use it too.
``table(columns, rows)`` is the one results table every command prints (chaos runs, CI merges, the planted-bug
catalogue, the migration fuzzer), its cells printable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

#: C0 and C1 controls and DEL; bidirectional marks, embeddings, overrides and isolates (they reorder what a reader
#: sees); line and paragraph separators; surrogates and U+FFFE/U+FFFF (no UTF-8, no XML 1.0)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, keep: str = "") -> str:
    """``str(text)`` with every unsafe character (controls, bidi controls, separators, surrogates, noncharacters)
    as a visible escape, but those in ``keep`` (e.g. ``"\\n\\t"`` where lines are the text's own). Nothing else
    changes: a backslash stays one."""
    s = str(text)
    return _UNSAFE.sub(lambda m: m.group() if m.group() in keep else _escape(m), s)


def table(columns: Sequence[tuple[str, int] | tuple[str, int, str]], rows: Iterable[Sequence[object]], *,
          markdown: bool = False, legend: Sequence[tuple[str, str]] = ()) -> str:
    """The one way a command prints a results table: a header, a rule, one line per row, every cell
    ``printable`` (``None`` as ``-``). ``columns``: (name, width) or (name, width, ``">"`` to right-align);
    a column widens to its widest cell, so every row stays aligned. ``markdown``: a Markdown
    table instead (widths ignored; a ``|`` inside a cell shown as ``/``), for pasting into a report.
    ``legend``: (column, what it means) for every column whose name does not say it, printed under the table."""
    def cell(value: object) -> str:
        return "-" if value is None else printable(value)

    if legend:
        width = max(len(name) for name, _ in legend)
        key = ["", *(f"  {name:<{width}}  {meaning}" for name, meaning in legend)]
    else:
        key = []
    if markdown:
        lines = ["| " + " | ".join(c[0] for c in columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
        lines += ["| " + " | ".join(cell(v).replace("|", "/") for v in row) + " |" for row in rows]
        return "\n".join(lines + key)

    body = [[cell(v) for v in row] for row in rows]
    widths = [max([c[1], len(c[0]), *(len(r[i]) for r in body if i < len(r))]) for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        return " ".join(f"{text:{(c[2] if len(c) > 2 else '<')}{w}}"
                        for text, c, w in zip(cells, columns, widths)).rstrip()

    header = line([c[0] for c in columns])
    return "\n".join([header, "-" * len(header), *(line(r) for r in body), *key])
