"""Checkers: data in, verdict out.

Each checker is a function of a saved run (``RunData``: the history, the
conversations' final state, the Temporal histories, the effect ledger) to a
``CheckResult`` whose verdict is ``pass``, ``fail`` or ``unknown``. They can
be re-run offline on any run directory (``python -m chaos check DIR``). A
checker that crashes yields ``unknown``, never ``pass``; the run's verdict is
the worst of them (fail > unknown > pass).
"""

from __future__ import annotations

import json
import sqlite3
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from harness import operations as hist

PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"
#: the checker reads something this backend does not have (Temporal histories on the journal backend): said so,
#: neither a pass nor counted in the verdict
NOT_APPLICABLE = "not_applicable"
_RANK = {PASS: 0, UNKNOWN: 1, FAIL: 2}


@dataclass
class CheckResult:
    name: str
    verdict: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compose(results: list[CheckResult]) -> str:
    """fail > unknown > pass, over the checkers that apply; none that apply is unknown."""
    applicable = [r for r in results if r.verdict != NOT_APPLICABLE]
    if not applicable:
        return UNKNOWN
    return max((r.verdict for r in applicable), key=lambda v: _RANK.get(v, 1))


@dataclass
class RunData:
    """A saved run, read lazily from its directory."""

    run_dir: Path

    @cached_property
    def ops(self) -> list[hist.Op]:
        return hist.load(self.run_dir / "history.jsonl")

    @cached_property
    def conversations(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "conversations.json").read_text())

    @cached_property
    def journal(self) -> dict[str, Any]:
        path = self.run_dir / "journal.json"
        return json.loads(path.read_text()) if path.exists() else {}

    @property
    def histories_dir(self) -> Path:
        return self.run_dir / "histories"

    @cached_property
    def runs(self) -> dict[str, list[Any]]:
        """workflow id -> its chain of parsed runs (harness.event_history.RunRecord), in order."""
        from temporalio.client import WorkflowHistory

        from harness.event_history import parse_events

        out: dict[str, list[Any]] = {}
        for wf_dir in sorted(p for p in self.histories_dir.iterdir() if p.is_dir()):
            chain = []
            for f in sorted(wf_dir.glob("*.json")):
                h = WorkflowHistory.from_json(wf_dir.name, f.read_text())
                chain.append(parse_events(wf_dir.name, f.stem.split("-", 1)[1], list(h.events)))
            out[wf_dir.name] = chain
        return out

    @property
    def ledger_path(self) -> Path:
        ledger = self.journal.get("target", {}).get("ledger", "sandbox/ledger.sqlite3")
        return self.run_dir / "state" / (ledger or "sandbox/ledger.sqlite3")

    def ledger_rows(self, table: str) -> list[dict[str, Any]]:
        if not self.ledger_path.exists():
            return []
        conn = sqlite3.connect(f"file:{self.ledger_path}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY rowid")]  # noqa: S608 - fixed names
        finally:
            conn.close()

    def workspace(self, workflow_id: str) -> Path:
        from agent.tools import workspace_for

        return workspace_for(self.run_dir / "state" / "sandbox", workflow_id)


Checker = Callable[[RunData], CheckResult]


def all_checkers() -> list[tuple[str, Checker]]:
    from chaos.checker import evidence, ledger, lost, replay, stats, temporal

    return [
        ("lost", lost.check),
        ("temporal_history", temporal.check),
        ("effects", ledger.check),
        ("replay", replay.check),
        ("injection_evidence", evidence.check),
        ("stats", stats.check),
    ]


def run_checkers(run_dir: Path, only: list[str] | None = None) -> list[CheckResult]:
    data = RunData(run_dir)
    results = []
    for name, checker in all_checkers():
        if only and name not in only:
            continue
        try:
            result = checker(data)
        except Exception as exc:  # a crashed checker knows nothing: unknown, never pass
            result = CheckResult(name, UNKNOWN, f"checker crashed: {type(exc).__name__}: {exc}",
                                 {"traceback": traceback.format_exc()[-3000:]})
        results.append(result)
    return results
