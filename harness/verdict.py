"""Verdicts: three values that never round up, and how a run's checks compose into one.

``pass`` (the property held, and the checker could see it hold), ``fail`` (it
was violated) and ``unknown`` (the checker could not tell: data missing, a
fault that hit nothing, a crash of the checker itself). A fourth value,
``not_applicable``, says a checker reads something this backend does not
have (Temporal event histories on the checkpoint backend); it is shown with
its reason and counts neither way.

A run's verdict is the worst of its applicable checks (fail > unknown > pass);
a run with no applicable check is ``unknown``. Every tool that shows a verdict
(the chaos runner, ``chaos check``, the report) composes it here.

Standard library only (with ``harness.operations``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.operations import INFO, OK, Op, pairs

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
    """The worst of some verdicts (fail > unknown > pass); anything unrecognised counts as unknown; none is unknown."""
    ranked = [v if v in _RANK else UNKNOWN for v in verdicts if v != NOT_APPLICABLE]
    return max(ranked, key=lambda v: _RANK[v]) if ranked else UNKNOWN


def compose(results: Iterable[CheckResult]) -> str:
    """The run's verdict: the worst of the checks that apply; none that apply is unknown."""
    return worst(r.verdict for r in results)


# ------------------------------------------------------------------------------------------- the summary row


def client_sends(ops: list[Op]) -> list[tuple[Op, Op | None]]:
    """Every ``send_message`` a client invoked, with its completion (None: it never completed)."""
    return [(i, d) for i, d in pairs(ops) if i.process.startswith("client") and i.f == "send_message"]


def counts(ops: list[Op]) -> dict[str, int]:
    """ok / fail / info among the client's sends; one never completed counts as info (it may have happened)."""
    out = {"ok": 0, "fail": 0, "info": 0}
    for _, done in client_sends(ops):
        out[done.type if done else INFO] += 1
    return out


def recovery_s(ops: list[Op]) -> float | None:
    """The longest wait from the end of a fault to the next acknowledged message (None: no fault ended)."""
    oks = sorted(d.time for _, d in client_sends(ops) if d and d.type == OK)
    waits = []
    for inv, done in pairs(ops):
        if inv.process == "nemesis" and done is not None and not inv.f.startswith("phase:"):
            nxt = next((t for t in oks if t >= done.time), None)
            if nxt is not None:
                waits.append(nxt - done.time)
    return round(max(waits), 1) if waits else None


def summarise(name: str, ops: list[Op], checks: list[CheckResult]) -> dict[str, Any]:
    """One row of the suite's table: faults landed/injected, client ops, lost, duplicated effects, recovery, verdict.
    A figure a check did not produce is ``"?"``, never 0."""
    by = {c.name: c for c in checks}
    faults = by["injection_evidence"].details if "injection_evidence" in by else {}
    return {
        "scenario": name,
        "faults": f"{faults.get('landed', '?')}/{faults.get('injected', '?')}",
        **counts(ops),
        "lost": by["lost"].details.get("lost", "?") if "lost" in by else "?",
        "dup_effects": by["effects"].details.get("duplicated_effects", "?") if "effects" in by else "?",
        "recovery_s": recovery_s(ops),
        "verdict": compose(checks),
    }
