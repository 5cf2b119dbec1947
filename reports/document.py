"""The report as a list of blocks, rendered to Markdown and to self-contained HTML.

Contract: one ``Doc`` gives both ``report.md`` and ``report.html`` with the
same content. Paragraph text is a small Markdown subset (`code`, **bold**),
which both renderers keep; everything else is escaped, in Markdown as in HTML
(run data may hold HTML, link syntax or control characters). Figures are
referenced relative to the report: PNG in Markdown, SVG in HTML, each with
a link to its PDF (for LaTeX). Links are made only by the report itself: a
heading or a table row may carry an ``anchor`` (its id), a ``Grid`` cell and a
``links`` line point at such an anchor (``#id``) or at a file the report read,
by a path relative to the report's folder.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from harness.printable import printable
from reports.tables import Table, breakable, html_table, markdown, markdown_escape


@dataclass
class Chip:
    """One run in a ``Grid`` cell: its text (never colour alone), its kind (a CSS class: pass, fail, unknown,
    error), where it links (``#anchor`` in the report) and a longer description shown on hover."""
    text: str
    kind: str
    href: str
    title: str = ""


@dataclass
class GridRow:
    label: str
    note: str  # under the label, smaller (e.g. a soak's tally)
    cells: dict[str, list[Chip]]  # column -> its runs


@dataclass
class Grid:
    """A table of chips: rows (e.g. scenarios) by columns (e.g. engine and placement); a cell holds any number of
    chips (e.g. one per seed), an absent cell is shown as a dash with ``empty``'s words."""
    corner: str
    columns: list[str]
    rows: list[GridRow]
    empty: str = "not run"


@dataclass
class Doc:
    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def heading(self, level: int, text: str, anchor: str | None = None) -> None:
        self.blocks.append(("h", (level, text, anchor)))

    def grid(self, g: Grid) -> None:
        self.blocks.append(("grid", g))

    def links(self, lead: str, links: list[tuple[str, str]]) -> None:
        """One line: ``lead`` then each (text, href), a relative path or ``#anchor`` the report made."""
        if links:
            self.blocks.append(("links", (lead, list(links))))

    def para(self, text: str) -> None:
        self.blocks.append(("p", text))

    def bullets(self, items: list[str]) -> None:
        if items:
            self.blocks.append(("ul", list(items)))

    def table(self, t: Table) -> None:
        self.blocks.append(("table", t))

    def figure(self, name: str, title: str, caption: str) -> None:
        self.blocks.append(("figure", (name, title, caption)))

    def code(self, text: str) -> None:
        self.blocks.append(("code", text))

    def extend(self, other: Doc) -> None:
        self.blocks.extend(other.blocks)

    def markdown(self) -> str:
        out = []
        for kind, v in self.blocks:
            if kind == "h":
                anchor = f' <a id="{html.escape(v[2])}"></a>' if v[2] else ""
                out.append(f"{'#' * v[0]} {markdown_inline(v[1])}{anchor}")
            elif kind == "grid":
                out.append(_markdown_grid(v))
            elif kind == "links":
                out.append(f"{markdown_inline(v[0])}: " + " · ".join(
                    f"[{markdown_escape(text)}]({_href(href)})" for text, href in v[1]))
            elif kind == "p":
                out.append(markdown_inline(v))
            elif kind == "ul":
                out.append("\n".join(f"- {markdown_inline(item)}" for item in v))
            elif kind == "table":
                out.append(markdown(v) + f"\n\n*{markdown_escape(v.full_caption)}*"
                           + (f" (`{v.name}.csv`)" if v.saved else ""))
            elif kind == "figure":
                name, title, caption = v
                out.append(f"![{markdown_escape(title)}](figures/{name}.png)\n\n*Figure ({markdown_inline(title)}): "
                           f"{markdown_inline(caption)}* ([PDF](figures/{name}.pdf))")
            elif kind == "code":
                text = printable(v, keep="\n\t")
                fence = "`" * max(3, 1 + max((len(run) for run in re.findall("`+", text)), default=0))
                out.append(f"{fence}\n{text}\n{fence}")
        return "\n\n".join(out) + "\n"

    def html(self, title: str) -> str:
        body = []
        for kind, v in self.blocks:
            if kind == "h":
                anchor = f' id="{html.escape(v[2])}"' if v[2] else ""
                body.append(f"<h{v[0]}{anchor}>{inline(v[1])}</h{v[0]}>")
            elif kind == "grid":
                body.append(_html_grid(v))
            elif kind == "links":
                body.append(f'<p class="links">{inline(v[0])}: ' + " · ".join(
                    f'<a href="{html.escape(_href(href))}">{html.escape(printable(text))}</a>' for text, href in v[1])
                            + "</p>")
            elif kind == "p":
                body.append(f"<p>{inline(v)}</p>")
            elif kind == "ul":
                body.append("<ul>\n" + "\n".join(f"<li>{inline(i)}</li>" for i in v) + "\n</ul>")
            elif kind == "table":
                csv = f" (<code>{html.escape(v.name)}.csv</code>)" if v.saved else ""
                body.append(f"{html_table(v)}\n<p class=\"caption\">{html.escape(printable(v.full_caption))}{csv}</p>")
            elif kind == "figure":
                name, title_, caption = v
                alt = html.escape(printable(title_))
                body.append(f'<figure><img src="figures/{html.escape(name)}.svg" alt="{alt}">'
                            f"<figcaption>{inline(title_)}: {inline(caption)} "
                            f'(<a href="figures/{html.escape(name)}.pdf">PDF</a>)</figcaption></figure>')
            elif kind == "code":
                text = html.escape(printable(v, keep="\n\t"))
                body.append(f"<pre>{text}</pre>")
        return _PAGE.format(title=html.escape(title), body="\n".join(body))


def _href(href: str) -> str:
    """A link the report made, as a URL: ``#anchor`` as it is, a relative path percent-encoded (a file name's bytes
    that are not UTF-8, which Python holds as lone surrogates, as those bytes)."""
    if href.startswith("#"):
        return href
    try:
        return quote(href, errors="surrogateescape")
    except UnicodeEncodeError:  # a surrogate no file name can hold: shown escaped, a link to nothing
        return quote(printable(href))


def _html_grid(g: Grid) -> str:
    head = f'<th scope="col">{html.escape(printable(g.corner))}</th>' + "".join(
        f'<th scope="col">{html.escape(printable(c))}</th>' for c in g.columns)
    rows = []
    for r in g.rows:
        label = breakable(html.escape(printable(r.label))) + (f'<div class="note">{html.escape(printable(r.note))}</div>'
                                                    if r.note else "")
        cells = []
        for c in g.columns:
            chips = r.cells.get(c) or []
            cells.append("<td>" + (" ".join(
                f'<a class="chip {html.escape(ch.kind)}" href="{html.escape(_href(ch.href))}"'
                + (f' title="{html.escape(printable(ch.title))}"' if ch.title else "")
                + f">{html.escape(printable(ch.text))}</a>" for ch in chips)
                or f'<span class="none" title="{html.escape(g.empty)}">—</span>') + "</td>")
        rows.append(f'<tr><th scope="row">{label}</th>{"".join(cells)}</tr>')
    return (f'<table class="grid">\n<thead><tr>{head}</tr></thead>\n<tbody>\n' + "\n".join(rows)
            + "\n</tbody>\n</table>")


def _markdown_grid(g: Grid) -> str:
    lines = ["| " + " | ".join(markdown_escape(c) for c in [g.corner, *g.columns]) + " |",
             "|" + "|".join(":---" for _ in range(len(g.columns) + 1)) + "|"]
    for r in g.rows:
        label = markdown_escape(r.label) + (f" ({markdown_escape(r.note)})" if r.note else "")
        cells = [" ".join(f"[{markdown_escape(ch.text)}]({_href(ch.href)})" for ch in r.cells.get(c) or []) or "—"
                 for c in g.columns]
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines)


_CODE, _BOLD = re.compile(r"`([^`]+)`"), re.compile(r"\*\*([^*]+)\*\*")


def inline(text: str) -> str:
    """Escape, then the Markdown subset: `code` and **bold**."""
    s = html.escape(printable(text, keep="\n\t"), quote=False)
    return _BOLD.sub(r"<strong>\1</strong>", _CODE.sub(r"<code>\1</code>", s))


def markdown_inline(text: str) -> str:
    """The Markdown subset (**bold**, `code`) as ``inline`` reads it, everything else ``markdown_escape``d; a code
    span holding a character HTML or a table would read (``<``, ``|``...) is an HTML ``<code>`` element."""
    out, at = [], 0
    for m in _BOLD.finditer(text):
        out += [_markdown_code(text[at:m.start()]), f"**{_markdown_code(m.group(1))}**"]
        at = m.end()
    out.append(_markdown_code(text[at:]))
    return "".join(out)


def _markdown_code(text: str) -> str:
    out, at = [], 0
    for m in _CODE.finditer(text):
        code = printable(m.group(1).replace("\n", " "))
        plain = not any(c in code for c in '<>&"|')
        out += [markdown_escape(text[at:m.start()]),
                f"`{code}`" if plain else f"<code>{html.escape(code).replace('|', '&#124;')}</code>"]
        at = m.end()
    out.append(markdown_escape(text[at:]))
    return "".join(out)


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 72em; margin: 1.5em auto; padding: 0 1em; line-height: 1.45; }}
table {{ border-collapse: collapse; margin: 1em 0 0.3em; font-size: 0.9em; max-width: 100%; }}
th, td {{ padding: 0.25em 0.6em; border-bottom: 1px solid #ddd; vertical-align: top; }}
th {{ overflow-wrap: break-word; }}
td.txt {{ overflow-wrap: break-word; }}
thead th {{ border-bottom: 2px solid #333; }}
.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
.txt {{ text-align: left; }}
.caption, figcaption {{ color: #444; font-style: italic; font-size: 0.9em; }}
figure {{ margin: 1.5em 0; }}
figure img {{ max-width: 100%; }}
code, pre {{ background: #f4f4f4; padding: 0.1em 0.3em; overflow-wrap: anywhere; }}
pre {{ white-space: pre-wrap; padding: 0.5em 0.8em; border-left: 3px solid #999; }}
table.grid {{ font-size: 0.95em; }}
table.grid thead th {{ text-align: left; }}
table.grid th[scope=row] {{ text-align: left; font-weight: 600; min-width: 10em; }}
table.grid .note {{ font-weight: normal; color: #555; font-size: 0.85em; }}
table.grid td {{ vertical-align: middle; }}
.chip {{ display: inline-block; margin: 0.1em 0.05em; padding: 0.05em 0.45em; border: 1px solid; border-radius: 0.25em;
        color: #111; text-decoration: none; white-space: nowrap; font-size: 0.9em; }}
.chip:hover {{ text-decoration: underline; }}
.chip.pass {{ background: #dff3df; border-color: #4a8f4a; }}
.chip.fail {{ background: #f9d4d4; border-color: #b02020; border-width: 2px; font-weight: 700; }}
.chip.unknown {{ background: #fdf0c4; border-color: #a07a00; border-style: dashed; }}
.chip.error {{ background: #e7ddf5; border-color: #6a4c9c; border-style: dotted; border-width: 2px; }}
.none {{ color: #888; }}
h3[id] {{ scroll-margin-top: 0.5em; }}
:target {{ background: #fff6d6; }}
</style>
</head>
<body>
{body}
</body>
</html>
"""
