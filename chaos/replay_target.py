"""What the replay checker may run for a saved run: trust flows from the command line, never from the run directory.

``replay_target`` decides, from a target file the user gave or controls (``testbed.engines.byo.target``), or the
reference agent's own code; ``reference_workflows`` are the only workflows a run directory can select.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaos.checker.run_data import ReplayTarget
from harness.rundir import command_line
from harness.commands import tool
from testbed.engines.byo.target import REFERENCE, Target, load_recorded_target


def reference_workflows() -> frozenset[str]:
    """The workflow classes a reference agent's run may name: its own, and the planted ones
    (``testbed.faults.planted``). The only code a run directory can select, and only from this harness's own."""
    from testbed.faults import planted

    return frozenset({REFERENCE.workflow, *(planted.workflow_spec(name) for name in planted.planted_workflows())})


def replay_target(run_dir: Path, recorded: dict[str, Any], given: Target | None = None) -> ReplayTarget | str:
    """What the replay checker may run for the run in ``run_dir`` (``recorded``: run.json's ``target``), or why
    nothing, with the command to give. Trust flows from the command line, never from the run directory:

    1. ``given`` (a target file from the command line: ``--target``, or the one a fresh run was started with);
    2. else the target file run.json names, if this user's harness wrote that run.json (its signature verifies
       with this user's run key: ``harness.signing``) and the user still controls the file
       (``load_recorded_target``);
    3. else, if run.json names no target file, the reference agent: this interpreter and this harness's own code,
       with a workflow of ``reference_workflows()`` (run.json's ``python``, ``cwd``, ``env`` and declarations are
       never used);
    4. else nothing: the reason, and ``python -m chaos check DIR --target PATH/TO/chaos-target.toml``.

    A target file declaring another workflow than the run recorded is not the run's agent: nothing."""
    again = command_line(f"{tool('chaos')} check", {"--target": "PATH/TO/chaos-target.toml"}, [str(run_dir)])
    recorded = recorded if isinstance(recorded, dict) else {}
    from testbed.faults.planted import current_workflow

    workflow, source = current_workflow(recorded.get("workflow")), recorded.get("source")
    if given is not None and not given.is_reference:
        target, how = given, f"the target file {given.source}, given on the command line"
    elif source:
        try:
            target = load_recorded_target(str(source), run_dir, "the run's target file (run.json's target.source)")
        except ValueError as exc:
            return f"not replayed: {exc}; replay runs only a target file you give or one your own run names: {again}"
        how = f"the target file {source} run.json names (a run you made: run.json carries your signature)"
    elif workflow is None or (isinstance(workflow, str) and workflow in reference_workflows()):
        return ReplayTarget(workflow=workflow or REFERENCE.workflow, cwd=str(Path(__file__).resolve().parent.parent),
                            source="the reference agent: this harness's own code and interpreter")
    else:
        return (f"not replayed: run.json names no target file and the workflow {str(workflow)[:200]!r}, which is "
                f"not the reference agent's (nor a planted one of testbed.faults.planted); for your own agent: {again}")
    if workflow and workflow != target.workflow:
        return (f"not replayed: {how.split(',')[0]} declares the workflow {target.workflow}, but the run recorded "
                f"{str(workflow)[:200]!r}: not the agent that ran; give its own target file: {again}")
    return ReplayTarget(workflow=target.workflow, command=target.replay_command, source=how,
                        python=target.interpreter, cwd=target.cwd,
                        env=dict(target.env), replay_plugins=target.replay_plugins,
                        data_converter=target.data_converter, workflow_runner=target.workflow_runner,
                        strict_replay=target.strict_replay, strict_replay_ignore=target.strict_replay_ignore)
