"""Verdict values: three that never round up, a fourth that counts neither way, and a check's result.

``pass`` (the property held, and the checker could see it hold), ``fail`` (it
was violated) and ``unknown`` (the checker could not tell: data missing, a
fault that hit nothing, a crash of the checker itself). A fourth value,
``not_applicable``, says a check reads something this run cannot have (Temporal
event histories on the checkpoint engine); it is shown with its reason and
counts neither way.

This module only names the values, their order (``worst``) and the record a
check leaves in ``verdict.json`` (``CheckResult``). Which checks apply to a run
and how they compose into its verdict is decided in one place,
``chaos.checker.verdict``.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"
NOT_APPLICABLE = "not_applicable"
VERDICTS = (PASS, FAIL, UNKNOWN)
_RANK = {PASS: 0, UNKNOWN: 1, FAIL: 2}


@dataclass
class CheckResult:
    name: str
    verdict: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def shown(self) -> str:
        """``verdict: summary`` for a line a person reads, the summary's own restatement of the verdict left out
        (``not_applicable: not applicable: no worker was drained`` reads ``not_applicable: no worker was
        drained``)."""
        said = self.verdict.replace("_", " ") + ": "
        return f"{self.verdict}: {self.summary[len(said):] if self.summary.startswith(said) else self.summary}"

    @classmethod
    def from_dict(cls, d: Any) -> CheckResult:
        """A saved check; anything malformed reads as ``unknown`` (a damaged record never reads as a pass)."""
        if not isinstance(d, dict):
            return cls("?", UNKNOWN, f"unreadable check record: {d!r}"[:200])
        verdict = d.get("verdict")
        if verdict not in (*VERDICTS, NOT_APPLICABLE):
            verdict = UNKNOWN
        details = d.get("details") if isinstance(d.get("details"), dict) else {}
        return cls(str(d.get("name", "?")), verdict, str(d.get("summary", "")), details)


def worst(verdicts: Iterable[str]) -> str:
    """The worst of some verdicts (fail > unknown > pass); anything unrecognised counts as unknown; none is unknown.
    ``not_applicable`` counts neither way."""
    ranked = [v if v in _RANK else UNKNOWN for v in verdicts if v != NOT_APPLICABLE]
    return max(ranked, key=lambda v: _RANK[v]) if ranked else UNKNOWN
