"""Stats: ok / fail / info per operation type, and unhandled exceptions
grouped by class with one example each (from failed operations and from the
worker logs' tracebacks). Informational: it passes when it can count."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from fnmatch import fnmatch

from chaos.checker.run_data import RunData
from harness import run_files
from harness.operations import INFO, pairs
from harness.rundir import LOGS
from harness.verdict import PASS, CheckResult

_EXC = re.compile(r"^(?:[\w.]+\.)?([A-Z]\w*(?:Error|Exception|Exit|Interrupt))(?::\s*(.*))?$")


def check(data: RunData) -> CheckResult:
    by_op: dict[str, Counter] = defaultdict(Counter)
    exceptions: dict[str, dict] = {}
    for inv, done in pairs(data.ops):
        if inv.process.startswith("client"):
            by_op[inv.f][done.type if done else INFO] += 1
        if done is not None and done.error:
            cls = done.error.split(":", 1)[0].strip() or "Error"
            entry = exceptions.setdefault(cls, {"count": 0, "example": done.error[:300], "source": "history"})
            entry["count"] += 1
    try:
        logs = sorted(name for name in run_files.entries(data.run_dir, LOGS) if fnmatch(name, "w*.log"))
    except FileNotFoundError:
        logs = []
    truncated = []
    for name in logs:
        tail, size = run_files.read_tail(data.run_dir, f"{LOGS}/{name}", run_files.LOG_TAIL)
        if size > run_files.LOG_TAIL:
            truncated.append(f"{name}: the last {run_files.LOG_TAIL} of {size} bytes")
        lines = tail.decode(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if line.startswith("Traceback"):
                for j in range(i + 1, min(i + 200, len(lines))):
                    m = _EXC.match(lines[j])
                    if m:
                        entry = exceptions.setdefault(m.group(1), {"count": 0, "example": lines[j][:300],
                                                                  "source": name})
                        entry["count"] += 1
                        break
    table = {f: dict(c) for f, c in by_op.items()}
    details = {"ops": table, "exceptions": exceptions, **({"logs_read_in_part": truncated} if truncated else {})}
    summary = ", ".join(f"{f}: " + "/".join(f"{c.get(t, 0)}" for t in ("ok", "fail", "info")) for f, c in by_op.items())
    return CheckResult("stats", PASS, f"ok/fail/info {summary}; {len(exceptions)} exception class(es)",
                       details)
