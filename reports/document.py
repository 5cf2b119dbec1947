"""The report as a list of blocks, rendered to Markdown and to self-contained HTML.

Contract: one ``Doc`` gives both ``report.md`` and ``report.html`` with the
same content. Paragraph text is a small Markdown subset (`code`, **bold**),
which both renderers keep; everything else is escaped, in Markdown as in HTML
(run data may hold HTML, link syntax or control characters). Figures are
referenced relative to the report: PNG in Markdown, SVG in HTML, each with
a link to its PDF (for LaTeX).
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field
from typing import Any

from harness.printable import printable
from reports.tables import Table, html_table, markdown, markdown_escape


@dataclass
class Doc:
    blocks: list[tuple[str, Any]] = field(default_factory=list)

    def heading(self, level: int, text: str) -> None:
        self.blocks.append(("h", (level, text)))

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
                out.append(f"{'#' * v[0]} {markdown_inline(v[1])}")
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
                body.append(f"<h{v[0]}>{inline(v[1])}</h{v[0]}>")
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
body {{ font-family: system-ui, sans-serif; max-width: 70em; margin: 2em auto; padding: 0 1em; line-height: 1.45; }}
table {{ border-collapse: collapse; margin: 1em 0 0.3em; font-size: 0.9em; }}
th, td {{ padding: 0.25em 0.6em; border-bottom: 1px solid #ddd; vertical-align: top; }}
thead th {{ border-bottom: 2px solid #333; }}
.num {{ text-align: right; font-variant-numeric: tabular-nums; }}
.txt {{ text-align: left; }}
.caption, figcaption {{ color: #444; font-style: italic; font-size: 0.9em; }}
figure {{ margin: 1.5em 0; }}
figure img {{ max-width: 100%; }}
code, pre {{ background: #f4f4f4; padding: 0.1em 0.3em; }}
</style>
</head>
<body>
{body}
</body>
</html>
"""
