"""Confidence intervals for the report's means and medians: the percentile bootstrap (scipy).

``bootstrap_ci(values, "mean")`` gives the 95 % interval of the mean of the
sample, from ``RESAMPLES`` resamples drawn with a fixed seed, so a report
rebuilt from the same data prints the same intervals. The percentile method
(not BCa) is used because it is defined for every sample, also one whose
values are all equal (its interval is then that value). Fewer than
``MIN_N`` values give no interval (NaN, NaN): a bootstrap of two or three
values describes the sample, not the population.

``FEW_FOR_P99``: a p99 from fewer samples than this is interpolated between the
largest values (it is close to the maximum), and the report marks it so.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 0
MIN_N = 5
FEW_FOR_P99 = 100
STATISTICS = {"mean": np.mean, "median": np.median}


def bootstrap_ci(values: Sequence[float] | np.ndarray, statistic: str = "mean", *, seed: int = SEED,
                 confidence: float = CONFIDENCE, resamples: int = RESAMPLES) -> tuple[float, float]:
    """The percentile-bootstrap confidence interval (low, high) of ``statistic`` over the non-NaN ``values``."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if x.size < MIN_N:
        return math.nan, math.nan
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    with warnings.catch_warnings():  # scipy warns about samples with few distinct values; the interval stands
        warnings.simplefilter("ignore")
        res = sps.bootstrap((x,), STATISTICS[statistic], confidence_level=confidence, n_resamples=resamples,
                            method="percentile", vectorized=True, rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def with_ci(point: float, ci: tuple[float, float], fmt: str = ".1f") -> str:
    """``47.8 [45.1, 50.2]``; the point alone when there is no interval, an em dash when there is no point."""
    if math.isnan(point):
        return "—"
    if math.isnan(ci[0]) or math.isnan(ci[1]):
        return format(point, fmt)
    return f"{point:{fmt}} [{ci[0]:{fmt}}, {ci[1]:{fmt}}]"
