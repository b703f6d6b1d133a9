"""The hooks an algorithm hands an engine: engines consume these, never algorithm names, so the
virtual-clock engine schedules the same steps and landings without a second copy of any
algorithm.

- :class:`SharedMemoryHooks` for workers that claim chunks of the epoch and step on the shared
  master (one-worker sync, Hogwild, Hogbatch, Adaptive). What a step computes is the engine's
  worker; how its result lands in the master is the algorithm's :data:`LinkFactory`; a
  :class:`Controller` may steer batch sizes from the coordinator while workers train.
- :class:`DistributedHooks` for torch.distributed ranks (sync on several workers, local SGD):
  the algorithm's :class:`RankLoop`, and how what rank 0 settled at setup reads in summary.json.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hetsgd.engines.distributed.rank import RankLoop
from hetsgd.engines.shared.links import LinkFactory
from hetsgd.engines.training import Controller
from hetsgd.workers import WorkerSpec

# summary.json entries from what rank 0 settled at setup: (world, {column: value per rank}).
SetupSummary = Callable[[list[WorkerSpec], dict[str, list[float]]], dict]


@dataclass(frozen=True)
class SharedMemoryHooks:
    link: LinkFactory  # how each worker's step lands in the master; picklable
    controller: Controller | None = None


@dataclass(frozen=True)
class DistributedHooks:
    loop: type[RankLoop]
    setup_summary: SetupSummary
    publishing: bool  # rank 0 keeps its replica and publishes it into the master on request


Hooks = SharedMemoryHooks | DistributedHooks
