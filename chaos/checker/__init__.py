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

import importlib
from collections.abc import Callable

from chaos.checker.run_data import RunData
from harness.rundir import CHECKS
from harness.verdict import CheckResult

Checker = Callable[[RunData], CheckResult]

#: every check, in the order they run and are shown (``harness.rundir.CHECKS``), each in the file named after it
CHECKERS: dict[str, Checker] = {name: importlib.import_module(f"chaos.checker.{name}").check for name in CHECKS}
ALL_CHECKERS = list(CHECKERS)
