"""The hooks an algorithm hands an engine: engines consume these, never algorithm names, so the
virtual-clock engine schedules the same steps and landings without a second copy of any
algorithm. Each is named for what it hands over, not for an engine: every kind runs on a real
engine and on the virtual clock.

- :class:`LinkHooks` for workers that claim chunks of the epoch and step on the shared master
  (one-worker sync, Hogwild, Hogbatch, Adaptive). What a step computes is the engine's worker;
  how its result lands in the master is the algorithm's :data:`LinkFactory`; a
  :class:`Controller` may steer batch sizes from the coordinator while workers train.
- :class:`RankLoopHooks` for ranks that each run the algorithm's :class:`RankLoop` (sync on
  several workers, local SGD), and how what rank 0 settled at setup reads in summary.json.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from hetsgd.config import RunConfig
from hetsgd.engines.common.links import LinkFactory
from hetsgd.engines.ranks.loop import RankLoop
from hetsgd.engines.training import Controller
from hetsgd.workers import WorkerSpec

# summary.json entries from what rank 0 settled at setup: (world, {column: value per rank}).
SetupSummary = Callable[[list[WorkerSpec], dict[str, list[float]]], dict]


def per_group(world: list[WorkerSpec], values: list[float], total: bool = False
              ) -> dict[str, float | None]:
    """Per-rank values by group, for a :data:`SetupSummary`: their mean (or their sum); None
    where they are NaN."""
    out: dict[str, float | None] = {}
    for group in dict.fromkeys(spec.group for spec in world):
        mine = [v for spec, v in zip(world, values) if spec.group == group]
        value = sum(mine) if total else sum(mine) / len(mine)
        out[group] = None if math.isnan(value) else value
    return out


@dataclass(frozen=True)
class LinkHooks:
    link: LinkFactory  # how each worker's step lands in the master; picklable
    controller: Controller | None = None


@dataclass(frozen=True)
class RankLoopHooks:
    loop: type[RankLoop]
    setup_summary: SetupSummary
    publishing: bool  # rank 0 keeps its replica and publishes it into the master on request


Hooks = LinkHooks | RankLoopHooks


def step_choice(cfg: RunConfig, hooks: Hooks) -> str:
    """The training step the workers take, as asked (``auto`` resolved later): a rank loop's
    own, else ``optim.step``; what summary.json names and the virtual clock costs."""
    return hooks.loop.step_choice(cfg) if isinstance(hooks, RankLoopHooks) else cfg.optim.step
