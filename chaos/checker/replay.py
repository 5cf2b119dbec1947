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

Replay is strict (``harness.strict_replay``): Temporal's replayer checks the sequence of commands, not their
inputs, so each activity and child workflow the replay schedules is also compared, type and input, with the event
that scheduled it. A difference fails, naming the call, its event and both values; a call that could not be
compared makes the check unknown, never pass. Local activities' inputs are not compared (the history does not
record them) and the summary says how many. ``ReplayTarget.strict_replay`` False (a target's
``strict_replay = false``) turns the comparison off, and the summary says so.

A target not in Python declares its own replayer instead (``ReplayTarget.command``, a target's
``replay_command``, e.g. the TypeScript SDK's ``Worker.runReplayHistory`` behind ``node replay.js {history}``):
it is run once per workflow, in the target's directory with its environment, on a private copy of that workflow's
saved runs (read by ``harness.run_files``' rules). Exit 0: that workflow replays; 1: it does not (its last stderr
line is the reason); anything else, or no answer within ``COMMAND_TIMEOUT_S``: unknown. Whether inputs were
compared is the command's to say: the summary quotes the command where its output speaks of inputs, else says
"inputs not compared".

What runs comes from ``data.replay_target`` (``testbed.engines.byo.target.replay_target``: the reference agent's own code, or
a target file the user controls), never from run.json: a run directory is data, and the interpreter, directory,
environment and declarations it records are not used. No replay target: unknown, saying why and what to give.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from chaos.checker.run_data import RunData, ReplayTarget
from harness import run_files, target_pythonpath
from harness.placeholders import placeholder_problem
from harness.strict_replay import describe
from harness.verdict import FAIL, PASS, UNKNOWN, CheckResult

#: a namespace longer than this in run.json is not passed on (Temporal's own limit is 255 bytes)
NAMESPACE_LIMIT = 255
#: seconds a target's replay_command has per workflow (a TypeScript replayer bundles the workflow code first)
COMMAND_TIMEOUT_S = 300.0
#: how much of a replay command's output a summary quotes
QUOTED_CHARS = 300


def check(data: RunData) -> CheckResult:
    target = data.replay_target
    if not isinstance(target, ReplayTarget):
        return CheckResult("replay", UNKNOWN, target or "no target to replay with was given (replay runs only the "
                                                        "reference agent's code or a target file you control)")
    if target.command:
        return check_with_command(data, target)
    workflow, python, cwd = target.workflow, target.python, target.cwd
    if not os.access(python, os.X_OK) or (cwd is not None and not os.path.isdir(cwd)):
        return CheckResult("replay", UNKNOWN, f"the target's interpreter {python} or directory {cwd} is not on this "
                                              "machine; check again with --target FILE (the target file here)")
    unreadable = _unreadable_histories(data)
    if unreadable:
        return CheckResult("replay", UNKNOWN, unreadable)
    env = {**os.environ, **target.env}
    env["PYTHONPATH"] = target_pythonpath(target.env.get("PYTHONPATH"))
    # Built the way the agent's workers are: its plugins, data converter and workflow runner (testbed/engines/byo/target.py).
    plugins, converter, runner = list(target.replay_plugins), target.data_converter, target.workflow_runner
    argv = _replayer_argv(data, target, plugins, converter, runner)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, cwd=cwd)
    from harness.replayer import RESULT_PREFIX

    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    result = json.loads(lines[-1][len(RESULT_PREFIX):]) if lines else None
    declared = {"workflow": workflow, "replay_plugins": plugins, "data_converter": converter,
                "workflow_runner": runner, "strict_replay": target.strict_replay,
                "strict_replay_ignore": list(target.strict_replay_ignore), "replayed_with": target.source}
    if result is not None and "error" in result:  # a declared object would not load: no judgement, not a fail
        return CheckResult("replay", UNKNOWN, f"the replayer could not be built as the target declares: "
                                              f"{result['error'][:400]}{sandbox_hint(result['error'], target)}",
                           {**declared, **result})
    if result is not None and "unreadable" in result:  # a file below the histories' folder it does not read
        return CheckResult("replay", UNKNOWN, f"the saved histories cannot be read: {result['unreadable'][:400]}",
                           {**declared, **result})
    # What a crashed replayer said, by its last line (a traceback's is the exception): the whole is in details.
    said = {"stdout_tail": proc.stdout[-3000:], "stderr_tail": proc.stderr[-3000:]}
    if proc.returncode != 0:
        return CheckResult("replay", UNKNOWN, f"the replayer could not run in {python} (exit {proc.returncode}): "
                                              f"{_last_line(proc.stderr) or '(no output)'}"
                                              f"{sandbox_hint(proc.stderr, target)}", {**declared, **said})
    if result is None:
        return CheckResult("replay", UNKNOWN, f"the replayer printed no result: "
                                              f"{_last_line(proc.stderr) or _last_line(proc.stdout) or '(no output)'}",
                           {**declared, **said})
    return _judged(data, target, result, {**declared, **result})


def _replayer_argv(data: RunData, target: ReplayTarget, plugins: list[str], converter: str | None,
                   runner: str | None) -> list[str]:
    """``harness.replayer``'s command line for the run's histories, as the target declares its workers."""
    argv = [target.python, "-m", "harness.replayer", str(data.dir.event_histories), "--workflow", target.workflow]
    for plugin in plugins:
        argv += ["--plugin", plugin]
    if converter:
        argv += ["--data-converter", converter]
    if runner:
        argv += ["--workflow-runner", runner]
    if not target.strict_replay:
        argv += ["--no-strict"]
    argv += [f"--strict-ignore={path}" for path in target.strict_replay_ignore]
    namespace = _namespace(data)
    if namespace:  # what workflow.info().namespace said when it ran; one argument, never read as an option
        argv += [f"--namespace={namespace}"]
    return argv


def _judged(data: RunData, target: ReplayTarget, result: dict[str, Any], details: dict[str, Any]) -> CheckResult:
    """The verdict of a replay that ran: its failures, the inputs that differ, or how clean it was."""
    uses = _describe(result.get("uses") or {})
    if result["replayed"] == 0:
        return CheckResult("replay", UNKNOWN, "no histories to replay", details)
    strict = result.get("strict") or {}
    differ = strict.get("mismatch_count") or 0
    if result["failures"]:
        first = result["failures"][0]
        hint = next((h for f in result["failures"] for h in [sandbox_hint(str(f.get("error")), target)] if h), "")
        also = f"; and {differ} scheduled input(s) differ on replay" if differ else ""
        return CheckResult("replay", FAIL, f"{len(result['failures'])} of {result['replayed']} histories failed to "
                                           f"replay ({uses}); first {first['workflow_id']}: {first['error'][:200]}"
                                           f"{also}{hint}", details)
    if differ:
        return CheckResult("replay", FAIL, f"{differ} scheduled call(s) differ on replay from the history (workflow "
                                           f"code computes their arguments non-deterministically); first: "
                                           f"{describe(strict['mismatches'][0])[:700]} ({uses})", details)
    note = _vacuous(data, details)
    if isinstance(note, CheckResult):
        return note
    clean = f"{result['replayed']} histories replayed cleanly on a cold worker ({uses}){note}"
    if strict.get("off"):
        return CheckResult("replay", PASS, f"{clean}; inputs not compared (strict_replay = false)", details)
    if "error" in strict or "compared" not in strict:
        why = str(strict.get("error", "the replayer reported no comparison"))[:300]
        return CheckResult("replay", UNKNOWN, f"{clean}, but scheduled inputs were not compared: {why}", details)
    if strict.get("unknown_count"):
        first = strict["unknown"][0]
        return CheckResult("replay", UNKNOWN, f"{clean}, but {strict['unknown_count']} scheduled call(s) could not be "
                                              f"compared with the history; first: {first['kind']} {first['name']!r} "
                                              f"(event {first['event_id']} of {first['workflow_id']}): "
                                              f"{first['reason'][:300]}", details)
    local = strict.get("local_activities_not_compared") or 0
    inputs = "local activity's input" if local == 1 else "local activities' inputs"
    local_note = f"; {local} {inputs} not compared (the history does not record them)" if local else ""
    ignored = strict.get("ignored_paths") or []
    if ignored:
        local_note += f"; left out as declared: {', '.join(str(p) for p in ignored[:8])[:400]}"
    return CheckResult("replay", PASS, f"{clean}; {strict['compared']} scheduled input(s) equal to the history's"
                                       f"{local_note}", details)


def _vacuous(data: RunData, details: dict) -> str | CheckResult:
    """A history in which no workflow task ever completed replays "cleanly" because there is nothing in it to
    replay: no evidence of determinism (the workflow_tasks check says why it never ran). The clause naming such
    histories for a passing summary, or the unknown result when every history is one."""
    vacuous = sorted(wid for wid, chain in data.event_histories.items()
                     if not any(t.outcome == "completed" for run in chain for t in run.workflow_tasks))
    details["histories_without_a_completed_workflow_task"] = vacuous
    if vacuous and len(vacuous) == len(data.event_histories):
        return CheckResult("replay", UNKNOWN, f"none of the {len(vacuous)} histories has a completed workflow task: "
                                              "replaying them proves nothing", details)
    return f"; {len(vacuous)} with no completed workflow task prove nothing ({', '.join(vacuous[:3])})" if vacuous else ""


def check_with_command(data: RunData, target: ReplayTarget) -> CheckResult:
    """Replay each workflow's saved runs with the target's own replayer (``target.command``); see the module doc."""
    shown = " ".join(target.command)[:200]
    declared = {"replay_command": list(target.command), "replayed_with": target.source}
    if target.cwd is not None and not os.path.isdir(target.cwd):
        return CheckResult("replay", UNKNOWN, f"the target's directory {target.cwd} is not on this machine; check "
                                              "again with --target FILE (the target file here)", declared)
    unreadable = _unreadable_histories(data)
    if unreadable:
        return CheckResult("replay", UNKNOWN, unreadable, declared)
    root, top = data.dir.event_histories.parent, data.dir.event_histories.name
    try:
        workflow_ids = sorted(name for name, mode in run_files.entries(root, top).items() if stat.S_ISDIR(mode))
    except FileNotFoundError:
        workflow_ids = []
    if not workflow_ids:
        return CheckResult("replay", UNKNOWN, "no histories to replay", declared)
    env = {**os.environ, **target.env, "PYTHONPATH": target_pythonpath(target.env.get("PYTHONPATH"))}
    outcomes: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="dah-replay-") as private:
        for wid in workflow_ids:
            outcomes[wid] = _replay_one(root, top, wid, Path(private), target, env)
    details = {**declared, "replayed": len(workflow_ids), "workflows": outcomes}
    failed = [w for w, o in outcomes.items() if o["outcome"] == FAIL]
    unknown = [w for w, o in outcomes.items() if o["outcome"] == UNKNOWN]
    if failed:
        return CheckResult("replay", FAIL, f"{len(failed)} of {len(workflow_ids)} workflows failed to replay with "
                                           f"{shown}; first {failed[0]}: {outcomes[failed[0]]['said']}", details)
    if unknown:
        return CheckResult("replay", UNKNOWN, f"{len(unknown)} of {len(workflow_ids)} workflows could not be judged "
                                              f"by {shown}; first {unknown[0]}: {outcomes[unknown[0]]['said']}",
                           details)
    note = _vacuous(data, details)
    if isinstance(note, CheckResult):
        return note
    words = next((o["said"] for o in outcomes.values() if re.search(r"\binputs?\b", o["said"], re.IGNORECASE)), None)
    inputs = (f"inputs compared by the command, in its words: {words!r}" if words else
              "inputs not compared (the command does not say it compares them)")
    return CheckResult("replay", PASS, f"{len(workflow_ids)} workflows' histories replayed with {shown} (exit 0 "
                                       f"each){note}; {inputs}", details)


def _replay_one(root: Path, top: str, wid: str, private: Path, target: ReplayTarget, env: dict) -> dict:
    """One workflow's outcome with the target's replayer: ``{"outcome", "exit", "said"}``. Its runs are copied
    into ``private`` first, so the command reads no link or oversized file the run directory could hold."""
    folder = private / wid
    try:
        names = sorted(n for n, mode in run_files.entries(root, f"{top}/{wid}").items()
                       if n.endswith(".json") and stat.S_ISREG(mode))
        folder.mkdir()
        for name in names:
            (folder / name).write_bytes(run_files.read_bytes(root, f"{top}/{wid}/{name}", run_files.JSON_LIMIT))
    except (OSError, run_files.RefusedPath) as exc:
        return {"outcome": UNKNOWN, "exit": None, "said": f"its saved runs cannot be read: {str(exc)[:QUOTED_CHARS]}"}
    if not names:
        return {"outcome": UNKNOWN, "exit": None, "said": "no saved run"}
    problem = placeholder_problem("workflow_id", wid)
    if problem:  # a folder name from the run directory: never shell text or an option to the command
        return {"outcome": UNKNOWN, "exit": None, "said": f"not replayed: {problem}"}
    values = {"history": str(folder), "workflow_id": wid}  # one pass: a value is never filled again
    argv = [re.sub(r"\{(history|workflow_id)\}", lambda m: values[m.group(1)], part) for part in target.command]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=COMMAND_TIMEOUT_S,
                              env=env, cwd=target.cwd, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"outcome": UNKNOWN, "exit": None, "said": f"no answer within {COMMAND_TIMEOUT_S:.0f} s"}
    except OSError as exc:
        return {"outcome": UNKNOWN, "exit": None, "said": f"cannot run it: {exc}"}
    out, err = _last_line(proc.stdout), _last_line(proc.stderr)
    if proc.returncode == 0:
        return {"outcome": PASS, "exit": 0, "said": out or err}
    said = err or out or "(no output)"
    return {"outcome": FAIL if proc.returncode == 1 else UNKNOWN, "exit": proc.returncode,
            "said": said if proc.returncode == 1 else f"exit {proc.returncode}: {said}"}


def _unreadable_histories(data: RunData) -> str | None:
    """Why the run's saved histories' folder cannot be listed (a symlink, which is not followed; not a directory),
    in one line; None when it can, or when there is none (then there is nothing to replay)."""
    try:
        run_files.entries(data.dir.event_histories.parent, data.dir.event_histories.name)
    except FileNotFoundError:
        return None
    except (OSError, run_files.RefusedPath) as exc:
        return f"the saved histories cannot be read: {exc}"
    return None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:QUOTED_CHARS] if lines else ""


def _namespace(data: RunData) -> str | None:
    """The Temporal namespace run.json records (run data: only a short string is used), or None."""
    try:
        backend = data.run.get("backend")
    except (OSError, ValueError):  # a malformed run.json: the other checks say so; replay loses the namespace
        return None
    temporal = backend.get("temporal") if isinstance(backend, dict) else None
    namespace = temporal.get("namespace") if isinstance(temporal, dict) else None
    return namespace if isinstance(namespace, str) and 0 < len(namespace) <= NAMESPACE_LIMIT else None


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
