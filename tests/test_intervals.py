"""Intervals over seeds: Student's t as the docs say, covering the mean as often as they claim
with as few seeds as a comparison has, none for one run, rows told apart where the interval of
their ratio leaves out 1, and seed-mean curves that hold each seed's last value instead of
dropping it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t as student_t
from scipy.stats import ttest_1samp
from test_report import table_rows, write_run

from hetsgd.outputs import intervals
from hetsgd.outputs.plots import _band
from hetsgd.outputs.report import write_report


def test_the_mean_interval_is_scipys_one_sample_t_interval() -> None:
    values = [1.0, 2.0, 4.0, 8.0]
    theirs = ttest_1samp(values, 0.0).confidence_interval(0.95)
    assert intervals.mean_interval(values) == pytest.approx((theirs.low, theirs.high))


@pytest.mark.parametrize("seeds", [2, 3, 5])
def test_the_intervals_hold_the_true_value_as_often_as_they_say(seeds: int) -> None:
    # a percentile bootstrap never reaches past the seeds' own range, so it held the mean
    # 49 % / 75 % / 83 % of the time here for 2 / 3 / 5 seeds, and a ratio of two about 80-90 %
    rng = np.random.default_rng(7)
    draws = 4000
    means = ratios = 0
    for _ in range(draws):
        fast, slow = rng.normal(10.0, 1.0, seeds), rng.normal(13.0, 2.0, seeds)
        low, high = intervals.mean_interval(fast.tolist())  # type: ignore[misc]
        means += low <= 10.0 <= high
        low, high = intervals.ratio_interval(slow.tolist(), fast.tolist())  # type: ignore[misc]
        ratios += low <= 1.3 <= high
    assert 0.93 <= means / draws <= 0.97  # Student's t is exact for normal seeds
    # the delta method on the log scale is approximate, and on the safe side with few seeds
    assert 0.93 <= ratios / draws <= 0.985


def test_known_cases_by_hand() -> None:
    # seeds that agree: the interval is their value
    assert intervals.mean_interval([1.8, 1.8, 1.8]) == (1.8, 1.8)
    assert intervals.ratio_interval([3.0, 3.0], [1.5, 1.5]) == (2.0, 2.0)
    # mean 4 over a denominator that never moves: log-scale standard error
    # sqrt(var(5, 3) / (2 * 4²)) = 0.25 on Welch's 1 degree of freedom, t = 12.7062...
    half = 12.706204736174707 * 0.25
    assert intervals.ratio_interval([5.0, 3.0], [2.0, 2.0]) == pytest.approx(
        (2.0 * math.exp(-half), 2.0 * math.exp(half)))
    # both sides vary: (5 / 2) · exp(±t · sqrt(2/(2·5²) + 2/(2·2²))), Welch's degrees of freedom
    # 0.29² / (0.04² + 0.25²)
    half = student_t.ppf(0.975, 0.29**2 / (0.04**2 + 0.25**2)) * math.sqrt(0.29)
    assert intervals.ratio_interval([4.0, 6.0], [1.0, 3.0]) == pytest.approx(
        (2.5 * math.exp(-half), 2.5 * math.exp(half)))
    assert intervals.mean_interval([1.0]) is None  # one run: no interval, none made up
    # seeds that disagree widely: 2.0 ± t(2) · 1.5 / sqrt(3) reaches below 0, where no time is
    half = 4.302652729911275 * 1.5 / math.sqrt(3)
    assert intervals.mean_interval([0.5, 2.0, 3.5]) == pytest.approx((2.0 - half, 2.0 + half))
    assert intervals.mean_interval([0.5, 2.0, 3.5], at_least=0.0) == pytest.approx((0.0, 2.0 + half))
    # nothing to say of a value that is not finite, or of a ratio to a mean of 0
    assert intervals.mean_interval([1.0, math.nan]) is None
    assert intervals.ratio_interval([1.0, 2.0], [0.0, 0.0]) is None
    assert intervals.ratio_interval([1.0, math.inf], [1.0, 2.0]) is None
    assert intervals.geometric_interval([2.0, 0.0]) is None
    # paired ratios 2 and 8: log2 1 and 3, mean 2 ± t(1) * sqrt(2) / sqrt(2), on the log scale
    half = 12.706204736174707 * math.log(2)
    assert intervals.geometric_interval([2.0, 8.0]) == pytest.approx(
        (4 * math.exp(-half), 4 * math.exp(half)))
    assert intervals.ratio_interval([1.0, 2.0], [1.0]) is None
    assert intervals.excludes_one((1.01, 2.0)) and intervals.excludes_one((0.5, 0.99))
    assert not intervals.excludes_one((0.9, 1.1)) and not intervals.excludes_one((1.0, 1.2))


def _reach_at(t: float) -> list[float]:
    """Training losses from 2.0 to 0.1 (L_best) that reach normalized loss 0.9 at ``t`` s and
    stay: one snapshot a second, normalized 0 up to the whole second before ``t``, then the
    value from which a straight line to 1.0 a second later meets 0.9 at ``t``."""
    whole = int(t)
    start = 1.0 - 0.1 / (1.0 - (t - whole))  # normalized value at ``whole`` s
    normalized = [0.0] * whole + [start, 1.0, 1.0]
    return [2.0 - 1.9 * n for n in normalized]


def _report_of(folder: Path, times: dict[str, tuple[float | None, ...]]) -> str:
    """The report of runs on the mix ``gpu`` that reach normalized loss 0.9 at the given times
    (None: never, the loss stays halfway), one run a seed."""
    for algo, seeds in times.items():
        for seed, t in enumerate(seeds):
            write_run(folder / f"{algo}{seed}", algo=algo, devices="gpu", seed=seed,
                      train_loss=[2.0, 1.0, 1.0, 1.0] if t is None else _reach_at(t))
    return write_report(folder)


def test_rows_are_told_apart_by_the_interval_of_their_speedup(tmp_path: Path) -> None:
    times = {"sync": (2.2, 2.7, 3.2), "hogbatch": (2.5, 3.0, 3.5), "adaptive": (1.2, 1.25, 1.3)}
    markdown = _report_of(tmp_path, times)
    numbers = pd.read_csv(tmp_path / "report.csv").set_index("algo")
    for algo, seeds in times.items():  # the fixture times what it says
        assert numbers.at[algo, "time_to_0.9_mean"] == pytest.approx(np.mean(seeds))
    cells = {row[0]: row[-1] for row in table_rows(markdown)}
    assert cells == {"sync": "—", "hogbatch": "not distinguishable", "adaptive": "faster"}
    assert numbers.at["adaptive", "speedup_low"] > 1.0  # the verdict is the interval's
    assert numbers.at["hogbatch", "speedup_low"] < 1.0 < numbers.at["hogbatch", "speedup_high"]
    assert ("Fastest to 0.9: adaptive · gpu; every other row with an interval is told apart "
            "from it.") in markdown
    # hogbatch is slower on average, yet not ranked below sync
    assert numbers.at["hogbatch", "speedup"] < 1.0


def test_a_times_interval_stops_at_0_where_its_seeds_disagree_widely(tmp_path: Path) -> None:
    # mean 3.0 ± t(2) · 1.9 / sqrt(3) = 3.0 ± 4.72: the linear interval reaches -1.72 s
    markdown = _report_of(tmp_path, {"sync": (1.1, 3.0, 4.9), "hogwild": (2.5, 3.0, 3.5)})
    numbers = pd.read_csv(tmp_path / "report.csv").set_index("algo")
    half = 4.302652729911275 * 1.9 / math.sqrt(3)
    assert numbers.at["sync", "time_to_0.9_mean"] == pytest.approx(3.0)
    assert numbers.at["sync", "time_to_0.9_low"] == 0.0
    assert numbers.at["sync", "time_to_0.9_high"] == pytest.approx(3.0 + half)
    assert f"3.00 [0.00, {3.0 + half:.2f}] n=3" in markdown
    assert numbers.at["hogwild", "time_to_0.9_low"] == pytest.approx(
        3.0 - 4.302652729911275 * 0.5 / math.sqrt(3))  # above 0: not cut


def test_the_ranking_names_a_row_whose_ratio_to_the_fastest_holds_one(tmp_path: Path) -> None:
    # hogwild's seeds are each 0.1 s behind the fastest's, well inside their spread, so their
    # ratio's interval holds 1; sync's times are twice the fastest's, and its interval does not
    times = {"hogbatch": (1.2, 1.5, 1.8), "hogwild": (1.3, 1.6, 1.9), "sync": (2.4, 3.0, 3.6)}
    markdown = _report_of(tmp_path, times)
    assert ("Fastest to 0.9: hogbatch · gpu; not distinguishable from it (the interval of the "
            "ratio of the mean times holds 1): hogwild · gpu.") in markdown
    assert "Not ranked" not in markdown  # every row was


def test_the_ranking_names_every_row_it_leaves_out_and_why(tmp_path: Path) -> None:
    # sync's third seed never gets to 0.9, so its mean over the two that did would flatter it;
    # hogwild ran one seed, so its ratio to the fastest has no interval
    times = {"hogbatch": (1.2, 1.5, 1.8), "hogwild": (2.0,), "sync": (2.4, 3.0, None)}
    markdown = _report_of(tmp_path, times)
    assert ("Fastest to 0.9: hogbatch · gpu; no other row has an interval to compare with it. "
            "Not ranked: sync · gpu (1 of 3 timed runs never stayed at 0.9); hogwild · gpu (n=1: "
            "no interval).") in markdown
    # the baseline's seed that never got there counts with the 3 s it ran: 2.8 s mean, and the
    # speedups over it are lower bounds (with sync's two timed seeds alone, hogbatch's is 1.8)
    numbers = pd.read_csv(tmp_path / "report.csv").set_index("algo")
    assert numbers.at["hogbatch", "speedup"] == pytest.approx(2.8 / 1.5)
    assert numbers.at["hogbatch", "speedup_bound"] and numbers.at["hogwild", "speedup_bound"]
    cells = {row[0]: row[-2:] for row in table_rows(markdown)}
    assert cells["hogwild"] == ["≥ 1.40", "n=1: no interval"]  # 2.8 / 2.0
    assert cells["hogbatch"][0].startswith("≥ 1.87 [")
    summary = tmp_path / "hogwild0" / "summary.json"  # flagged as contended: not timed
    summary.write_text(json.dumps({**json.loads(summary.read_text()),
                                   "contention": {"flagged": True}}))
    assert "Not ranked: sync · gpu (1 of 3 timed runs never stayed at 0.9); hogwild · gpu (no " \
           "timed run)." in write_report(tmp_path)
    markdown = _report_of(tmp_path / "none", {"hogbatch": (1.2, None), "sync": (None, 2.0)})
    assert ("No row ranked: sync · gpu (1 of 2 timed runs never stayed at 0.9); hogbatch · gpu "
            "(1 of 2 timed runs never stayed at 0.9).") in markdown
    # a row with a seed that never got there has no speedup (its mean would flatter it)
    assert {row[0]: row[-2:] for row in table_rows(markdown)}["hogbatch"] == ["—", "—"]


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
