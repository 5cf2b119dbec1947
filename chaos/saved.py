"""What ``python -m chaos`` does with a saved run directory: check it again, or run it again.

    check_command(path)   ``chaos check``: every checker again, offline, on the saved files (``chaos.runner.check``)
    rerun_job(path)       ``chaos rerun``: (scenario, engine, seed) as run.json recorded them, to run again

Nothing a run directory names is run unless this user's harness made it (run.json signed with this user's run key)
and the user still controls it (``testbed.engines.byo.target.load_recorded_target``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from chaos.fault_timeline import lines
from harness.engines import HOME, canonical, names as engine_names
from harness.printable import printable
from harness.rundir import RUN_JSON, RunDir, RunDirError, command_line
from harness.commands import tool


def check_command(path: Path, target_path: Path | None = None, as_json: bool = False) -> int:
    """``python -m chaos check DIR``: the checkers again on a saved run, printed (``--json``: as JSON); 0 only if
    it passes, 1 otherwise, 2 for a directory that is no run or a target file that does not load. A run stopped
    before its final read has nothing to check: ``unknown``, saying so."""
    prog = f"{tool('chaos')} check"
    from chaos.runner import check

    run_dir = RunDir(path.resolve())
    if not run_dir.operations.exists():
        print(f"{prog}: {path} has no operations.jsonl (nor a history.jsonl); give a run directory "
              "such as runs/<scenario>/latest", file=sys.stderr)
        return 2
    stopped = unfinished(run_dir)
    if stopped and not run_dir.conversations.exists():
        # Stopped before its final read: the checkers would only report the files it never wrote.
        if as_json:
            print(json.dumps({"verdict": "unknown", "status": run_dir.read_run().get("status"),
                              "note": stopped, "checks": []}))
        else:
            print(f"{printable(stopped)}; it stopped before its final read (no conversations.json), so "
                  f"there is nothing to check\n\nverdict: unknown")
        return 1
    if stopped:
        print(f"note: {printable(stopped)}; checking what it recorded", file=sys.stderr)
    given = None
    if target_path:
        from testbed.engines.byo.target import load_target

        try:
            given = load_target(target_path)
        except ValueError as exc:
            print(f"{prog}: {exc}", file=sys.stderr)
            return 2
    verdict, checks, _ = check(run_dir.path, given)
    if as_json:
        print(json.dumps({"verdict": verdict, "checks": [c.as_dict() for c in checks]}, default=str))
    else:
        for c in checks:
            said, _, summary = c.shown().partition(": ")
            print(f"{printable(c.name):<20} {printable(said):<15} {printable(summary)}")
        saved = run_dir.read_verdict() or {}
        timeline = lines(saved.get("fault_timeline") or {})
        if timeline:
            print("\nthe faults, as scheduled and as they happened:")
            print("\n".join(printable(line) for line in timeline))
        for key, heading in (("lint", "lint (risky settings in its event histories; they fail nothing)"),
                             ("diagnoses", "diagnoses (what made it slow or fail, and what to change)")):
            found = [d for d in saved.get(key) or [] if isinstance(d, dict)]
            if found:
                print(f"\n{heading}:")
                print("\n".join(f"  {printable(str(d.get('line')))}" for d in found))
        print(f"\nverdict: {verdict} (safety: {saved.get('safety', '?')}, liveness: {saved.get('liveness', '?')})")
    return 0 if verdict == "pass" else 1


def lint_command(paths: list[Path], lint_fails: bool = False, as_json: bool = False) -> int:
    """``python -m chaos lint DIR...``: each run's lint findings (``chaos.lint``), one line each; 0, or with
    ``lint_fails`` 1 if any run has one; 2 for a path that is no run directory (nothing is linted then)."""
    from chaos.checker.run_data import RunData
    from chaos.lint import lint

    prog = f"{tool('chaos')} lint"
    for path in paths:
        if not RunDir(path.resolve()).operations.exists():
            print(printable(f"{prog}: {path} is not a chaos run directory (no operations.jsonl); give one such as "
                            "runs/<scenario>/latest"), file=sys.stderr)
            return 2
    found = 0
    for path in paths:
        findings, why = lint(RunData(path.resolve()))
        found += len(findings)
        if as_json:
            print(json.dumps({"run_dir": str(path), "findings": findings, "unavailable": why}, default=str))
            continue
        print(printable(f"{path}: " + (why or (f"{len(findings)} finding(s)" if findings else "nothing risky seen "
                                                "in its event histories"))))
        for f in findings:
            print(printable(f"  lint: {f['line']}"))
    if not as_json:
        print(f"{found} finding(s) in {len(paths)} run(s)" + ("" if lint_fails else " (informs only: --lint-fails "
                                                                                     "to fail on them)"))
    return 1 if lint_fails and found else 0


def unfinished(run: RunDir) -> str | None:
    """What ``chaos check`` says first of a run that did not complete (None: it completed)."""
    record = run.read_run()
    status = record.get("status")
    if status in (None, "complete"):
        return None
    if status == "running":
        return (f"{run.path} says running: it is still running, or was killed outright (SIGKILL, a lost machine) "
                "and never recorded an end")
    during = record.get("stopped_during")
    error = record.get("error")
    return f"{run.path} was {status}" + (f" during {during}" if during else "") + (f" ({error})" if error else "")


def rerun_job(run_dir: Path, connection: Any = None, target_path: Path | None = None,
              image: str | None = None) -> tuple[Any, Any, int]:
    """(scenario, engine, seed) as a saved run recorded them, on ``connection``'s cluster (None: the embedded
    server; the saved run's cluster is not reused: its address may not be this machine's to reach).

    The scenario is data (validated); nothing the run names is run unless the user controls it: the target file
    is ``target_path``, or the one run.json names if the user controls it (``testbed.engines.byo.target.load_recorded_target``);
    a Docker worker image is ``image``, or for the reference agent the harness's own (None here: built from this
    checkout); a reference run's workflow must be the reference's or a planted one. ValueError: one line saying
    what to pass."""
    from testbed.engines import make_engine
    from chaos.scenarios import scenario_from_dict
    from chaos.replay_target import reference_workflows
    from testbed.engines.byo.target import load_recorded_target, load_target

    record = RunDir(run_dir).read_run()
    if record.get("kind") != "chaos" or "scenario" not in record:
        raise ValueError(f"{run_dir} is not a chaos run directory (no scenario in its run.json)")
    saved_engine = record.get("backend") if isinstance(record.get("backend"), dict) else {}
    again = command_line(f"{tool('chaos')} rerun", {"--target": "PATH/TO/chaos-target.toml"}, [str(run_dir)])
    recorded_file = saved_engine.get("target_file")
    if target_path is not None:
        target = load_target(target_path)
    elif recorded_file:
        try:
            target = load_recorded_target(str(recorded_file), Path(run_dir),
                                          f"{run_dir}: the target file its run.json names")
        except ValueError as exc:
            raise ValueError(f"{exc}; pass the target file you trust: {again}") from None
        target_path = Path(os.path.realpath(str(recorded_file)))
    else:
        target = None
    workers = saved_engine.get("workers") or "process"
    if workers == "docker" and image is None and (saved_engine.get("image") or target is not None):
        if target is not None:
            raise ValueError(f"{run_dir} ran your agent in Docker image {saved_engine.get('image')!r}; a run "
                             f"directory's image is never run: pass the image you trust with --image NAME "
                             f"({again} --image NAME)")
        print(f"note: {run_dir} names the image {saved_engine.get('image')!r}; a run directory's image is never run: "
              "using dah-worker built from this checkout (--image NAME for another)", file=sys.stderr)
    try:
        scenario = scenario_from_dict(record["scenario"])
    except (TypeError, KeyError, AttributeError, ValueError) as exc:
        raise RunDirError(Path(run_dir) / RUN_JSON, "a scenario as dah-chaos run records it",
                          str(exc)[:300] if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"[:120],
                          "scenario") from None
    workflow = scenario.cluster.workflow
    if target is None and workflow is not None and (not isinstance(workflow, str)
                                                      or workflow not in reference_workflows()):
        raise ValueError(f"{run_dir}: its scenario's cluster.workflow {str(workflow)[:200]!r} is not the reference "
                         "agent's nor a planted one (testbed.faults.planted); a run directory's code is never run")
    durability = canonical(str(saved_engine.get("name")))  # "target" (your agent) runs on the home engine
    durability = durability if durability in engine_names() else HOME
    return (scenario, make_engine(durability, workers=workers, image=image, target=target, target_file=target_path,
                                   connection=connection),
            int(record.get("seed", 1)))
