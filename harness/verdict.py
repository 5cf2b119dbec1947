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

from harness.operations import FAIL as OP_FAIL, INFO, OK, Op, pairs

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


def reply_matches(reply: Any, expect: str, how: str = "exact") -> bool:
    """Whether a reply is the expected answer: equal to ``expect``, or (``how`` "prefix") starting with it."""
    return isinstance(reply, str) and (reply.startswith(expect) if how == "prefix" else reply == expect)


def answered(inv: Op, done: Op | None) -> bool:
    """Whether a send was acknowledged with its correct answer. A send that carries its ``expect`` (and ``match``)
    counts only if the reply matches: a refusal ("[Agent is busy processing another message]") or a wrong answer
    is a reply, not a recovery. One that carries no ``expect`` (a driver that plans none) counts when ok."""
    if done is None or done.type != OK:
        return False
    value = inv.value if isinstance(inv.value, dict) else {}
    if not isinstance(value.get("expect"), str):
        return True
    reply = done.value.get("reply") if isinstance(done.value, dict) else None
    return reply_matches(reply, value["expect"], str(value.get("match") or "exact"))


def recovery(ops: list[Op]) -> dict[str, Any]:
    """Recovery per conversation: for each fault's end, each conversation's wait to its next *correct* answer
    (``answered``: an acknowledged send whose reply matches its expected answer; any other reply, a refusal or a
    wrong answer, does not end the wait).

    ``worst_s``: the worst conversation's longest wait (None: no fault ended, or nothing was answered correctly
    after one); ``by_conversation``: each one's longest wait; ``never``: conversations that sent a message after a
    fault ended and never had one answered correctly again (they did not recover, whatever the others did). A fault
    that was not injected (its operation ``fail``) starts no wait."""
    oks: dict[str, list[float]] = {}
    sent_after: dict[str, float] = {}
    for inv, done in client_sends(ops):
        conv = str((inv.value or {}).get("conversation", inv.process))
        if answered(inv, done):
            oks.setdefault(conv, []).append(done.time)
        sent_after[conv] = max(sent_after.get(conv, 0.0), inv.time)
    ends = [done.time for inv, done in pairs(ops)
            if inv.process == "nemesis" and done is not None and done.type != OP_FAIL and not inv.f.startswith("phase:")]
    by_conv: dict[str, float] = {}
    never: set[str] = set()
    for end in ends:
        for conv in sorted(set(oks) | set(sent_after)):
            nxt = next((t for t in sorted(oks.get(conv, [])) if t >= end), None)
            if nxt is not None:
                by_conv[conv] = max(by_conv.get(conv, 0.0), nxt - end)
            elif sent_after.get(conv, -1.0) >= end or any(
                    i.time < end and (d is None or d.time >= end) for i, d in client_sends(ops)
                    if str((i.value or {}).get("conversation", i.process)) == conv):
                never.add(conv)
    return {"worst_s": round(max(by_conv.values()), 1) if by_conv else None,
            "by_conversation": {c: round(v, 1) for c, v in sorted(by_conv.items())}, "never": sorted(never)}


def recovery_s(ops: list[Op]) -> float | None:
    """The worst conversation's recovery (``recovery``)."""
    return recovery(ops)["worst_s"]


def summarise(name: str, ops: list[Op], checks: list[CheckResult]) -> dict[str, Any]:
    """One row of the suite's table: faults landed/attempted (with ``(n not injected: why)`` for scheduled faults that
    did not happen: never ``1/1`` for a fault that was not injected), client ops, lost, duplicated effects, recovery,
    verdict.
    A figure a check did not produce is ``"?"``, never 0; a ``lost`` check that failed on something other than a
    lost message (a wrong answer, a doubled one) shows it (``0+2 bad``), so a failed check never reads as 0."""
    by = {c.name: c for c in checks}
    faults = by["injection_evidence"].details if "injection_evidence" in by else {}
    lost: Any = "?"
    if "lost" in by and by["lost"].verdict in (PASS, FAIL):
        lost = by["lost"].details.get("lost", "?")
        bad = len(by["lost"].details.get("problems") or []) - (lost if isinstance(lost, int) else 0)
        if by["lost"].verdict == FAIL and bad > 0:
            lost = f"{lost}+{bad} bad"
    dup: Any = by["effects"].details.get("duplicated_effects", "?") if "effects" in by and \
        by["effects"].verdict in (PASS, FAIL) else "?"
    if "effects" in by and by["effects"].verdict == NOT_APPLICABLE and by["effects"].summary.startswith("declared:"):
        dup = "declared"  # the target declared its agent has no external effects (effects = "none")
    rec = recovery(ops)
    worst: Any = rec["worst_s"]
    if rec["never"]:
        worst = f"never ({len(rec['never'])})"
    missed = faults.get("not_injected") or []
    injected = faults.get("injected", "?")
    attempted = injected + len(missed) if isinstance(injected, int) else injected
    return {
        "scenario": name,
        "faults": f"{faults.get('landed', '?')}/{attempted}" + (
            f" ({len(missed)} not injected: {missed[0].get('short') or missed[0].get('why', '?')})" if missed else ""),
        **counts(ops),
        "lost": lost,
        "dup_effects": dup,
        "recovery_s": worst,
        "checked": f"{sum(c.verdict in (PASS, FAIL) for c in checks)}/{len(checks)}",
        "verdict": compose(checks),
    }
