"""reports/: the report is built from saved run directories alone (synthetic ones here; no Temporal)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest

from cli import report as cli
from reports.build import build

STAMP = "20261122T100000000000Z"

# ---------------------------------------------------------------- synthetic runs


def _series(name, section, loop, mode, workload, latency, client, model, server=None, eager=None):
    return {"name": name, "section": section, "loop": loop, "model_mode": mode, "workload": workload,
            "model_latency": latency, "server": server, "eager": eager,
            "turns": [{"i": i + 1, "client_ms": c, "model_ms": m, "steps": 1, "activities": 1}
                      for i, (c, m) in enumerate(zip(client, model))]}


def _paired(suffix, load, ratios):
    """An overhead series of the tool workload and its floor, paired turn by turn: each turn's ratio given."""
    agent = {**_series(f"process/activities/tool{suffix}", "overhead", "durable", "mock", "tool", "fixed:0",
                       [60, 62, 64], [10, 10, 10], "tuned", True), "variant": "activities", "local_model": False,
             "local_tools": [], "floor": f"floor/3-dispatched{suffix}", "round": 1, "load_processes": load}
    for t, floor_ms, ratio in zip(agent["turns"], [40, 41, 42], ratios):
        t.update(floor_ms=floor_ms, vs_floor=ratio)
    floor = {**_series(f"floor/3-dispatched{suffix}", "overhead", "floor", None, None, None, [40, 41, 42],
                       [0, 0, 0], "tuned", True), "floor_activities": 3, "floor_local": False,
             "paired_with": agent["name"], "round": 1, "load_processes": load}
    return agent, floor


def _bd_turn(i, client, rtt, wss, wex, ass, aex, model, other):
    return {"i": i, "client_ms": client, "server_ms": client - rtt, "client_rtt_ms": rtt,
            "wft_sched_to_start_ms": wss, "wft_exec_ms": wex, "act_sched_to_start_ms": ass, "act_exec_ms": aex,
            "model_ms": model, "other_ms": other, "wft_count": 3, "act_count": 3}


def write_bench(run: Path, *, status="complete", files=None, started="2026-11-22T10:00:00Z", profile="quick"
                ) -> None:
    run.mkdir(parents=True)
    record = {"schema": 2, "kind": "bench", "name": "bench", "profile": profile, "seed": 0,
              "command": "python -m benchmarks --quick",
              "status": status, "started": started, "wall_s": 42.0,
              "sections": ["table2", "tuning", "overhead", "breakdown", "length", "throughput", "recovery", "micro"],
              "machine": {"cores": 2, "memory_gb": 7.8, "cpu": "Test CPU", "platform": "Linux-test",
                          "python": "3.11.9", "temporalio": "1.35.0",
                          "temporal_cli": "temporal version 1.9.1 (Server 1.32.0)"},
              "config": {"turns": 5, "warmup_turns": 2, "model_latency": "fixed:0"},
              "server_profiles": {"tuned": {"history.transferProcessorMaxPollRPS": "1000"}, "stock": {}}}
    data = {
        "latency": {"series": [
            # Hand-checkable: durable mean 13, plain mean 3.5, per-turn ratios 5, 4, 3.5, 3.2 (median 3.75).
            _series("durable/mock/reply", "table2", "durable", "mock", "reply", "fixed:0", [10, 12, 14, 16],
                    [1, 1, 1, 1], "tuned", True),
            _series("plain/mock/reply", "table2", "plain", "mock", "reply", "fixed:0", [2, 3, 4, 5], [1, 1, 1, 1]),
            _series("durable/model/tool", "table2", "durable", "model", "tool", "lognormal:300,0.3",
                    [320, 340, 360, 380, 400], [300] * 5, "tuned", True),
            _series("plain/model/tool", "table2", "plain", "model", "tool", "lognormal:300,0.3",
                    [305, 310, 315, 320, 325], [300] * 5),
            _series("tuning/stock/no-eager", "tuning", "durable", "mock", "tool", "fixed:0", [30, 32, 34],
                    [2, 2, 2], "stock", False),
            _series("tuning/tuned/eager", "tuning", "durable", "mock", "tool", "fixed:0", [15, 16, 17],
                    [2, 2, 2], "tuned", True),
            # Overhead (client - model) medians 22 and 12; the floors of their shapes 16 and 9.
            {**_series("process/activities/reply", "overhead", "durable", "mock", "reply", "fixed:0", [30, 32, 34],
                       [10, 10, 10], "tuned", True), "variant": "activities", "local_model": False,
             "local_tools": []},
            {**_series("process/local-model/reply", "overhead", "durable", "mock", "reply", "fixed:0", [21, 22, 23],
                       [10, 10, 10], "tuned", True), "variant": "local-model", "local_model": True,
             "local_tools": []},
            {**_series("floor/1-dispatched", "overhead", "floor", None, None, None, [15, 16, 17], [0, 0, 0], "tuned",
                       True), "floor_activities": 1, "floor_local": False},
            {**_series("floor/1-local", "overhead", "floor", None, None, None, [8, 9, 10], [0, 0, 0], "tuned",
                       True), "floor_activities": 1, "floor_local": True},
            # Paired turn by turn (runs since the interleaving): the ratio is the median of the per-turn ratios,
            # and a loaded round is a row of its own in the spread.
            *_paired("", 0, [1.1, 1.3, 1.2]), *_paired("@load2-r1", 2, [1.5, 1.7, 1.6]),
        ]},
        "breakdown": {"series": [
            {"name": "durable/mock/reply", "turns": [_bd_turn(i, 10 + 2 * i, 2, 3, 2, 1, 2, 1, 1 + i)
                                                    for i in range(1, 5)]},
            {"name": "tuning/stock/no-eager", "turns": [_bd_turn(i, 30 + i, 3, 8, 4, 5, 6, 2, 3)
                                                       for i in range(1, 4)]},
            {"name": "tuning/tuned/eager", "turns": [_bd_turn(i, 15 + i, 2, 2, 3, 0.5, 4, 2, 2)
                                                    for i in range(1, 4)]},
        ]},
        "length": {"series": [
            {"name": "can_off", "continue_as_new": "server-suggested",
             "turns": [{"i": i, "client_ms": 10 + 0.05 * i, "history_bytes": 5000 + 800 * i,
                        "history_events": 14 + 11 * i, "run_index": 0} for i in range(1, 101)]},
            {"name": "can_on", "continue_as_new": "every 200 events",
             "turns": [{"i": i, "client_ms": 10.0, "history_bytes": 5000 + 800 * (i % 18),
                        "history_events": 14 + 11 * (i % 18), "run_index": i // 18} for i in range(1, 101)]},
        ]},
        "throughput": {"points": [
            {"workers": w, "conversations": c, "turns_per_conversation": 10, "turns": 10 * c, "wall_s": 10 * c / tp,
             "turns_per_s": tp, "p50_ms": 60.0, "p95_ms": 90.0, "errors": 0}
            for w, c, tp in [(1, 1, 8.0), (1, 4, 20.0), (1, 16, 30.0), (2, 1, 8.5), (2, 4, 28.0), (2, 16, 55.0)]]},
        "recovery": {"points": [
            {"heartbeat_s": hb, "tool_s": 4.0, "baseline_ms": 4100.0, "killed_ms": 4100.0 + 1000 * (hb + 0.9),
             "recovery_s": hb + 0.9, "killed_worker": "w1", "kill_after_s": 1.0} for hb in (1.0, 2.0, 5.0, 10.0)]},
        "resources": {"interval_s": 0.5, "sections": {
            "table2": {"temporal-server": {"cpu_mean_pct": 12.0, "cpu_max_pct": 80.0, "rss_mean_mb": 120.0,
                                           "rss_max_mb": 130.0, "samples": 190},
                       "bench (client + worker + model)": {"cpu_mean_pct": 45.0, "cpu_max_pct": 99.0,
                                                           "rss_mean_mb": 210.0, "rss_max_mb": 230.0,
                                                           "samples": 190}},
            "throughput": {"temporal-server": {"cpu_mean_pct": 60.0, "cpu_max_pct": 150.0, "rss_mean_mb": 140.0,
                                               "rss_max_mb": 160.0, "samples": 40}}}},
        "checkpoint_backend": {"points": [
            {"measure": m, "backend": b, "n": 300, "p50_ms": p50, "mean_ms": p50 * 1.1, "p95_ms": p50 * 2,
             "vs_floor": None if m == "turn" else p50 / 0.3,
             # the samples the report's intervals come from (one point without: a run from before they were kept)
             **({} if m == "turn" else {"samples_ms": [p50 * (0.8 + 0.4 * ((i * 37) % 100) / 100)
                                                        for i in range(300)]})}
            for m, b, p50 in [("floor", "fsync'd SQLite commit", 0.3), ("step", "checkpoint (sqlite)", 0.55),
                              ("step", "temporal (activity per step)", 19.0), ("turn", "checkpoint (sqlite)", 25.0)]]},
        # Hand-checkable: per engine, turns 20, 22, 24, 26, 28 ms with 10 ms inside model steps (minus model: 14).
        "engines": {
            "series": [{"name": f"{e}/{m}/reply", "engine": e, "model_mode": m, "workload": "reply",
                        "model_latency": "fixed:0", "turns": [{"i": i, "client_ms": k + 18 + 2 * i, "model_ms": 10}
                                                              for i in range(1, 6)]}
                       for k, e in ((0, "plain"), (40, "dbos-sqlite"), (100, "restate")) for m in ("mock", "model")],
            "floor": [{"engine": "fsync'd SQLite commit", "n": 50, "p50_ms": 0.5, "mean_ms": 0.55, "p95_ms": 1.0,
                       "vs_floor": 1.0, "samples_ms": [0.4 + 0.2 * (i % 10) / 10 for i in range(50)]}],
            "steps": [{"engine": e, "n": 50, "p50_ms": v, "mean_ms": v, "p95_ms": 2 * v, "vs_floor": v / 0.5,
                       "samples_ms": [v] * 50} for e, v in (("plain", 0.001), ("dbos-sqlite", 1.5), ("restate", 4.0))],
            "configs": {"dbos-sqlite": {"system_database": "SQLite", "synchronous": "FULL"}},
            "unavailable": {"dbos-postgres": "PostgreSQL is not installed: make system-deps"},
            "engines": ["plain", "dbos-sqlite", "dbos-postgres", "restate"]},
        "scale": _scale_data(),
        "micro": {"machine_info": {"python_version": "3.11.9", "cpu": {"brand_raw": "Test CPU"}},
                  "datetime": "2026-11-22T10:05:00", "version": "5.3.1",
                  "benchmarks": [{"name": "test_encode_payload", "fullname": "benchmarks/micro/test_x.py::test_encode",
                                  "stats": {"min": 1e-6, "max": 9e-6, "mean": 2.5e-6, "stddev": 0.5e-6,
                                            "median": 2.25e-6, "ops": 400000.0, "rounds": 1000}}]},
    }
    (run / "run.json").write_text(json.dumps(record))
    for stem, doc in data.items():
        if files is None or stem in files:
            (run / f"{stem}.json").write_text(json.dumps(doc))


class Hist:
    """Writes operation-log lines the way harness.operations.OperationLog does."""

    def __init__(self) -> None:
        self.ops: list[dict] = []

    def invoke(self, process, f, t, value=None) -> int:
        self.ops.append({"index": len(self.ops), "process": process, "type": "invoke", "f": f, "value": value,
                         "time": t, "wall": 1.7e9 + t})
        return len(self.ops) - 1

    def complete(self, idx, type_, t, error=None) -> None:
        inv = self.ops[idx]
        op = {"index": len(self.ops), "process": inv["process"], "type": type_, "f": inv["f"], "time": t,
              "wall": 1.7e9 + t, "invoke_index": idx}
        if error:
            op["error"] = error
        self.ops.append(op)

    def event(self, process, f, t) -> None:
        self.complete(self.invoke(process, f, t), "ok", t)

    def write(self, path: Path) -> None:
        lines = [json.dumps({k: v for k, v in op.items() if v is not None}) for op in sorted(
            self.ops, key=lambda o: (o["time"], o["index"]))]
        path.write_text("\n".join(lines) + "\n")


PHASES = {"setup": 0.0, "warm-up": 0.5, "faults": 2.0, "heal": 10.0, "settle": 10.1, "final": 15.0, "stopped": 16.0}


def chaos_history(fault="kill_worker", clients=(1, 2)) -> tuple[Hist, dict[str, int]]:
    """Two clients sending every 0.25 s from 0.5 s to 14 s; a fault window [5, 7]; one info, one never completed,
    one fail."""
    h = Hist()
    for name, t in PHASES.items():
        h.event("nemesis" if name == "heal" else "generator", f"phase:{name}", t)
    nem = h.invoke("nemesis", fault, 5.0, {"when": "busy", "down_s": 1.0})
    h.complete(nem, "ok", 7.0)
    sup = h.invoke("supervisor", "restart_worker", 6.0, {"worker": "w1"})
    h.complete(sup, "ok", 6.4)
    counts = {"ok": 0, "fail": 0, "info": 0}
    for c in clients:
        t = 0.5 + 0.1 * c
        while t < 14.0:
            idx = h.invoke(f"client-{c}", "send_message", round(t, 3), {"n": len(h.ops)})
            if c == 1 and 5.5 <= t < 5.75:
                h.complete(idx, "info", 9.5, error="TimeoutError")
                counts["info"] += 1
            elif c == 2 and 8.0 <= t < 8.25:
                h.complete(idx, "fail", t + 0.05, error="update failed")
                counts["fail"] += 1
            elif 5.0 <= t < 7.0:
                h.complete(idx, "ok", 7.3 + 0.01 * (t - 5))  # held until the worker is back
                counts["ok"] += 1
            else:
                h.complete(idx, "ok", t + 0.12 + 0.03 * c)
                counts["ok"] += 1
            t += 0.25
    if clients:
        h.invoke("client-1", "send_message", 14.5, {"n": 999})  # never completes: info
        counts["info"] += 1
    return h, counts


CHECKS = ["lost", "effects", "temporal", "replay", "injection_evidence"]


def write_chaos(runs: Path, scenario: str, *, complete=True, failing=(), fault="kill_worker", link=True,
                clients=(1, 2), schema=2, stamp=STAMP) -> dict:
    """A chaos run directory as the runner writes it (schema 1: as it did before run.json, still read)."""
    run = runs / scenario / stamp
    run.mkdir(parents=True)
    h, counts = chaos_history(fault, clients)
    h.write(run / ("operations.jsonl" if schema == 2 else "history.jsonl"))
    record = {"scenario": {"name": scenario, "description": f"{fault} 100% of the time & then heal_{scenario}",
                           "events": [], "cluster": {}, "workload": {}, "timeouts": "fast"},
              "seed": 7, "reproduce": f"python -m chaos run {scenario} --seed 7",
              "machine": {"cores": 2, "memory_gb": 7.8, "cpu": "Test CPU", "python": "3.11.9",
                          "temporalio": "1.35.0"}}
    checked = {}
    if complete:
        checks = [{"name": n, "verdict": "fail" if n in failing else "pass", "summary": f"{n} ok", "details": {}}
                  for n in CHECKS]
        record |= {"phases": PHASES, "wall_s": 17.0}
        checked = {"checks": checks, "verdict": "fail" if failing else "pass",
                   "summary": {"scenario": scenario, "faults": "1/1", **counts, "lost": 0, "dup_effects": 0,
                               "recovery_s": 0.3, "model_rec_s": 1.56, "tool_rec_s": None, "wft_rec_s": 1.01,
                               "verdict": "fail" if failing else "pass"}}
    if schema == 1:
        (run / "journal.json").write_text(json.dumps(record | checked))
    else:
        record |= {"schema": 2, "kind": "chaos", "name": scenario, "status": "complete" if complete else "interrupted"}
        (run / "run.json").write_text(json.dumps(record))
        if checked:
            (run / "verdict.json").write_text(json.dumps({"schema": 2, **checked}))
    if link:
        (runs / scenario / "latest").symlink_to(stamp)
    return counts


FUZZ = {"options": {"iterations": 4, "workers": 3, "out": "runs/migration_fuzz"}, "wall_seconds": 30.5,
        "families": {"direct-spawns": {"iterations": 2, "completed": 2, "children": 6, "cross_worker_children": 4,
                                       "cross_worker_children_pct": 66.7, "moved_workflows": 1,
                                       "moved_workflows_pct": 12.5, "activities_off_parent_worker_pct": 40.0,
                                       "worker_kills": 0, "violations": 0, "mean_seconds": 3.25},
                     "all": {"iterations": 4, "completed": 4, "children": 10, "cross_worker_children": 7,
                             "cross_worker_children_pct": 70.0, "moved_workflows": 2, "moved_workflows_pct": 11.1,
                             "activities_off_parent_worker_pct": 35.5, "worker_kills": 1, "violations": 0,
                             "mean_seconds": 3.5}},
        "iterations": [{}, {}, {}, {}], "invariants_held": True}


def make_runs(root: Path) -> dict:
    runs = root / "runs"
    write_bench(runs / "bench" / STAMP)
    (runs / "bench" / "latest").symlink_to(STAMP)
    write_bench(runs / "bench" / "20250101T000000000000Z", files=["latency"])  # older: must not be used
    counts = write_chaos(runs, "kill_mid_turn")
    # No client operations (nothing to plot: keeps the test fast), and a failed check.
    write_chaos(runs, "model_outage", failing=("effects",), fault="model_outage", clients=(), schema=1)
    unknown_counts = write_chaos(runs, "kill_idle", complete=False, link=False)  # interrupted: no checks, no summary
    damaged = runs / "crash_after_effect" / STAMP
    damaged.mkdir(parents=True)
    (damaged / "run.json").write_text('{"scenario": {"name": "crash_after_effect"', encoding="utf-8")
    (damaged / "operations.jsonl").write_text("")
    fuzz = runs / "migration_fuzz" / STAMP
    fuzz.mkdir(parents=True)
    (fuzz / "results.json").write_text(json.dumps(FUZZ))
    (runs / "migration_fuzz" / "latest").symlink_to(STAMP)
    return {"runs": runs, "counts": counts, "unknown_counts": unknown_counts, "damaged": damaged}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("reports")
    info = make_runs(root)
    out = root / "out"
    # Written, without the run whose run.json is truncated: exit 1, that run named (exit 2: nothing usable).
    assert cli.main(["--runs", str(info["runs"]), "--out", str(out)]) == 1
    return {**info, "out": out, "md": (out / "report.md").read_text()}


# ---------------------------------------------------------------- tests

FIGURES = ["breakdown", "tuning", "latency-cdf", "scaling-length", "scaling-history-bytes", "throughput", "recovery",
           "resources", "checkpoint", "engines", *(f"chaos-{s}-{k}" for s in ("kill_mid_turn", "kill_idle")
                          for k in ("latency-raw", "latency-quantiles", "rate"))]


def test_every_output_file_exists(built):
    out = built["out"]
    for name in ["report.md", "report.html", "table1.csv", "table2.csv", "table2_overhead.csv", "breakdown.csv",
                 "tuning.csv", "length.csv", "throughput.csv", "recovery.csv", "resources.csv", "micro.csv",
                 "checkpoint.csv", "engines_turns.csv", "engines_steps.csv", "migration_fuzz.csv", "table1.tex", "table2.tex", "breakdown.tex"]:
        assert (out / name).is_file(), name
    for name in FIGURES:
        png, svg = out / "figures" / f"{name}.png", out / "figures" / f"{name}.svg"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert b"<svg" in svg.read_bytes()[:2000], name
        assert (out / "figures" / f"{name}.pdf").read_bytes()[:5] == b"%PDF-", name
        assert f"figures/{name}.pdf" in built["md"]
        assert f"figures/{name}.png" in built["md"]
        assert f'src="figures/{name}.svg"' in (out / "report.html").read_text()
    assert not list(out.glob(".building-*")), "the staging directory is removed"


def test_latex_tables_are_booktabs_and_escaped(built):
    for name in ("table1", "table2", "breakdown"):
        tex = (built["out"] / f"{name}.tex").read_text()
        for rule in (r"\toprule", r"\midrule", r"\bottomrule", r"\begin{tabular}", r"\caption{", r"\label{tab:"):
            assert rule in tex, (name, rule)
    t1 = (built["out"] / "table1.tex").read_text().replace(r"\allowbreak{}", "")  # a line may break after _ and @
    assert r"kill\_mid\_turn" in t1 and "kill_mid_turn" not in t1.replace(r"\_", "")
    assert r"100\% of the time \& then heal\_kill\_mid\_turn" in t1
    assert r"effects (FAIL)" in t1
    t2 = (built["out"] / "table2.tex").read_text()
    # n = 4: too few turns for an interval; p99 marked as coming from few turns
    assert "reply & mock (fixed:0) & Durable & 4 & 13.0 & 13.0 & 2.6 & 15.7 & 15.9* & 16.0" in t2
    assert "lognormal:300,0.3" in t2


def test_table2_numbers(built):
    t2 = pd.read_csv(built["out"] / "table2.csv").set_index("Series")
    d = t2.loc["durable/mock/reply"]
    assert d["Loop"] == "Durable" and d["n"] == 4
    assert d["mean"] == pytest.approx(13.0)
    assert d["sd"] == pytest.approx(math.sqrt(20 / 3))  # sample sd of 10, 12, 14, 16
    assert d["p50"] == pytest.approx(13.0)
    assert d["p95"] == pytest.approx(15.7)  # linear interpolation: 14 + 0.85 * 2
    assert d["min"] == 10 and d["max"] == 16
    assert t2.loc["plain/model/tool", "p50"] == pytest.approx(315.0)
    assert "tuning/stock/no-eager" not in t2.index

    over = pd.read_csv(built["out"] / "table2_overhead.csv").set_index("Workload")
    reply, tool = over.loc["reply"], over.loc["tool"]
    assert reply["ratio of means"] == pytest.approx(13 / 3.5)
    assert reply["median turn ratio"] == pytest.approx(3.75)  # median of 5, 4, 3.5, 3.2
    assert reply["difference"] == pytest.approx(9.5)
    assert reply["durable overhead"] == pytest.approx(12.0) and reply["plain overhead"] == pytest.approx(2.5)
    assert reply["overhead difference"] == pytest.approx(9.5)
    assert tool["ratio of means"] == pytest.approx(360 / 315)
    assert tool["median turn ratio"] == pytest.approx(360 / 315)
    assert tool["overhead difference"] == pytest.approx(45.0)
    assert "3.71x" in built["md"] and "median per-turn ratio 3.75x" in built["md"]


def test_breakdown_tuning_micro_numbers(built):
    bd = pd.read_csv(built["out"] / "breakdown.csv").set_index("Series")
    row = bd.loc["durable/mock/reply"]
    assert row["client"] == pytest.approx(15.0)  # median of 12, 14, 16, 18
    assert row["act_exec - model"] == pytest.approx(1.0)
    assert row["other"] == pytest.approx(3.5)  # median of 2, 3, 4, 5
    tuning = pd.read_csv(built["out"] / "tuning.csv").set_index("Series")
    assert tuning.loc["tuning/tuned/eager", "vs baseline"] == pytest.approx(16 / 32)
    assert tuning.loc["tuning/stock/no-eager", "median wft_sched_to_start"] == pytest.approx(8.0)
    micro = pd.read_csv(built["out"] / "micro.csv")
    assert micro.loc[0, "mean (µs)"] == pytest.approx(2.5)
    overhead = pd.read_csv(built["out"] / "overhead.csv").set_index("Series")
    assert overhead.loc["process/activities/reply", "overhead p50"] == pytest.approx(22.0)
    assert overhead.loc["process/activities/reply", "above floor"] == pytest.approx(22.0 - 16.0)
    assert overhead.loc["process/local-model/reply", "above floor"] == pytest.approx(12.0 - 9.0)
    assert overhead.loc["process/activities/reply", "vs floor"] == pytest.approx(22.0 / 16.0)  # before pairing
    paired = overhead.loc["process/activities/tool"]
    assert (paired["floor p50"], paired["vs floor"], paired["load"]) == (41.0, pytest.approx(1.2), 0)
    assert overhead.loc["process/activities/tool@load2-r1", "vs floor"] == pytest.approx(1.6)
    spread = pd.read_csv(built["out"] / "overhead_spread.csv").set_index("load")
    assert list(spread["Series"]) == ["process/activities/tool"] * 2 and set(spread["Floor"]) == {"floor/3-dispatched"}
    assert spread.loc[0, "median"] == pytest.approx(1.2) and spread.loc[2, "median"] == pytest.approx(1.6)


def test_table1_verdicts(built):
    t1 = pd.read_csv(built["out"] / "table1.csv").set_index("Scenario")
    assert t1.loc["kill_mid_turn", "Outcome"] == "pass"
    assert t1.loc["kill_mid_turn", "Checked"] == "lost, effects, temporal, replay, injection_evidence"
    assert t1.loc["kill_mid_turn", "Recovery (s)"] == pytest.approx(0.3)
    assert t1.loc["kill_mid_turn", "Timeouts"] == "fast"
    assert t1.loc["kill_mid_turn", "Model call held (s)"] == pytest.approx(1.56)
    assert t1.loc["kill_mid_turn", "Workflow task held (s)"] == pytest.approx(1.01)
    assert pd.isna(t1.loc["kill_mid_turn", "Tool held (s)"])  # nothing of that kind was held: empty, never 0
    c = built["counts"]
    assert (t1.loc["kill_mid_turn", ["ok", "fail", "info"]].tolist() == [c["ok"], c["fail"], c["info"]])
    assert t1.loc["model_outage", "Outcome"] == "FAIL"
    assert t1.loc["model_outage", ["ok", "fail", "info"]].tolist() == [0, 0, 0]
    assert "effects (FAIL)" in t1.loc["model_outage", "Checked"]
    # Interrupted: no checks, no summary. Never pass; counts recomputed from the history.
    idle = t1.loc["kill_idle"]
    assert idle["Outcome"].startswith("unknown") and "pass" not in idle["Outcome"]
    u = built["unknown_counts"]
    assert [idle["ok"], idle["fail"], idle["info"]] == [u["ok"], u["fail"], u["info"]]
    assert u["info"] == 2 and u["fail"] == 1
    assert "crash_after_effect" not in t1.index
    assert "verdict **unknown (interrupted: the run was never checked)**" in built["md"]


def test_damaged_and_unused_runs_are_reported(built):
    md = built["md"]
    assert f"skipped {built['damaged']}: {built['damaged'] / 'run.json'}: expected JSON, got a syntax error" in md
    # The verdicts count it: what is shown and what is left out add up to every chaos run found.
    verdicts = md.split("## Verdicts", 1)[1].split("\n## ", 1)[0]
    assert "4 run(s) found: 3 shown (1 pass, 1 FAIL, 1 unknown), 1 not shown." in verdicts
    assert f"1 malformed run is left out: `{built['damaged']}`" in verdicts
    # The older bench run is listed as not used: every section it has comes from the newer one.
    older = built["runs"] / "bench" / "20250101T000000000000Z"
    assert f"`{older}` (status **complete**, started 2026-11-22T10:00:00Z): every section it has (table2, tuning, " \
           f"overhead) comes from a newer run" in md
    assert md.count(str(older)) == 1
    assert f"Source: `{built['runs'] / 'bench' / STAMP}`" in md.split("## Table 2")[1]
    assert "none: no complete run has it" not in md  # every bench section is present


def test_never_completed_op_is_info_with_latency_to_the_end(built):
    from reports.sources import load
    from reports import ops

    run = next(r for r in load(built["runs"]).chaos if r.scenario == "kill_mid_turn")
    assert run.end_s == pytest.approx(16.0)
    clients = ops.client_ops(run.ops, run.end_s)
    never = clients[~clients["completed"]]
    assert len(never) == 1 and never.iloc[0]["type"] == "info"
    assert never.iloc[0]["latency_s"] == pytest.approx(16.0 - 14.5)
    windows = ops.fault_windows(run.ops, run.end_s)
    assert [(w.f, w.start_s, w.end_s) for w in windows] == [("kill_worker", 5.0, 7.0)]


def test_interrupted_bench_renders_what_exists(tmp_path):
    runs = tmp_path / "runs"
    bench = runs / "bench" / STAMP
    write_bench(bench, status="interrupted", files=["latency"])
    (bench / "breakdown.json").write_text('{"series": [')
    out = tmp_path / "out"
    assert cli.main(["--runs", str(runs), "--out", str(out), "--bench", str(bench)]) == 0
    md = (out / "report.md").read_text()
    assert (out / "table2.csv").is_file() and not (out / "breakdown.csv").exists()
    assert f"skipped {bench / 'breakdown.json'}: {bench / 'breakdown.json'}: expected JSON, got a syntax error" in md
    # Named on the command line: used although interrupted, and said so beside its sections and in the warnings.
    assert "status **interrupted** (not a complete run: named on the command line)" in md.split("## Table 2")[1]
    assert f"using {bench} although its status is interrupted" in md
    assert "| breakdown | none: no complete run has it |" in md
    assert "no data: no complete bench run has this section" in md.split("## Overhead breakdown")[1].split("##")[0]
    assert "no data (run `make chaos`)" in md


def test_empty_runs_dir_still_writes_a_report(tmp_path, capsys):
    runs = tmp_path / "runs"
    runs.mkdir()
    out = tmp_path / "out"
    assert cli.main(["--runs", str(runs), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "No runs found" in md
    for hint in ("no data (run `make bench`)", "no data (run `make chaos`)",
                 "no data (run `dah-fuzz`)"):
        assert hint in md
    assert "no runs found" in capsys.readouterr().out


def test_missing_runs_dir_exits_2(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert cli.main(["--runs", str(missing), "--out", str(tmp_path / "out")]) == 2
    assert str(missing) in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_rebuild_replaces_only_its_own_files_and_a_failed_build_keeps_the_old_report(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    write_bench(runs / "bench" / STAMP, files=["recovery"])  # one figure: a fast build
    out = tmp_path / "out"
    assert cli.main(["--runs", str(runs), "--out", str(out)]) == 0
    assert (out / "figures" / "recovery.png").is_file()
    (out / "mine.txt").write_text("not the report's")
    before = (out / "report.md").read_text()

    from reports.document import Doc

    def boom(self):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(Doc, "markdown", boom)
    with pytest.raises(RuntimeError):
        build(runs, out)
    assert (out / "report.md").read_text() == before
    assert not list(out.glob(".building-*"))
    monkeypatch.undo()

    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["--runs", str(empty), "--out", str(out)]) == 0
    assert not (out / "figures" / "recovery.png").exists() and not (out / "recovery.csv").exists()
    assert (out / "mine.txt").read_text() == "not the report's"
    assert os.path.getsize(out / "report.md") > 0


# ---------------------------------------------------------------- reports from several runs

def test_each_section_comes_from_the_newest_complete_run_that_has_it(tmp_path):
    """Two roots (two CI machines): table2 only in an older run, micro in a newer one; an interrupted and a
    running newer run that have both are never used, and are listed with their status."""
    from reports.sources import load

    a, b = tmp_path / "machine-a", tmp_path / "machine-b"
    write_bench(a / "bench" / "20261122T100000Z", files=["latency", "micro"], started="2026-11-22T10:00:00Z")
    write_bench(b / "bench" / "20261122T110000Z", files=["micro"], started="2026-11-22T11:00:00Z")
    write_bench(a / "bench" / "20261122T120000Z", files=["latency", "micro"], status="interrupted",
                started="2026-11-22T12:00:00Z")
    write_bench(b / "bench" / "20261122T130000Z", status="running", started="2026-11-22T13:00:00Z")
    (a / "bench" / "latest").symlink_to("20261122T120000Z")  # even a (wrong) latest link does not decide
    src = load([a, b])
    assert src.bench_for("table2").path == a / "bench" / "20261122T100000Z"
    assert src.bench_for("tuning").path == a / "bench" / "20261122T100000Z"
    assert src.bench_for("micro").path == b / "bench" / "20261122T110000Z"
    assert src.bench_for("throughput") is None
    assert {(k.path.name, k.status) for k in src.bench_skipped} == {("20261122T120000Z", "interrupted"),
                                                                    ("20261122T130000Z", "running")}
    assert [r.path.name for r in src.bench_used] == ["20261122T110000Z", "20261122T100000Z"]

    # --bench: a directory of runs is scanned the same way; a run directory named itself is used as it is.
    named = a / "bench" / "20261122T120000Z"
    src = load([tmp_path], [b / "bench", named])
    assert src.bench_for("table2").path == named and src.bench_for("micro").path == named
    assert [k.path.name for k in src.bench_skipped] == ["20261122T130000Z"]
    assert any(f"using {named} although its status is interrupted" in w for w in src.warnings)


def test_report_from_several_roots_shows_each_sections_run(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    # Tables without figures (micro, overhead): a fast build.
    write_bench(a / "bench" / "20261122T100000Z", files=["micro"], started="2026-11-22T10:00:00Z",
                profile="default")
    write_bench(b / "bench" / "20261122T110000Z", files=["micro"], started="2026-11-22T11:00:00Z")
    write_bench(b / "bench" / "20261122T120000Z", files=["micro"], status="failed", started="2026-11-22T12:00:00Z")
    out = tmp_path / "out"
    assert cli.main(["--runs", str(a), str(b), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    micro = md.split("## Micro-benchmarks")[1].split("\n## ")[0]
    assert (f"Source: `{b / 'bench' / '20261122T110000Z'}`, started 2026-11-22T11:00:00Z, profile quick, "
            f"durability temporal, status **complete**. **Quick profile**") in micro
    assert md.startswith("# ") and "**QUICK PROFILE: the sections micro come from a `--quick` run" in md
    assert f"| micro | {b / 'bench' / '20261122T110000Z'} | 2026-11-22T11:00:00Z | quick | temporal | complete |" in md
    assert f"`{b / 'bench' / '20261122T120000Z'}` (status **failed**): skipped, did not complete" in md
    assert f"`{a / 'bench' / '20261122T100000Z'}` (status **complete**" in md  # not used: a newer run has micro
    # The hint for an absent section does not send the reader into a run that empties the others.
    assert "the report takes each section from the newest complete run that has it" in md
    assert f"- {b / 'bench' / '20261122T120000Z'}" not in md

    # The flag repeated adds up, as several names after one flag do (it used to keep only the last).
    out3 = tmp_path / "out3"
    assert cli.main(["--runs", str(a), "--runs", str(b), "--out", str(out3)]) == 0
    md3 = (out3 / "report.md").read_text()
    assert f"| micro | {b / 'bench' / '20261122T110000Z'} |" in md3
    assert f"`{a / 'bench' / '20261122T100000Z'}` (status **complete**" in md3

    # A default-profile run alone: no quick banner.
    out2 = tmp_path / "out2"
    assert cli.main(["--runs", str(tmp_path / "none"), "--out", str(out2)]) == 2
    assert cli.main(["--runs", str(a), "--out", str(out2)]) == 0
    assert "QUICK PROFILE" not in (out2 / "report.md").read_text()


def _tex_rows(tex: str) -> tuple[str, int, list[str]]:
    """The environment, the tabular's column count and its body rows (header included) of a generated table."""
    import re

    env = re.search(r"\\begin\{(table\*?)\}", tex).group(1)
    spec = re.search(r"\\begin\{tabular\}\{@\{\}(.*?)@\{\}\}\n", tex).group(1)
    cols = len(re.findall(r"[lrc]|p\{[^}]*\}", spec))
    body = tex.split("\\toprule\n")[1].split("\\bottomrule")[0].replace("\\midrule\n", "")
    # A stacked header cell is a nested tabular: its \\ are not row ends.
    body = re.sub(r"\\begin\{tabular\}\[b\].*?\\end\{tabular\}", "H", body)
    return env, cols, [r for r in body.split("\\\\\n") if r.strip()]


def test_latex_tables_fit_a_two_column_page(built):
    for name in ("table1", "table2", "table2_overhead", "breakdown"):
        tex = (built["out"] / f"{name}.tex").read_text()
        env, cols, rows = _tex_rows(tex)
        assert env == "table*", name  # wider than one column: across both
        assert rows and all(r.count(" & ") + 1 == cols for r in rows), (name, cols, rows)
        assert cols <= 13 and ("\\small" in tex or "\\footnotesize" in tex), name
        assert "\\setlength{\\tabcolsep}{4pt}" in tex
    t2 = (built["out"] / "table2.tex").read_text()
    assert "mean (ms) \\\\{} [95\\% CI]" in t2  # units in headers; "\\{}" keeps "[" from being \\'s argument
    assert "* p99 of fewer than 100 turns" in t2
    # The model/plain durable series have 5 turns: an interval, which brackets the mean.
    assert "360.0 [" in t2
    preview = (built["out"] / "preview.tex").read_text()
    assert "\\documentclass[twocolumn]{article}" in preview
    for name in ("table1", "table2", "table2_overhead", "breakdown"):
        assert f"\\input{{{name}.tex}}" in preview
    assert "\\includegraphics[width=\\columnwidth]{figures/latency-cdf.pdf}" in preview
    assert "\\includegraphics[width=\\textwidth]{figures/breakdown.pdf}" in preview


def test_bootstrap_ci_brackets_the_estimate_and_is_deterministic():
    import numpy as np

    from reports.confidence import bootstrap_ci, with_ci

    x = np.random.default_rng(7).lognormal(3.0, 0.4, 40)
    for stat, point in (("mean", float(np.mean(x))), ("median", float(np.median(x)))):
        lo, hi = bootstrap_ci(x, stat)
        assert lo < point < hi, stat
        assert (lo, hi) == bootstrap_ci(x, stat)  # same seed, same interval
        assert (lo, hi) != bootstrap_ci(x, stat, seed=1)
        assert hi - lo < point  # a real interval, not the range of the data
    assert bootstrap_ci(x[:4]) == (pytest.approx(math.nan, nan_ok=True), pytest.approx(math.nan, nan_ok=True))
    assert bootstrap_ci([5.0] * 10, "median") == (5.0, 5.0)
    assert with_ci(47.8, (45.1, 50.2)) == "47.8 [45.1, 50.2]"
    assert with_ci(47.8, (math.nan, math.nan)) == "47.8"


def test_resources_of_each_section_come_from_the_newest_run_that_measured_it(tmp_path):
    runs = tmp_path / "runs"
    old, new = runs / "bench" / "20261122T100000Z", runs / "bench" / "20261122T110000Z"
    write_bench(old, files=["resources"], started="2026-11-22T10:00:00Z")  # table2 and throughput
    write_bench(new, files=["resources"], started="2026-11-22T11:00:00Z")
    doc = json.loads((new / "resources.json").read_text())
    doc["sections"] = {"table2": {"temporal-server": {**doc["sections"]["table2"]["temporal-server"],
                                                      "cpu_mean_pct": 99.0}}}
    (new / "resources.json").write_text(json.dumps(doc))  # a later `--only table2` run
    out = tmp_path / "out"
    assert cli.main(["--runs", str(runs), "--out", str(out)]) == 0
    res = pd.read_csv(out / "resources.csv")
    assert res[(res["section"] == "table2")]["cpu_mean_pct"].tolist() == [99.0]
    assert res[(res["section"] == "throughput")]["cpu_mean_pct"].tolist() == [60.0]
    md = (out / "report.md").read_text()
    assert f"Also from `{old}` (started 2026-11-22T10:00:00Z, profile quick): the samples of throughput. **Quick profile**: not for citation." in md


def test_the_checkpoint_table_gives_intervals_from_the_saved_samples_and_the_points_alone_without(built) -> None:
    import csv

    rows = {(r["measure"], r["backend"]): r for r in csv.DictReader((built["out"] / "checkpoint.csv").open())}
    step = rows[("step", "checkpoint (sqlite)")]
    lo, hi = float(step["p50 CI low"]), float(step["p50 CI high"])
    assert lo < float(step["p50_ms"]) < hi and float(step["mean CI low"]) < float(step["mean CI high"])
    turn = rows[("turn", "checkpoint (sqlite)")]
    assert turn["p50 CI low"] in ("", "nan") and float(turn["p50_ms"]) == 25.0  # no samples: no interval
    assert "p50 (ms) [95% CI]" in built["md"] and "0.550 [" in built["md"]


def test_the_engines_tables_compare_every_engine_and_name_the_one_not_measured(built) -> None:
    import csv

    turns = {(r["Engine"], r["Model"]): r for r in csv.DictReader((built["out"] / "engines_turns.csv").open())}
    assert {e for e, _ in turns} == {"plain", "dbos", "restate"}
    assert float(turns[("dbos", "mock (fixed:0)")]["p50"]) == 64.0  # 60..68 ms: median 64
    assert float(turns[("dbos", "mock (fixed:0)")]["minus model p50"]) == 54.0
    steps = {r["engine"]: r for r in csv.DictReader((built["out"] / "engines_steps.csv").open())}
    assert float(steps["restate"]["vs_floor"]) == 8.0 and steps["fsync'd SQLite commit"]["measure"] == "floor"
    assert "synchronous: FULL" in steps["dbos"]["durability"]
    assert "**dbos-postgres** not measured: PostgreSQL is not installed" in built["md"]


def _lines_naming(err: str, file: Path) -> list[str]:
    return [line for line in err.splitlines() if str(file) in line]


@pytest.mark.parametrize("content, got", [(b"[1, 2]", "a list"), (b'"a run"', "'a run'"), (b"5", "5"),
                                          (b"null", "null")], ids=["a list", "a string", "a number", "null"])
def test_a_run_json_that_is_not_an_object_is_malformed_exit_1_or_2_when_nothing_else(
        tmp_path: Path, capsys: pytest.CaptureFixture, content: bytes, got: str) -> None:
    """As a run.json with a field of the wrong type: the run is left out, named in one warning line, exit 1; every
    run left out so: exit 2."""
    runs = tmp_path / "runs"
    write_chaos(runs, "kill_mid_turn", clients=())
    write_chaos(runs, "kill_idle", clients=())
    bad = runs / "kill_idle" / STAMP
    (bad / "run.json").write_bytes(content)
    assert cli.main(["--runs", str(runs), "--out", str(tmp_path / "out")]) == 1
    [line] = _lines_naming(capsys.readouterr().err, bad / "run.json")
    assert line == f"[reports] warning: skipped {bad}: {bad}/run.json: expected an object, got {got}"
    assert "kill\\_idle" not in (tmp_path / "out" / "report.md").read_text().split("## Verdicts")[1].split("##")[0]
    (runs / "kill_mid_turn" / STAMP / "run.json").write_bytes(content)
    assert cli.main(["--runs", str(runs), "--out", str(tmp_path / "out")]) == 2


@pytest.mark.parametrize("kind, file, content, said", [
    ("soak", "soak.json", b"[]", "soak.json: expected an object, got a list"),
    ("soak", "soak.json", b'{"runs": 5}', "soak.json: field 'runs': expected a list, got 5"),
    ("fuzz", "results.json", b'"done"', "results.json: expected an object, got 'done'"),
    ("fuzz", "results.json", b'{"families": []}', "results.json: field 'families': expected an object, got a list"),
], ids=["soak.json a list", "soak.json runs 5", "results.json a string", "results.json families a list"])
def test_a_soak_or_fuzz_file_of_the_wrong_shape_is_malformed_like_any_other(
        tmp_path: Path, capsys: pytest.CaptureFixture, kind: str, file: str, content: bytes, said: str) -> None:
    runs = tmp_path / "runs"
    write_chaos(runs, "kill_mid_turn", clients=())
    if kind == "fuzz":
        where = runs / "migration_fuzz" / STAMP
        where.mkdir(parents=True)
    else:
        from tests.test_report_verdicts import write_soak

        write_soak(runs, "kill_idle", {1: "pass"}, {"cores": 2})
        where = runs / "soak-kill_idle" / "20261122T110000000000Z"
    (where / file).write_bytes(content)
    assert cli.main(["--runs", str(runs), "--out", str(tmp_path / "out")]) == 1
    [line] = _lines_naming(capsys.readouterr().err, where / file)
    assert line == f"[reports] warning: skipped {where}: {where}/{said}"


def test_a_run_left_out_only_as_incomplete_keeps_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runs = tmp_path / "runs"
    write_chaos(runs, "kill_mid_turn", clients=())
    write_chaos(runs, "kill_idle", clients=())
    (runs / "kill_idle" / STAMP / "operations.jsonl").unlink()  # started: run.json written, no operation yet
    assert cli.main(["--runs", str(runs), "--out", str(tmp_path / "out")]) == 0
    [line] = _lines_naming(capsys.readouterr().err, runs / "kill_idle" / STAMP)
    assert line.endswith("no operations.jsonl")


def _scale_point(size: str, conversations: int, messages: int, check_s: float, cpu_ms: float, chain: int = 0) -> dict:
    return {"size": size, "conversations": conversations, "messages_per_conversation": 20, "max_history_events": chain,
            "messages": messages, "events": messages * 25, "runs": conversations, "longest_chain_events": 500,
            "wall_s": 60.0, "harness_cpu_s": cpu_ms * messages / 1000, "harness_cpu_ms_per_message": cpu_ms,
            "peak_rss_mib": 300.0, "report_rss_mib": 400.0, "check_s": check_s, "replay_s": check_s / 2,
            "replay_ms_per_history": 40.0, "run_dir_bytes": 2**20 * messages / 100, "report_s": 3.0,
            "verdict": "pass", "checker_s": {"lost": check_s / 4, "replay": check_s / 2},
            "measurement_s": {"lint": 0.001}}


def _scale_data() -> dict:
    """The scale section of a bench run: three sizes and a continue-as-new chain, checks growing linearly."""
    from benchmarks.scale import acceptance, fits

    points = [_scale_point("c10", 10, 200, 2.0, 50.0), _scale_point("c30", 30, 600, 5.0, 45.0),
              _scale_point("c100", 100, 2000, 15.0, 40.0), _scale_point("chain", 2, 440, 4.0, 60.0, chain=1000)]
    return {"points": points, "fits": fits(points), "acceptance": acceptance(points)}


def test_the_report_tables_the_scale_sizes_the_checks_and_the_fits() -> None:
    from reports import scale as rscale

    data = _scale_data()
    assert data["fits"]["check_s~messages"]["r2"] > 0.99
    assert list(rscale.table(data).df["messages"]) == [200, 600, 2000, 440]
    assert list(rscale.checks_table(data).df["check"]) == ["lost", "replay", "(lint)"]
    assert "check_s" in set(rscale.fits_table(data).df["measure"])
    assert rscale.acceptance_lines(data)[-1].endswith("acceptance met")
