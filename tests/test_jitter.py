"""Jitter of simulated step times: its distribution, its seeding, both virtual engines taking
it, and where it is refused."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_config
from test_virtual_engine import Fixed

from hetsgd.config import ConfigError
from hetsgd.engines.common.links import default_link
from hetsgd.engines.common.memory import SharedMaster
from hetsgd.engines.virtual.busy import BusyTime
from hetsgd.engines.virtual.coordinator import VirtualCoordinator
from hetsgd.engines.virtual.group import VirtualClock
from hetsgd.engines.virtual.step_times import StepTimes
from hetsgd.runs.setup import load_run_data
from hetsgd.workers import WorkerSpec, expand

SIMULATED = ("devices=cpu", "devices.simulated=true", "devices.groups.cpu.count=2",
             "devices.groups.cpu.profile=xeon_e5_2686v4_core")


def _spec(rank: int, slowdown: float = 1.0) -> WorkerSpec:
    return WorkerSpec(rank, "cpu", "cpu", "cpu", 1, 16, slowdown, False, simulated=True)


def _factors(times: StepTimes, n: int) -> np.ndarray:
    return np.array([times.factor() for _ in range(n)])


def test_the_factor_has_mean_1_and_the_jitter_as_its_relative_spread() -> None:
    cfg = run_config(*SIMULATED, "devices.groups.cpu.jitter=0.2")
    factors = _factors(StepTimes(Fixed(1.0), _spec(0), cfg), 40_000)
    # 5 standard errors: the mean's is 0.2 / 200 = 0.001, the spread's about 0.2 / 280
    assert factors.mean() == pytest.approx(1.0, abs=0.005)
    assert factors.std() == pytest.approx(0.2, abs=0.004)
    assert factors.min() > 0 and np.median(factors) < 1.0  # a lognormal: skewed to long steps


def test_the_streams_follow_the_seed_and_the_rank() -> None:
    cfg, other = run_config(*SIMULATED, "devices.groups.cpu.jitter=0.05"), run_config(
        *SIMULATED, "devices.groups.cpu.jitter=0.05", "seed=1")
    first = _factors(StepTimes(Fixed(1.0), _spec(0), cfg), 10)
    assert (first == _factors(StepTimes(Fixed(1.0), _spec(0), cfg), 10)).all()
    assert not np.isin(first, _factors(StepTimes(Fixed(1.0), _spec(1), cfg), 10)).any()
    assert not np.isin(first, _factors(StepTimes(Fixed(1.0), _spec(0), other), 10)).any()


def test_without_jitter_a_step_takes_the_profile_times_the_slowdown() -> None:
    times = StepTimes(Fixed(0.5, copy=0.1), _spec(0, slowdown=3.0), run_config(*SIMULATED))
    assert times.rng is None
    assert [times.step(16, copies=2) for _ in range(3)] == [pytest.approx((1.5, 0.6))] * 3
    # with jitter, the step's one factor spreads its copies as well as its compute
    cfg = run_config(*SIMULATED, "devices.groups.cpu.jitter=0.2")
    times = StepTimes(Fixed(0.5, copy=0.1), _spec(0, slowdown=3.0), cfg)
    drawn = _factors(StepTimes(Fixed(0.5, copy=0.1), _spec(0, slowdown=3.0), cfg), 3)
    assert [times.step(16, copies=2) for _ in range(3)] == [
        pytest.approx((1.5 * f, 0.6 * f)) for f in drawn]


def test_a_rank_clock_advances_by_the_jittered_step() -> None:
    cfg = run_config(*SIMULATED, "devices.groups.cpu.jitter=0.1")
    spec = _spec(1, slowdown=2.0)
    clock = VirtualClock(1, StepTimes(Fixed(0.25), spec, cfg), None, BusyTime([_spec(0), spec]))
    for _ in range(5):
        clock.computed(16)
    drawn = _factors(StepTimes(Fixed(0.25), spec, cfg), 5)
    assert clock.now() == pytest.approx(0.5 * drawn.sum(), rel=1e-12)
    assert clock.step_seconds(lambda i: None, spec, 16) == 0.5  # the mean, drawing nothing


def test_simulated_workers_take_jittered_steps_the_same_way_every_run() -> None:
    """Each worker's busy time is its profile's step times its own stream of factors."""
    cfg = run_config("algo=hogwild", "dataset=digits", "model=logreg", *SIMULATED,
                     "devices.groups.cpu.jitter=0.3", "budget.seconds=1.0", "budget.epochs=null")
    data = load_run_data(cfg, progress=False)

    def run() -> list[dict[str, float]]:
        master = SharedMaster.initial(cfg.model, data.problem, cfg.seed)
        return VirtualCoordinator(cfg, expand(cfg.devices), data.problem, data.train, master,
                                  None, default_link, None,
                                  [Fixed(0.01), Fixed(0.01)]).run(None).counters

    counters = run()
    assert counters == run()
    for spec, row in zip(expand(cfg.devices), counters):
        drawn = _factors(StepTimes(Fixed(0.01), spec, cfg), int(row["updates"]))
        assert row["busy_s"] == pytest.approx(0.01 * drawn.sum(), rel=1e-9)
    assert counters[0]["updates"] != counters[1]["updates"]  # no longer in lockstep


def test_the_paper_mixes_jitter_and_a_real_mix_refuses_it() -> None:
    paper = run_config("devices=paper_hogbatch_v100").devices.groups
    assert (paper["cpu"].jitter, paper["accel"].jitter) == (0.05, 0.02)
    assert run_config("devices=cpu").devices.groups["cpu"].jitter == 0.0
    with pytest.raises(ConfigError, match=r"devices\.groups\.cpu\.jitter=0\.05 .*simulated=true"):
        run_config("devices=cpu", "devices.groups.cpu.jitter=0.05")
    with pytest.raises(ConfigError, match=r"jitter=-0\.1"):
        run_config(*SIMULATED, "devices.groups.cpu.jitter=-0.1")
