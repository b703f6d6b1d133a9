"""Adaptive Hogbatch's controller on counters it is handed: when it resizes, by how much, and
the layouts it refuses (hetsgd/algorithms/adaptive.py)."""

from __future__ import annotations

import dataclasses
import re

import pytest
from conftest import run_config

from hetsgd.algorithms import adaptive
from hetsgd.config import ConfigError
from hetsgd.config.algorithms import AdaptiveConfig
from hetsgd.engines.base import TICK_S
from hetsgd.engines.counters import WorkerCounters
from hetsgd.errors import UserError
from hetsgd.workers import WorkerSpec, expand

SPECS = [WorkerSpec(rank=0, group="accel", kind="cpu", device="cpu", threads=1, batch_size=1024,
                    slowdown=1.0, accel=True),
         WorkerSpec(rank=1, group="cpu", kind="cpu", device="cpu", threads=1, batch_size=8,
                    slowdown=1.0, accel=False)]


def _driven(cfg: AdaptiveConfig, seconds: float,
            specs: list[WorkerSpec] = SPECS) -> adaptive.BatchController:
    """The controller after, tick after tick, the accelerator made one update and each host ten:
    the accelerator's share stays below the target's 1/2."""
    controller = adaptive.BatchController(cfg, specs)
    counters = WorkerCounters(len(specs))
    updates = counters.column("updates")
    for tick in range(1, round(seconds / TICK_S) + 1):
        for spec in specs:
            updates[spec.rank] += 1 if spec.accel else 10
        controller.tick(tick * TICK_S, counters)
    return controller


def _resizes(cfg: AdaptiveConfig, seconds: float) -> list[tuple[float, int, int]]:
    """(time, worker, batch size) of each resize of the two workers of SPECS (:func:`_driven`)."""
    return [(row["time_s"], row["worker"], row["batch_size"])
            for row in _driven(cfg, seconds).log if row["time_s"] > 0]


def test_the_controller_resizes_every_period_from_the_first() -> None:
    """Its window started at the first tick and restarted a tick after each resize, so it was
    a tick short of the half window it needs at every other control: resizes came at 1, 2, 3 s,
    half as often as period_s=0.5 says."""
    resizes = _resizes(AdaptiveConfig(max_accel_batch=1024), seconds=2.0)
    # ratio 10, each resize by 10 ** 0.5: the accelerator to its floor, then the host grows
    assert [(round(t, 6), worker, size) for t, worker, size in resizes] == [
        (0.5, 0, 324), (1.0, 0, 102), (1.5, 0, 32), (2.0, 1, 25)]


def test_a_window_of_exactly_half_window_s_is_full_enough() -> None:
    """period_s=0.1 of window_s=0.2: after a resize the next control's window is exactly half
    window_s, but 0.03 - 0.02 is 0.00999... in floats, so some controls found it short and
    waited a whole period. Resizes of 1 % keep the accelerator shrinking at every control."""
    cfg = AdaptiveConfig(max_accel_batch=1024, period_s=0.1, window_s=0.2, max_factor=1.01)
    resizes = _resizes(cfg, seconds=2.0)
    assert [round(t, 6) for t, _, _ in resizes] == [round(0.1 * k, 6) for k in range(1, 21)]
    assert {worker for _, worker, _ in resizes} == {0}


def test_each_host_group_grows_to_max_host_batch() -> None:
    """All host batches grow by one factor, each up to max_host_batch: the factor was capped where
    the largest group (8) reached 64, so a group at 1 stopped at 8, and the summary still named
    max_host_batch as the bound that stopped the controller."""
    one = WorkerSpec(rank=2, group="one", kind="cpu", device="cpu", threads=1, batch_size=1,
                     slowdown=1.0, accel=False)
    specs = [dataclasses.replace(SPECS[0], batch_size=256), SPECS[1], one]
    cfg = AdaptiveConfig(max_accel_batch=256)
    # ratio 20, each resize by 4: accelerator 64, 32, then hosts x4 at 1.5 s and 2.0 s
    midway = _driven(cfg, 2.0, specs).summary()["adaptive"]
    assert midway["final_batch_sizes"] == {0: 32, 1: 64, 2: 16} and midway["bound"] is None
    settled = _driven(cfg, 3.0, specs).summary()["adaptive"]
    assert settled["final_batch_sizes"] == {0: 32, 1: 64, 2: 64}
    assert settled["bound"] == "min_accel_batch and max_host_batch"


def test_the_dead_band_and_the_largest_resize_are_options() -> None:
    capped = _resizes(AdaptiveConfig(max_accel_batch=1024, max_factor=2.0), seconds=1.0)
    assert [size for _, _, size in capped] == [512, 256]
    assert _resizes(AdaptiveConfig(max_accel_batch=1024, dead_band=20.0), seconds=2.0) == []
    for key, value in (("dead_band", 0.9), ("max_factor", 1.0)):
        with pytest.raises(ConfigError, match=f"algo.{key}"):
            AdaptiveConfig(**{key: value})


def test_accelerators_of_two_batch_sizes_are_refused() -> None:
    """The rule resizes one accelerator batch: a second accelerator group at 64 under one at
    256 was resized to the first one's size, growing when the rule shrank."""
    cfg = run_config("algo=adaptive", "devices=emulated")
    specs = expand(cfg.devices)
    slow = dataclasses.replace(specs[0], rank=len(specs), group="slow", batch_size=64)
    assert specs[0].accel and specs[0].batch_size == 256
    with pytest.raises(UserError, match="^" + re.escape(
            "Adaptive resizes one accelerator batch size: devices.groups.accel.batch_size=256 "
            "and devices.groups.slow.batch_size=64 differ (give every accelerator group one)")):
        adaptive.plan(cfg, [*specs, slow])
    alike = dataclasses.replace(slow, batch_size=256)
    assert len(adaptive.plan(cfg, [*specs, alike]).workers) == len(specs) + 1
