"""Malformed run directories (issue 28, case 7): ``chaos check``, ``chaos summary`` and ``python -m reports`` say
what is wrong in one line (the file, the field, what was expected) and exit 2 (or 1 where a verdict or a
report still results), never with a traceback.

The examples are the issue's cases; the property test (Hypothesis) mutates a saved run directory and its soak
(run.json, verdict.json, operations.jsonl, conversations.json, soak.json: wrong types, NaN and Infinity,
control characters, deep nesting, truncation, invalid UTF-8, huge strings, symlinks out) and runs all three
commands on it, each under an audit hook recording every file it opens:

    DAH_PROPERTY_EXAMPLES=200 .venv/bin/python -m pytest tests/test_malformed_run_dirs.py -k property -s

prints the figures (examples, outcomes, the slowest command, the largest RSS, files touched outside).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from harness.commands import tool
from tests.events import HANG_S

ROOT = Path(__file__).resolve().parent.parent
LABEL = "kill_mid_turn@checkpoint"
SECRET = "dah-secret-7f3c9e"  # only ever in the sentinel files outside the run directory
#: the property test's bounds per command: its own CPU time (a busy machine's waits are not its work) and peak RSS;
#: a command that hangs without computing is killed at HANG_S and fails on its exit status
MAX_CPU_S, MAX_RSS_MB = 60.0, 1536.0


# ------------------------------------------------------------------------------------------- a saved run


def saved_runs(runs: Path) -> Path:
    """A chaos run directory under ``runs/<LABEL>/`` (returned) and a one-seed soak of it under
    ``runs/soak-<LABEL>/``, written by the harness's own writers (``RunDir``, the operation log, the checkers,
    ``SoakRecord``) as a checkpoint-backend run of kill_mid_turn leaves them; no engine is started (a real
    run takes ~35 s, too long to make per session here)."""
    from testbed.engines.checkpoint.engine import CheckpointEngine
    from chaos.runner import _target_record, check
    from chaos.scenarios import SCENARIOS
    from chaos.runner import Outcome
    from chaos.soak import SoakRecord
    from harness.operations import OK, OperationLog
    from harness.recording import workspace_name
    from harness.rundir import CONVERSATIONS, RunDir

    scenario, backend = SCENARIOS["kill_mid_turn"], CheckpointEngine()
    run = RunDir.create(runs / LABEL)
    reproduce = f"python -m chaos run kill_mid_turn --seed 3 --durability checkpoint"
    run.begin("chaos", LABEL, seed=3, reproduce=reproduce, scenario=asdict(scenario), schedule=[],
              backend=backend.record(), target=_target_record(scenario, backend), checkers=backend.checkers,
              machine={"cores": 2}, phases={})
    oplog = OperationLog(run.operations)
    oplog.event("generator", "phase:setup")
    oplog.event("generator", "phase:warm-up")
    conversations = []
    for n in range(2):
        wid = f"chaos-abc123-{n}"
        text, expect, content = f"append line-{n}; to log-{n}.txt", f"appended 8 bytes to log-{n}.txt", f"line-{n};"
        sent = oplog.invoke(f"client-{n}", "send_message", {"conversation": wid, "n": 0, "text": text,
                                                              "expect": expect, "match": "exact",
                                                              "run_id": f"{wid}-msg-0"})
        if n == 0:
            oplog.event("generator", "phase:faults")
            kill = oplog.invoke("nemesis", "kill_worker", {"when": "busy", "activity": "model", "down_s": 0.5})
            oplog.complete(kill, OK, {"worker": "w1", "identity": "w1-1", "down_s": 0.5, "killed_at": time.time(),
                                        "evidence": [{"workflow_id": f"{wid}-msg-0", "activity": "plan_next_action",
                                                      "attempt": 1, "worker": "w1-1"}]})
        oplog.complete(sent, OK, {"reply": expect, "turn": 1})
        workspace = run.state / "sandbox" / workspace_name(wid)
        workspace.mkdir(parents=True)
        (workspace / f"log-{n}.txt").write_text(content)
        conversations.append({
            "workflow_id": wid, "started": True, "final_status": "COMPLETED", "result": None,
            "planned": [{"text": text, "expect": expect, "kind": "append", "path": f"log-{n}.txt",
                         "content": content, "match": "exact"}],
            "final_history": [{"role": "user", "content": text}, {"role": "assistant", "content": expect}]})
    oplog.event("nemesis", "phase:heal")
    oplog.event("generator", "phase:stopped")
    oplog.close()
    run.write_json(CONVERSATIONS, {"workload": asdict(scenario.workload), "config": {}, "backend": "checkpoint",
                                   "conversations": conversations,
                                   "runs": {c["workflow_id"]: [f"{c['workflow_id']}-msg-0"] for c in conversations}})
    run.logs.mkdir()
    (run.logs / "w1-1.log").write_text("READY\nWARM\n")
    verdict, checks, row = check(run.path)
    run.finish("complete", 1.0)
    soak = SoakRecord(runs, LABEL, [3], f"python -m chaos soak kill_mid_turn --seeds 3", {},
                      scenario=asdict(scenario), backend=backend.record())
    soak.add(Outcome(LABEL, 3, verdict, run.path, 1.0, reproduce, list(checks), dict(row)))
    soak.finish()
    return run.path


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``<tmp>/runs``: the saved run and its soak, to copy for each case."""
    runs = tmp_path_factory.mktemp("pristine") / "runs"
    saved_runs(runs)
    return runs


def _copy(pristine: Path, where: Path) -> tuple[Path, Path, Path]:
    """(runs, the chaos run directory, the soak directory), a fresh copy under ``where``."""
    runs = where / "runs"
    shutil.copytree(pristine, runs, symlinks=True)
    return runs, next((runs / LABEL).glob("2*")), next((runs / f"soak-{LABEL}").glob("2*"))


def _run(args: list[str], cwd: Path, *, audit: Path | None = None) -> dict[str, Any]:
    """One command as a child process: its exit status, output, wall time and peak RSS (``os.wait4``: this
    child's own); with ``audit``, under a hook that appends every path it opens, lists or writes to that file."""
    import tempfile
    import threading

    # The harness's own temporary files (the replayer's private PYTHONPATH dir, tempfile's probe) go under cwd/tmp:
    # written because the harness needs them, not because run data names them
    (cwd / "tmp").mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "MPLCONFIGDIR": str(cwd / "mpl"), "PYTHONPATH": str(ROOT),
           "TMPDIR": str(cwd / "tmp")}
    command = [sys.executable, "-c", AUDITED, str(audit), *args] if audit else [sys.executable, "-m", *args]
    start = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=err)
        timer = threading.Timer(HANG_S, proc.kill)  # a hung command fails the bound, never the suite
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)  # not Popen.wait: wait4 gives this child's own peak RSS
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"code": proc.returncode, "out": out.read().decode(errors="replace"),
                "err": err.read().decode(errors="replace"), "wall_s": time.monotonic() - start,
                "cpu_s": usage.ru_utime + usage.ru_stime,
                "rss_mb": usage.ru_maxrss / 1024}


#: the child under an audit hook: argv = [log file, module, args...]; every path opened (with its mode), listed,
#: renamed or removed is appended to the log as JSON lines, with os.write (no open: the hook must not recurse)
AUDITED = r"""
import json, os, runpy, sys
log = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
EVENTS = {"open", "harness.run_files.open", "os.listdir", "os.scandir", "sqlite3.connect", "os.rename", "os.replace", "os.remove",
          "os.unlink", "os.mkdir", "os.rmdir", "os.symlink", "shutil.copyfile", "shutil.rmtree"}
def hook(event, args):
    if event not in EVENTS or not args:
        return
    two = event in ("os.rename", "os.replace", "os.symlink", "shutil.copyfile")  # (source, destination, ...)
    # a symlink's first argument is what the new link will point to, not a file touched
    paths = [a for a in (args[1:2] if event == "os.symlink" else args[:2 if two else 1])
             if isinstance(a, (str, bytes, os.PathLike))]
    mode = args[1] if event == "open" and len(args) > 1 and isinstance(args[1], str) else ""
    flags = args[2] if event == "open" and len(args) > 2 and isinstance(args[2], int) else 0
    write = event not in ("open", "harness.run_files.open", "os.listdir", "os.scandir", "sqlite3.connect") or any(
        c in mode for c in "wax+") or bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
    # the argument holding each path's directory descriptor, where the call takes one (os.open's event has none)
    fd_at = {"os.rename": (2, 3), "os.replace": (2, 3), "os.remove": (1,), "os.unlink": (1,), "os.mkdir": (2,),
             "os.rmdir": (1,), "os.symlink": (2,)}.get(event, ())
    for n, p in enumerate(paths):
        p = os.fsdecode(p)
        if p in (":memory:", ""):
            continue
        at = args[fd_at[n]] if n < len(fd_at) and len(args) > fd_at[n] else None
        if not os.path.isabs(p) and isinstance(at, int) and not isinstance(at, bool):
            p = os.path.join(os.readlink(f"/proc/self/fd/{at}"), p)  # relative to that folder, not to the cwd
        # a relative path may be relative to a directory descriptor (shutil.rmtree's walk), not to the cwd
        # a name renamed onto, removed or made is that name, not where a link there points (an open follows it)
        if not os.path.isabs(p):
            path = p
        elif event == "open" or event == "harness.run_files.open" or not write:
            path = os.path.realpath(p)
        else:
            path = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
        os.write(log, (json.dumps({"event": event, "path": path, "write": write}) + "\n").encode())
sys.addaudithook(hook)
module = sys.argv[2]
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def _check(run_dir: Path, cwd: Path, **kw: Any) -> dict[str, Any]:
    return _run(["chaos", "check", str(run_dir)], cwd, **kw)


def _summary(runs: Path, cwd: Path, **kw: Any) -> dict[str, Any]:
    out = cwd / "out"
    return _run(["chaos", "summary", str(runs), "--summary", str(out / "summary.json"), "--junit",
                 str(out / "junit.xml")], cwd, **kw)


def _reports(runs: Path, cwd: Path, **kw: Any) -> dict[str, Any]:
    return _run(["reports", "--runs", str(runs), "--out", str(cwd / "out" / "report")], cwd, **kw)


def _one_line_naming(result: dict[str, Any], file: Path) -> str:
    """The one stderr line naming ``file``; no traceback anywhere."""
    assert "Traceback" not in result["out"] + result["err"], result["err"][-3000:]
    lines = [line for line in result["err"].splitlines() if str(file) in line]
    assert len(lines) == 1, result["err"][-3000:]
    return lines[0]


# ---------------------------------------------------------------------------------------- the cases


@pytest.mark.parametrize("content, expected", [
    (b"[1, 2]", "run.json: expected an object, got a list"),
    (b"this is not JSON", "run.json: expected JSON, got a syntax error at line 1 column 1: Expecting value"),
    (b'{"kind": "chaos", "name": "caf\xe9"}', "run.json: expected UTF-8 text, got byte 0xe9 at offset 30"),
    (b"[" * 200_000 + b"]" * 200_000, "run.json: expected JSON nested at most 200 deep, got 200000 levels"),
    (b'{"kind": "chaos", "target": 5}', "run.json: field 'target': expected an object or null, got 5"),
    (b'{"kind": "chaos", "seed": Infinity}', "run.json: field 'seed': expected a finite number, got Infinity"),
], ids=["a list", "not JSON", "invalid UTF-8", "nested 200000 deep", "target 5", "seed Infinity"])
def test_check_says_what_is_wrong_with_run_json_in_one_line(pristine: Path, tmp_path: Path, content: bytes,
                                                             expected: str) -> None:
    _, run_dir, _ = _copy(pristine, tmp_path)
    (run_dir / "run.json").write_bytes(content)
    result = _check(run_dir, tmp_path)
    assert result["code"] == 2 and result["out"] == "", result
    assert result["err"] == f"{tool('chaos', tmp_path)} check: {run_dir}/{expected}\n"
    _one_line_naming(result, run_dir / "run.json")


def test_check_names_the_operations_line_that_is_a_string(pristine: Path, tmp_path: Path) -> None:
    _, run_dir, _ = _copy(pristine, tmp_path)
    lines = (run_dir / "operations.jsonl").read_text().splitlines()
    lines[2] = json.dumps("send_message")
    (run_dir / "operations.jsonl").write_text("\n".join(lines) + "\n")
    result = _check(run_dir, tmp_path)
    assert result["code"] == 2
    assert result["err"] == (f"{tool('chaos', tmp_path)} check: {run_dir}/operations.jsonl:3: expected an object, "
                             "got 'send_message'\n")


def test_a_malformed_conversations_file_is_an_unknown_check_naming_the_field(pristine: Path, tmp_path: Path) -> None:
    # Only checkers read it: their verdict is unknown, and the summary says which file and field, no traceback.
    _, run_dir, _ = _copy(pristine, tmp_path)
    doc = json.loads((run_dir / "conversations.json").read_text())
    doc["conversations"][1]["planned"][0]["text"] = 7
    (run_dir / "conversations.json").write_text(json.dumps(doc))
    result = _check(run_dir, tmp_path)
    assert result["code"] == 1 and "Traceback" not in result["out"] + result["err"], result
    assert (f"lost                 unknown         malformed run directory: {run_dir}/conversations.json: field "
            "'conversations[1].planned[0].text': expected a string, got 7") in result["out"]
    assert "verdict: unknown" in result["out"]


def test_summary_counts_a_run_nested_200000_deep_as_an_error_and_goes_on(pristine: Path, tmp_path: Path) -> None:
    runs, run_dir, _ = _copy(pristine, tmp_path)
    other = tmp_path / "other" / "kill_idle" / run_dir.name  # a second CI job's run, readable
    shutil.copytree(run_dir, other)
    record = (other / "run.json").read_text()
    (other / "run.json").write_text(record.replace(f'"name": "{LABEL}"', '"name": "kill_idle"'))
    (run_dir / "run.json").write_bytes(b'{"a": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    result = _run(["chaos", "summary", str(runs), str(other.parent.parent), "--summary",
                   str(tmp_path / "out" / "summary.json"), "--junit", str(tmp_path / "out" / "junit.xml")], tmp_path)
    assert result["code"] == 1, result  # the other run is merged: a verdict table results, never a pass
    line = _one_line_naming(result, run_dir / "run.json")
    assert line == (f"{tool('chaos', tmp_path)} summary: unreadable: {run_dir}/run.json: expected JSON nested at most 200 "
                    "deep, got 200001 levels")
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert sorted((r["scenario"], r["verdict"], r["status"]) for r in doc["runs"]) == [
        ("kill_idle", "unknown", "complete"), (LABEL, "error", "unreadable")]
    assert doc["all_passed"] is False
    # Nothing readable at all: exit 2.
    only = _summary(runs, tmp_path)
    assert only["code"] == 2 and _one_line_naming(only, run_dir / "run.json"), only


@pytest.mark.slow
def test_reports_skips_a_run_nested_200000_deep_naming_it(pristine: Path, tmp_path: Path) -> None:
    runs, run_dir, soak_dir = _copy(pristine, tmp_path)
    lines = (run_dir / "operations.jsonl").read_bytes().splitlines()
    (run_dir / "run.json").write_bytes(b'{"kind": "chaos", "x": ' + b"{\"a\": " * 200_000 + b"1" + b"}" * 200_001)
    result = _reports(runs, tmp_path)
    assert result["code"] == 1, result  # written (the soak), without the malformed run
    line = _one_line_naming(result, run_dir / "run.json")
    assert line.endswith(f"{run_dir}/run.json: expected JSON nested at most 200 deep, got 200001 levels")
    assert "skipped" in line
    # A damaged operations line is only part of a run: used without it.
    (run_dir / "run.json").write_bytes((pristine / LABEL / run_dir.name / "run.json").read_bytes())
    (run_dir / "operations.jsonl").write_bytes(b"\n".join([*lines[:3], b"[" * 200_000, *lines[3:]]) + b"\n")
    assert _reports(runs, tmp_path)["code"] == 0
    # Nothing usable at all: exit 2.
    (soak_dir / "soak.json").write_bytes(b"[" * 200_000)
    (run_dir / "run.json").write_bytes(b"[" * 200_000)
    assert _reports(runs, tmp_path)["code"] == 2


def test_reports_with_seed_infinity_says_so_instead_of_overflowing(pristine: Path, tmp_path: Path) -> None:
    runs, run_dir, _ = _copy(pristine, tmp_path)
    record = (run_dir / "run.json").read_text().replace('"seed": 3', '"seed": Infinity')
    assert "Infinity" in record
    (run_dir / "run.json").write_text(record)
    result = _reports(runs, tmp_path)
    assert result["code"] == 1, result
    line = _one_line_naming(result, run_dir / "run.json")
    assert line.endswith(f"{run_dir}/run.json: field 'seed': expected a finite number, got Infinity")


def test_a_table_cell_of_infinity_renders() -> None:
    from reports.tables import cell

    assert cell(float("inf"), "d") == "inf" and cell(float("-inf"), ".1f") == "-inf" and cell(3.0, "d") == "3"


# ------------------------------------------------------------------------------------- the property test

#: the files a mutation lands in (the soak's own soak.json included), relative to the chaos run directory or,
#: with a ``soak:`` prefix, to the soak's
FILES = ("run.json", "verdict.json", "operations.jsonl", "conversations.json", "soak:soak.json", "soak:run.json")
_DEEP = [150, 201, 5_000, 200_000]
VALUES = st.one_of(
    st.sampled_from([b"5", b'"x"', b"[]", b"{}", b"null", b"true", b"-1", b"1.5", b"1e308", b"-0",
                     b"123456789012345678901234567890", b"NaN", b"Infinity", b"-Infinity"]),
    st.text(alphabet=st.sampled_from("\x00\x01\x07\x1b\x7f\u2028\ud7ff[]{}\"\\a/é"), max_size=30).map(
        lambda t: json.dumps(t).encode()),  # control characters and brackets, escaped (valid JSON)
    st.sampled_from([b'"\x00\x1b[31m raw"', b'"tab\there"']),  # raw control characters: not JSON
    st.sampled_from(_DEEP).map(lambda n: b"[" * n + b"]" * n),
    st.sampled_from(_DEEP).map(lambda n: b'{"a": ' * n + b"1" + b"}" * n),
    st.sampled_from(_DEEP).map(lambda n: b"[" * n),  # never closed
    st.sampled_from([1_000, 1_000_000, 20_000_000]).map(lambda n: b'"' + b"A" * n + b'"'),
)
#: what a mutation does: a value somewhere in the file, or the file itself
MUTATIONS = st.one_of(
    st.tuples(st.just("value"), st.sampled_from(FILES), st.floats(0, 1, exclude_max=True), VALUES),
    st.tuples(st.just("truncate"), st.sampled_from(FILES), st.floats(0, 1, exclude_max=True), st.just(b"")),
    st.tuples(st.just("bytes"), st.sampled_from(FILES), st.floats(0, 1, exclude_max=True),
              st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\n"])),
    st.tuples(st.just("remove"), st.sampled_from(FILES), st.just(0.0), st.just(b"")),
    st.tuples(st.just("grow"), st.sampled_from(FILES), st.just(0.0), st.sampled_from([10_000, 100_000])),
)
#: mutations that point outside the run directory: symlinks, and paths in run data (case 3)
ESCAPES = st.tuples(st.sampled_from(["symlink", "path"]), st.sampled_from(
    (*FILES, "logs/w1-1.log", "workspace")), st.floats(0, 1, exclude_max=True), st.just(b""))
_HOLE = "\x00hole\x00"


def _value_paths(doc: Any, at: tuple = (), depth: int = 5) -> list[tuple]:
    out = [at]
    if depth and isinstance(doc, dict):
        out += [p for k, v in doc.items() for p in _value_paths(v, (*at, k), depth - 1)]
    elif depth and isinstance(doc, list):
        out += [p for i, v in enumerate(doc) for p in _value_paths(v, (*at, i), depth - 1)]
    return out


def _with_value(text: bytes, where: float, raw: bytes) -> bytes:
    """``text`` (JSON) with the value at the ``where``-th of its paths replaced by ``raw`` bytes (not JSON, as
    an earlier mutation may leave it: ``raw`` inserted at that fraction of it)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return text[:int(where * len(text))] + raw + text[int(where * len(text)):]
    paths = _value_paths(doc)
    path = paths[int(where * len(paths))]
    if not path:
        return raw
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = _HOLE
    return json.dumps(doc, indent=1).encode().replace(json.dumps(_HOLE).encode(), raw)


def _mutate(run_dir: Path, soak_dir: Path, outside: Path, mutation: tuple) -> None:
    kind, name, where, payload = mutation
    base = soak_dir if name.startswith("soak:") else run_dir
    file = base / name.removeprefix("soak:")
    if kind == "symlink":
        target = outside / ("secret.json" if name.endswith("json") else "secret.txt")
        if name == "workspace":
            file = next((run_dir / "state" / "sandbox").glob("*/log-*.txt"))
        file.unlink(missing_ok=True)
        file.symlink_to(target)
        return
    if kind == "path":  # a path in the run's data naming the secret: ../ out of the workspace, or absolute
        if (run_dir / "conversations.json").is_symlink():
            return  # an earlier mutation already points it outside (writing through it would change a sentinel)
        doc = json.loads((run_dir / "conversations.json").read_text())
        planned = doc["conversations"][0]["planned"][0]
        planned["path"] = "../../../../../../outside/secret.txt" if where < 0.5 else str(outside / "secret.txt")
        (run_dir / "conversations.json").write_text(json.dumps(doc))
        return
    data = file.read_bytes() if file.exists() else b""
    if kind == "remove":
        file.unlink(missing_ok=True)
    elif kind == "truncate":
        file.write_bytes(data[:int(where * len(data))])
    elif kind == "bytes":
        at = int(where * len(data))
        file.write_bytes(data[:at] + payload + data[at:])
    elif kind == "grow":  # many lines of the log (or one file padded by that many spaces)
        if file.suffix == ".jsonl":
            file.write_bytes(data + (data.splitlines(keepends=True) or [b"\n"])[-1] * payload)
        else:
            file.write_bytes(data.rstrip() + b" " * payload * 100)
    elif file.suffix == ".jsonl":
        lines = data.splitlines() or [b""]
        n = int(where * len(lines))
        lines[n] = _with_value(lines[n], (where * len(lines)) % 1, payload).replace(b"\n", b" ")
        file.write_bytes(b"\n".join(lines) + b"\n")
    else:
        file.write_bytes(_with_value(data, where, payload))


def _allowed_roots() -> list[str]:
    """Where a command may read besides its inputs: the interpreter, the harness's own source, the system."""
    import sysconfig

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(ROOT), *sysconfig.get_paths().values(),
             "/proc", "/sys", "/dev", "/etc", "/usr", "/lib", "/lib64", "/opt",
             *(os.path.expanduser(d) for d in ("~/.fonts", "~/.local/share/fonts", "~/.local/share"))}
    return sorted({os.path.realpath(r) for r in roots if r})


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _figures() -> dict[str, Any]:
    """What a property test saw, over its examples: what the lead quotes."""
    return {"examples": 0, "outcomes": Counter(), "max_wall_s": 0.0, "max_cpu_s": 0.0, "max_rss_mb": 0.0,
            "touched_outside": []}


def _property(pristine: Path, base: Path, mutations: list[tuple], figures: dict[str, Any]) -> None:
    """Mutate a copy, run check, summary and reports on it at once, each under the audit hook; assert the
    property and add to ``figures``."""
    import tempfile

    ex = Path(tempfile.mkdtemp(dir=base))
    outside = ex / "outside"  # sentinels: nothing may read or change them
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    (outside / "secret.json").write_text(json.dumps({"conversations": [], "secret": SECRET, "kind": "chaos"}))
    sentinels = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in outside.iterdir()}
    runs, run_dir, soak_dir = _copy(pristine, ex)
    for m in mutations:
        _mutate(run_dir, soak_dir, outside, m)
    (ex / "out").mkdir()
    commands = {"check": lambda: _check(run_dir, ex, audit=ex / "check.audit"),
                "summary": lambda: _summary(runs, ex, audit=ex / "summary.audit"),
                "reports": lambda: _reports(runs, ex, audit=ex / "reports.audit")}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(commands)) as pool:  # at once: each mostly waits on its imports
        results = dict(zip(commands, pool.map(lambda c: commands[c](), commands)))
    reads_ok = [str(ex / "runs"), str(ex / "out"), str(ex / "mpl"), str(ex / "tmp"), *_allowed_roots()]
    listed_ok = {str(ex), "."}  # the working directory, as the import system lists it
    writes_ok = [str(ex / "runs"), str(ex / "out"), str(ex / "mpl"), str(ex / "tmp"), "/dev/null"]
    touched = []
    for name, r in results.items():
        said = f"{name} after {mutations}: exit {r['code']}\n{r['err'][-2000:]}"
        figures["outcomes"][f"{name} {r['code']}"] += 1
        figures["max_wall_s"] = max(figures["max_wall_s"], r["wall_s"])
        figures["max_cpu_s"] = max(figures["max_cpu_s"], r["cpu_s"])
        figures["max_rss_mb"] = max(figures["max_rss_mb"], r["rss_mb"] or 0)
        assert r["code"] in (0, 1, 2), said
        assert "Traceback" not in r["out"] + r["err"], said
        assert r["cpu_s"] < MAX_CPU_S and (r["rss_mb"] or 0) < MAX_RSS_MB, (said, r["cpu_s"], r["rss_mb"])
        assert SECRET not in r["out"] + r["err"], said
        removing = False  # inside an allowed shutil.rmtree: its relative paths are relative to what it removes
        for line in (ex / f"{name}.audit").read_text().splitlines():
            event = json.loads(line)
            if event["path"] in listed_ok and event["event"] in ("os.listdir", "os.scandir"):
                continue
            if event["event"] == "shutil.rmtree":
                removing = _inside(event["path"], writes_ok) and not _inside(event["path"], [str(outside)])
            if not os.path.isabs(event["path"]):
                if removing:
                    continue
                if event["event"] == "open" and ".." not in Path(event["path"]).parts:
                    continue  # relative to a directory descriptor: harness.run_files' own event names the file
                event["path"] = os.path.realpath(ex / event["path"])  # relative to the working directory
            if _inside(event["path"], [str(outside)]) or not _inside(event["path"], writes_ok if event["write"]
                                                                       else reads_ok):
                touched.append((name, event["event"], event["path"], event["write"]))
    figures["touched_outside"] += touched
    figures["examples"] += 1
    for p, (content, mtime) in sentinels.items():
        assert p.read_bytes() == content and p.stat().st_mtime_ns == mtime, f"{p} changed after {mutations}"
    for here, _, files in os.walk(ex):  # what the commands wrote (symlinks not followed) never holds the secret
        for f in files:
            path = Path(here) / f
            if not path.is_symlink() and outside not in path.parents and SECRET.encode() in path.read_bytes():
                pytest.fail(f"{path} holds the secret after {mutations}")
    assert not touched, f"opened outside the run directory after {mutations}: {touched[:5]}"
    shutil.rmtree(ex)


def _examples(default: int) -> int:
    return int(os.environ.get("DAH_PROPERTY_EXAMPLES") or default)


#: a failing example's message names its mutations (derandomized: the same ones each run); shrinking would
#: cost minutes of three-command examples
NO_SHRINKING = (Phase.explicit, Phase.generate)
#: ~15 s an example on a loaded 2-core machine
TIMEOUT_S = max(300, 30 * _examples(5))


def _hold(pristine: Path, base: Path, mutations: st.SearchStrategy, examples: int, what: str) -> None:
    """The property over ``examples`` lists of ``mutations``; its figures printed whatever the outcome."""
    figures = _figures()

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True, phases=NO_SHRINKING,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(st.lists(mutations, min_size=1, max_size=3))
    def mutated(mutations: list[tuple]) -> None:
        _property(pristine, base, mutations, figures)

    try:
        mutated()
    finally:
        print(f"\n{what}: {figures['examples']} example(s); outcomes {dict(sorted(figures['outcomes'].items()))}; "
              f"slowest command {figures['max_wall_s']:.1f} s ({figures['max_cpu_s']:.1f} s of CPU); largest RSS {figures['max_rss_mb']:.0f} MB; files "
              f"touched outside the run directory: {len(figures['touched_outside'])}")


@pytest.mark.timeout(TIMEOUT_S)
@pytest.mark.slow
def test_property_malformed_run_dirs_are_one_line_bounded_and_contained(
        pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    _hold(pristine, tmp_path_factory.mktemp("property"), MUTATIONS, _examples(5), "malformed run directories")


@pytest.mark.timeout(TIMEOUT_S)
def test_property_links_and_paths_out_of_the_run_dir_are_not_followed(
        pristine: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    _hold(pristine, tmp_path_factory.mktemp("escapes"), ESCAPES, _examples(2), "links and paths out")


# ------------------------------------------- the property test: what a received directory names (issue 40)

#: a target file that is the reference agent declared as one: what a run made here names, and replays with
OWN_TARGET = f'''name = "reference-as-a-target"
worker = ["{{python}}", "-m", "testbed", "worker", "--address", "{{address}}", "--task-queue", "{{task_queue}}",
          "--identity", "{{identity}}"]
driver = "testbed.engines.temporal.driver:Driver"
workflow = "agent.workflow:AgentWorkflow"
cwd = "{ROOT}"
'''
#: a target file a received directory may carry or point at: run, its commands write the marker
PAYLOAD = '''name = "payload"
worker = ["sh", "payload.sh", "{address}", "{task_queue}"]
driver = "testbed.engines.temporal.driver:Driver"
replay_command = ["sh", "payload.sh", "{history}", "{workflow_id}"]
'''
NOBODY = 65534
#: where a mutation puts the target file run.json names, and which fields name it
TARGET_PLACES = ("inside-relative", "inside-absolute", "climbing", "nobodys", "group-writable", "dir-others-write",
                 "link-to-nobodys", "missing", "yours")
HOSTILE = st.text(alphabet=st.sampled_from("ab-_./$()`;| \n\x00~é\u202e{}"), min_size=0, max_size=24)
RECEIVED = st.one_of(
    st.tuples(st.just("target"), st.sampled_from(TARGET_PLACES), st.sampled_from(["source", "target_file", "both"])),
    st.tuples(st.just("signature"), st.sampled_from(["strip", "foreign", "garbage", "link-outside", "resign",
                                                     "resign"]), st.just("")),
    st.tuples(st.just("scenario_name"), HOSTILE, st.just("")),
    st.tuples(st.just("event_op"), HOSTILE, st.just("")),
    st.tuples(st.just("workflow_folder"), HOSTILE.filter(lambda t: t not in ("", ".", "..") and "/" not in t
                                                         and "\x00" not in t), st.just("")),
    st.tuples(st.just("out"), st.sampled_from(["nobodys", "others-write", "link-outside", "scenario-link"]),
              st.just("")),
)


@pytest.fixture(scope="module")
async def own_target_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real run of a target file, made here (so signed by this user): (run dir, target file)."""
    from dataclasses import replace

    from chaos.runner import run
    from chaos.scenarios import SCENARIOS, ClusterSpec
    from testbed.engines import make_engine
    from testbed.engines.workload import Workload
    from testbed.engines.byo.target import load_target

    folder = tmp_path_factory.mktemp("own-target")
    os.chmod(folder, 0o755)
    good = folder / "chaos-target.toml"
    good.write_text(OWN_TARGET)
    scenario = replace(SCENARIOS["kill_idle"], name="received", events=(), random_events=0, warmup_s=0.5,
                       fault_s=0.5, settle_s=30.0, final_s=30.0, cluster=ClusterSpec(workers=1),
                       workload=Workload(conversations=1, messages=1, append_ratio=0.0, until_heal=False))
    result = await run(scenario, make_engine(target=load_target(good), target_file=good), seed=1,
                       out_root=folder / "runs")
    replay = next(c for c in result.checks if c.name == "replay")
    assert replay.verdict == "pass", replay.summary  # the run made here replays with the target file it names
    return result.run_dir, good


class _Audit:
    """What this process does while ``on``: every command it starts, and every file it writes, renames, links or
    removes (Python's audit events)."""

    def __init__(self) -> None:
        self.on, self.spawned, self.written = False, [], []
        sys.addaudithook(self)

    def __call__(self, event: str, args: tuple) -> None:
        if not self.on:
            return
        if event in ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.system", "os.spawn"):
            self.spawned.append(repr(args)[:300])
        elif event == "open" and len(args) > 1 and isinstance(args[1], str) and set(args[1]) & set("wax+"):
            self.written.append(os.fspath(args[0]) if isinstance(args[0], (str, bytes, os.PathLike)) else args[0])
        elif event == "open" and len(args) > 2 and isinstance(args[2], int) and args[2] & (os.O_WRONLY | os.O_RDWR):
            self.written.append(args[0])
        elif event in ("os.rename", "os.remove", "os.rmdir", "os.symlink", "os.link", "os.mkdir", "shutil.rmtree"):
            self.written.append(args[0] if event not in ("os.rename",) else args[1])


_AUDIT: list[_Audit] = []


def _received(base: Path, good: Path, ex: Path, outside: Path, mutations: list[tuple]) -> tuple[Path, Path, bool]:
    """A copy of ``base`` with ``mutations``: (the run directory, the --out folder for a rerun, whether a rerun of
    it would still be yours alone: signed by you, naming your own target file as the one to run
    (``backend.target_file``), with a scenario and an out folder a rerun may use)."""
    import secrets as _secrets

    from harness import signing

    run = ex / "received"
    shutil.copytree(base, run, symlinks=True)
    record = json.loads((run / "run.json").read_text())
    out = ex / "out"
    out.mkdir()
    resign, legit = "stale", True  # by default as received: run.json edited, its old run.sig left beside it
    (run / "payload.sh").write_text(f"echo ran >> {outside / 'ran'}\n")
    for kind, what, field in mutations:
        if kind == "target":
            legit = legit and (what == "yours" or field == "source")  # a rerun runs backend.target_file
            place = {"inside-relative": "chaos-target.toml", "inside-absolute": str(run / "chaos-target.toml"),
                     "climbing": str(run / ".." / "received" / "chaos-target.toml"),
                     "nobodys": str(ex / "theirs" / "chaos-target.toml"),
                     "group-writable": str(ex / "gw" / "chaos-target.toml"),
                     "dir-others-write": str(ex / "open" / "chaos-target.toml"),
                     "link-to-nobodys": str(ex / "link" / "chaos-target.toml"),
                     "missing": str(ex / "missing.toml"), "yours": str(good)}[what]
            (run / "chaos-target.toml").write_text(PAYLOAD)
            if what in ("nobodys", "group-writable", "dir-others-write", "link-to-nobodys"):
                folder = Path(place).parent
                folder.mkdir(exist_ok=True)
                real = folder / "real.toml" if what == "link-to-nobodys" else Path(place)
                real.write_text(PAYLOAD.replace("payload.sh", str(run / "payload.sh")))
                if what in ("nobodys", "link-to-nobodys"):
                    os.chown(real, NOBODY, NOBODY)
                if what == "group-writable":
                    real.chmod(0o664)
                if what == "dir-others-write":
                    folder.chmod(0o777)
                if what == "link-to-nobodys" and not os.path.lexists(place):
                    Path(place).symlink_to(real)
            if field in ("source", "both"):
                record["target"] = {**record["target"], "source": place, "workflow": None}
            if field in ("target_file", "both"):
                record["backend"] = {**record["backend"], "target_file": place}
        elif kind == "signature":
            resign = True if what == "resign" else what
            if what == "foreign":
                resign = "foreign"
            elif what == "garbage":
                resign = "garbage"
            elif what == "link-outside":
                resign = "link"
            elif what == "strip":
                resign = "strip"
        elif kind == "scenario_name":
            legit = False
            record["scenario"]["name"] = what
        elif kind == "event_op":
            legit = False
            record["scenario"]["events"] = [{"at_s": 0.5, "op": what, "args": {}}]
        elif kind == "workflow_folder":
            histories = run / "event_histories"
            first = next(histories.iterdir())
            first.rename(histories / what)
        elif kind == "out":
            legit = False
            if what == "nobodys":
                os.chown(out, NOBODY, NOBODY)
            elif what == "others-write":
                out.chmod(0o777)
            elif what == "link-outside":  # a link of theirs to a folder of theirs
                theirs = ex / "their-out"
                theirs.mkdir(exist_ok=True)
                os.chown(theirs, NOBODY, NOBODY)
                shutil.rmtree(out) if not out.is_symlink() else out.unlink()
                out.symlink_to(theirs)
                os.lchown(out, NOBODY, NOBODY)
            elif what == "scenario-link" and not out.is_symlink():
                name = record["scenario"]["name"]
                link = out / name if isinstance(name, str) and "/" not in name and name else out / "x"
                if not link.is_symlink():  # the same mutation drawn twice: one link
                    link.symlink_to(outside)
    data = json.dumps(record, indent=1).encode()
    (run / "run.json").write_bytes(data)
    sig = run / signing.SIGNATURE
    if resign != "stale" or data == (base / "run.json").read_bytes():
        sig.unlink(missing_ok=True)
    if resign is True:
        signing.sign(run / "run.json", data)
    elif resign == "foreign":
        sig.write_text(signing.signature(data, key=_secrets.token_bytes(32)))
    elif resign == "garbage":
        sig.write_bytes(b"hmac-sha256 " + b"\xff" * 70)
    elif resign == "link":
        sig.symlink_to(outside / "secret.txt")
    if resign is not True:
        legit = False
    return run, out, legit


def _hold_received(own_target_run: tuple[Path, Path], base: Path, examples: int) -> dict[str, Any]:
    from chaos.runner import check
    from chaos.saved import rerun_job
    from harness.rundir import RunDirError
    from harness.run_files import RefusedPath
    from harness.commands import own_out

    if not _AUDIT:
        _AUDIT.append(_Audit())
    audit = _AUDIT[0]
    run_dir, good = own_target_run
    figures = {"examples": 0, "replayed_with_your_target": 0, "reruns_accepted": 0, "commands_run": 0,
               "touched_outside": 0, "outcomes": Counter()}

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True, phases=NO_SHRINKING,
              suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    @given(st.lists(RECEIVED, min_size=1, max_size=3))
    def received(mutations: list[tuple]) -> None:
        import tempfile

        ex = Path(tempfile.mkdtemp(dir=base))
        outside = ex / "outside"
        outside.mkdir()
        (outside / "secret.txt").write_text(SECRET + "\n")
        sentinels = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in outside.iterdir()}
        run, out, legit = _received(run_dir, good, ex, outside, mutations)
        audit.spawned, audit.written, audit.on = [], [], True
        try:
            verdict, checks, _ = check(run)
            try:
                scenario, engine, _ = rerun_job(run)
                own_out(out, scenario.name + engine.suffix)  # what the command checks before it starts anything
                accepted = True
            except (ValueError, RunDirError, RefusedPath):
                accepted = False
        finally:
            audit.on = False
        replay = next(c for c in checks if c.name == "replay")
        said = f"after {mutations}: replay {replay.verdict}: {replay.summary[:300]}; spawned {audit.spawned[:3]}"
        payload = [s for s in audit.spawned if "payload" in s or "'sh'" in s]
        outside_writes = [w for w in audit.written if not isinstance(w, int)
                          and not str(os.path.realpath(os.fspath(w))).startswith(str(ex) + "/")
                          or str(os.path.realpath(os.fspath(w))).startswith(str(outside))]
        figures["commands_run"] += len(payload)
        outside_writes = [w for w in outside_writes if "/tmp/dah-" not in str(w)]
        figures["touched_outside"] += len(outside_writes)
        figures.setdefault("touched", []).extend(str(w)[:200] for w in outside_writes[:3])
        figures["replayed_with_your_target"] += replay.details.get("replayed_with", "").startswith("the target file")
        figures["reruns_accepted"] += accepted
        figures["outcomes"][f"replay {replay.verdict}, rerun {'accepted' if accepted else 'refused'}"] += 1
        figures["examples"] += 1
        assert not payload, said
        assert not (outside / "ran").exists(), said
        for p, (content, mtime) in sentinels.items():
            assert p.read_bytes() == content and p.stat().st_mtime_ns == mtime, said
        assert not accepted or legit, f"rerun accepted {mutations}"
        if replay.details.get("replayed_with", "").startswith("the target file"):  # replayed with a target file:
            assert replay.details["replayed_with"].startswith(f"the target file {good} "), said  # only your own
        shutil.rmtree(ex)

    try:
        received()
    finally:
        if figures.get("touched"):
            print(f"\nwritten outside: {figures['touched'][:12]}")
        print(f"\nreceived run directories: {figures['examples']} example(s); {dict(figures['outcomes'])}; "
              f"commands run from the directory: {figures['commands_run']}; files touched outside: "
              f"{figures['touched_outside']}; replays with your own target: {figures['replayed_with_your_target']}")
    return figures


@pytest.mark.timeout(max(600, 6 * _examples(100)))
def test_property_a_received_run_directory_runs_nothing_it_names_and_writes_nowhere_else(
        own_target_run: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Target files inside the directory or another user's, signatures stripped, foreign or stale, hostile scenario
    names, faults and workflow folders, and --out folders others own or can write: over 100 examples, check and
    rerun run no command the directory names and write nothing outside it."""
    base = tmp_path_factory.mktemp("received")
    os.chmod(base, 0o755)
    figures = _hold_received(own_target_run, base, _examples(100))
    assert figures["commands_run"] == 0 and figures["touched_outside"] == 0, figures
