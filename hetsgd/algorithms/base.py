"""The interface every algorithm provides: a plan, then the hooks an engine runs it with.

An algorithm never starts processes or moves data itself. It settles a :class:`Plan` before any
work starts (the workers it trains on, every derived value filled into the config), then hands
an engine its hooks:

- :class:`SharedMemoryHooks` for workers that claim chunks of the epoch and step on the shared
  master (one-worker sync, Hogwild, Hogbatch, Adaptive). What a step computes is the engine's
  worker; how its result lands in the master is the algorithm's :data:`LinkFactory`; a
  :class:`Controller` may steer batch sizes from the coordinator while workers train.
- :class:`DistributedHooks` for torch.distributed ranks (sync on several workers, local SGD):
  the algorithm's :class:`RankLoop`, and how what rank 0 settled at setup reads in summary.json.

Engines consume hooks, never algorithm names, so the virtual-clock engine
(:mod:`hetsgd.engines.virtual`) schedules the same steps and landings without a second copy of any
algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from hetsgd.config import RunConfig
from hetsgd.devices import WorkerSpec
from hetsgd.engines.checkpoint import Checkpoint
from hetsgd.engines.distributed.coordinator import DistributedCoordinator, SetupSummary
from hetsgd.engines.distributed.rank import RankLoop
from hetsgd.engines.shared_memory.coordinator import Controller, Coordinator, OnTick
from hetsgd.engines.shared_memory.links import LinkFactory
from hetsgd.engines.shared_memory.memory import SharedData, SharedMaster
from hetsgd.engines.shared_memory.worker import worker_process
from hetsgd.engines.virtual.coordinator import VirtualCoordinator
from hetsgd.engines.virtual.mix import profiles_for
from hetsgd.engines.virtual.ranks import VirtualRanks
from hetsgd.errors import UserError
from hetsgd.model.problem import Problem


@dataclass(frozen=True)
class Plan:
    """What an algorithm settled before training: the config with every derived value filled in
    (so no later code derives it again), the workers it trains on, and those values by name
    for summary.json's ``plan`` entry."""

    cfg: RunConfig
    workers: list[WorkerSpec]
    settled: dict[str, Any] = field(default_factory=dict)


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


class Algorithm(Protocol):
    """What each module of :mod:`hetsgd.algorithms` provides."""

    NAME: str

    def plan(self, cfg: RunConfig, specs: list[WorkerSpec]) -> Plan:
        """Pick the workers and settle derived values; a layout the algorithm cannot run is a
        one-line ``UserError``."""
        ...

    def hooks(self, plan: Plan) -> Hooks:
        """What the engine runs the planned workers with."""
        ...


def coordinator(plan: Plan, hooks: Hooks, problem: Problem, data: SharedData,
                master: SharedMaster, on_tick: OnTick | None,
                resume: Checkpoint | None = None) -> Coordinator:
    """The engine that runs ``plan``'s workers with ``hooks``, from ``resume`` if given: the
    virtual clock for a simulated mix, else processes."""
    if plan.cfg.devices.simulated:
        if resume is not None or plan.cfg.checkpoint.every_s is not None:
            raise UserError("checkpoints are not supported on simulated mixes (a simulated run "
                            "is deterministic: run it again instead): set checkpoint.every_s=null, "
                            "without resume")
        profiles = profiles_for(plan.cfg, plan.workers, problem)
        if isinstance(hooks, DistributedHooks):
            return VirtualRanks(plan.cfg, plan.workers, problem, data, master, on_tick,
                                hooks.loop, hooks.setup_summary, profiles)
        return VirtualCoordinator(plan.cfg, plan.workers, problem, data, master, on_tick,
                                  hooks.link, hooks.controller, profiles)
    if isinstance(hooks, DistributedHooks):
        return DistributedCoordinator(plan.cfg, plan.workers, problem, data, master, on_tick,
                                      hooks.loop, hooks.publishing, hooks.setup_summary, resume)
    return Coordinator(plan.cfg, plan.workers, problem, data, master, on_tick,
                       target=partial(worker_process, link_factory=hooks.link),
                       controller=hooks.controller, resume=resume)
