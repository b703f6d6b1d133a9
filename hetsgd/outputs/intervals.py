"""Confidence intervals over seeds, and whether a ratio of two rows' means tells them apart.

A comparison has 2-5 seeds a row. A bootstrap's percentile interval cannot reach past the seeds'
own range, so with n seeds it misses the mean at least 2 * 2**-n of the time (for seeds spread
evenly about it): at most 75 % coverage for three seeds, 50 % for two, whatever confidence it is
asked for. Intervals here are therefore Student's t, which is exact for normal seeds and widens
as they get fewer (``tests/test_intervals.py`` checks that they hold the true value as often as
they say):

- the mean of a row's runs: mean ± t(n - 1) · s / sqrt(n), a time's cut at 0 (a time's mean
  is not below it, so the cut never leaves the true mean out);
- the ratio of two rows' means (a speedup; the rows independent): on the log scale, where a
  ratio is a difference, with the delta method's standard error sqrt(s_a²/(n_a·a²) +
  s_b²/(n_b·b²)) and Welch-Satterthwaite's degrees of freedom, then exponentiated, so it is
  never below zero;
- paired ratios (a seed's speedup over the same seed's baseline): the mean's interval of their
  logarithms, exponentiated: an interval of their geometric mean.

Two rows are told apart where the interval of their ratio leaves out 1 (:func:`excludes_one`).
With one run there is no interval: None, never a made-up one. Seeds that agree exactly (a
simulated run's repeatable times often do) give the point itself.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

CONFIDENCE = 0.95
METHOD = "Student-t"

Interval = tuple[float, float]


def _t_quantile(dof: float) -> float:
    # imported here: every run imports this module (the tuning checks name the report's
    # metrics) before its own errors are caught, and scipy.stats maps ~180 MB (BLAS among it)
    from scipy.stats import t

    return float(t.ppf((1 + CONFIDENCE) / 2, dof))


def _usable(*samples: Sequence[float]) -> bool:
    return all(len(sample) >= 2 and all(map(math.isfinite, sample)) for sample in samples)


def mean_interval(values: Sequence[float], at_least: float = -math.inf) -> Interval | None:
    """Student's t interval of the mean of ``values``, on the values' own scale, cut at
    ``at_least`` where the quantity cannot be smaller (a time: 0): its true mean is not, so the
    cut leaves the coverage as it was, while the interval no longer shows a time below 0 where
    the seeds disagree widely. None for fewer than two, or a value that is not finite."""
    if not _usable(values):
        return None
    mean = statistics.fmean(values)
    half = _t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return max(mean - half, at_least), mean + half


def geometric_interval(ratios: Sequence[float]) -> Interval | None:
    """Student's t interval of the geometric mean of paired ratios (each seed's speedup, both
    sides run from the same seed): the mean's interval on the log scale, exponentiated, so
    never below zero; None as :func:`mean_interval` does, or for a ratio of 0 or below."""
    if not _usable(ratios) or min(ratios) <= 0:
        return None
    low, high = mean_interval([math.log(ratio) for ratio in ratios])  # type: ignore[misc]
    return math.exp(low), math.exp(high)


def ratio_interval(numerator: Sequence[float], denominator: Sequence[float]) -> Interval | None:
    """The interval of mean(numerator) / mean(denominator), each side sampled on its own; None
    unless both sides have two values or more, all finite, and a mean above 0 (times do)."""
    if not _usable(numerator, denominator):
        return None
    means = [statistics.fmean(side) for side in (numerator, denominator)]
    if min(means) <= 0:
        return None
    parts = [statistics.variance(side) / (len(side) * mean ** 2)
             for side, mean in zip((numerator, denominator), means, strict=True)]
    ratio = means[0] / means[1]
    spread = sum(parts)
    if spread == 0:
        return ratio, ratio
    dof = spread ** 2 / sum(part ** 2 / (len(side) - 1)
                            for part, side in zip(parts, (numerator, denominator), strict=True))
    half = _t_quantile(dof) * math.sqrt(spread)
    return ratio * math.exp(-half), ratio * math.exp(half)


def excludes_one(interval: Interval) -> bool:
    """Whether a ratio's interval leaves out 1: the two rows it compares are told apart."""
    return interval[0] > 1 or interval[1] < 1
