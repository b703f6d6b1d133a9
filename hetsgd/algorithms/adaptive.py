"""Adaptive Hogbatch (Ma & Rusu): Hogbatch plus a controller that resizes batches from measured
update rates toward a target share of model updates between the accelerator and host classes.

The paper does not give its rule. This is the project's reconstruction (docs/algorithms.md):

* every ``period_s`` seconds, measure each class's update rate U over the last ``window_s``;
* with s* = ``target_share`` (the accelerator class's wanted share of updates),
  r = (s* / (1 - s*)) * U_host / U_accel is how many times more often the accelerators should
  update; within a factor ``dead_band`` (1.1) of 1 nothing changes;
* r > 1: shrink the accelerator batch,
  b_g <- clamp(b_g / r^gamma, min_accel_batch, max_accel_batch); once b_g sits at
  ``min_accel_batch`` (the paper's threshold, which caps the utilization cost), grow the host
  batches by r^gamma, each up to ``max_host_batch`` (one factor for all, so a group that starts
  smaller keeps growing after a larger one stops at the bound). On the paper's machines a small
  accelerator step is mostly its two copies of the model, so the host batches must grow far past
  64 for the accelerator to catch up; where both bounds stop the controller, the threshold decides the
  balance and the utilization (docs/results/adaptive_threshold.md);
* r < 1: undo in the opposite order (host batches back down to their configured size, then
  b_g up to ``max_accel_batch``);
* each resize is capped at a factor of ``max_factor`` (4), and the measuring window restarts
  after it, from the counts at the resize (so the next control, ``period_s`` later, has a
  window of ``period_s``: rates need one at least ``MIN_WINDOW_FILL`` of ``window_s`` long).
  Times are compared with ``CLOCK_SLACK_S`` to spare: tick times are floats, and a control
  due exactly ``period_s`` later, or a window of exactly half ``window_s``, came out a rounding
  short and waited a tick, or a whole period.

Every change is logged (``batches.csv``); the summary says whether a bound stopped the controller.
"""

from __future__ import annotations

import dataclasses
from collections import deque

from hetsgd.algorithms import hogbatch
from hetsgd.algorithms.api import (
    AdaptiveConfig,
    Hooks,
    LinkHooks,
    Plan,
    RunConfig,
    UserError,
    WorkerCounters,
    WorkerSpec,
)

NAME = "adaptive"
CONFIG = AdaptiveConfig
MIN_WINDOW_FILL = 0.5  # rates need a window at least this full (share of window_s) to count
# Before the accelerators' first update in a window, their count is taken as this (shrink).
NO_UPDATE_FLOOR = 0.5
# Slack on comparisons of clock times: far above the float error of a tick's time (n * 0.01 s on
# the virtual clock), far below a tick.
CLOCK_SLACK_S = 1e-6


def plan(cfg: RunConfig, specs: list[WorkerSpec]) -> Plan:
    """Hogbatch's layout; ``max_accel_batch`` defaults to the accelerator group's batch size, and
    a threshold above it means the accelerator batch never shrinks (the default threshold is
    set for the paper's GPU batch of 1024, above an emulated accelerator's 256). A batch that
    starts above its bound is refused: the controller would take the bound for the batch. So
    are accelerators of several batch sizes: the rule resizes one accelerator batch (the
    paper's one GPU), and would give every accelerator the first one's."""
    hogbatch.check_workers(cfg, specs)
    algo = cfg.algo
    assert isinstance(algo, AdaptiveConfig)
    accel = {s.group: s.batch_size for s in specs if s.accel}
    group, accel_batch = next(iter(accel.items()))
    if other := next((g for g, size in accel.items() if size != accel_batch), None):
        raise UserError(f"Adaptive resizes one accelerator batch size: devices.groups.{group}"
                        f".batch_size={accel_batch} and devices.groups.{other}.batch_size="
                        f"{accel[other]} differ (give every accelerator group one)")
    for spec in specs:
        key = "max_accel_batch" if spec.accel else "max_host_batch"
        bound = getattr(algo, key)
        if bound is not None and spec.batch_size > bound:
            raise UserError(f"devices.groups.{spec.group}.batch_size={spec.batch_size} is above "
                            f"algo.{key}={bound}, the most Adaptive resizes it to: lower the "
                            "one or raise the other")
    max_accel_batch = algo.max_accel_batch or accel_batch
    min_accel_batch = min(algo.min_accel_batch, max_accel_batch)
    cfg = dataclasses.replace(cfg, algo=dataclasses.replace(
        algo, max_accel_batch=max_accel_batch, min_accel_batch=min_accel_batch))
    return Plan(cfg, specs, {"max_accel_batch": max_accel_batch,
                             "min_accel_batch": min_accel_batch,
                             "max_host_batch": algo.max_host_batch})


def hooks(plan: Plan) -> Hooks:
    algo = plan.cfg.algo
    assert isinstance(algo, AdaptiveConfig)
    link = hogbatch.hooks(plan)
    assert isinstance(link, LinkHooks)
    return LinkHooks(link.link, BatchController(algo, plan.workers))


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


class BatchController:
    """Runs in the coordinator; workers read their batch size from the shared counters."""

    def __init__(self, cfg: AdaptiveConfig, specs: list[WorkerSpec]) -> None:
        self.cfg = cfg
        self.specs = specs
        self.accel = [s.rank for s in specs if s.accel]
        self.host = [s.rank for s in specs if not s.accel]
        self.accel_batch = float(specs[self.accel[0]].batch_size)
        assert cfg.max_accel_batch is not None, "settled by plan()"
        self.max_accel_batch = float(cfg.max_accel_batch)
        self.initial_host = {r: specs[r].batch_size for r in self.host}
        self.host_factor = 1.0
        # the factor that takes the smallest host batch to the bound; _sizes caps each group
        self.max_host_factor = max(1.0, cfg.max_host_batch / min(self.initial_host.values(), default=1))
        # (time, accelerators' updates, hosts' updates), from the clock's start
        self.window: deque[tuple[float, float, float]] = deque([(0.0, 0.0, 0.0)])
        self.next_control = cfg.period_s
        self.last_ratio: float | None = None
        self.last_share: float | None = None  # accelerator share of updates, last window
        self.log: list[dict[str, float | str]] = [
            {"time_s": 0.0, "worker": s.rank, "group": s.group, "batch_size": s.batch_size}
            for s in specs]

    @property
    def _accel_size(self) -> int:
        """The accelerators' batch size: the damped size, rounded. Bounds are judged on it: a
        size a fraction above its floor rounds to the floor, where a shrink would change nothing
        and cost a control period."""
        return max(1, round(self.accel_batch))

    def _sizes(self) -> dict[int, int]:
        sizes = {r: self._accel_size for r in self.accel}
        sizes.update({r: min(self.cfg.max_host_batch, max(b, round(b * self.host_factor)))
                      for r, b in self.initial_host.items()})
        return sizes

    def tick(self, elapsed: float, counters: WorkerCounters) -> None:
        updates = counters.column("updates")
        self.window.append((elapsed, float(updates[self.accel].sum()), float(updates[self.host].sum())))
        while self.window and elapsed - self.window[0][0] > self.cfg.window_s:
            self.window.popleft()
        if elapsed < self.next_control - CLOCK_SLACK_S:
            return
        self.next_control = elapsed + self.cfg.period_s
        (t0, a0, h0), (t1, a1, h1) = self.window[0], self.window[-1]
        if t1 - t0 < MIN_WINDOW_FILL * self.cfg.window_s - CLOCK_SLACK_S or h1 == h0:
            return  # not enough evidence yet
        self.last_share = (a1 - a0) / (a1 - a0 + h1 - h0)
        share = self.cfg.target_share
        ratio = share / (1 - share) * (h1 - h0) / max(a1 - a0, NO_UPDATE_FLOOR)
        self.last_ratio = ratio
        if 1 / self.cfg.dead_band < ratio < self.cfg.dead_band:
            return
        step = _clamp(ratio ** self.cfg.gamma, 1 / self.cfg.max_factor, self.cfg.max_factor)
        before = self._sizes()
        if ratio > 1 and self._accel_size > self.cfg.min_accel_batch:
            self.accel_batch = _clamp(self.accel_batch / step, self.cfg.min_accel_batch, self.max_accel_batch)
        elif ratio > 1:
            self.host_factor = _clamp(self.host_factor * step, 1.0, self.max_host_factor)
        elif self.host_factor > 1:
            self.host_factor = _clamp(self.host_factor * step, 1.0, self.max_host_factor)
        else:
            self.accel_batch = _clamp(self.accel_batch / step, self.cfg.min_accel_batch, self.max_accel_batch)
        after = self._sizes()
        if after == before:
            return
        sizes = counters.column("batch_size")
        for rank, size in after.items():
            if size != before[rank]:
                sizes[rank] = size
                self.log.append({"time_s": elapsed, "worker": rank, "group": self.specs[rank].group,
                                 "batch_size": size})
        self.window.clear()
        self.window.append((elapsed, a1, h1))  # the rates after the resize, from its counts

    def summary(self) -> dict:
        """Where the controller ended, and which bound (if any) kept it from its target."""
        bound = None
        if self.last_ratio is not None and self.last_ratio >= self.cfg.dead_band:
            if self._accel_size <= self.cfg.min_accel_batch and self.host_factor >= self.max_host_factor:
                bound = "min_accel_batch and max_host_batch"
        elif self.last_ratio is not None and self.last_ratio <= 1 / self.cfg.dead_band:
            if self.host_factor <= 1 and self._accel_size >= self.max_accel_batch:
                bound = "max_accel_batch"
        return {"adaptive": {"target_share": self.cfg.target_share, "bound": bound,
                             "last_window_share": self.last_share,
                             "last_ratio": self.last_ratio, "final_batch_sizes": self._sizes()}}

