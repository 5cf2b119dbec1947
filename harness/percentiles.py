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
