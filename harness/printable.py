"""Run data made safe to show: a name, summary or error read from a run directory may hold any character.

``printable(text)`` replaces every character that could act on a terminal, reorder what a reader sees, or make an
XML 1.0 document not well-formed with a visible escape (``\\x1b``, ``\\u202e``), so the text still shows what it
held. The CLIs print run data through it; the JUnit writer (``chaos.ci``) and the report (``reports``) use it too.
"""

from __future__ import annotations

import re

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
