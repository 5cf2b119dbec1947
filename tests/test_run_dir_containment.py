"""A received run directory cannot make ``chaos check`` read or write outside it (issue 28, cases 2 and 3).

Each test plants one attack in a small saved run (written by the harness's own operation log and effect ledger,
checked by the real ``python -m chaos check``) and asserts that the file outside is neither changed nor shown,
and that the run does not pass by skipping what it could not read: the affected check is unknown, with a reason
that begins "refused:".
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cli.chaos import main as chaos_main
from harness import run_files
from harness.durable_files import write_atomic
from harness.operations import OK, OperationLog
from harness.recording import EffectLedger, ExecutionIdentity

TEXT, REPLY = "append hello to notes.txt", "Appended to notes.txt."
SECRET = "s3cret-outside-the-run-directory"


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete chaos run of one conversation with one planned append, whose ``chaos check`` passes."""
    run = tmp_path_factory.mktemp("saved") / "run"
    (run / "state" / "sandbox" / "c-0").mkdir(parents=True)
    (run / "logs").mkdir()
    oplog = OperationLog(run / "operations.jsonl")
    op = oplog.invoke("client-0", "send_message", {"conversation": "c-0", "n": 0, "text": TEXT, "expect": REPLY,
                                                     "match": "exact"})
    oplog.complete(op, OK, {"reply": REPLY})
    oplog.close()
    conversation = {"workflow_id": "c-0", "started": True, "final_status": "COMPLETED", "result": None,
                    "final_history": [{"role": "user", "content": TEXT}, {"role": "assistant", "content": REPLY}],
                    "planned": [{"text": TEXT, "expect": REPLY, "kind": "append", "path": "notes.txt",
                                 "content": "hello\n", "match": "exact"}]}
    (run / "conversations.json").write_text(json.dumps({"workload": {}, "conversations": [conversation]}))
    (run / "state" / "sandbox" / "c-0" / "notes.txt").write_text("hello\n")
    with EffectLedger(run / "state" / "ledger.sqlite3") as ledger:
        ident = ExecutionIdentity("c-0", "r-1", "1", 1, "w1")
        execution = ledger.begin_execution(ident, "append_file")
        ledger.apply_once(ident, "append_file", "notes.txt", "d1", lambda: "ok", lambda: False)
        ledger.end_execution(execution, "completed")
    (run / "logs" / "w1-1.log").write_text("worker started\n")
    na = "reads Temporal event histories; this run has none"
    (run / "run.json").write_text(json.dumps({
        "schema": 2, "kind": "chaos", "name": "containment", "status": "complete", "seed": 1,
        "target": {"ledger": "ledger.sqlite3", "workspace": "sandbox/{workflow_id}",
                   "model_activity": "plan_next_action"},
        "backend": {"name": "checkpoint", "not_applicable": {"temporal_history": na, "replay": na}}}))
    return run


@pytest.fixture
def run(saved_run: Path, tmp_path: Path) -> Path:
    """A fresh copy of the saved run (symlinks kept as symlinks) to plant an attack in."""
    copy = tmp_path / "run"
    shutil.copytree(saved_run, copy, symlinks=True)
    return copy


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "outside" / "secret"
    path.parent.mkdir()
    path.write_text(SECRET + "\n")
    return path


def check(run: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict, str]:
    """``python -m chaos check RUN --json``: (exit code, its JSON, everything it printed)."""
    code = chaos_main(["check", str(run), "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out), out + err


def verdicts(result: dict) -> dict[str, tuple[str, str]]:
    return {c["name"]: (c["verdict"], c["summary"]) for c in result["checks"]}


def refused(run: Path, capsys: pytest.CaptureFixture[str], check_name: str, secret: Path | None = None) -> str:
    """Check the run; assert it did not pass, ``check_name`` is unknown because a file was refused, and the
    secret is nowhere in what was printed or written; the refusal's summary."""
    code, result, printed = check(run, capsys)
    verdict, summary = verdicts(result)[check_name]
    assert (code, result["verdict"], verdict) == (1, "unknown", "unknown"), (result["verdict"], summary)
    assert "refused:" in summary, summary
    if secret is not None:
        assert SECRET not in printed and SECRET not in (run / "verdict.json").read_text()
        assert secret.read_text() == SECRET + "\n"
    return summary


def test_the_saved_run_passes_as_it_is(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The control: every attack below starts from a run that passes, so "not pass" is the attack's doing.
    code, result, _ = check(run, capsys)
    assert (code, result["verdict"]) == (0, "pass"), verdicts(result)


def test_a_planted_temp_file_symlink_does_not_redirect_the_verdict(run: Path, secret: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # Case 2: write_atomic wrote through DIR/.verdict.json.tmp, overwriting the victim and linking verdict.json to it.
    os.symlink(secret, run / ".verdict.json.tmp")
    code, result, _ = check(run, capsys)
    assert (code, result["verdict"]) == (0, "pass")
    assert secret.read_text() == SECRET + "\n"
    assert stat.S_ISREG(os.lstat(run / "verdict.json").st_mode)
    assert json.loads((run / "verdict.json").read_text())["verdict"] == "pass"
    assert os.path.islink(run / ".verdict.json.tmp")  # left alone, never written through


def test_write_atomic_never_writes_through_a_symlink_in_the_directory(tmp_path: Path, secret: Path) -> None:
    # Whatever temporary name an attacker guesses: the file is created exclusively, so a planted one cannot be used.
    target = tmp_path / "out.json"
    for name in (".out.json.tmp", f".out.json.{os.getpid()}.tmp"):
        os.symlink(secret, tmp_path / name)
    os.symlink(secret, target)  # and the destination itself a symlink: replaced, not written through
    write_atomic(target, b"{}\n")
    assert secret.read_text() == SECRET + "\n"
    assert not os.path.islink(target) and target.read_bytes() == b"{}\n"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp") and not os.path.islink(tmp_path / p)]


def test_a_planned_append_path_that_climbs_out_is_not_read(run: Path, secret: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    climb = os.path.relpath(secret, run / "state" / "sandbox" / "c-0")
    assert climb.startswith("../")
    conversations = json.loads((run / "conversations.json").read_text())
    conversations["conversations"][0]["planned"][0]["path"] = climb
    (run / "conversations.json").write_text(json.dumps(conversations))
    summary = refused(run, capsys, "lost", secret)
    assert "contains '..'" in summary


def test_an_absolute_workspace_template_is_not_read(run: Path, secret: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    record = json.loads((run / "run.json").read_text())
    record["target"]["workspace"] = str(secret.parent)
    (run / "run.json").write_text(json.dumps(record))
    conversations = json.loads((run / "conversations.json").read_text())
    conversations["conversations"][0]["planned"][0]["path"] = secret.name
    (run / "conversations.json").write_text(json.dumps(conversations))
    summary = refused(run, capsys, "lost", secret)
    assert "is absolute" in summary


def test_an_absolute_ledger_path_is_not_opened(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A ledger outside, recording a clean run: had it been read, effects would pass on someone else's file.
    outside = tmp_path / "outside-ledger.sqlite3"
    shutil.copy(run / "state" / "ledger.sqlite3", outside)
    record = json.loads((run / "run.json").read_text())
    record["target"]["ledger"] = str(outside)
    (run / "run.json").write_text(json.dumps(record))
    summary = refused(run, capsys, "effects")
    assert "is absolute" in summary


def test_a_ledger_that_is_a_symlink_is_not_opened(run: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    outside = tmp_path / "outside-ledger.sqlite3"
    shutil.move(run / "state" / "ledger.sqlite3", outside)
    os.symlink(outside, run / "state" / "ledger.sqlite3")
    summary = refused(run, capsys, "effects")
    assert "is a symlink" in summary


def test_a_symlink_inside_the_saved_workspace_is_not_followed(run: Path, secret: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    # A model with a shell can leave notes.txt -> /etc/shadow; the file tools refuse symlinks, so must the checker.
    notes = run / "state" / "sandbox" / "c-0" / "notes.txt"
    notes.unlink()
    os.symlink(secret, notes)
    summary = refused(run, capsys, "lost", secret)
    assert "is a symlink" in summary


def test_a_symlinked_workspace_directory_is_not_followed(run: Path, secret: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    workspace = run / "state" / "sandbox" / "c-0"
    shutil.rmtree(workspace)
    (secret.parent / "notes.txt").write_text(SECRET)
    os.symlink(secret.parent, workspace)
    refused(run, capsys, "lost", secret)


def test_a_worker_log_linked_to_dev_zero_is_not_read(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Before: stats read /dev/zero without bound (a MemoryError under a 3 GB cap).
    os.symlink("/dev/zero", run / "logs" / "w9-1.log")
    summary = refused(run, capsys, "stats")
    assert "is a symlink" in summary


def test_a_fifo_in_the_run_directory_is_never_opened(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Opening a FIFO for reading blocks until a writer comes: chaos check would hang for ever.
    notes = run / "state" / "sandbox" / "c-0" / "notes.txt"
    notes.unlink()
    os.mkfifo(notes)
    os.mkfifo(run / "logs" / "w2-1.log")
    code, result, _ = check(run, capsys)
    assert (code, result["verdict"]) == (1, "unknown")
    found = verdicts(result)
    assert found["lost"][0] == "unknown" and "is a FIFO, not a regular file" in found["lost"][1]
    assert found["stats"][0] == "unknown" and "is a FIFO, not a regular file" in found["stats"][1]


def test_a_log_over_its_bound_is_read_from_its_end(run: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_files, "LOG_TAIL", 1000)
    log = run / "logs" / "w3-1.log"
    log.write_text("Traceback (most recent call last):\nOldError: gone\n" + "x" * 2000
                   + "\nTraceback (most recent call last):\nKeyError: 'k'\n")
    code, result, _ = check(run, capsys)
    stats = next(c for c in result["checks"] if c["name"] == "stats")
    assert code == 0 and set(stats["details"]["exceptions"]) == {"KeyError"}
    assert stats["details"]["logs_read_in_part"] == [f"w3-1.log: the last 1000 of {log.stat().st_size} bytes"]


def test_the_reader_refuses_what_would_leave_the_root(tmp_path: Path, secret: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "big").write_bytes(b"x" * 11)
    os.symlink(secret.parent, root / "link")
    cases = {"../outside/secret": "contains '..'", str(secret): "is absolute", "link/secret": "is a symlink",
             "sub/big": "over the 10-byte bound", "sub": "is a directory"}
    for rel, why in cases.items():
        with pytest.raises(run_files.RefusedPath, match=why):
            run_files.read_bytes(root, rel, 10)
    with pytest.raises(FileNotFoundError):
        run_files.read_bytes(root, "sub/missing", 10)
    assert run_files.read_bytes(root, "sub/big", 11) == b"x" * 11


def test_a_run_directory_typed_through_latest_still_checks(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The path the user gives is followed once (runs/X/latest -> <stamp>); only what lies below it is not.
    os.symlink(run.name, run.parent / "latest")
    code, result, _ = check(run.parent / "latest", capsys)
    assert (code, result["verdict"]) == (0, "pass"), verdicts(result)


def _checked(run: Path, verdict: str) -> Path:
    """``run`` with a verdict.json saying ``verdict`` (as a forged or a real one would)."""
    checks = [{"name": "lost", "verdict": verdict, "summary": "as written"}]
    (run / "verdict.json").write_text(json.dumps({"schema": 2, "verdict": verdict, "checks": checks,
                                                  "summary": {"scenario": "containment", "verdict": verdict}}))
    return run


def test_summary_reads_no_run_directory_outside_the_inputs(run: Path, tmp_path: Path) -> None:
    from chaos import ci

    outside = _checked(run, "pass")  # what the summary points at, outside the directory given to `chaos summary`
    given = tmp_path / "artefact"
    given.mkdir()
    (given / ci.SUITE_SUMMARY).write_text(json.dumps({
        "schema": 2, "kind": ci.SUMMARY_KIND, "command": "suite", "status": "complete",
        "runs": [{"scenario": "containment", "seed": 1, "status": "complete", "verdict": "fail",
                  "run_dir": os.path.relpath(outside, given)}]}))
    [row] = ci.merge([given]).rows
    assert row["verdict"] != "pass" and "is not among the inputs" in row["error"], row


def test_reports_do_not_follow_a_latest_link_out_of_the_runs_directory(run: Path, tmp_path: Path) -> None:
    from reports import sources

    runs = tmp_path / "runs"
    stamp = runs / "containment" / "20261126T000000Z"
    shutil.copytree(run, stamp, symlinks=True)
    _checked(stamp, "fail")
    os.symlink(_checked(run, "pass"), runs / "containment" / "latest")  # a pass from elsewhere
    [chosen] = sources.load(runs).chaos
    assert (chosen.path, chosen.verdict) == (stamp, "fail")


def test_a_fifo_for_the_operation_log_ends_the_check_at_once(run: Path) -> None:
    # Read before any checker runs: the check stops, naming the file (never blocking on the FIFO).
    (run / "operations.jsonl").unlink()
    os.mkfifo(run / "operations.jsonl")
    out = subprocess.run([sys.executable, "-m", "chaos", "check", str(run)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "refused:" in out.stderr and "is a FIFO" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("linked", ["event_histories", "event_histories/c-0"])
def test_a_symlinked_event_histories_folder_is_not_followed_and_replay_says_so_in_one_line(
        run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], linked: str) -> None:
    # On Temporal (replay applies): the saved histories, or one workflow's, are a symlink to a folder elsewhere.
    record = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**record, "backend": {"name": "temporal"}}))
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "c-0").mkdir(parents=True)
    (elsewhere / "c-0" / "1-r-1.json").write_text(json.dumps({"events": []}))
    if linked == "event_histories":
        os.symlink(elsewhere, run / "event_histories")
    else:
        (run / "event_histories").mkdir()
        os.symlink(elsewhere / "c-0", run / linked)
    code, result, printed = check(run, capsys)
    verdict, summary = verdicts(result)["replay"]
    assert (code, result["verdict"], verdict) == (1, "unknown", "unknown"), summary
    assert summary == (f"the saved histories cannot be read: refused: {run / linked}: {linked} is a symlink, and "
                       "symlinks inside a run directory are not followed")
    for name, (_, said) in verdicts(result).items():  # no check quotes a traceback
        assert "Traceback" not in said and 'File "' not in said and "\n" not in said, (name, said)
