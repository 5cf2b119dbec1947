"""``migration_fuzz``: an engine's worker processes, fan-out and write shapes, placement from the engine's records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.event_history import ChildRecord, RunRecord
from harness.recording import EffectLedger, ExecutionIdentity
from tests.run_directory import assert_valid
from migration_fuzz.fuzz import FuzzOptions, Shape, check_iteration, drawn, families, run_fuzz, shape_for
from testbed.engines import make_engine
from testbed.scripted_routes import FUZZ_FAN_OUT, fuzz_answer


def test_shapes_are_a_function_of_the_seed() -> None:
    shapes = [shape_for(seed, "all", 5) for seed in range(60)]
    assert shapes == [shape_for(seed, "all", 5) for seed in range(60)]
    assert {s.kind for s in shapes} == set(FUZZ_FAN_OUT)
    assert all(1 <= s.n <= 5 for s in shapes)
    assert all((s.writes >= 1) == (s.kind == "ptc-mixed") for s in shapes)
    assert {shape_for(seed, "ptc-spawns", 3).kind for seed in range(10)} == {"ptc-spawns"}
    writes = [shape_for(seed, "all", 4, ("writes",)) for seed in range(20)]
    assert all(s.kind == "writes" and s.n == 0 and 1 <= s.writes <= 4 for s in writes)


def test_each_engine_runs_the_families_its_tools_allow() -> None:
    """The fan-out families need spawn and run_ptc; 'all' keeps drawing them where they run (as before)."""
    temporal, checkpoint = make_engine("temporal"), make_engine("checkpoint")
    assert families(temporal) == (*FUZZ_FAN_OUT, "writes") and drawn(temporal) == FUZZ_FAN_OUT
    assert families(checkpoint) == drawn(checkpoint) == ("writes",)


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
    reply = "1 + 1 = 2\n2 + 2 = 4"
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
        short = "1 + 1 = 2"
        assert any("2 + 2 = 4" in p for p in check_iteration(shape, wid, tag, short, None, good, ledger, workspace))
        ledger.record_application(ExecutionIdentity(wid, "r0", "3", 2, "w2-1"), "write_file", "fuzz/t/file-1.txt")
        assert any("applied 2 times" in p for p in check_iteration(shape, wid, tag, reply, None, good, ledger,
                                                                   workspace))


def test_the_writes_check_needs_the_answer_and_each_file_once(tmp_path: Path) -> None:
    """On an engine without event histories (tree None): the answer, the ledger and the bytes decide."""
    shape, wid, tag = Shape("writes", 0, 2), "fuzz-x-w", "w"
    workspace = tmp_path / "ws"
    (workspace / "fuzz" / tag).mkdir(parents=True)
    for j in (1, 2):
        (workspace / "fuzz" / tag / f"file-{j}.txt").write_text(f"w file {j}")
    with EffectLedger(tmp_path / "ledger.sqlite3") as ledger:
        for j in (1, 2):
            ledger.record_application(ExecutionIdentity(wid, "checkpoint", str(j), 1, "w1-1"), "write_file",
                                      f"fuzz/w/file-{j}.txt")
        assert check_iteration(shape, wid, tag, fuzz_answer(tag, 2), None, None, ledger, workspace) == []
        assert any("not 'w: wrote 2 files'" in p for p in
                   check_iteration(shape, wid, tag, "ERROR: disk full", None, None, ledger, workspace))
        (workspace / "fuzz" / tag / "file-2.txt").write_text("w file 2, torn")
        assert any("file-2.txt is missing or holds the wrong content" in p for p in
                   check_iteration(shape, wid, tag, fuzz_answer(tag, 2), None, None, ledger, workspace))


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


def test_an_engine_without_spawn_or_temporal_refuses_what_it_cannot_run() -> None:
    out = subprocess.run([sys.executable, "-m", "migration_fuzz", "--durability", "checkpoint", "--kind",
                          "direct-spawns"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip().endswith("--kind direct-spawns: the checkpoint engine has no spawn or run_ptc; "
                                       "its families: writes")
    out = subprocess.run([sys.executable, "-m", "migration_fuzz", "--durability", "checkpoint", "--address",
                          "127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--address 127.0.0.1:1: the checkpoint engine has no Temporal cluster" in out.stderr


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_fuzz_on_the_checkpoint_engine_with_a_worker_killed_in_every_iteration(tmp_path: Path) -> None:
    """The checkpoint engine's own worker processes under the same kills: every write applied once with the right
    bytes and the expected answer; which worker ran each step comes from the ledger, and what no record says
    (where a child's first task ran) is printed as not observed. A 1 s model call makes each iteration outlast the
    kill's random delay (at most 0.8 s)."""
    out = subprocess.run([sys.executable, "-m", "migration_fuzz", "--durability", "checkpoint", "--iterations", "2",
                          "--workers", "2", "--chaos", "--model-latency", "fixed:1000", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all invariants held" in out.stdout
    writes_row = next(line for line in out.stdout.splitlines() if line.startswith("writes "))
    assert writes_row.split()[4:6] == ["not", "observed"]
    assert "  not observed     the engine keeps no event histories" in out.stdout
    run_dir = next((tmp_path / "migration_fuzz").glob("2*"))
    report = json.loads((run_dir / "results.json").read_text())
    assert report["invariants_held"] and report["families"]["writes"]["cross_worker_children"] is None
    assert [len(it["kills"]) for it in report["iterations"]] == [1, 1]
    for it in report["iterations"]:
        assert it["shape"]["kind"] == "writes" and it["cross_children"] is None
        steps = it["parent"]["activities"]
        # a model call, one write per file, the final model call: each by a worker of ours
        assert [tool for tool, _ in steps] == ["plan_next_action", *["write_file"] * it["shape"]["writes"],
                                               "plan_next_action"]
        assert all(worker.startswith(("w1-", "w2-")) for _, worker in steps)
    assert json.loads((run_dir / "run.json").read_text())["backend"]["name"] == "checkpoint"
    assert_valid(run_dir)
