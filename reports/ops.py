"""A chaos run's history as the report sees it: client operations, fault windows, phases.

Contract (all times in seconds since the run started, as in the operation log):

* ``client_ops(ops, end_s)``: one row per ``send_message`` invoke of a
  ``client*`` process: ``invoke_s``, ``complete_s``, ``latency_s``, ``type``
  (ok | fail | info) and ``completed``. An invoke without a completion counts
  as info, ``completed=False``, with its latency measured to ``end_s``.
* ``fault_windows(ops, end_s)``: one ``Window`` per nemesis operation that is
  not a phase marker, [invoke, completion] (until ``end_s`` if it never ended).
* ``phase_times(ops, phases)``: phase name -> time, from run.json's
  ``phases`` when given, else from the ``phase:*`` events of the history.

Nothing here reads files or raises on odd values: ops whose times are not
numbers are dropped by ``reports.sources`` before they get here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from harness.operations import FAIL, INVOKE, Op, pairs

CLIENT_F = "send_message"
TYPES = ("ok", "fail", "info")


@dataclass
class Window:
    f: str
    start_s: float
    end_s: float
    ended: bool  # False: the fault had not ended when the history stops
    args: Any = None


def end_of_run(ops: list[Op], phases: dict[str, Any] | None = None) -> float:
    """The last time the run recorded anything (the operation log's last op or run.json's last phase)."""
    times = [op.time for op in ops]
    times += [t for t in (phases or {}).values() if isinstance(t, (int, float)) and math.isfinite(t)]
    return float(max(times, default=0.0))


def is_client(op: Op) -> bool:
    return str(op.process).startswith("client") and op.f == CLIENT_F


def client_ops(ops: list[Op], end_s: float) -> pd.DataFrame:
    rows = []
    for inv, done in pairs(ops):
        if not is_client(inv):
            continue
        if done is None:
            # Never completed: Jepsen counts it as info; its latency is at least the rest of the run.
            rows.append({"invoke_s": inv.time, "complete_s": math.nan, "latency_s": max(end_s - inv.time, 0.0),
                         "type": "info", "completed": False})
        else:
            kind = done.type if done.type in TYPES else "info"
            rows.append({"invoke_s": inv.time, "complete_s": done.time, "latency_s": max(done.time - inv.time, 0.0),
                         "type": kind, "completed": True})
    return pd.DataFrame(rows, columns=["invoke_s", "complete_s", "latency_s", "type", "completed"])


def fault_windows(ops: list[Op], end_s: float) -> list[Window]:
    out = []
    for inv, done in pairs(ops):
        if done is not None and done.type == FAIL or inv.f == "nemesis_error":
            continue  # a fault that was not injected (its operation fail, or the nemesis raised): no window
        if inv.process == "nemesis" and not str(inv.f).startswith("phase:"):
            out.append(Window(str(inv.f), inv.time, done.time if done is not None else end_s, done is not None,
                              inv.value))
    return out


def supervisor_restarts(ops: list[Op]) -> list[float]:
    return [op.time for op in ops if op.process == "supervisor" and op.type == INVOKE]


def phase_times(ops: list[Op], phases: dict[str, Any] | None = None) -> dict[str, float]:
    recorded = {k: float(v) for k, v in (phases or {}).items() if isinstance(v, (int, float))}
    if recorded:
        return recorded
    # An interrupted run may have no phases in its run.json: the operation log has them as events.
    return {str(op.f).split(":", 1)[1]: op.time for op in ops
            if op.type == INVOKE and str(op.f).startswith("phase:")}
