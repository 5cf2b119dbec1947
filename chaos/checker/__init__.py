"""Checkers: data in, verdict out.

Each checker is a function of a saved run (``RunData``: the operation log,
the conversations' final state, the event histories, the effect ledger and
what the target declared) to a ``CheckResult`` whose verdict is ``pass``,
``fail`` or ``unknown`` (``harness.verdict``). They read only the run
directory, never the agent under test, and can be re-run offline on any run
directory (``python -m chaos check DIR``). A checker that crashes yields
``unknown``, never ``pass``; the run's verdict is the worst of them
(fail > unknown > pass). Each check lives in the file named after it.
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable
from pathlib import Path

from chaos.checker.run_data import ReplayTarget, RunData
from harness.run_files import RefusedPath
from harness.rundir import CHECKS, RunDirError
from harness.verdict import UNKNOWN, CheckResult

Checker = Callable[[RunData], CheckResult]

#: every check, in the order they run and are shown (``harness.rundir.CHECKS``), each in the file named after it
CHECKERS: dict[str, Checker] = {name: importlib.import_module(f"chaos.checker.{name}").check for name in CHECKS}
ALL_CHECKERS = list(CHECKERS)
#: checks of one fault's promise: not applicable to a run without that fault, whatever a target declares
FAULT_CHECKERS = {"drain": "drain_worker"}
#: checks of one engine's own records: not applicable to a run on another backend (run.json's backend name)
ENGINE_CHECKERS = {"dbos_steps": ("dbos", "dbos-postgres"), "restate_journal": ("restate",)}


def run_checkers(run_dir: Path, only: list[str] | None = None,
                 replay_target: ReplayTarget | str | None = None) -> list[CheckResult]:
    """The checks ``only`` names (default: all) on the saved run; ``replay_target``: what ``replay`` may run
    (``chaos.replay_target.replay_target``; None: nothing, and replay is unknown)."""
    data = RunData(run_dir, replay_target)
    results = []
    for name, checker in CHECKERS.items():
        if only and name not in only:
            continue
        try:
            result = checker(data)
        except RefusedPath as exc:  # a file the run names that is not read (outside, a symlink, too large)
            result = CheckResult(name, UNKNOWN, str(exc))
        except RunDirError as exc:  # a malformed file: which one and where says all there is to say
            result = CheckResult(name, UNKNOWN, f"malformed run directory: {exc}")
        except Exception as exc:  # a crashed checker knows nothing: unknown, never pass
            result = CheckResult(name, UNKNOWN, f"checker crashed: {type(exc).__name__}: {exc}",
                                 {"traceback": traceback.format_exc()[-3000:]})
        results.append(result)
    return results
