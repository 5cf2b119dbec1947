"""``migration_fuzz``: worker processes on one task queue, fan-out shapes, placement from histories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.event_history import ChildRecord, RunRecord
from harness.recording import EffectLedger, ExecutionIdentity
from agent.contracts import AgentResult
from tests.run_directory import assert_valid
from migration_fuzz.fuzz import KINDS, FuzzOptions, Shape, check_iteration, run_fuzz, shape_for


def test_shapes_are_a_function_of_the_seed() -> None:
    shapes = [shape_for(seed, "all", 5) for seed in range(60)]
    assert shapes == [shape_for(seed, "all", 5) for seed in range(60)]
    assert {s.kind for s in shapes} == set(KINDS)
    assert all(1 <= s.n <= 5 for s in shapes)
    assert all((s.writes >= 1) == (s.kind == "ptc-mixed") for s in shapes)
    assert {shape_for(seed, "ptc-spawns", 3).kind for seed in range(10)} == {"ptc-spawns"}


def _tree(workflow_id: str, child_ids: list[str], child_status: str = "completed") -> dict[str, list[RunRecord]]:
    root = RunRecord(workflow_id, "r0", status="completed",
                     children=[ChildRecord(c, "AgentWorkflow", i, run_id=f"r{i}", outcome=child_status)
                               for i, c in enumerate(child_ids, 1)])
    tree = {workflow_id: [root]}
    for i, c in enumerate(child_ids, 1):
        tree[c] = [RunRecord(c, f"r{i}", status=child_status)]
    return tree


def test_the_checker_finds_each_kind_of_violation(tmp_path: Path) -> None:
    """The invariants can fail: a missing child, a child started twice, a failed child, a file applied twice."""
    shape = Shape("ptc-mixed", 2, 1)
    wid, tag = "fuzz-x-t", "t"
    workspace = tmp_path / "ws"
    (workspace / "fuzz" / tag).mkdir(parents=True)
    (workspace / "fuzz" / tag / "file-1.txt").write_text("t file 1")
    reply = AgentResult("1 + 1 = 2\n2 + 2 = 4", 1, 5, 0, "one_shot")
    with EffectLedger(tmp_path / "ledger.sqlite3") as ledger:
        ident = ExecutionIdentity(wid, "r0", "3", 1, "w1-1")
        ledger.record_application(ident, "write_file", "fuzz/t/file-1.txt")
        good = _tree(wid, [f"{wid}/generic-1", f"{wid}/generic-2"])
        assert check_iteration(shape, wid, tag, reply, None, good, ledger, workspace) == []

        assert any("1 children started" in p for p in
                   check_iteration(shape, wid, tag, reply, None, _tree(wid, [f"{wid}/generic-1"]), ledger, workspace))
        twice = _tree(wid, [f"{wid}/generic-1", f"{wid}/generic-1"])
        assert any("started twice" in p for p in check_iteration(shape, wid, tag, reply, None, twice, ledger, workspace))
        failed = _tree(wid, [f"{wid}/generic-1", f"{wid}/generic-2"], child_status="failed")
        assert any("ended failed" in p for p in check_iteration(shape, wid, tag, reply, None, failed, ledger, workspace))
        short = AgentResult("1 + 1 = 2", 1, 5, 0, "one_shot")
        assert any("2 + 2 = 4" in p for p in check_iteration(shape, wid, tag, short, None, good, ledger, workspace))
        ledger.record_application(ExecutionIdentity(wid, "r0", "3", 2, "w2-1"), "write_file", "fuzz/t/file-1.txt")
        assert any("applied 2 times" in p for p in check_iteration(shape, wid, tag, reply, None, good, ledger,
                                                                   workspace))


def test_bad_options_are_refused_by_name() -> None:
    out = subprocess.run([sys.executable, "-m", "migration_fuzz", "--workers", "0"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "--workers 0: must be between 1 and 16" in out.stderr
    out = subprocess.run([sys.executable, "-m", "migration_fuzz", "--chaos", "--workers", "1"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "--chaos needs at least 2 workers" in out.stderr


@pytest.mark.timeout(240)
async def test_fuzz_with_a_worker_killed_in_every_iteration(tmp_path: Path) -> None:
    # Seeds 6 and 7 draw ptc-mixed and ptc-spawns shapes. A 300 ms model makes each iteration outlast the
    # kill's random delay (at most 0.8 s), so every iteration loses a worker while it runs.
    opts = FuzzOptions(iterations=2, workers=2, max_n=3, seed=6, chaos=True, out=tmp_path / "mf",
                       model_latency="fixed:300")
    assert [shape_for(opts.seed + i, "all", 3).kind for i in range(2)] == ["ptc-mixed", "ptc-spawns"]
    report = await run_fuzz(opts)
    assert report["invariants_held"], json.dumps(report["iterations"], indent=1)
    assert [len(it["kills"]) for it in report["iterations"]] == [1, 1]
    for it in report["iterations"]:
        parent = it["parent"]
        assert parent["workflow_tasks"] and all(w.startswith(("w1-", "w2-")) for w in parent["workflow_tasks"])
        assert len(it["children"]) == it["shape"]["n"]
        assert all(c["started_by"] for c in it["children"])
    assert_valid(Path(report["run_dir"]))
    saved = json.loads((Path(report["run_dir"]) / "results.json").read_text())
    assert saved["families"] == report["families"]
    assert (Path(report["run_dir"]) / "table.txt").read_text().startswith("family")
