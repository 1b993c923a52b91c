"""One replay of a reproduced figure, summarised, and kept for the process: ids that share a set-up (fair Figs. 3,
4 and 7; constraint-aware Figs. 6 to 10) replay it once when `megha reproduce all` runs them together.

An `Outcome` keeps what the figures need and drops the records: the run's metrics, allocation-time quantiles on a
fine grid, every finished job's JRT delay and the utilization steps. Generated traces (re-timed jobs, Poisson
arrivals) go to one scratch folder per process under fixed names, so equal set-ups give equal configurations.
"""

from __future__ import annotations

import atexit
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from megha.loadgen.metrics import RunMetrics
from megha.loadgen.replay import ReplayConfig
from megha.sim.experiments import harness
from megha.sim.experiments.allocation import CDF_PERCENTS
from megha.sim.experiments.harness import Run


@dataclass(frozen=True, slots=True)
class Outcome:
    """The figures of one replay: `run` (the experiments' CSV row), `metrics`, allocation-time quantiles at
    `CDF_PERCENTS`, sorted JRT delays of the finished jobs, and utilization (first resource) per step."""

    config: ReplayConfig
    run: Run
    metrics: RunMetrics
    allocation_quantiles: np.ndarray
    jrt_delays: np.ndarray
    utilization: np.ndarray


_OUTCOMES: dict[ReplayConfig, Outcome] = {}
_SCRATCH: list[tempfile.TemporaryDirectory[str]] = []


def outcome(config: ReplayConfig, label: str) -> Outcome:
    """Replay `config` (labelled `label` in the progress lines and the run's row), or return this process's
    earlier outcome of the same configuration."""
    known = _OUTCOMES.get(config)
    if known is not None:
        return known
    run, result = harness.run_replay(config, label)
    allocation = harness.allocation_times(result)
    delays = np.sort(np.array([j.jrt_delay for j in result.recorder.jobs.values()], dtype=np.float64))
    metrics = result.metrics
    utilization = next(iter(metrics.utilization.fractions.values()))
    _OUTCOMES[config] = done = Outcome(
        config,
        run,
        metrics,
        np.percentile(allocation, CDF_PERCENTS) if allocation.size else np.full(CDF_PERCENTS.size, np.nan),
        delays[~np.isnan(delays)],
        np.asarray(utilization, dtype=np.float64),
    )
    return done


def scratch() -> Path:
    """This process's folder for generated traces (removed when it exits)."""
    if not _SCRATCH:
        folder = tempfile.TemporaryDirectory(prefix="megha-reproduce-")
        atexit.register(folder.cleanup)
        _SCRATCH.append(folder)
    return Path(_SCRATCH[0].name)
