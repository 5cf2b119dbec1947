"""Percentiles and the summary every latency table shows (n, mean, sd, min, max, p50, p95, p99): one definition
for the benchmarks that measure and the report that reads their samples back."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarise(values: Sequence[float]) -> dict[str, float]:
    """n, mean, sd (sample), min, max, p50, p95, p99 of the values that are not NaN (a sample that was not taken);
    NaN for what an empty or single sample cannot give."""
    values = [v for v in values if not math.isnan(v)]
    n = len(values)
    return {
        "n": n,
        "mean": statistics.fmean(values) if n else math.nan,
        "sd": statistics.stdev(values) if n > 1 else math.nan,
        "min": min(values) if n else math.nan,
        "max": max(values) if n else math.nan,
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
    }


def spread(values: Sequence[float]) -> dict[str, float]:
    """n, median, quartiles (q1, q3), min and max of the values that are not NaN: how much repeated measurements
    of one figure disagree."""
    values = [v for v in values if not math.isnan(v)]
    s = summarise(values)
    return {"n": s["n"], "median": s["p50"], "q1": percentile(values, 25), "q3": percentile(values, 75),
            "min": s["min"], "max": s["max"]}


def median_floor_ratio(turns: Sequence[dict]) -> float:
    """One round of an overhead series (``latency.json``): the median of its turns' ``vs_floor``, each turn's
    overhead over its paired floor turn (NaN for a series measured without a floor beside it)."""
    return percentile([v for t in turns if (v := t.get("vs_floor")) is not None and not math.isnan(v)], 50)


def floor_ratio_spreads(series: Sequence[dict]) -> list[dict]:
    """The overhead section's ratios over its rounds (``latency.json``'s overhead series; ``--overhead-rounds``):
    per agent configuration, workload and load (``load_processes``, CPU-bound processes beside it), the round
    figures (``median_floor_ratio``) and their ``spread``, in the order the series were measured. Series paired
    with no floor are left out."""
    rounds: dict[tuple[str, str, int], list[float]] = {}
    floors: dict[tuple[str, str, int], str] = {}
    for s in series:
        if s.get("section") != "overhead" or s.get("loop") != "durable" or not s.get("floor"):
            continue
        key = (str(s.get("variant")), str(s.get("workload")), int(s.get("load_processes") or 0))
        rounds.setdefault(key, []).append(median_floor_ratio(s["turns"]))
        floors[key] = str(s["floor"]).split("@")[0]
    return [{"series": f"process/{v}/{w}", "floor": floors[(v, w, k)], "load_processes": k,
             "rounds": rounds[(v, w, k)], **spread(rounds[(v, w, k)])} for v, w, k in rounds]
