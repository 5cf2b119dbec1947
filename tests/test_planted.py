"""The planted-bug catalogue is well-formed, and a planted bug that passes is reported as not caught."""

from __future__ import annotations

import importlib
from dataclasses import asdict
from pathlib import Path

from chaos.checker import ALL_CHECKERS
from chaos.planted import CATALOGUE, caught
from chaos.runner import run
from testbed.engines.temporal import ReferenceOnTemporal
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
    assert {b.agent for b in CATALOGUE} == {"reference", "third_party"}


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
