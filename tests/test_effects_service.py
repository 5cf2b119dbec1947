"""testbed.effects_service over real HTTP: keys de-duplicate, keyless requests apply every time, malformed and
oversized bodies are refused, the admin routes need the token, every request and effect is logged, and a caller's
TCP port is traced to the worker process (a real child) that holds the connection."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from testbed.effects_service import MAX_BODY_BYTES, EffectsService, identity
from testbed.faults.effects import EffectFault, caller_pid
from tests.events import HANG_S, wait_for, wait_for_async


def log_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_repeated_key_is_replayed_and_applies_nothing(tmp_path: Path) -> None:
    with EffectsService(tmp_path / "effects.jsonl") as service:
        first = httpx.post(f"{service.url}/v1/notes", json={"text": "note-1;", "conversation": "c1"},
                           headers={"Idempotency-Key": "wf/run/1"})
        again = httpx.post(f"{service.url}/v1/notes", json={"text": "note-1;", "conversation": "c1"},
                           headers={"Idempotency-Key": "wf/run/1"})
        listed = httpx.get(f"{service.url}/v1/notes").json()
    print(first.json(), again.json(), listed)
    assert first.status_code == again.status_code == 200
    assert first.json() == {"note_id": "n-1", "text": "note-1;", "replayed": False}
    assert again.json() == {"note_id": "n-1", "text": "note-1;", "replayed": True}
    assert listed == {"notes": [{"note_id": "n-1", "text": "note-1;", "conversation": "c1"}]}
    effects = [r for r in log_lines(tmp_path / "effects.jsonl") if r["event"] == "effect"]
    assert [(e["identity"], e["key"], e["note_id"], e["conversation"]) for e in effects] == [
        (identity("note", "note-1;"), "wf/run/1", "n-1", "c1")]


def test_a_keyless_request_is_applied_every_time_and_logged_as_keyless(tmp_path: Path) -> None:
    with EffectsService(tmp_path / "effects.jsonl") as service:
        answers = [httpx.post(f"{service.url}/v1/notes", json={"text": "same"}).json() for _ in range(2)]
        stats = service.stats()
    print(answers, stats)
    assert [a["note_id"] for a in answers] == ["n-1", "n-2"] and not any(a["replayed"] for a in answers)
    assert stats["effects"] == 2 and stats["keyless"] == 2
    records = log_lines(tmp_path / "effects.jsonl")
    effects = [r for r in records if r["event"] == "effect"]
    assert [e["key"] for e in effects] == [None, None] and len({e["identity"] for e in effects}) == 1
    requests = [r for r in records if r["event"] == "request"]
    assert [(r["method"], r["path"], r["key"], r["status"]) for r in requests] == [("POST", "/v1/notes", None, 200)] * 2
    assert all(isinstance(r["peer_port"], int) and r["time"] > 0 and r["body"] == '{"text":"same"}'
               for r in requests)


@pytest.mark.parametrize("body", [b"not json", b"[1]", b'{"text": 5}', b'{"note": "x"}',
                                  b'{"text": "x", "conversation": 3}', b"[" * 5000])
def test_a_malformed_body_is_a_400_naming_the_problem(tmp_path: Path, body: bytes) -> None:
    with EffectsService(tmp_path / "effects.jsonl") as service:
        got = httpx.post(f"{service.url}/v1/notes", content=body, headers={"Content-Type": "application/json"})
        assert service.notes() == []
    print(got.status_code, got.json())
    assert got.status_code == 400 and isinstance(got.json()["error"], str) and got.json()["error"]
    assert [r["status"] for r in log_lines(tmp_path / "effects.jsonl") if r["event"] == "request"] == [400]


def test_bounds_an_oversized_body_and_an_overlong_key_are_refused(tmp_path: Path) -> None:
    with EffectsService(tmp_path / "effects.jsonl") as service:
        big = httpx.post(f"{service.url}/v1/notes", json={"text": "x" * MAX_BODY_BYTES})
        long_key = httpx.post(f"{service.url}/v1/notes", json={"text": "x"}, headers={"Idempotency-Key": "k" * 300})
        fits = httpx.post(f"{service.url}/v1/notes", json={"text": "x" * (MAX_BODY_BYTES - 100)})
    print(big.status_code, big.json(), long_key.status_code, long_key.json(), fits.status_code)
    assert big.status_code == 400 and "over the limit" in big.json()["error"]
    assert long_key.status_code == 400 and "Idempotency-Key" in long_key.json()["error"]
    assert fits.status_code == 200
    requests = [r for r in log_lines(tmp_path / "effects.jsonl") if r["event"] == "request"]
    assert all(len(r["body"]) <= 2048 for r in requests)


def test_the_admin_routes_need_the_token(tmp_path: Path) -> None:
    faults = {"faults": [{"mode": "status", "status": 503, "count": 1}]}
    with EffectsService(tmp_path / "effects.jsonl", admin_token="s3cret") as service:
        none = httpx.post(f"{service.url}/admin/faults", json=faults)
        wrong = httpx.post(f"{service.url}/admin/faults", json=faults, headers={"Authorization": "Bearer nope"})
        after_refusals = httpx.post(f"{service.url}/v1/notes", json={"text": "a"})
        right = httpx.post(f"{service.url}/admin/faults", json=faults, headers={"Authorization": "Bearer s3cret"})
        faulted = httpx.post(f"{service.url}/v1/notes", json={"text": "b"})
        healed = httpx.post(f"{service.url}/v1/notes", json={"text": "c"})
        stats = httpx.get(f"{service.url}/admin/stats", headers={"Authorization": "Bearer s3cret"}).json()
        bad = httpx.post(f"{service.url}/admin/faults", json={"faults": [{"mode": "explode"}]},
                         headers={"Authorization": "Bearer s3cret"})
        texts = [n["text"] for n in service.notes()]
    print(none.status_code, wrong.status_code, right.json(), faulted.status_code, stats, bad.json())
    assert (none.status_code, wrong.status_code, right.status_code) == (401, 403, 200)
    assert after_refusals.status_code == 200 and faulted.status_code == 503 and healed.status_code == 200
    assert texts == ["a", "c"] and stats["status_faults"] == 1
    assert bad.status_code == 400 and "explode" in bad.json()["error"]
    assert "s3cret" not in (tmp_path / "effects.jsonl").read_text()  # headers are never logged


_CLIENT = """
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print(s.getsockname()[1], flush=True)
time.sleep(600)  # until the test kills it, however long the test takes
"""


def test_the_caller_s_port_is_traced_to_the_worker_holding_the_connection(tmp_path: Path) -> None:
    """A real child (started through a shell, so the socket is a grandchild's) connects; its port leads to the
    pid we started, and to no pid we did not start."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    script = tmp_path / "client.py"
    script.write_text(_CLIENT)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    child = subprocess.Popen(["/bin/sh", "-c", f"{sys.executable} {script} {port}; true"], stdout=subprocess.PIPE,
                             text=True, start_new_session=True)  # its own group: the grandchild is stopped with it
    try:
        assert child.stdout is not None
        peer_port = int(child.stdout.readline())
        conn, addr = listener.accept()
        assert addr[1] == peer_port
        found = caller_pid(peer_port, port, [other.pid, child.pid])
        print(f"peer port {peer_port} -> pid {found} (started {child.pid}, other {other.pid})")
        assert found == child.pid
        assert caller_pid(peer_port, port, [other.pid]) is None
        assert caller_pid(peer_port + 1 if peer_port < 65535 else 1, port, [child.pid]) is None
        conn.close()
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the shell and the client it started: nothing is left behind
        other.kill()
        for p in (child, other):
            p.wait()
        listener.close()


_WORKER = """
import http.client, json, sys, time
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
c.request("POST", "/v1/notes", body=json.dumps({"text": "note-crash;"}), headers={"Idempotency-Key": "k1"})
print("ANSWERED", c.getresponse().status, flush=True)
time.sleep(600)
"""


def test_crash_after_effect_applies_logs_then_has_the_caller_killed_before_any_answer(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    procs: list[subprocess.Popen] = []

    def kill_caller(peer_port: int) -> dict | None:
        pid = caller_pid(peer_port, service.port, [p.pid for p in procs])
        if pid is None:
            return None
        proc = next(p for p in procs if p.pid == pid)
        proc.kill()
        proc.wait()
        return {"pid": pid}

    service = EffectsService(tmp_path / "effects.jsonl", kill_caller=kill_caller,
                             faults=[EffectFault("crash_after_effect", count=1)])
    with service:
        procs.append(subprocess.Popen([sys.executable, str(script), str(service.port)], stdout=subprocess.PIPE,
                                      text=True))
        out, _ = procs[0].communicate(timeout=HANG_S)  # killed by the fault; else it would sleep 600 s
        again = httpx.post(f"{service.url}/v1/notes", json={"text": "note-crash;"}, headers={"Idempotency-Key": "k1"})
    records = log_lines(tmp_path / "effects.jsonl")
    print(out, [(r["event"], r.get("status"), r.get("outcome")) for r in records])
    assert procs[0].returncode == -9 and "ANSWERED" not in out  # killed before any answer reached it
    assert again.json()["replayed"] is True  # the retry finds the effect applied once
    events = [r["event"] for r in records if r["event"] in ("effect", "fault", "request")]
    assert events == ["effect", "fault", "request", "request"]
    fault = next(r for r in records if r["event"] == "fault")
    assert fault["outcome"] == "killed" and fault["killed"] == {"pid": procs[0].pid}
    assert [r["status"] for r in records if r["event"] == "request"] == [None, 200]


def test_crash_after_effect_without_a_caller_it_may_kill_answers_and_says_so(tmp_path: Path) -> None:
    with EffectsService(tmp_path / "effects.jsonl", kill_caller=lambda port: None,
                        faults=[EffectFault("crash_after_effect", count=None)]) as service:
        got = httpx.post(f"{service.url}/v1/notes", json={"text": "x"})
    faults = [r for r in log_lines(tmp_path / "effects.jsonl") if r["event"] == "fault"]
    print(got.json(), faults)
    assert got.status_code == 200 and faults[0]["outcome"] == "not_injected" and "no worker" in faults[0]["reason"]


def test_the_subprocess_prints_ready_and_serves(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "testbed.effects_service", "--log", str(tmp_path / "e.jsonl")],
                            stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[0] == "READY"
        wait_for(lambda: httpx.get(f"{line[1]}/healthz").status_code == 200, "the effects service's healthy /healthz",
                 proc=proc, every_s=0.05)
        assert httpx.post(f"{line[1]}/v1/notes", json={"text": "t"}).json()["note_id"] == "n-1"
    finally:
        proc.terminate()
        assert proc.wait(timeout=HANG_S) == 0
    assert [r["event"] for r in log_lines(tmp_path / "e.jsonl")][:1] == ["started"]


_NOTE_WORKER = """
import http.client, json, sys, time
host, port = sys.argv[1].removeprefix("http://").split(":")
identity = sys.argv[2]
print("READY", flush=True)
for n in range(1000):
    c = http.client.HTTPConnection(host, int(port))
    c.request("POST", "/v1/notes", json.dumps({"text": f"{identity}-{n}"}), {"Idempotency-Key": f"{identity}-{n}"})
    print("saved", c.getresponse().status, flush=True)
    time.sleep(0.1)
"""


def test_the_test_bed_kills_the_calling_worker_process_and_records_the_kill(tmp_path: Path) -> None:
    """The stack's effects service, armed with crash-after-effect, has the stack kill the worker process that
    made the call (found by its TCP port), records it as a nemesis kill_worker aimed after_effect, and the
    supervisor restarts the worker, whose next effects are answered."""
    import asyncio

    from harness.operations import OperationLog, load
    from testbed.stack import StackSpec, stack
    from testbed.worker_process import WorkerProcess

    script = tmp_path / "note_worker.py"
    script.write_text(_NOTE_WORKER)
    oplog = OperationLog(tmp_path / "operations.jsonl")
    spec = StackSpec(state_dir=tmp_path / "state", model=False, worker_processes=1, oplog=oplog,
                     effects_log=tmp_path / "effects_service.jsonl",
                     effects_faults=[EffectFault("crash_after_effect", count=1)],
                     make_worker=lambda name, at: WorkerProcess(
                         ("{python}", str(script), "{effects_url}", "{identity}"), {"effects_url": at.effects_url},
                         identity_prefix=name, warm_line=None, log_dir=tmp_path / "logs"))

    async def run() -> tuple[int, int]:
        async with stack(spec) as s:
            first_pid = s.workers[0].process.pid
            async def restarted_and_effects() -> bool:
                return bool(s.workers[0].restarts and s.effects_service.stats()["effects"] > 3)

            await wait_for_async(restarted_and_effects, "the worker's restart and its effects after it", every_s=0.1)
            return first_pid, s.workers[0].restarts

    first_pid, restarts = asyncio.run(run())
    oplog.close()
    records = log_lines(tmp_path / "effects_service.jsonl")
    [fault] = [r for r in records if r["event"] == "fault"]
    kills = [op for op in load(tmp_path / "operations.jsonl") if op.f == "kill_worker" and op.type == "ok"]
    print(fault, [k.value for k in kills], restarts)
    assert fault["outcome"] == "killed" and fault["killed"]["pid"] == first_pid and fault["killed"]["worker"] == "w1"
    assert len(kills) == 1 and kills[0].value["pid"] == first_pid and kills[0].value["aim"]["at"] == "after_effect"
    assert restarts >= 1
    unanswered = [r for r in records if r["event"] == "request" and r["status"] is None]
    assert [r["note_id"] for r in unanswered] == [fault["note_id"]]
    assert (tmp_path / "logs" / "w1-1.log").read_text().count("saved") == 0  # killed before its first answer
    assert "saved 200" in (tmp_path / "logs" / "w1-2.log").read_text()


def test_a_service_target_s_crash_after_effect_is_the_service_s_fault_not_the_worker_s(tmp_path: Path) -> None:
    """For a target declaring effects = "service", the scenario's after_effect crash point arms the effects service
    (once) instead of DAH_CRASH_AT; every Temporal chaos run's workers get {effects_url} and DAH_EFFECTS_URL."""
    from dataclasses import replace

    from testbed.engines.temporal.engine import ReferenceOnTemporal
    from chaos.scenarios import SCENARIOS
    from testbed.engines.byo.target import REFERENCE
    from harness.operations import OperationLog
    from harness.rundir import RunDir
    from testbed.stack import Endpoints

    scenario = SCENARIOS["crash_after_effect"]
    for effects, armed, crash_at in (("service", ["crash_after_effect"], set()), (None, [], {"after_effect"})):
        run = RunDir.create(tmp_path / str(effects))
        backend = ReferenceOnTemporal(target=replace(REFERENCE, effects=effects))
        spec = backend.stack_spec(scenario, run, 1, OperationLog(run.operations), ui=False)
        worker = spec.make_worker("w1", Endpoints("127.0.0.1:1", "default", "http://m/v1", {}, "http://127.0.0.1:9"))
        print(effects, spec.effects_log, [f.mode for f in spec.effects_faults], worker.faults.crash_at)
        assert spec.effects_log == run.path / "effects_service.jsonl"
        assert [f.mode for f in spec.effects_faults] == armed and set(worker.faults.crash_at) == crash_at
        assert worker.values["effects_url"] == "http://127.0.0.1:9" and worker.env["DAH_EFFECTS_URL"] == "http://127.0.0.1:9"
