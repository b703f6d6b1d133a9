"""Intervals over seeds: scipy's bootstrap as the docs say, none for one run, "not
distinguishable" where two rows' intervals overlap, and seed-mean curves that hold each seed's
last value instead of dropping it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import bootstrap
from test_report import table_rows, write_run

from hetsgd.outputs import intervals
from hetsgd.outputs.plots import _band
from hetsgd.outputs.report import write_report


def test_the_mean_interval_is_scipys_percentile_bootstrap_with_the_stated_settings() -> None:
    values = [1.0, 2.0, 4.0, 8.0]
    ours = intervals.mean_interval(values)
    theirs = bootstrap((np.asarray(values),), np.mean, confidence_level=0.95, n_resamples=9999,
                       method="percentile", rng=np.random.default_rng(0)).confidence_interval
    assert ours == pytest.approx((theirs.low, theirs.high))
    assert ours is not None and 1.0 < ours[0] < np.mean(values) < ours[1] < 8.0


def test_known_cases_by_hand() -> None:
    # seeds that agree: the interval is their value
    assert intervals.mean_interval([1.8, 1.8, 1.8]) == (1.8, 1.8)
    # resampled means of (5, 3) are 3, 4 or 5 with chances 1/4, 1/2, 1/4: the 2.5 and 97.5
    # percentiles are 3 and 5, over a denominator that never moves
    assert intervals.ratio_interval([5.0, 3.0], [2.0, 2.0]) == pytest.approx((1.5, 2.5))
    assert intervals.mean_interval([1.0]) is None  # one run: no interval, none made up
    assert intervals.ratio_interval([1.0, 2.0], [1.0]) is None
    assert intervals.overlap((1.0, 2.0), (2.0, 3.0)) and not intervals.overlap((1, 2), (2.1, 3))


def _reach_at(t: float) -> list[float]:
    """Training losses from 2.0 to 0.1 (L_best) that reach normalized loss 0.9 at ``t`` s and
    stay: one snapshot a second, normalized 0 up to the whole second before ``t``, then the
    value from which a straight line to 1.0 a second later meets 0.9 at ``t``."""
    whole = int(t)
    start = 1.0 - 0.1 / (1.0 - (t - whole))  # normalized value at ``whole`` s
    normalized = [0.0] * whole + [start, 1.0, 1.0]
    return [2.0 - 1.9 * n for n in normalized]


def test_overlapping_intervals_are_not_distinguishable(tmp_path: Path) -> None:
    times = {"sync": (2.2, 3.2), "hogbatch": (2.5, 3.5), "adaptive": (1.2, 1.3)}
    for algo, seeds in times.items():
        for seed, t in enumerate(seeds):
            write_run(tmp_path / f"{algo}{seed}", algo=algo, devices="gpu", seed=seed,
                      train_loss=_reach_at(t))
    markdown = write_report(tmp_path)
    numbers = pd.read_csv(tmp_path / "report.csv").set_index("algo")
    for algo, seeds in times.items():  # the fixture times what it says
        assert numbers.at[algo, "time_to_0.9_mean"] == pytest.approx(np.mean(seeds))
    cells = {row[0]: row[-1] for row in table_rows(markdown)}
    assert cells == {"sync": "—", "hogbatch": "not distinguishable", "adaptive": "faster"}
    assert "Fastest to 0.9: adaptive · gpu; its interval overlaps no other row's." in markdown
    # hogbatch is slower on average, yet not ranked below sync
    assert numbers.at["hogbatch", "speedup"] < 1.0


def test_the_seed_mean_holds_a_seed_that_ended_at_its_last_value() -> None:
    short = (np.array([0.0, 1.0]), np.array([0.0, 1.0]))
    long = (np.array([0.0, 2.0]), np.array([0.0, 0.5]))
    grid, mean, low, high = _band([short, long])
    held = np.where(grid <= 1.0, grid, 1.0)  # the short seed's value, held from 1 s
    assert mean == pytest.approx((held + grid / 4) / 2)
    assert low == pytest.approx(np.minimum(held, grid / 4))
    assert high == pytest.approx(np.maximum(held, grid / 4))
    # no jump where the short seed ends: every step of the mean is as small as the grid's
    assert np.abs(np.diff(mean)).max() <= (grid[1] - grid[0]) * 1.0 + 1e-12
