"""Checkers: data in, verdict out.

Each checker is a function of a saved run (``RunData``: the operation log,
the conversations' final state, the event histories, the effect ledger and
what the target declared) to a ``CheckResult`` whose verdict is ``pass``,
``fail`` or ``unknown`` (``harness.verdict``). They read only the run
directory, never the agent under test, and can be re-run offline on any run
directory (``python -m chaos check DIR``). Each check lives in the file named
after it; a check that decides several properties has one function per
property, and its ``check`` composes them.

This package lists the checks (``CHECKERS``). Which of them apply to a run, how
a crashed one counts, how they compose into the run's verdict, the table's row
and ``verdict.json`` are decided in one module, ``chaos.checker.verdict``.
Measurements that decide nothing (recovery times) are ``chaos.recovery``.
"""

from __future__ import annotations

from collections.abc import Callable

from chaos.checker import (dbos_steps, drain, effects, injection_evidence, lost, replay, restate_journal, stats,
                           temporal_history, workflow_tasks)
from chaos.checker.run_data import RunData
from harness.verdict import CheckResult

Checker = Callable[[RunData], CheckResult]

#: every check, in the order they run and are shown
CHECKERS: dict[str, Checker] = {
    "lost": lost.check,
    "temporal_history": temporal_history.check,
    "workflow_tasks": workflow_tasks.check,
    "effects": effects.check,
    "replay": replay.check,
    "injection_evidence": injection_evidence.check,
    "stats": stats.check,
    "drain": drain.check,
    "dbos_steps": dbos_steps.check,
    "restate_journal": restate_journal.check,
}
ALL_CHECKERS = list(CHECKERS)
