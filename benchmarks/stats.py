"""Summary statistics of latency samples (the columns of the paper's Table 2)."""

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
    """n, mean, sd (sample), min, max, p50, p95, p99; NaN for what an empty or single sample cannot give."""
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
