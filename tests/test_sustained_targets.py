"""Time to a target is the time after which a run *stays* there: a run that touched a target and
left it (a collapse) has no time to it, is marked unstable and is credited in no speedup; and a
run that ends far above its own best has not learnt.

The curves are convergence tables built here, one snapshot a second, so every time is worked
out by hand in a comment beside it."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from test_report import table_rows, write_run

from hetsgd.engines.training import Training
from hetsgd.outputs import paper_table
from hetsgd.outputs.metrics import Reach, snapshot_spacing, sustained, time_to_losses
from hetsgd.outputs.report import write_report
from hetsgd.outputs.summary import RunSummary, learnt_between
from hetsgd.runs.evaluation import _results

# normalized 0, 0.5, 1.0, then back to 0.5 and 0: reaches 0.9 at 1.8 s and leaves it
COLLAPSE = [2.0, 1.05, 0.1, 1.05, 2.0]
# normalized 0, 0.5, 1.0, 1.0, 1.0: reaches 0.9 at 1.8 s and stays
STAYS = [2.0, 1.05, 0.1, 0.1, 0.1]
# normalized 0, 1.0, 0.5, 1.0, 1.0: touches 0.9 at 0.9 s, dips, and stays from 2.8 s
DIPS = [2.0, 0.1, 1.05, 0.1, 0.1]


def test_a_curve_that_left_the_target_has_no_time_and_is_unstable() -> None:
    reach = sustained(range(5), [0.0, 0.5, 1.0, 0.5, 0.0], 0.9)
    assert reach == Reach(time=None, first=pytest.approx(1.8))
    assert reach.unstable


def test_a_curve_that_stays_is_timed_where_it_last_crossed() -> None:
    assert sustained(range(5), [0.0, 0.5, 1.0, 1.0, 1.0], 0.9) == Reach(pytest.approx(1.8),
                                                                        pytest.approx(1.8))
    # first at 0 + 0.9 / 1.0 = 0.9 s; back below at 2 s; from 2 + 0.4 / 0.5 = 2.8 s for good
    dipped = sustained(range(5), [0.0, 1.0, 0.5, 1.0, 1.0], 0.9)
    assert (dipped.time, dipped.first) == (pytest.approx(2.8), pytest.approx(0.9))
    assert not dipped.unstable
    never = sustained(range(3), [0.0, 0.2, 0.4], 0.9)
    assert never == Reach(None, None) and not never.unstable
    # a NaN snapshot (a diverged evaluation) counts as short of the target
    assert sustained(range(3), [1.0, math.nan, 1.0], 0.9).time == 2.0
    assert sustained(range(3), [1.0, 1.0, 1.0], 0.9).time == 0.0
    # at the target is there: 0 + 0.9 / 0.9 = 1 s, and it stays
    assert sustained(range(3), [0.0, 0.9, 0.9], 0.9) == Reach(1.0, 1.0)
    # snapshots 2 s and then 4 s apart: 12 + 4 x (0.9 - 0.5) / (1.0 - 0.5) = 15.2 s
    assert sustained([10, 12, 16], [0.0, 0.5, 1.0], 0.9).time == pytest.approx(15.2)


def test_absolute_losses_are_timed_for_good() -> None:
    # the reproduction's collapsed Hogwild seed: 0.006 at 2 s, then chance (2.309)
    loss = [2.3, 0.5, 0.006, 2.309, 2.309]
    assert time_to_losses(range(5), loss, [0.23]) == {"0.23": None}
    # a run that stays: 0.5 -> 0.1 between 1 and 2 s crosses 0.23 at 1 + 0.27 / 0.4 = 1.675 s
    assert time_to_losses(range(4), [2.3, 0.5, 0.1, 0.1], [0.23]) == {
        "0.23": pytest.approx(1.675)}


@pytest.mark.parametrize(("first", "last", "best", "learnt"), [
    (2.3, 0.5, 0.1, True),  # gave back 0.4 of a 2.2 drop
    (2.3, 1.2, 0.1, True),  # exactly half: still learnt
    (2.3, 1.3, 0.1, False),  # more than half given back: a collapse
    (2.3, 2.09, 0.006, False),  # the reproduction's collapsed seed
    (2.3, 2.4, 0.1, False),  # ended above its start
])
def test_a_run_that_ends_far_above_its_best_has_not_learnt(first: float, last: float,
                                                           best: float, learnt: bool) -> None:
    assert learnt_between(first, last, best) is learnt


def test_the_summary_of_a_collapsed_run_marks_it_and_times_only_what_it_kept() -> None:
    t = [0.0, 1.0, 2.0, 3.0, 4.0]
    convergence = pd.DataFrame({
        "time_s": t, "epoch": [x / 2 for x in t], "train_loss": [2.3, 0.5, 0.006, 2.0, 2.1],
        # held out: 1.2 (half of the initial 2.4) is kept from 0 + 1.2 / 1.8 s; 0.48 and 0.24
        # are left (the targets are of the test loss's start, not the training loss's)
        "test_loss": [2.4, 0.6, 0.1, 1.0, 1.0], "test_acc": [0.1, 0.5, 0.9, 0.6, 0.6]})
    workers = [{"group": "cpu", "updates": 10, "examples": 100, "threads": 1}]
    summary = _results(RunSummary(status="completed", error=None, algo="hogwild",
                                  dataset="digits", model="mlp", devices="cpu", seed=0),
                       Training(time_s=4.0), convergence, workers, 100, [])
    assert summary.target_losses is not None and summary.target_losses.curve == "test_loss"
    assert summary.target_losses.reference == "0.5 / 0.2 / 0.1 x the initial test loss"
    assert summary.target_losses.losses == pytest.approx([1.2, 0.48, 0.24])
    assert summary.time_to_loss == {"1.2": pytest.approx(1.2 / 1.8), "0.48": None,
                                    "0.24": None}
    assert summary.epochs_to_loss == {"1.2": pytest.approx(1.2 / 1.8 / 2), "0.48": None,
                                      "0.24": None}
    assert summary.unstable_losses == ["0.48", "0.24"]
    assert summary.snapshot_spacing_s == 1.0
    assert snapshot_spacing([0.0, 1.0, 2.0, 10.0]) == 1.0  # the median: thinned runs space out
    assert summary.learnt is False  # 2.1 is far above its best, 0.006


def test_a_run_that_left_the_target_is_not_credited_in_the_report(tmp_path: Path) -> None:
    for seed in (0, 1):
        write_run(tmp_path / f"sync{seed}", algo="sync", devices="gpu", seed=seed,
                  train_loss=STAYS)
    write_run(tmp_path / "hogwild0", algo="hogwild", devices="cpu", seed=0, train_loss=COLLAPSE)
    write_run(tmp_path / "hogwild1", algo="hogwild", devices="cpu", seed=1, train_loss=STAYS)
    write_run(tmp_path / "hogbatch0", algo="hogbatch", devices="cpu+gpu", seed=0,
              train_loss=DIPS)
    markdown = write_report(tmp_path)
    rows = {row[0]: row for row in table_rows(markdown)}
    numbers = pd.read_csv(tmp_path / "report.csv").set_index("algo")
    # sync stays from 1.8 s on both seeds: its interval is that one point
    assert rows["sync"][4] == "1.80 [1.80, 1.80] n=2"
    # hogwild's stable seed is timed, its collapsed one is not, and the row is not credited
    assert rows["hogwild"][3] == "2/2 completed (1 unstable at 0.9)"
    assert rows["hogwild"][4] == "1.80 n=1/2"
    assert math.isnan(numbers.at["hogwild", "speedup"]) and rows["hogwild"][-2] == "—"
    # hogbatch touched 0.9 at 0.9 s but is timed from its return, 2.8 s
    assert numbers.at["hogbatch", "time_to_0.9_mean"] == pytest.approx(2.8)
    assert numbers.at["hogbatch", "speedup"] == pytest.approx(1.8 / 2.8)


def _run(seed: int, reached: float | None, unstable: tuple[float, ...] = ()) -> paper_table.Run:
    return paper_table.Run(seed=seed, time_s=0.5, cpu_share=1.0, gpu_util=None, cpu_busy=100.0,
                           final_loss=2.0, times={0.1: reached}, snapshots=50, adaptive=None,
                           final_batches={}, unstable=list(unstable))


def test_the_paper_table_does_not_credit_a_seed_that_left_its_target() -> None:
    gpu = paper_table.Row("paper_hogbatch_v100", "sync", [_run(0, 0.4), _run(1, 0.45)])
    hogwild = paper_table.Row("paper_hogbatch_v100", "hogwild",
                              [_run(0, None, unstable=(0.1,)), _run(1, 0.15)])
    # seed 1 alone is credited: 0.45 / 0.15, one ratio of the two seeds (no interval)
    assert paper_table.speedup(hogwild, gpu, 0.1) == "3.0x n=1/2"
    (note,) = [line for line in paper_table.notes([hogwild]) if "unstable" in line]
    assert note == ("CPU Hogwild, V100 (AWS p3.16xlarge), seed 0: reached 0.1 and left it "
                    "(unstable): no time to it, not credited")
