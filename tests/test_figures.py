"""The report's figures read as a referee reads them: one question per figure, labels that do not run into each
other, log axes with enough labelled ticks, no setup time, a legend only for what is drawn.

The figures are drawn from data shaped as ``benchmarks`` and ``chaos`` write it; what a figure shows is read back
from its SVG, where matplotlib keeps every drawn text as a comment.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np

from harness.operations import Op
from reports import figures as figs
from reports import style
from reports.sources import ChaosRun


def _texts(svg: Path) -> list[str]:
    """Every text drawn in a matplotlib SVG: tick labels, axis labels, legend entries."""
    return re.findall(r"<!-- (.*?) -->", svg.read_text())


def _bd_turns(n: int, client: float, model: float) -> list[dict[str, float]]:
    return [{"i": i, "client_ms": client + i, "server_ms": client - 2, "client_rtt_ms": 2.0,
             "wft_sched_to_start_ms": 3.0, "wft_exec_ms": 9.0, "act_sched_to_start_ms": 1.0,
             "act_exec_ms": model + 6.0, "model_ms": model, "other_ms": 0.5} for i in range(1, n + 1)]


# The breakdown series one full bench run writes, named as benchmarks names them: 20 in all.
TABLE2 = [f"durable/{m}/{w}" for w in ("reply", "tool") for m in ("mock", "model")]
TUNING = [f"{srv}/{v}/tool" for v in ("eager", "no-eager", "no-sandbox", "local-tools", "process")
          for srv in ("stock", "tuned")]
OVERHEAD = [f"process/{v}/reply" for v in ("activities", "local-model")] + [
    f"process/{v}/tool" for v in ("activities", "local-tools", "local-model", "local-all")]


def _breakdown() -> list[dict]:
    return [{"name": n, "turns": _bd_turns(6, 40.0 + 300.0 * ("/model/" in n), 300.0 if "/model/" in n else 14.0)}
            for n in TABLE2 + TUNING + OVERHEAD]


def test_log_ticks_label_a_narrow_range_densely():
    # Chaos latencies between 1.3 and 5 s: not just 2 and 5.
    assert figs.log_ticks(1.3, 5.0) == [1.5, 2.0, 3.0, 5.0]
    # Fewer than three inside: the ticks around the range are added, and the axis widened to them.
    assert figs.log_ticks(1.3, 1.9) == [1.0, 1.5, 2.0]
    # Six decades in little room: every other decade, written short.
    wide = figs.log_ticks(1e-4, 100.0, room=6)
    assert wide == [1e-4, 1e-2, 1.0, 100.0]
    assert [figs._log_label(v) for v in wide] == ["10\u207b\u2074", "0.01", "1", "100"]


def test_the_overlap_check_catches_rotated_labels_running_into_each_other():
    # The old breakdown's left panel: 20 rotated names under 20 narrow bars.
    fig, ax = style.new(style.DOUBLE, 2.8, ncols=2, width_ratios=[1, 2])
    names = TABLE2 + TUNING + OVERHEAD
    ax[0].bar(np.arange(len(names)), np.ones(len(names)))
    ax[0].set_xticks(np.arange(len(names)), names, rotation=30, ha="right")
    fig.canvas.draw()
    assert style.overlapping_labels(fig)
    fig.clf()


def test_breakdown_is_one_figure_per_section_with_readable_labels(tmp_path, caplog):
    latency = [{"name": n, "section": sec} for sec, names in (("table2", TABLE2), ("tuning", TUNING),
                                                               ("overhead", OVERHEAD)) for n in names]
    with caplog.at_level(logging.WARNING, logger="reports.style"):
        made = figs.plot_breakdown(_breakdown(), tmp_path, latency)
    assert [f.name for f in made] == ["breakdown", "breakdown-overhead"]  # tuning: the tuning figure
    assert not [r for r in caplog.records if "overlap" in r.getMessage()]
    table2 = _texts(tmp_path / "breakdown.svg")
    assert {"reply, mock", "reply, model", "tool, mock", "tool, model"} <= set(table2)
    assert not any("stock" in t or "activities" in t for t in table2)  # no other section's series
    overhead = _texts(tmp_path / "breakdown-overhead.svg")
    assert {"activities, reply", "local-all, tool"} <= set(overhead)
    assert not any(t.startswith(("reply, ", "tool, ")) for t in overhead)
    # Without the latency series, the sections come from the names the benchmarks give them.
    assert [f.name for f in figs.plot_breakdown(_breakdown(), tmp_path / "names")] == ["breakdown",
                                                                                       "breakdown-overhead"]


def test_tuning_bars_are_horizontal_and_do_not_overlap(tmp_path, caplog):
    series = [{"name": n, "section": "tuning", "server": n.split("/")[0], "variant": n.split("/")[1],
               "turns": [{"i": i, "client_ms": 60.0 + i} for i in range(1, 7)]} for n in TUNING]
    with caplog.at_level(logging.WARNING, logger="reports.style"):
        assert figs.plot_tuning(series, _breakdown(), tmp_path).name == "tuning"
    assert not [r for r in caplog.records if "overlap" in r.getMessage()]
    assert {"stock eager", "tuned process"} <= set(_texts(tmp_path / "tuning.svg"))


def _op(i: int, process: str, type_: str, f: str, t: float, invoke: int | None = None) -> Op:
    return Op(index=i, process=process, type=type_, f=f, time=t, invoke_index=invoke)


def _chaos_run(tmp_path: Path) -> ChaosRun:
    """12 s of setup, then three clients whose turns take 1.3 to 4.8 s, two worker kills, two slow links that
    overlap and a supervisor restart."""
    ops: list[Op] = []

    def pair(process: str, f: str, start: float, end: float, type_: str = "ok") -> None:
        ops.append(_op(len(ops), process, "invoke", f, start))
        ops.append(_op(len(ops), process, type_, f, end, invoke=len(ops) - 1))

    phases = {"setup": 0.0, "warm-up": 12.0, "faults": 13.0, "heal": 18.0, "settle": 18.5, "final": 24.0,
              "stopped": 25.0}
    for k, (start, latency) in enumerate([(12.2, 2.9), (12.3, 3.4), (15.2, 1.3), (16.3, 3.9), (16.7, 4.8),
                                          (20.9, 1.5), (21.7, 1.6), (22.7, 1.5)]):
        pair(f"client-{k % 3}", "send_message", start, start + latency)
    pair("nemesis", "kill_worker", 13.6, 13.7)
    pair("nemesis", "kill_worker", 17.1, 17.2)
    pair("nemesis", "degrade_link", 14.0, 16.5)
    pair("nemesis", "degrade_link", 15.0, 17.5)
    ops.append(_op(len(ops), "supervisor", "invoke", "restart_worker", 14.7))
    ops.sort(key=lambda op: op.time)
    return ChaosRun(scenario="kill_mid_turn", path=tmp_path / "kill_mid_turn" / "run", record={"phases": phases},
                    ops=ops, verdict="pass", verdict_note="", summary={}, summary_from_history=False, checks=[],
                    end_s=25.0)


def test_chaos_figures_crop_setup_label_the_log_axis_and_name_faults_once(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="reports.style"):
        made = figs.plot_chaos(_chaos_run(tmp_path), tmp_path, "chaos-kill_mid_turn")
    assert [f.name for f in made] == [f"chaos-kill_mid_turn-{k}" for k in ("latency-raw", "latency-quantiles",
                                                                          "rate")]
    assert not [r for r in caplog.records if "overlap" in r.getMessage()]
    raw = _texts(tmp_path / "chaos-kill_mid_turn-latency-raw.svg")
    assert {"1.5", "2", "3", "5"} <= set(raw)  # between 1 and 5 s, more than 2 and 5
    times = [float(t) for t in raw if re.fullmatch(r"\d+(\.\d+)?", t) and float(t) >= 10]
    assert min(times) >= 11 and "0" not in raw  # the time axis starts after the setup
    assert "The first 12 s of the run (setup" in made[0].caption
    for fig in made:
        texts = _texts(tmp_path / f"{fig.name}.svg")
        # each fault kind named once, on its lane, never again as a legend patch
        assert texts.count("kill_worker") == 1 and texts.count("degrade_link") == 1, texts
        assert "worker restart" in texts and "phase" in texts
