"""Confidence intervals over seeds, and whether two of them tell methods apart.

Each interval is scipy's bootstrap (:func:`scipy.stats.bootstrap`) of the mean over a row's
runs (seeds), or of the ratio of two rows' means (a speedup, the rows resampled independently),
at :data:`CONFIDENCE`, by the *percentile* method: scipy's default, BCa, estimates a bias and
an acceleration that 2-3 seeds (what a comparison usually has) cannot pin down, and gives NaN
where the seeds agree exactly (a simulated run's repeatable times often do).
The resampling is seeded (:data:`SEED`), so a report reads the same every time it is written.
With one run there is no interval: None, never a made-up one. Few seeds give wide intervals;
that is what they know.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 9999
SEED = 0
METHOD = "percentile"

Interval = tuple[float, float]


def _interval(samples: Sequence[Sequence[float]],
              statistic: Callable[..., np.ndarray]) -> Interval | None:
    # imported here: every run imports this module (the tuning checks name the report's
    # metrics) before its own errors are caught, and scipy.stats maps ~180 MB (BLAS among it)
    from scipy.stats import bootstrap

    if any(len(sample) < 2 for sample in samples):
        return None
    found = bootstrap(tuple(np.asarray(s, dtype=float) for s in samples), statistic,
                      confidence_level=CONFIDENCE, n_resamples=RESAMPLES, method=METHOD,
                      rng=np.random.default_rng(SEED), vectorized=True).confidence_interval
    return float(found.low), float(found.high)


def mean_interval(values: Sequence[float]) -> Interval | None:
    """The bootstrap interval of the mean of ``values``; None for fewer than two."""
    return _interval([values], np.mean)


def _ratio(numerator: np.ndarray, denominator: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(numerator, axis=axis) / np.mean(denominator, axis=axis)


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float]) -> Interval | None:
    """The bootstrap interval of mean(numerator) / mean(denominator), each resampled on its
    own; None unless both have two values or more."""
    return _interval([numerator, denominator], _ratio)


def overlap(a: Interval, b: Interval) -> bool:
    """Whether two intervals share a point: their methods are not distinguishable."""
    return a[0] <= b[1] and b[0] <= a[1]


def bracket(low: float, high: float, fmt: str) -> str:
    """``[low, high]``; empty where the interval is unknown (NaN)."""
    return f"[{low:{fmt}}, {high:{fmt}}]" if math.isfinite(low) and math.isfinite(high) else ""


def cell(mean: float, interval: Interval | None, n: int, fmt: str, of: int | None = None,
         unit: str = "") -> str:
    """A time or a speedup as every table shows one: ``mean [low, high] n=k``, ``n=k/m`` where
    only k of m runs count; no interval where there is none (one run) or it is unknown."""
    spread = "" if interval is None else bracket(*interval, fmt)
    counted = f"n={n}" + (f"/{of}" if of is not None and n < of else "")
    return " ".join(part for part in (f"{mean:{fmt}}{unit}", spread, counted) if part)


def mean_cell(values: Sequence[float | None], fmt: str, of: int | None = None,
              unit: str = "") -> str:
    """:func:`cell` of the values that exist (None or NaN: a run without one), ``n=k/m`` with m
    ``of`` runs (all the values by default); a dash where none exists."""
    present = [v for v in values if v is not None and math.isfinite(v)]
    if not present:
        return "—"
    return cell(statistics.fmean(present), mean_interval(present), len(present), fmt,
                len(values) if of is None else of, unit)
