"""Figures over seeds: a mean that skips what was not measured, a ratio that says when its denominator is 0, and a
statistic of the runs' summaries."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from megha.loadgen.metrics import Summary
from megha.sim.reproduce.outcome import Outcome


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator; infinite when only the denominator is 0, NaN when both are."""
    if denominator == 0:
        return math.inf if numerator > 0 else math.nan
    return numerator / denominator


def mean(values: Iterable[float]) -> float:
    """The mean of the values that are not NaN; NaN when none is."""
    data = np.array(list(values), dtype=np.float64)
    return float(np.nanmean(data)) if data.size and not np.isnan(data).all() else math.nan


def summary_mean(runs: Sequence[Outcome], statistic: str, measure: str = "allocation_time") -> float:
    """A statistic (`Summary` field) of the runs' `measure` averaged over seeds; "max" is the largest over seeds."""
    summaries: list[Summary] = [getattr(o.metrics, measure) for o in runs]
    if statistic == "max":
        return max(s.max for s in summaries)
    return mean(getattr(s, statistic) for s in summaries)
