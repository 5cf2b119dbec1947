"""The planted-bug catalogue is well-formed, and a planted bug that passes is reported as not caught."""

from __future__ import annotations

import importlib
from dataclasses import asdict
from pathlib import Path

from chaos.checker import ALL_CHECKERS
from chaos.planted import CATALOGUE, caught
from chaos.runner import run
from testbed.engines.temporal.engine import ReferenceOnTemporal
from chaos.scenarios import scenario_from_dict


def test_every_entry_names_real_checkers_mutations_and_workflows() -> None:
    assert len({b.name for b in CATALOGUE}) == len(CATALOGUE)
    for bug in CATALOGUE:
        assert set(bug.caught_by) <= set(ALL_CHECKERS), bug.name
        assert bug.scenario.cluster.faults is not None  # building it raises on an unknown mutation or crash point
        if bug.scenario.cluster.workflow:
            module, _, name = bug.scenario.cluster.workflow.partition(":")
            assert hasattr(importlib.import_module(module), name), bug.name
        assert scenario_from_dict(asdict(bug.scenario)) == bug.scenario, bug.name  # `chaos rerun` can run it
    assert {b.agent for b in CATALOGUE} == {"reference", "third_party", "third_party_tasks"}


def test_an_older_run_naming_a_planted_workflow_by_its_old_module_reruns_and_replays_the_same_build(
        tmp_path: Path) -> None:
    """Run directories saved before the planted bugs moved name them ``chaos.mutants:NAME``: a rerun starts the same
    build and the replay checker replays with it (the reference agent's code, never the run directory's)."""
    from chaos.replay_target import ReplayTarget, reference_workflows, replay_target
    from testbed.faults.planted import current_workflow, workflow_spec

    bug = next(b for b in CATALOGUE if b.name == "wall_clock_workflow")
    old = asdict(bug.scenario)
    old["cluster"]["workflow"] = "chaos.mutants:WallClockAgentWorkflow"
    assert scenario_from_dict(old) == bug.scenario
    assert current_workflow("chaos.mutants:WallClockAgentWorkflow") == workflow_spec("WallClockAgentWorkflow") \
        in reference_workflows()
    replay = replay_target(tmp_path, {"workflow": "chaos.mutants:HashSeedAgentWorkflow", "source": None})
    assert isinstance(replay, ReplayTarget) and replay.workflow == "testbed.faults.planted:HashSeedAgentWorkflow"
    assert isinstance(replay_target(tmp_path, {"workflow": "chaos.mutants:Nothing", "source": None}), str)
    assert current_workflow("agent.workflow:AgentWorkflow") == "agent.workflow:AgentWorkflow"


def test_a_run_that_passed_never_counts_as_caught() -> None:
    bug = next(b for b in CATALOGUE if b.name == "unkeyed_effects")
    assert not caught(bug, "pass", {"effects": "pass"})
    assert not caught(bug, "fail", {"effects": "pass", "lost": "fail"})  # caught, but not by the checker it targets
    assert not caught(bug, "unknown", {"effects": "unknown"})  # this one must be a fail
    assert caught(bug, "fail", {"effects": "fail"})


async def test_workflow_code_that_raises_is_caught_by_workflow_tasks_and_lost(tmp_path: Path) -> None:
    bug = next(b for b in CATALOGUE if b.name == "stuck_workflow_task")
    result = await run(bug.scenario, ReferenceOnTemporal(), seed=bug.seed, out_root=tmp_path)
    verdicts = {c.name: c.verdict for c in result.checks}
    assert verdicts["workflow_tasks"] == "fail" and verdicts["lost"] == "fail", result.checks
    assert caught(bug, result.verdict, verdicts)
