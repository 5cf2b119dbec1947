"""The benchmark pipeline end to end: real embedded server, real worker, real model HTTP, then the report.

These check that the pipeline measures what it says (turn shapes in the
breakdown, continue-as-new in the length series, a complete run.json) and that
an interrupted run keeps what it finished. They assert no timing figures:
benchmarks report numbers, tests check behaviour.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.commands import tool
from tests.conftest import temporal_server_pids
from tests.run_directory import assert_valid

ROOT = Path(__file__).resolve().parent.parent


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.slow
def test_quick_benchmark_then_report_from_the_saved_run(tmp_path: Path) -> None:
    before = temporal_server_pids()
    runs = tmp_path / "runs"
    # checkpoint after tuning: the stock server's workers must leave the run's shared ledger open for it.
    out = bench("--quick", "--only", "table2,tuning,overhead,length,checkpoint", "--turns", "3", "--out",
                str(runs))
    assert out.returncode == 0, out.stderr[-3000:]
    assert temporal_server_pids() <= before, "a temporal server was left running"
    run_dir = (runs / "bench" / "latest").resolve()
    assert_valid(run_dir)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "complete" and record["sections"] == ["table2", "tuning", "overhead", "length",
                                                                     "checkpoint"]
    assert record["machine"]["cores"] and record["machine"]["temporalio"]
    assert record["reproduce"].startswith(f"{tool('benchmarks', ROOT)} --quick --only table2,tuning,overhead,length,checkpoint "
                                          "--turns 3 ")
    checkpoint = json.loads((run_dir / "checkpoint_backend.json").read_text())
    assert {p["measure"] for p in checkpoint["points"]} == {"floor", "step", "turn"}

    series = {s["name"]: s for s in json.loads((run_dir / "latency.json").read_text())["series"]}
    table2 = [s for s in series.values() if s["section"] == "table2"]
    assert {(s["loop"], s["model_mode"], s["workload"]) for s in table2} == {
        (loop, mode, w) for loop in ("durable", "plain") for mode in ("mock", "model") for w in ("reply", "tool")}
    assert all(len(s["turns"]) == 3 for s in table2)
    # The model's own latency is measured in both loops; the emulated 20 ms shows in model mode.
    assert all(t["model_ms"] >= 20 for s in table2 if s["model_mode"] == "model" for t in s["turns"])
    tuning = [s for s in series.values() if s["section"] == "tuning"]
    assert len(tuning) == 10  # stock and tuned, each: eager, no-eager, no-sandbox, local-tools, process
    assert {s["variant"] for s in tuning} == {"eager", "no-eager", "no-sandbox", "local-tools", "process"}
    assert {tuple(s["local_tools"]) for s in tuning if s["variant"] == "local-tools"} == {("calculator",)}
    assert all(s["local_tools"] == [] for s in tuning if s["variant"] != "local-tools")

    # The overhead section: the worker in its own process, per configuration, and the floor of each shape.
    overhead = {s["name"]: s for s in series.values() if s["section"] == "overhead"}
    assert set(overhead) == {"process/activities/reply", "process/local-model/reply", "process/activities/tool",
                             "process/local-tools/tool", "process/local-model/tool", "process/local-all/tool",
                             "floor/1-dispatched", "floor/3-dispatched", "floor/1-local", "floor/3-local"}
    assert all(len(s["turns"]) == 3 for s in overhead.values())
    # Each series whose steps are alike is paired with the floor of its shape, turn by turn; a mix has no floor.
    assert {n: s["floor"] for n, s in overhead.items() if s["loop"] == "durable"} == {
        "process/activities/reply": "floor/1-dispatched", "process/local-model/reply": "floor/1-local",
        "process/activities/tool": "floor/3-dispatched", "process/local-all/tool": "floor/3-local",
        "process/local-tools/tool": None, "process/local-model/tool": None}
    for name, s in overhead.items():
        if s.get("floor"):
            floor_ms = {t["i"]: t["client_ms"] for t in overhead[s["floor"]]["turns"]}
            assert overhead[s["floor"]]["paired_with"] == name
            assert [t["floor_ms"] for t in s["turns"]] == [floor_ms[t["i"]] for t in s["turns"]]
            assert all(t["vs_floor"] > 0 for t in s["turns"])
    assert {(s["round"], s["load_processes"]) for s in overhead.values()} == {(1, 0)}

    breakdown = {s["name"]: s["turns"] for s in json.loads((run_dir / "breakdown.json").read_text())["series"]}
    for turn in breakdown["process/local-all/tool"]:  # the whole turn in one task: two model calls and the tool
        assert (turn["wft_count"], turn["act_count"], turn["local_count"]) == (1, 0, 3), turn
        assert 0 < turn["model_ms"] < turn["wft_exec_ms"], turn  # read from the markers
    for turn in breakdown["durable/mock/reply"]:  # one model call: Update task, plan, reply task
        assert (turn["wft_count"], turn["act_count"]) == (2, 1), turn
    for turn in breakdown["durable/mock/tool"]:  # plan, calculator, plan
        assert (turn["wft_count"], turn["act_count"]) == (4, 3), turn
        assert 0 < turn["model_ms"] < turn["act_exec_ms"] <= turn["server_ms"] <= turn["client_ms"] + 5
    assert len(list((run_dir / "event_histories").rglob("*.json"))) >= 10  # the breakdown can be recomputed

    length = {s["name"]: s["turns"] for s in json.loads((run_dir / "length.json").read_text())["series"]}
    assert {t["run_index"] for t in length["can_off"]} == {0}
    sizes = [t["history_bytes"] for t in length["can_off"]]
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0]
    assert max(t["run_index"] for t in length["can_on"]) >= 1  # continue-as-new happened

    report = subprocess.run([sys.executable, "-m", "reports", "--runs", str(runs), "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert report.returncode == 0, report.stderr[-3000:]
    for name in ("report.md", "table2.csv", "table2.tex", "breakdown.csv", "length.csv", "overhead.csv"):
        assert (tmp_path / "out" / name).exists(), name
    assert "\\toprule" in (tmp_path / "out" / "table2.tex").read_text()


def _cpu_hogs_of_this_interpreter() -> set[int]:
    """The CPU-bound processes (benchmarks.load) started by this interpreter's benchmark runs."""
    from benchmarks.load import HOG

    return {p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == [sys.executable, "-c", HOG]}


@pytest.mark.slow
def test_overhead_rounds_idle_and_loaded_are_named_apart_and_leave_no_process(tmp_path: Path) -> None:
    before = _cpu_hogs_of_this_interpreter()
    out = bench("--quick", "--only", "overhead", "--workloads", "reply", "--turns", "2", "--overhead-rounds", "2",
                "--overhead-load", "1", "--out", str(tmp_path / "runs"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert _cpu_hogs_of_this_interpreter() <= before, "a CPU-bound process was left running"
    run_dir = (tmp_path / "runs" / "bench" / "latest").resolve()
    assert_valid(run_dir)
    record = json.loads((run_dir / "run.json").read_text())
    assert "--overhead-rounds 2 --overhead-load 1" in record["reproduce"]
    series = json.loads((run_dir / "latency.json").read_text())["series"]
    agents = {(s["name"], s["round"], s["load_processes"], s["floor"]) for s in series if s["loop"] == "durable"}
    assert agents == {(f"process/{c}/reply{suffix}", r, k, f"floor/1-{kind}{suffix}")
                      for c, kind in (("activities", "dispatched"), ("local-model", "local"))
                      for r, k, suffix in ((1, 0, ""), (1, 1, "@load1-r1"), (2, 0, "@idle-r2"), (2, 1, "@load1-r2"))}
    assert len({s["name"] for s in series}) == len(series) == 16
    # Progress shows the spread, idle and loaded side by side; the report has it as a table.
    assert "idle" in out.stderr and "1 CPU-bound" in out.stderr
    report = subprocess.run([sys.executable, "-m", "reports", "--runs", str(tmp_path / "runs"), "--out",
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert report.returncode == 0, report.stderr[-3000:]
    spread = (tmp_path / "out" / "overhead_spread.csv").read_text().splitlines()
    assert spread[0].startswith("Series,Floor,load,rounds,median") and len(spread) == 5  # 2 series x 2 loads


def test_unknown_section_is_refused_with_the_list() -> None:
    out = bench("--only", "table2,tables")
    assert out.returncode == 2
    assert "tables" in out.stderr and "throughput" in out.stderr


def test_interrupted_run_keeps_finished_sections_and_stops_everything(tmp_path: Path) -> None:
    before = temporal_server_pids()
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "table2,length", "--turns", "2", "--out",
         str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a test run started as a background job ignores SIGINT
    try:
        record_path = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            runs = [p / "run.json" for p in (tmp_path / "bench").glob("*") if (p / "run.json").exists()]
            if runs and "table2" in json.loads(runs[0].read_text())["sections"]:
                record_path = runs[0]
                break
            time.sleep(0.2)
        assert record_path is not None, "table2 never finished"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    record = json.loads(record_path.read_text())
    assert record["status"] == "interrupted" and record["sections"] == ["table2"]
    assert len(json.loads((record_path.parent / "latency.json").read_text())["series"]) == 8
    assert not (tmp_path / "bench" / "latest").exists()  # latest points only at a complete run
    assert_valid(record_path.parent)
    assert temporal_server_pids() <= before, "a temporal server was left running"


def test_sigtermed_run_ends_terminated_in_its_section_and_stops_everything(tmp_path: Path) -> None:
    before = temporal_server_pids()
    log = tmp_path / "bench.log"
    with log.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks", "--quick", "--only", "table2", "--turns", "2",
                                 "--out", str(tmp_path / "runs")], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while "[table2]" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # what `kill PID` and a CI job's timeout send
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, log.read_text()[-2000:]
    assert "terminated: every process was stopped" in log.read_text()
    [run_dir] = [p for p in (tmp_path / "runs" / "bench").iterdir() if p.is_dir() and not p.is_symlink()]
    record = json.loads((run_dir / "run.json").read_text())
    assert (record["status"], record["stopped_during"], record["sections"]) == ("terminated", "section table2", [])
    assert_valid(run_dir)
    assert temporal_server_pids() <= before, "a temporal server was left running"


def test_proxy_benchmark_measures_every_path_and_stops_what_it_started(tmp_path: Path, capsys) -> None:
    import threading

    import psutil

    from benchmarks import proxy

    children = {c.pid for c in psutil.Process().children()}
    out = tmp_path / "proxy.json"
    assert proxy.main(["--requests", "30", "--rounds", "3", "--mb", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["latency_us"]) == set(result["throughput"]) == {"direct", "proxied", "proxied + latency:0"}
    assert all(s["n"] == 30 for s in result["latency_us"].values())
    # the proxied paths really went through the proxies: the 1 MB upload twice (warm-up and measured), at least
    assert all(s["bytes_upstream"] >= 2_000_000 for s in result["proxy_stats"].values())
    assert "added p50" in capsys.readouterr().out
    assert not [t.name for t in threading.enumerate() if t.name in ("fault-proxy-bench", "fault-proxy-bench-toxic")]
    # its upstream server is a `python -c` child; other children of this process (the image builds that the tests
    # start at collection run dpkg-query, docker and dockerd from a thread) are not the benchmark's to stop
    left = []
    for c in psutil.Process().children():
        try:
            if (c.pid not in children and c.is_running() and c.status() != psutil.STATUS_ZOMBIE
                    and c.cmdline()[:2] == [sys.executable, "-c"]):
                left.append(c)
        except psutil.NoSuchProcess:
            pass
    assert not left


def test_engines_section_measures_every_engine_in_one_run_with_its_durability_settings(tmp_path: Path) -> None:
    engines = "plain,checkpoint,dbos,restate"
    # dbos-sqlite: the name older results gave dbos, still accepted and measured as dbos
    proc = bench("--quick", "--only", "engines", "--engines", engines.replace("dbos", "dbos-sqlite"),
                 "--engines-turns", "2", "--workloads", "tool", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = Path(proc.stdout.strip().splitlines()[0].removeprefix("results:").strip())
    data = json.loads((run / "engines.json").read_text())
    assert data["unavailable"] == {}, data["unavailable"]
    assert {(s["engine"], s["model_mode"]) for s in data["series"]} == {
        (e, m) for e in engines.split(",") for m in ("mock", "model")}
    for s in data["series"]:  # every turn answered (the benchmark checks each reply) and its model time read
        assert len(s["turns"]) == 2 and all(0 < t["model_ms"] < t["client_ms"] for t in s["turns"]), s
    assert [p["engine"] for p in data["steps"]] == engines.split(",")
    assert data["configs"]["dbos"]["durability"]["synchronous"] == "FULL"
    assert "journal_mode" in data["configs"]["checkpoint"]
    assert data["floor"][0]["p50_ms"] > 0
