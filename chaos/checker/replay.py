"""replay: every saved event history replays without non-determinism errors on a
fresh, cold worker built from the current code (Temporal's ``Replayer``, in
a new interpreter: the target's own, where its code imports). For the hot-fix scenario this is the proof that the fix
was replay-safe.

The replayer is built the way the target's workers are: with the plugins, data converter and workflow runner the
target declares (``replay_plugins``, ``data_converter``, ``workflow_runner``; none: the SDK's defaults). Without
them a correct agent's histories could fail to decode or trip the default sandbox: a false fail. A declared object
that cannot be loaded makes the check unknown, naming it. A failure that looks like the workflow sandbox refusing
something (``RestrictedWorkflowAccessError``, "Cannot access threading.local.__mro_entries__", "restricted") is
most often a replayer built without what the workers use: the summary then names ``replay_plugins`` and
``workflow_runner`` and what to declare (it cannot tell a missing declaration from workflow code that really
breaks the sandbox's rules; the workers' own runner decides).

What runs comes from ``data.replay_target`` (``chaos.target.replay_target``: the reference agent's own code, or
a target file the user controls), never from run.json: a run directory is data, and the interpreter, directory,
environment and declarations it records are not used. No replay target: unknown, saying why and what to give.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

from chaos.checker.run_data import RunData, ReplayTarget
from harness import target_pythonpath
from harness.verdict import FAIL, PASS, UNKNOWN, CheckResult


def check(data: RunData) -> CheckResult:
    target = data.replay_target
    if not isinstance(target, ReplayTarget):
        return CheckResult("replay", UNKNOWN, target or "no target to replay with was given (replay runs only the "
                                                        "reference agent's code or a target file you control)")
    workflow, python, cwd = target.workflow, target.python, target.cwd
    if not os.access(python, os.X_OK) or (cwd is not None and not os.path.isdir(cwd)):
        return CheckResult("replay", UNKNOWN, f"the target's interpreter {python} or directory {cwd} is not on this "
                                              "machine; check again with --target FILE (the target file here)")
    env = {**os.environ, **target.env}
    env["PYTHONPATH"] = target_pythonpath(target.env.get("PYTHONPATH"))
    # Built the way the agent's workers are: its plugins, data converter and workflow runner (chaos/target.py).
    plugins, converter, runner = list(target.replay_plugins), target.data_converter, target.workflow_runner
    argv = [python, "-m", "harness.replayer", str(data.dir.event_histories), "--workflow", workflow]
    for plugin in plugins:
        argv += ["--plugin", plugin]
    if converter:
        argv += ["--data-converter", converter]
    if runner:
        argv += ["--workflow-runner", runner]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    from harness.replayer import RESULT_PREFIX

    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    result = json.loads(lines[-1][len(RESULT_PREFIX):]) if lines else None
    declared = {"workflow": workflow, "replay_plugins": plugins, "data_converter": converter,
                "workflow_runner": runner, "replayed_with": target.source}
    if result is not None and "error" in result:  # a declared object would not load: no judgement, not a fail
        return CheckResult("replay", UNKNOWN, f"the replayer could not be built as the target declares: "
                                              f"{result['error'][:400]}{sandbox_hint(result['error'], target)}",
                           {**declared, **result})
    if proc.returncode != 0:
        return CheckResult("replay", UNKNOWN, f"the replayer could not run in {python} (exit {proc.returncode}): "
                                              f"{proc.stderr.strip()[-500:]}{sandbox_hint(proc.stderr, target)}",
                           declared)
    if result is None:
        return CheckResult("replay", UNKNOWN, f"the replayer printed no result: {proc.stdout[-300:]} "
                                              f"{proc.stderr[-300:]}", declared)
    details = {**declared, **result}
    uses = _describe(result.get("uses") or {})
    if result["replayed"] == 0:
        return CheckResult("replay", UNKNOWN, "no histories to replay", details)
    if result["failures"]:
        first = result["failures"][0]
        hint = next((h for f in result["failures"] for h in [sandbox_hint(str(f.get("error")), target)] if h), "")
        return CheckResult("replay", FAIL, f"{len(result['failures'])} of {result['replayed']} histories failed to "
                                           f"replay ({uses}); first {first['workflow_id']}: {first['error'][:200]}"
                                           f"{hint}", details)
    # A history in which no workflow task ever completed replays "cleanly" because there is nothing in it to
    # replay: no evidence of determinism (the workflow_tasks check says why it never ran).
    vacuous = sorted(wid for wid, chain in data.event_histories.items()
                     if not any(t.outcome == "completed" for run in chain for t in run.workflow_tasks))
    details["histories_without_a_completed_workflow_task"] = vacuous
    if vacuous and len(vacuous) == len(data.event_histories):
        return CheckResult("replay", UNKNOWN, f"none of the {len(vacuous)} histories has a completed workflow task: "
                                              "replaying them proves nothing", details)
    note = (f"; {len(vacuous)} with no completed workflow task prove nothing ({', '.join(vacuous[:3])})"
            if vacuous else "")
    return CheckResult("replay", PASS, f"{result['replayed']} histories replayed cleanly on a cold worker "
                                       f"({uses}){note}", details)


def _describe(uses: dict) -> str:
    """One phrase: what the replayer was built with, as declared and as in use after the plugins configured it."""
    plugins = [p.get("name") or p.get("spec") for p in uses.get("plugins") or []]
    converter, runner = uses.get("data_converter") or {}, uses.get("workflow_runner") or {}
    codec = converter.get("payload_codec")
    in_use = converter.get("payload_converter", "?") + (f" + codec {codec}" if codec else "")
    return "; ".join([f"plugins {', '.join(plugins)}" if plugins else "no plugins",
                      f"data converter {converter.get('spec') or '(not declared)'}: {in_use}",
                      f"workflow runner {runner.get('spec') or '(not declared)'}: {runner.get('type', '?')}"])


#: what the Python SDK's workflow sandbox says when it refuses an access (RestrictedWorkflowAccessError: "Cannot
#: access threading.local.__mro_entries__ from inside a workflow..."), and the word its other refusals use
SANDBOX_REFUSAL = re.compile(r"RestrictedWorkflowAccessError|Cannot access \S+|restricted|sandbox", re.IGNORECASE)


def sandbox_hint(error: str, target: ReplayTarget) -> str:
    """For a replay error that looks like the workflow sandbox refusing something: a clause naming the target-file
    fields that build the replayer as the workers are built, and what is declared now; else ``""``."""
    if not SANDBOX_REFUSAL.search(error or ""):
        return ""
    now = ", ".join([f"replay_plugins = {list(target.replay_plugins)}"] * bool(target.replay_plugins)
                    + [f"workflow_runner = {target.workflow_runner!r}"] * bool(target.workflow_runner)) or "neither"
    return ("; this looks like the workflow sandbox refusing what the agent's workers allow: declare in the target "
            "file the plugins the workers are built with (replay_plugins = [\"MODULE:NAME\"], e.g. the framework's "
            "Temporal plugin) or their workflow runner (workflow_runner = "
            "\"temporalio.worker:UnsandboxedWorkflowRunner\", or a sandboxed runner with the passthrough modules "
            f"they use); declared now: {now}")
