"""replay: every saved event history replays without non-determinism errors on a
fresh, cold worker built from the current code (Temporal's ``Replayer``, in
a new interpreter: the target's own, where its code imports). For the hot-fix scenario this is the proof that the fix
was replay-safe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from chaos.checker.run_data import RunData
from harness import target_pythonpath
from harness.verdict import FAIL, PASS, UNKNOWN, CheckResult


def check(data: RunData) -> CheckResult:
    target = data.target
    workflow = target.get("workflow")
    if not workflow:
        return CheckResult("replay", UNKNOWN, "the target declares no workflow class to replay its histories with")
    # In the target's own Python, where its workflow code imports (harness.target_pythonpath adds only the
    # replayer's package); the reference agent's is the harness's own.
    python, cwd = target.get("python") or sys.executable, target.get("cwd") or None
    if not os.access(python, os.X_OK) or (cwd is not None and not os.path.isdir(cwd)):
        return CheckResult("replay", UNKNOWN, f"the target's interpreter {python} or directory {cwd} is not on this "
                                              "machine; check again with --target FILE (the target file here)")
    env = {**os.environ, **target.get("env", {})}
    env["PYTHONPATH"] = target_pythonpath(target.get("env", {}).get("PYTHONPATH"))
    proc = subprocess.run([python, "-m", "harness.replayer", str(data.dir.event_histories), "--workflow", workflow],
                          capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    if proc.returncode != 0:
        return CheckResult("replay", UNKNOWN, f"the replayer could not run in {python} (exit {proc.returncode}): "
                                              f"{proc.stderr.strip()[-500:]}")
    from harness.replayer import RESULT_PREFIX

    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if not lines:
        return CheckResult("replay", UNKNOWN, f"the replayer printed no result: {proc.stdout[-300:]} {proc.stderr[-300:]}")
    result = json.loads(lines[-1][len(RESULT_PREFIX):])
    details = {"workflow": workflow, **result}
    if result["replayed"] == 0:
        return CheckResult("replay", UNKNOWN, "no histories to replay", details)
    if result["failures"]:
        first = result["failures"][0]
        return CheckResult("replay", FAIL, f"{len(result['failures'])} of {result['replayed']} histories failed to "
                                           f"replay; first {first['workflow_id']}: {first['error'][:200]}", details)
    return CheckResult("replay", PASS, f"{result['replayed']} histories replayed cleanly on a cold worker", details)
