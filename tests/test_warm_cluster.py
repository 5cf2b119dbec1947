"""A warm Temporal server shared by a soak's seeds (``testbed.engines.temporal.cluster.WarmTemporal``, used by
``chaos.soak``) leaks nothing from one seed to the next: a seed run after 20 others on one warm server gives the
verdict and the fault timeline it gives on a cluster of its own, and a workflow an earlier seed left running stops
the next seed loudly.

Real processes throughout (the embedded dev server, forked reference workers, the scripted model); the seeds are
short (a kill_idle cut to 1 s of faults and two conversations of fast turns: ~4 s each) so 22 of them stay
affordable.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from agent.contracts import AgentConfig, AgentInput
from agent.workflow import AgentWorkflow
from chaos.runner import RunFailed, run, run_captured
from chaos.generator import NemesisEvent
from chaos.scenarios import SCENARIOS, ClusterSpec
from chaos.soak import seed_needs_own_cluster
from testbed.engines.temporal.connection import TemporalConnection
from testbed.engines.workload import Workload
from testbed.engines.temporal.engine import ReferenceOnTemporal
from testbed.engines.temporal.cluster import WarmTemporal
from tests.run_directory import problems

SHORT = dataclasses.replace(SCENARIOS["kill_idle"], name="kill_idle_short", warmup_s=0.3, fault_s=1.0,
                            events=(NemesisEvent(0.2, "kill_worker", {"when": "idle", "down_s": 0.5}),),
                            workload=dataclasses.replace(SCENARIOS["kill_idle"].workload, conversations=2,
                                                         messages=2, think_s=0.2),
                            cluster=ClusterSpec(model_latency="fixed:20"))
OTHER_SEEDS = range(2, 22)  # 20 seeds before the one compared


def _verdict(path: Path) -> tuple[str, dict[str, str], list[str], int]:
    """(verdict, check -> verdict, the fault timeline's ops in order, how many started late)."""
    v = json.loads((path / "verdict.json").read_text())
    timeline = v["fault_timeline"]
    return (v["verdict"], {c["name"]: c["verdict"] for c in v["checks"]},
            [f["op"] for f in timeline["faults"]], timeline["late"])


def _model_calls_are_its_own(path: Path) -> None:
    """The seed's model server counted only this seed's conversations: it is the seed's own (a bring-your-own agent
    sends no run header, so a shared one could not tell seeds apart)."""
    stats = json.loads((path / "run.json").read_text())["model_server"]
    own = {c["workflow_id"] for c in json.loads((path / "conversations.json").read_text())["conversations"]}
    assert set(stats["by_run"]) == own and sum(stats["by_run"].values()) == stats["requests"] > 0, (stats, own)


@pytest.mark.slow
async def test_a_seed_after_20_others_on_a_warm_server_gives_what_it_gives_cold(tmp_path: Path) -> None:
    cold = await run(SHORT, ReferenceOnTemporal(), seed=1, out_root=tmp_path / "cold")
    warm = WarmTemporal(tmp_path / "temporal.log")
    try:
        others = [await run_captured(SHORT.name, SHORT, ReferenceOnTemporal(), seed=s, out_root=tmp_path / "warm",
                                     cluster=warm) for s in OTHER_SEEDS]
        assert [(o.seed, o.verdict) for o in others] == [(s, "pass") for s in OTHER_SEEDS], \
            [(o.seed, o.lines()) for o in others if o.verdict != "pass"]
        after = await run(SHORT, ReferenceOnTemporal(), seed=1, out_root=tmp_path / "warm", cluster=warm)
        assert warm.runs == len(OTHER_SEEDS) + 1 and warm.server is not None  # one server all along
    finally:
        await warm.close()
    assert _verdict(after.run_dir) == _verdict(cold.run_dir) and cold.verdict == "pass"
    verdict, checks, ops, late = _verdict(after.run_dir)
    assert ops == ["kill_worker"] and late == 0
    assert problems(after.run_dir) == []
    _model_calls_are_its_own(after.run_dir)
    assert not (after.run_dir / "logs" / "temporal.log").exists()  # it ran on the shared server


async def test_a_workflow_left_running_stops_the_next_seed_on_the_warm_server(tmp_path: Path) -> None:
    warm = WarmTemporal(tmp_path / "temporal.log")
    try:
        first = await run(SHORT, ReferenceOnTemporal(), seed=1, out_root=tmp_path, cluster=warm)
        assert first.verdict == "pass" and warm.server is not None
        # the leak: a workflow the previous seed left (on a queue nobody polls, so it runs until ended)
        client = await TemporalConnection(address=warm.server.address).connect()
        await client.start_workflow(AgentWorkflow.run, AgentInput(config=AgentConfig()), id="planted-leak",
                                    task_queue="nobody-polls")
        with pytest.raises(RunFailed, match=r"still runs 1 workflow\(s\) an earlier run left \(planted-leak\)"):
            await run(SHORT, ReferenceOnTemporal(), seed=2, out_root=tmp_path, cluster=warm)
        assert warm.server is None  # replaced: the next seed starts on a fresh server
        again = await run(SHORT, ReferenceOnTemporal(), seed=2, out_root=tmp_path, cluster=warm)
        assert again.verdict == "pass"
        _model_calls_are_its_own(again.run_dir)
    finally:
        await warm.close()


def test_seeds_that_restart_or_partition_the_server_get_a_cluster_of_their_own() -> None:
    engine = ReferenceOnTemporal()
    assert not seed_needs_own_cluster(engine, SCENARIOS["kill_mid_turn"], 1)
    assert seed_needs_own_cluster(engine, SCENARIOS["server_restart"], 1)
    assert seed_needs_own_cluster(engine, SCENARIOS["partition_temporal_reset"], 1)
    assert not seed_needs_own_cluster(engine, SCENARIOS["partition_model"], 1)
    mixed = SCENARIOS["mixed"]
    own = {s for s in range(1, 41) if seed_needs_own_cluster(engine, mixed, s)}
    assert own and own != set(range(1, 41))  # some mixed seeds fault the server, others do not
