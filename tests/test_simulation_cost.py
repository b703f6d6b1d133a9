"""A simulated run says what it will cost before it trains, and every run says whether it learnt.

The estimate is a measurement of wall time, so its tests feed the probe a clock of their own;
the runs check where the estimate goes (the log, before the progress display, and
summary.json), not its value."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from conftest import compose_config

from hetsgd.config import to_run_config
from hetsgd.config.schema import BudgetConfig
from hetsgd.engines.virtual import cost
from hetsgd.engines.virtual.cost import PROBE_S, CostProbe
from hetsgd.observe.progress import TrainingProgress
from hetsgd.outputs.comparison import status_text
from hetsgd.outputs.summary import RunSummary, learnt_between
from hetsgd.runs import runner

# two one-example Hogwild workers on roofline profiles: a simulated run of a few seconds
VIRTUAL = ("algo=hogwild", "model=logreg", "dataset=digits", "devices=cpu",
           "devices.simulated=true", "devices.groups.cpu.count=2",
           "devices.groups.cpu.batch_size=16", "devices.groups.cpu.profile=xeon_e5_2686v4_core",
           "budget.seconds=0.05", "budget.epochs=null", "eval.every_s=0.01")
# one real worker process, for an amount of work that does not depend on this machine's speed
REAL = ("algo=sync", "model=logreg", "dataset=digits", "devices=single_cpu",
        "budget.epochs=1", "budget.seconds=null")


@pytest.mark.parametrize(("first", "last", "learnt"), [
    (2.3, 0.5, True), (2.3, 2.3, False), (2.3, 2.35, False), (2.3, math.nan, False),
    (math.nan, 0.5, False)])
def test_a_run_has_learnt_only_where_its_training_loss_went_down(first: float, last: float,
                                                                 learnt: bool) -> None:
    assert learnt_between(first, last) is learnt


class _Counters:
    """What the probe reads of the workers' counters: the examples each has trained."""

    def __init__(self) -> None:
        self.examples = np.zeros(2)

    def column(self, name: str) -> np.ndarray:
        assert name == "examples"
        return self.examples


def _probe(monkeypatch: pytest.MonkeyPatch, budget: BudgetConfig,
           ticks: list[tuple[float, float, float]]) -> tuple[CostProbe, list[float]]:
    """A probe of ``budget`` over 100 examples, fed ``ticks`` of (virtual s, wall s, examples)
    after starting at wall time 100; what it passed on to the progress display."""
    wall = iter([100.0, *(w for _, w, _ in ticks), 1000.0])
    # the probe's clock alone: time.perf_counter itself stays, for any other thread
    monkeypatch.setattr(cost, "time", SimpleNamespace(perf_counter=lambda: next(wall)))
    shown: list[float] = []
    probe = CostProbe(budget, 100, lambda elapsed, _: shown.append(elapsed))
    counters = _Counters()
    for elapsed, _, examples in ticks:
        counters.examples[:] = examples / 2
        probe.tick(elapsed, counters)  # type: ignore[arg-type]
    return probe, shown


def test_the_estimate_times_the_window_after_the_first_tick(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="hetsgd"):
        # 2 wall s of setup and first steps, then 0.01 virtual s in 3 wall s: 300 s a second
        probe, shown = _probe(monkeypatch, BudgetConfig(epochs=None, seconds=1.0),
                              [(0.0, 102.0, 0), (0.005, 104.0, 10), (0.01, 105.0, 20),
                               (0.02, 108.0, 30)])
    assert probe.estimate == {"real_s_per_virtual_s": pytest.approx(300),
                              "probed_virtual_s": pytest.approx(PROBE_S),
                              "estimated_real_s": pytest.approx(5 + 300 * 0.99)}
    estimate, = (r.getMessage() for r in caplog.records if "real s per virtual s" in r.getMessage())
    assert "300 real s per virtual s" in estimate and "about 5 min" in estimate
    assert shown == [0.01, 0.02]  # the progress display starts once the estimate is out
    assert probe.measured(0.02) == {**probe.estimate, "real_s": 900.0}


def test_an_epoch_budget_is_estimated_at_the_windows_pace(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0.2 epochs in the window's 0.01 virtual s: 2 epochs end 0.09 virtual s after it
    probe, _ = _probe(monkeypatch, BudgetConfig(epochs=2.0, seconds=1.0),
                      [(0.0, 100.0, 0), (0.01, 101.0, 20)])
    assert probe.estimate is not None
    assert probe.estimate["estimated_real_s"] == pytest.approx(1 + 100 * 0.09)
    # a first tick after some steps (0.01 virtual s, 0.2 epochs) opens the window there: 0.01
    # virtual s and 0.2 epochs later, 1 wall s has passed, 100 a second; 2 epochs end 0.08
    # virtual s after it (from the start, or with all 0.4 epochs, it would read 50 a second,
    # or 2 epochs 0.04 s after it)
    probe, _ = _probe(monkeypatch, BudgetConfig(epochs=2.0, seconds=1.0),
                      [(0.01, 100.0, 20), (0.015, 100.5, 30), (0.02, 101.0, 40)])
    assert probe.estimate == {"real_s_per_virtual_s": pytest.approx(100),
                              "probed_virtual_s": pytest.approx(0.01),
                              "estimated_real_s": pytest.approx(1 + 100 * 0.08)}


def test_a_short_epoch_budget_is_timed_over_a_tenth_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # 10 epochs: the window closes at the first tick past 1 epoch, 0.002 virtual s in
    probe, shown = _probe(monkeypatch, BudgetConfig(epochs=10.0, seconds=None),
                          [(0.0, 100.0, 0), (0.001, 101.0, 50), (0.002, 102.0, 100)])
    assert probe.estimate == {"real_s_per_virtual_s": pytest.approx(1000),
                              "probed_virtual_s": pytest.approx(0.002),
                              "estimated_real_s": pytest.approx(2 + 1000 * 0.018)}
    assert shown == [0.002]


def test_a_run_shorter_than_the_window_is_measured_whole(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="hetsgd"):
        probe, shown = _probe(monkeypatch, BudgetConfig(epochs=None, seconds=0.005),
                              [(0.0, 101.0, 0)])
        assert probe.estimate is None and shown == []
        assert not caplog.records
        measured = probe.measured(0.005)
    said, = (r.getMessage() for r in caplog.records)
    assert said.startswith("simulated run: its training took 900 real s (1.8e+05 real s per ")
    assert measured == {"real_s_per_virtual_s": pytest.approx(900 / 0.005),
                                     "probed_virtual_s": 0.005, "estimated_real_s": 900.0,
                                     "real_s": 900.0}


def _run(tmp_path: Path, *overrides: str) -> dict:
    cfg = compose_config(*overrides)
    runner.run(to_run_config(cfg), tmp_path / "run", cfg)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed", summary["error"]
    assert RunSummary.from_dict(summary).to_dict() == summary  # the new fields read back
    return summary


def test_a_simulated_run_logs_its_estimate_before_its_progress(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    def shown(self: TrainingProgress, elapsed_s: float, counters: object) -> None:
        logging.getLogger("hetsgd").info("progress at %s", elapsed_s)

    monkeypatch.setattr(TrainingProgress, "update", shown)
    with caplog.at_level(logging.INFO, logger="hetsgd"):
        summary = _run(tmp_path, *VIRTUAL)
    messages = [r.getMessage() for r in caplog.records]
    first = next(i for i, m in enumerate(messages) if "real s per virtual s" in m)
    assert first < next(i for i, m in enumerate(messages) if m.startswith("progress at"))
    simulation = summary["simulation"]
    assert simulation["probed_virtual_s"] >= PROBE_S
    assert f"{simulation['real_s_per_virtual_s']:.3g} real s per virtual s" in messages[first]
    assert 0 < simulation["estimated_real_s"] and 0 < simulation["real_s"]
    assert summary["learnt"] is True and not summary.get("warnings")


def test_a_simulated_run_that_cannot_learn_completes_with_a_warning(tmp_path: Path) -> None:
    summary = _run(tmp_path, *VIRTUAL, "optim.lr=1e-12")
    assert summary["learnt"] is False
    warning, = summary["warnings"]
    assert warning.startswith("the run has not learnt: its training loss went from "
                              f"{summary['initial']['train_loss']:.4g} to ")


@pytest.mark.integration
@pytest.mark.parametrize(("lr", "learnt"), [("0.1", True), ("1e-12", False)])
def test_a_real_run_says_whether_it_learnt(tmp_path: Path, lr: str, learnt: bool) -> None:
    summary = _run(tmp_path, *REAL, f"optim.lr={lr}")
    assert summary["learnt"] is learnt
    assert "simulation" not in summary
    assert any("has not learnt" in w for w in summary.get("warnings") or []) is not learnt


def test_the_report_counts_completed_runs_that_did_not_learn() -> None:
    runs = pd.DataFrame({"status": ["completed", "completed", "completed", "diverged"],
                         # an old run's summary has no flag (NaN): it is not counted as not learnt
                         "learnt": pd.Series([True, False, math.nan, False], dtype=object)})
    assert status_text(runs) == "3/4 completed (1 not learnt), 1 diverged"
    assert status_text(runs[:1]) == "1/1 completed"
