"""The effects and lost checkers on the external effects service's log (issue 29), on small run directories built
by hand or written by the real service: duplicates counted by identity whatever the keys, a declared "no effects"
agent not applicable (and shown as declared), a lost or doubled note, a crash-after-effect confirmed by the log.
And on the effect ledger (issue 40): a file that is not a ledger is unknown, naming it, never "0 effects"."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import httpx
import pytest

from chaos.checker import effects, injection_evidence, lost
from chaos.checker.run_data import RunData
from chaos.checker.verdict import table_row
from chaos.runner import check
from harness.operations import INFO, OK, OperationLog
from harness.recording import EffectLedger, ExecutionIdentity
from harness.verdict import FAIL, NOT_APPLICABLE, PASS, UNKNOWN, CheckResult
from testbed.effects_service import EffectsService

TOKENS = ("note-0-000001;", "note-1-000002;")


def _run_dir(tmp_path: Path, sends: list[tuple[str, str]], target: dict | None = None,
             effect_log: list[dict] | None = None) -> Path:
    """One conversation planning a note per ``sends`` item (token, completion type); ``effect_log``: the effects
    service's log lines (None: no log)."""
    run = tmp_path / "run"
    (run / "state").mkdir(parents=True)
    oplog = OperationLog(run / "operations.jsonl")
    planned = []
    for n, (token, kind) in enumerate(sends):
        text, expect = f"save the note '{token}'", f"saved note {token}"
        planned.append({"text": text, "expect": expect, "kind": "note", "path": None, "content": token,
                        "match": "exact"})
        op = oplog.invoke("client-0", "send_message", {"conversation": "c-0", "n": n, "text": text,
                                                         "expect": expect, "match": "exact"})
        oplog.complete(op, kind, {"reply": expect} if kind == OK else None,
                         error=None if kind == OK else "TimeoutError")
    oplog.close()
    final = [m for token, kind in sends if kind == OK
             for m in ({"role": "user", "content": f"save the note '{token}'"},
                       {"role": "assistant", "content": f"saved note {token}"})]
    conv = {"workflow_id": "c-0", "planned": planned, "started": True, "final_history": final,
            "final_status": "COMPLETED", "result": None}
    (run / "conversations.json").write_text(json.dumps({"workload": {}, "conversations": [conv]}))
    (run / "run.json").write_text(json.dumps({"schema": 2, "kind": "chaos", "name": "t", "status": "complete",
                                              "target": target or {"effects": "service"}}))
    if effect_log is not None:
        (run / "effects_service.jsonl").write_text("".join(json.dumps(r) + "\n" for r in effect_log))
    return run


def _effect(token: str, key: str | None, n: int) -> dict:
    return {"event": "effect", "time": 1.0 + n, "kind": "note", "identity": f"note:{token}", "text": token,
            "key": key, "note_id": f"n-{n}", "conversation": "c-0", "peer_port": 40000 + n}


def _request(key: str | None, n: int, status: int | None = 200, replayed: bool = False) -> dict:
    return {"event": "request", "time": 1.0 + n, "method": "POST", "path": "/v1/notes", "key": key, "body": "{}",
            "peer_port": 40000 + n, "status": status, "replayed": replayed, "note_id": f"n-{n}"}


def test_one_effect_applied_twice_under_two_distinct_keys_fails_effects_and_lost(tmp_path: Path) -> None:
    """An agent that sends a fresh key on every attempt: the service cannot tell, the identity can."""
    log = [_effect(TOKENS[0], "attempt-1-uuid", 1), _request("attempt-1-uuid", 1, status=None),
           _effect(TOKENS[0], "attempt-2-uuid", 2), _request("attempt-2-uuid", 2)]
    data = RunData(_run_dir(tmp_path, [(TOKENS[0], OK)], effect_log=log))
    got, missing = effects.check(data), lost.check(data)
    print(got.summary, "|", missing.summary)
    assert got.verdict == FAIL and got.details["duplicated_effects"] == 1
    assert got.details["duplicated_examples"][f"note:{TOKENS[0]}"] == {"applied": 2,
                                                                        "keys": ["attempt-1-uuid", "attempt-2-uuid"]}
    assert missing.verdict == FAIL and "applied 2 times" in missing.summary


def test_each_effect_once_passes_with_a_crash_after_effect_and_keyless_requests_reported(tmp_path: Path) -> None:
    log = [_effect(TOKENS[0], "wf/run/1", 1), _request("wf/run/1", 1, status=None),
           {**_request("wf/run/1", 3, replayed=True), "note_id": "n-1"},
           _effect(TOKENS[1], None, 2), _request(None, 2)]
    data = RunData(_run_dir(tmp_path, [(TOKENS[0], OK), (TOKENS[1], OK)], effect_log=log))
    got, missing = effects.check(data), lost.check(data)
    print(got.summary, "|", missing.summary)
    assert got.verdict == PASS and got.details["keyless_requests"] == 1 and got.details["unanswered_effects"] == 1
    assert "1 request(s) sent no Idempotency-Key" in got.summary
    assert missing.verdict == PASS and missing.details["notes_checked"] == 2


def test_an_acknowledged_note_never_applied_is_lost(tmp_path: Path) -> None:
    data = RunData(_run_dir(tmp_path, [(TOKENS[0], OK), (TOKENS[1], INFO)], effect_log=[_effect(TOKENS[1], "k", 1)]))
    got = lost.check(data)
    print(got.summary)
    assert got.verdict == FAIL and got.details["notes_lost"] == 1 and "never applied" in got.summary
    assert TOKENS[0] in got.summary


def test_an_indeterminate_note_may_be_absent(tmp_path: Path) -> None:
    data = RunData(_run_dir(tmp_path, [(TOKENS[0], INFO)], effect_log=[]))
    got = lost.check(data)
    print(got.summary)
    assert got.verdict == PASS and got.details["notes_checked"] == 1


def test_notes_planned_without_a_service_log_are_unknown_not_passed(tmp_path: Path) -> None:
    data = RunData(_run_dir(tmp_path, [(TOKENS[0], OK)], effect_log=None))
    got, counted = lost.check(data), effects.check(data)
    print(got.summary, "|", counted.summary)
    assert got.verdict == UNKNOWN and "no effects service log" in got.summary
    assert counted.verdict == UNKNOWN


def test_declared_no_effects_is_not_applicable_and_shown_as_declared(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [], target={"effects": "none", "effects_reason": "it only does arithmetic",
                                         "checkers": ["effects", "lost"]}, effect_log=[])
    got = effects.check(RunData(run))
    print(got.verdict, got.summary)
    assert got.verdict == NOT_APPLICABLE and got.summary == "declared: it only does arithmetic"
    row = table_row("t", [], [got, CheckResult("lost", PASS, "")])
    assert row["dup_effects"] == "declared" and row["verdict"] == PASS
    _, checks, row = check(run)  # (the checkers the target left out are unknown: the run cannot pass)
    assert {c.name: c.verdict for c in checks}["effects"] == NOT_APPLICABLE and row["dup_effects"] == "declared"


def test_a_torn_last_line_is_left_out_and_said(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [(TOKENS[0], OK)], effect_log=[_effect(TOKENS[0], "k", 1)])
    with open(run / "effects_service.jsonl", "a") as f:
        f.write('{"event": "effect", "time": 2.0, "kind": "no')  # the harness was killed mid-write
    got = effects.check(RunData(run))
    print(got.summary)
    assert got.verdict == PASS and got.details["torn_last_line"] and "cut by a kill" in got.summary


def test_a_damaged_line_in_the_middle_is_unknown(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [(TOKENS[0], OK)], effect_log=[_effect(TOKENS[0], "k", 1)])
    (run / "effects_service.jsonl").write_text('{"event": 5}\n' + json.dumps(_effect(TOKENS[0], "k", 1)) + "\n")
    verdict, checks, _ = check(run, None)
    by = {c.name: c for c in checks}
    print(by["effects"].summary)
    assert by["effects"].verdict == UNKNOWN and "effects_service.jsonl:1" in by["effects"].summary


def test_the_real_service_log_of_fresh_keys_per_attempt_fails_and_of_one_key_passes(tmp_path: Path) -> None:
    for name, keys, verdict in (("fresh", ["a1", "a2"], FAIL), ("stable", ["wf/run/7", "wf/run/7"], PASS)):
        run = _run_dir(tmp_path / name, [(TOKENS[0], OK)], effect_log=None)
        with EffectsService(run / "effects_service.jsonl") as service:
            for key in keys:  # a retry of one tool call
                httpx.post(f"{service.url}/v1/notes", json={"text": TOKENS[0], "conversation": "c-0"},
                           headers={"Idempotency-Key": key})
        got = effects.check(RunData(run))
        print(name, got.verdict, got.summary)
        assert got.verdict == verdict


def test_a_kill_after_an_effect_is_confirmed_by_the_service_log(tmp_path: Path) -> None:
    killed = {"worker": "w1", "identity": "w1-1", "pid": 4242, "killed_at": 1795000000.25}
    log = [_effect(TOKENS[0], "k", 1), {"event": "fault", "time": 2.0, "fault": "crash_after_effect",
                                         "note_id": "n-1", "peer_port": 40001, "outcome": "killed", "killed": killed},
           _request("k", 1, status=None)]
    run = _run_dir(tmp_path, [(TOKENS[0], OK)], effect_log=log)
    data = json.loads((run / "run.json").read_text())
    data["scenario"] = {"cluster": {"crash_at": ["after_effect"]}}
    (run / "run.json").write_text(json.dumps(data))
    ops = [json.loads(line) for line in (run / "operations.jsonl").read_text().splitlines()]
    n = len(ops)
    ops += [{"index": n, "process": "nemesis", "type": "invoke", "f": "kill_worker", "time": 1.5, "wall": 1.5,
             "value": {"when": "busy", "activity": None, "down_s": 0.0, "at": "after_effect",
                       "via": "effects_service"}},
            {"index": n + 1, "process": "nemesis", "type": "ok", "f": "kill_worker", "time": 1.6, "wall": 1.6,
             "invoke_index": n, "value": {**killed, "evidence": [], "aim": {"at": "after_effect"}}}]
    (run / "operations.jsonl").write_text("".join(json.dumps(o) + "\n" for o in ops))
    got = injection_evidence.check(RunData(run))
    print(got.verdict, got.summary, got.details["faults"])
    assert got.verdict == PASS and got.details["landed"] == 1
    assert got.details["faults"][0]["evidence"][0]["response"] == "never sent"
    # A correct agent's retry after the kill, answered from the stored response (replayed: the same note id), is
    # the recovery, not the killed request answered: still confirmed.
    (run / "effects_service.jsonl").write_text("".join(json.dumps(r) + "\n" for r in
                                                       log + [{**_request("k", 1), "peer_port": 40999,
                                                               "replayed": True}]))
    got = injection_evidence.check(RunData(run))
    assert got.verdict == PASS and got.details["landed"] == 1, got.summary
    # The same kill with a log that shows the request answered is not confirmed.
    (run / "effects_service.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log[:2] + [_request("k", 1)]))
    got = injection_evidence.check(RunData(run))
    print(got.verdict, got.summary)
    assert got.verdict == UNKNOWN


def test_the_service_log_of_a_target_that_does_not_declare_it_changes_no_verdict(tmp_path: Path) -> None:
    """The probe: two identical forged POSTs to a reference run's effects service turned it into fail, though the
    reference agent never calls the service. Its log is read only for a target declaring effects = "service":
    here the ledger decides (pass), and the forged lines change nothing."""
    from harness.recording import EffectLedger

    forged = [_effect("forged", "k", 0), _effect("forged", "k2", 1)]
    run = _run_dir(tmp_path, [], target={"ledger": "ledger.sqlite3"}, effect_log=forged)
    with EffectLedger(run / "state" / "ledger.sqlite3"):
        pass  # an empty ledger: no effects applied
    assert effects.check(RunData(run)).verdict == PASS, effects.check(RunData(run)).summary
    # Without a ledger either, unknown (nothing could count its effects), saying what the service saw and why not read.
    (run / "state" / "ledger.sqlite3").unlink()
    result = effects.check(RunData(run))
    assert result.verdict == UNKNOWN and "does not declare effects = \"service\"" in result.summary, result.summary

# -- the effect ledger: a file that is not one ------------------------------------------------------------------

LEDGER_TARGET = {"effects": "ledger", "ledger": "ledger.sqlite3", "model_activity": "plan_next_action"}
#: the columns of the ledger's effects table (harness/recording.py, every schema version)
EFFECTS_COLUMNS = ("idempotency_key, workflow_id, tool, target, digest, state, apply_count, result, first_attempt, "
                   "applied_attempt, updated_at")


def _effects_of(run: Path) -> CheckResult:
    """The effects check as ``chaos check`` gives it (a checker's exception becomes its unknown)."""
    _, checks, _ = check(run)
    return next(c for c in checks if c.name == "effects")


def _sql(ledger: Path, *statements: str) -> None:
    conn = sqlite3.connect(ledger)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


def _a_real_ledger(ledger: Path) -> None:
    """One effect, applied once, recorded as an agent records it."""
    with EffectLedger(ledger) as recorded:
        ident = ExecutionIdentity("c-0", "r-1", "1", 1, "w1")
        execution = recorded.begin_execution(ident, "append_file")
        recorded.apply_once(ident, "append_file", "notes.txt", "d1", lambda: "ok", lambda: False)
        recorded.end_execution(execution, "ok")


@pytest.mark.parametrize("make, said", [
    ("not SQLite", "expected an effect ledger (harness/recording.py), got a file SQLite cannot read (file is not a "
                   "database)"),
    ("empty", "expected an effect ledger (harness/recording.py), got an SQLite database without its meta table "
              "(tables: none)"),
    ("another database", "expected an effect ledger (harness/recording.py), got an SQLite database without its "
                         "meta table (tables: notes)"),
    ("no schema version", "field 'meta': expected an effect ledger (harness/recording.py), got no schema_version in "
                          "its meta table"),
    ("no effects table", "field 'effects': expected a table 'effects' (schema version 4), got none"),
    ("effects of other columns", f"field 'effects': expected the columns {EFFECTS_COLUMNS}, got columns a, b (no "
                                 f"{EFFECTS_COLUMNS})"),
])
def test_a_ledger_that_is_not_one_is_unknown_naming_the_file_never_zero_effects(tmp_path: Path, make: str,
                                                                                said: str) -> None:
    run = _run_dir(tmp_path, [], target=LEDGER_TARGET)
    ledger = run / "state" / "ledger.sqlite3"
    if make == "not SQLite":
        ledger.write_bytes(b"not a database, whatever its name says\n" * 200)
    elif make == "empty":
        ledger.write_bytes(b"")
    elif make == "another database":
        _sql(ledger, "CREATE TABLE notes (text)")
    else:
        _a_real_ledger(ledger)
        _sql(ledger, *{"no schema version": ["DELETE FROM meta"],
                       "no effects table": ["DROP TABLE effects"],
                       "effects of other columns": ["DROP TABLE effects", "CREATE TABLE effects (a, b)"]}[make])
    got = _effects_of(run)
    print(got.summary)
    assert got.verdict == UNKNOWN and got.summary == f"malformed run directory: {ledger}: {said}"


def test_an_empty_ledger_passes_with_no_effects_and_a_missing_one_stays_unknown(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [], target=LEDGER_TARGET)
    ledger = run / "state" / "ledger.sqlite3"
    got = _effects_of(run)
    assert got.verdict == UNKNOWN and got.summary == f"no effect ledger at {ledger}"
    EffectLedger(ledger).close()  # opened by a worker that then recorded nothing: no effect to count
    got = _effects_of(run)
    assert got.verdict == PASS and got.summary.startswith("0 effects applied once each"), got.summary


def test_a_ledger_of_an_older_schema_version_is_still_read(tmp_path: Path) -> None:
    # Schema 2: no executions.kind (the model activity named model calls), no crash_points or mutations tables.
    run = _run_dir(tmp_path, [], target=LEDGER_TARGET)
    ledger = run / "state" / "ledger.sqlite3"
    _a_real_ledger(ledger)
    _sql(ledger, "ALTER TABLE executions DROP COLUMN kind", "ALTER TABLE executions DROP COLUMN scheduled_at",
         "DROP TABLE crash_points", "DROP TABLE mutations", "UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    got = _effects_of(run)
    assert got.verdict == PASS and got.details["logical_effects_applied"] == 1 and got.details["tool_executions"] == 1
    _, checks, _ = check(run)
    assert not [c for c in checks if "malformed" in c.summary], [(c.name, c.summary) for c in checks]
