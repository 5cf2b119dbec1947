"""The run directory's contract (harness/rundir.py, RUN_DIRECTORY.md, harness/run_directory.schema.json).

The end-to-end tests (chaos runs, the quick benchmark, the migration fuzzer) hold the directories they make to
the schema with ``tests.run_directory.assert_valid``; the tests here hold the schema to its document, and the
writer's guarantees (names, ``latest``, status, schema 1 still read, re-checks that move with the directory).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from harness.rundir import RunDir, command_line
from tests.run_directory import DOCUMENT, problems, schema_names


def test_every_file_and_field_of_the_schema_is_in_the_document() -> None:
    documented = set(re.findall(r"`([A-Za-z_][\w.]*)`", DOCUMENT.read_text()))
    missing = sorted(name for name in schema_names() if name not in documented)
    assert missing == [], f"RUN_DIRECTORY.md does not describe: {', '.join(missing)}"


def test_a_writer_that_adds_a_field_the_schema_does_not_know_is_caught(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "x")
    run.begin("migration_fuzz", "migration_fuzz", seed=1, reproduce="python -m migration_fuzz", options={},
              machine={"cores": 2, "memory_gb": 1.0, "cpu": "c", "platform": "p", "python": "3.11",
                       "temporalio": "1.35.0", "temporal_cli": "t"})
    assert problems(run.path) == []
    run.update(colour="blue")
    assert any("colour" in p for p in problems(run.path))
    run.run.pop("colour")
    run.run.pop("seed")
    run.save()
    assert any("'seed' is a required property" in p for p in problems(run.path))


def test_names_are_utc_and_never_shared_and_latest_moves_only_to_a_complete_run(tmp_path: Path) -> None:
    runs = [RunDir.create(tmp_path) for _ in range(3)]  # the same second, almost surely
    names = [r.path.name for r in runs]
    assert len(set(names)) == 3 and all(re.fullmatch(r"\d{8}T\d{6}Z(-\d+)?", n) for n in names)
    for r in runs:
        r.begin("bench", "bench")
    runs[0].finish("complete", 1.0)
    assert (tmp_path / "latest").resolve() == runs[0].path
    runs[1].finish("interrupted", 1.0, "KeyboardInterrupt")
    runs[2].finish("failed", 1.0, "RuntimeError: boom")
    assert (tmp_path / "latest").resolve() == runs[0].path  # never an unfinished run
    record = json.loads((runs[2].path / "run.json").read_text())
    assert record["status"] == "failed" and record["error"] == "RuntimeError: boom" and record["ended"]


def test_runs_started_in_the_same_second_by_several_processes_never_share_a_directory(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    start = time.time() + 2.0  # every process creates its directories from the same instant
    script = ("import sys, time; from pathlib import Path; from harness.rundir import RunDir\n"
              "while time.time() < float(sys.argv[2]): pass\n"
              "print(*(RunDir.create(Path(sys.argv[1])).path.name for _ in range(5)))")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path), str(start)], stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parent.parent) for _ in range(4)]
    names = [name for p in procs for name in p.communicate(timeout=60)[0].split()]
    assert all(p.returncode == 0 for p in procs)
    assert len(names) == 20 and len(set(names)) == 20 and len(list(tmp_path.iterdir())) == 20
    assert len({n.split("-")[0] for n in names}) < 20  # they did meet in one second (and got -2, -3, ...)


def test_a_reproduce_command_quotes_what_the_shell_would_split() -> None:
    cmd = command_line("python -m chaos run", {"--seed": 3, "--image": "my image", "--ui": True, "--x": None},
                       ["kill_mid_turn"])
    assert cmd == "python -m chaos run kill_mid_turn --seed 3 --image 'my image' --ui"


def test_a_schema_1_run_is_still_read(tmp_path: Path) -> None:
    old = tmp_path / "kill_mid_turn" / "20260101T000000000000Z"
    old.mkdir(parents=True)
    (old / "journal.json").write_text(json.dumps({"scenario": {"name": "kill_mid_turn"}, "backend": "journal",
                                                  "checks": [{"name": "lost", "verdict": "pass"}],
                                                  "verdict": "pass", "summary": {}}))
    (old / "history.jsonl").write_text("")
    run = RunDir(old)
    assert run.schema == 1 and run.operations.name == "history.jsonl" and run.event_histories.name == "histories"
    record = run.read_run()
    assert (record["kind"], record["name"], record["status"]) == ("chaos", "kill_mid_turn", "complete")
    assert set(record["backend"]["not_applicable"]) == {"temporal_history", "replay"}  # the old checkpoint backend
    assert run.read_verdict()["verdict"] == "pass"
