"""The scale section's pure parts (``benchmarks/scale.py``): the fits, whose process is whose, the sizes and the
acceptance (its report tables: tests/test_reports.py). The section itself runs chaos runs of up to 100
conversations: ``dah-bench --only scale`` (docs/benchmarks.md), never a test."""

from __future__ import annotations

import math
import pytest

from benchmarks.options import OPT_IN, Options
from benchmarks.scale import AGENT, ENGINE, HARNESS, acceptance, classify, fit, fits, sizes


def test_fit_recovers_a_line_and_its_exponent() -> None:
    f = fit([10, 30, 100], [5 + 2 * x for x in (10, 30, 100)])
    assert f["slope"] == pytest.approx(2.0) and f["intercept"] == pytest.approx(5.0) and f["r2"] == pytest.approx(1.0)
    assert fit([10, 30, 100], [3 * x for x in (10, 30, 100)])["exponent"] == pytest.approx(1.0)
    assert fit([10, 30, 100], [x * x for x in (10, 30, 100)])["exponent"] == pytest.approx(2.0)


def test_fit_of_scattered_points_has_r2_below_one_and_unfittable_data_has_none() -> None:
    assert 0.0 < fit([1, 2, 3, 4], [1, 3, 2, 4])["r2"] < 1.0
    assert fit([5, 5], [1, 2])["slope"] is None  # one distinct x: no line
    assert fit([1, 2, 3], [1.0, None, math.nan])["slope"] is None  # a missing y is left out


def test_the_harness_process_tree_is_split_into_harness_engine_and_agent() -> None:
    assert classify(["/x/.venv/bin/temporal", "server", "start-dev", "--port", "7233"]) == ENGINE
    assert classify(["/x/.venv/bin/python", "-P", "-m", "testbed.forkserver"]) == AGENT
    assert classify(["/x/.venv/bin/python", "-P", "-m", "testbed", "worker", "--address", "a"]) == AGENT
    assert classify(["/x/.venv/bin/python", "-m", "harness.replayer", "/r/event_histories"]) == HARNESS
    assert classify(["/x/.venv/bin/python", "-P", "-m", "testbed.containers", "reap", "1-2"]) == HARNESS
    assert classify([]) == HARNESS


def test_scale_is_opt_in_and_its_sizes_begin_with_the_continue_as_new_one() -> None:
    assert "scale" in OPT_IN and "scale" not in Options().sections()
    assert Options(only=("scale",)).sections() == ["scale"]
    got = sizes((100, 10, 30), 20, 220)
    assert [(s.conversations, s.messages, s.max_history_events) for s in got] == [
        (2, 220, 1000), (10, 20, 0), (30, 20, 0), (100, 20, 0)]
    assert [s.label for s in sizes((2,), 3, 0)] == ["c2xm3"]


def _point(size: str, conversations: int, check_s: float, cpu_ms: float, chain: int = 0) -> dict:
    return {"size": size, "conversations": conversations, "max_history_events": chain, "check_s": check_s,
            "harness_cpu_ms_per_message": cpu_ms, "peak_rss_mib": 300.0, "report_rss_mib": 400.0, "verdict": "pass"}


def test_acceptance_compares_the_largest_kill_mid_turn_size_with_the_smallest() -> None:
    points = [_point("c10", 10, 2.0, 50.0), _point("c100", 100, 15.0, 40.0),
              _point("chain", 2, 99.0, 500.0, chain=1000)]  # the chain size is not compared
    a = acceptance(points)
    assert a["compared"] == ["c10", "c100"] and a["checks_ratio"] == 7.5 and a["cpu_per_message_ratio"] == 0.8
    assert a["max_rss_mib"] == 400.0 and a["met"] is True
    assert acceptance([{**points[0], "verdict": "fail"}, points[1]])["met"] is False
    assert acceptance(points[:1]) == {"compared": None}
