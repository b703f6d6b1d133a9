"""The simulation against this machine (hetsgd.runs.validate): one case, run real and simulated
after a calibration of its mix, and the table the script prints."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from hetsgd.outputs.summary import RunSummary
from hetsgd.runs import validate as validation
from hetsgd.runs.validate import CASES, Comparison, UnsteadyMachine, drift_between, table, validate


@pytest.mark.integration
@pytest.mark.wall
@pytest.mark.serial
def test_simulated_hogbatch_keeps_the_real_runs_pace_and_shares(results_dir: Path) -> None:
    """Hogbatch with the host 4x slower, two seeds of 2 s, alone on the machine (``serial``: a
    calibration and a run that another test disturbs at different moments disagree). The
    bounds are loose for a noisy 2-core machine: the full comparison, 3 seeds of 4 s, has
    measured seed-by-seed ratios of 0.92-1.12 here, but one 2 s real run has read 1.69x slower
    than its calibration (a clean-clone CI run), and one seed's host share 1.66x simulated
    over real (0.39 against 0.24, its calibrations agreeing); each ratio checked is the median
    of the two seeds' (their mean), which one such seed does not decide. The host's share is
    the sharp check: a
    simulation that ignored its slowdown gives it about 3x its share, one that applied it twice
    about half; a clock off by more than 2x leaves the examples/s bounds. A real run that the
    machine slowed (a calibration after it disagrees with the one before, as after a host
    share of 0.39 against 0.20 simulated read once straight after the parallel tier) is run
    again; a machine that never holds still skips the test, saying so."""
    case, = (case for case in CASES if case.name.startswith("hogbatch"))
    common = ("dataset=digits", "model=mlp", "optim.lr=0.01", "budget.epochs=null",
              "budget.seconds=2", "eval.every_s=0.2", "eval.every_epochs=null", "progress=false")
    try:
        comparisons = validate([case], common, seeds=[0, 1], target_loss=0.1, out=results_dir,
                               calibration_s=0.25)
    except UnsteadyMachine as exc:  # no measure of the clock here now, not a wrong clock
        pytest.skip(str(exc))
    ratios = {c.metric: c.ratio for c in comparisons}
    assert 0.5 <= ratios["examples/s"] <= 2.0, table(comparisons)
    assert 0.6 <= ratios["host update share"] <= 1.6, table(comparisons)
    real, = (c.real for c in comparisons if c.metric == "host update share")
    assert 0.1 < real < 0.5, table(comparisons)  # the slowed host makes a minority of updates
    assert set(ratios) == {"examples/s", "host update share", "workers' CPU share",
                           "time to training loss 0.1"}


def test_drift_is_the_largest_groups_mean_move_either_way() -> None:
    before = [{"group": "accel", "batch_size": 8, "ms_per_step": 1.0},
              {"group": "cpu", "batch_size": 8, "ms_per_step": 4.0},
              {"group": "cpu", "batch_size": 64, "ms_per_step": 10.0}]
    # the cpu's steps twice as fast at one batch size, as fast at the other: moved sqrt(2)x
    half = [{**row, "ms_per_step": row["ms_per_step"] * (0.5 if row["batch_size"] == 64 else 1)}
            for row in before]
    noisy = [{**row, "ms_per_step": row["ms_per_step"] * {8: 2, 64: 0.5}[row["batch_size"]]}
             for row in before if row["group"] == "cpu"]
    assert drift_between(before, before) == 1.0
    assert drift_between(before, half) == pytest.approx(2 ** 0.5)
    assert drift_between(half, before) == pytest.approx(2 ** 0.5)
    assert drift_between(before, noisy) == pytest.approx(1.0)  # moves that cancel are noise


def test_a_real_run_the_machine_moved_under_is_measured_again_then_refused(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Calibrations and runs stubbed: the loop around them, not the machine, is under test."""
    def calibrations(*ms_per_step: float) -> None:
        steps = iter(ms_per_step)  # before and after each attempt's real run
        monkeypatch.setattr(validation, "calibrate", lambda cfg, seconds: [
            {"group": "cpu", "batch_size": 8, "ms_per_step": next(steps)}])

    saved: list[list[dict]] = []
    runs: list[str] = []
    given: list[tuple[str, ...]] = []
    done = RunSummary("completed", None, "hogbatch", "digits", "mlp", "emulated", 0)
    monkeypatch.setattr(validation, "save", lambda rows, cfg: saved.append(rows) or tmp_path)
    monkeypatch.setattr(validation, "_run", lambda overrides, run_dir: runs.append(run_dir.name)
                        or given.append(tuple(overrides)) or done)
    case, = (case for case in CASES if case.name.startswith("hogbatch"))
    calibrations(1.0, 2.0, 3.0, 3.3)  # moved 2x, then 1.1x: the second attempt counts
    validate([case], ("dataset=digits",), seeds=[0], target_loss=0.1, out=tmp_path)
    assert runs == ["seed0_real1", "seed0_real2", "seed0_simulated"]
    assert [rows[0]["ms_per_step"] for rows in saved] == [3.0]  # simulated: the one before it
    # the real runs are real; the simulation replays the calibration saved (here: tmp_path)
    assert not any(o.startswith("devices.simulated") for o in given[0] + given[1])
    assert given[2][-2:] == ("devices.simulated=true", f"devices.calibration={tmp_path}")
    assert given[2][:-2] == given[1]  # and is otherwise the same run
    calibrations(1.0, 2.0, 1.0, 0.5, 1.0, 1.5)  # never within 1.3x
    runs.clear()
    with pytest.raises(UnsteadyMachine, match="each of 3 real runs"):
        validate([case], ("dataset=digits",), seeds=[0], target_loss=0.1, out=tmp_path)
    assert runs == ["seed0_real1", "seed0_real2", "seed0_real3"]


def test_a_comparison_pairs_each_seeds_simulation_with_its_own_real_run() -> None:
    # the medians' ratio would be 220 / 200 = 1.1; seed by seed the simulation is 0.9x, 1.1x, 0.9x
    comparison = Comparison.of("a", "examples/s", [100.0, 200.0, 300.0], [90.0, 220.0, 270.0])
    assert (comparison.real, comparison.simulated) == (200.0, 220.0)
    assert comparison.ratio == pytest.approx(0.9)


def test_the_table_says_which_comparisons_it_cannot_make() -> None:
    comparisons = [Comparison.of("a", "examples/s", [100.0], [90.0]),
                   Comparison.of("a", "time to loss 0.1", [None, 2.0], [2.0, 2.0])]
    lines = table(comparisons).splitlines()
    assert lines[2] == "| a | examples/s | 100 | 90 | 0.90 |"
    assert lines[3] == "| a | time to loss 0.1 | — | 2 | — |"
    assert len(lines) == 4  # no run flagged: no line about what a flagged one means


def test_the_cpu_share_shows_how_many_runs_of_each_side_were_flagged(tmp_path: Path) -> None:
    def summary(share: float, flagged: bool) -> RunSummary:
        return RunSummary("completed", None, "hogwild", "digits", "mlp", "cpu", 0,
                          contention={"workers_cpu_share": share, "flagged": flagged})

    real = [summary(0.5, True), summary(0.95, False)]
    simulated = [summary(0.9, False), summary(0.8, False)]
    assert [validation.flagged(s) for s in real] == [True, False]
    assert not validation.flagged(RunSummary("completed", None, "hogwild", "digits", "mlp",
                                             "cpu", 0))  # no contention recorded
    share = Comparison.of("a", validation.CPU_SHARE,
                          [validation.METRICS[validation.CPU_SHARE](s) for s in real],
                          [validation.METRICS[validation.CPU_SHARE](s) for s in simulated],
                          ([validation.flagged(s) for s in real],
                           [validation.flagged(s) for s in simulated]))
    assert share.flagged == (1, 0, 2)
    lines = table([share]).splitlines()
    assert lines[2] == "| a | workers' CPU share | 0.725, 1/2 flagged | 0.85, 0/2 flagged | 1.32 |"
    assert "measure the contention, not the virtual clock" in lines[-1]


def test_the_time_compared_is_when_the_training_loss_stays_below_the_target(
        tmp_path: Path) -> None:
    """The test loss of an overfitting net rises after its minimum: the clock is compared on the
    training loss, held to the end (a loss that dipped below and came back is not credited)."""
    pd.DataFrame({"time_s": [0.0, 1.0, 2.0, 3.0], "train_loss": [1.0, 0.05, 0.2, 0.04],
                  "test_loss": [1.0, 0.05, 0.3, 0.5]}).to_csv(tmp_path / "convergence.csv",
                                                              index=False)
    run = RunSummary("completed", None, "hogbatch", "digits", "mlp", "emulated", 0,
                     run_dir=str(tmp_path))
    read = validation._time_to_training_loss(0.1)
    assert read(run) == pytest.approx(2 + 0.1 / 0.16)  # 0.2 -> 0.04 crosses 0.1 at 2.625 s
    assert validation._time_to_training_loss(0.01)(run) is None
    assert read(RunSummary("completed", None, "hogbatch", "digits", "mlp", "emulated", 0)) is None
