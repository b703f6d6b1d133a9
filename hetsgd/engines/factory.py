"""Which engine runs a plan: the virtual clock for a simulated mix, else processes; the
torch.distributed ranks for :class:`RankLoopHooks`, else shared-memory workers. The one place
that knows every engine, so the runner names none."""

from __future__ import annotations

from functools import partial
from typing import Protocol

from hetsgd.config import RunConfig, TorchOptimConfig
from hetsgd.engines.async_shared.process import worker_process
from hetsgd.engines.checkpoint import Checkpoint
from hetsgd.engines.common.coordinator import Coordinator
from hetsgd.engines.common.memory import SharedData, SharedMaster
from hetsgd.engines.hooks import Hooks, RankLoopHooks, step_choice
from hetsgd.engines.ranks.coordinator import DistributedCoordinator
from hetsgd.engines.training import Engine, Journal, OnTick
from hetsgd.engines.virtual.coordinator import VirtualCoordinator
from hetsgd.engines.virtual.mix import profiles_for
from hetsgd.engines.virtual.ranks import VirtualRanks
from hetsgd.errors import UserError
from hetsgd.model.optimizer import check_optimizers
from hetsgd.model.problem import Problem
from hetsgd.workers import WorkerSpec


class Planned(Protocol):
    """What an engine takes from an algorithm's plan (``hetsgd.algorithms.base.Plan``, a layer
    above): the config with every derived value settled, and the workers chosen."""

    @property
    def cfg(self) -> RunConfig: ...

    @property
    def workers(self) -> list[WorkerSpec]: ...


def check_optimizer_for(cfg: RunConfig, hooks: Hooks, workers: int) -> None:
    """A torch optimizer where the engine can use it, its classes and arguments checked once
    here: ranks (each its own optimizer on its own replica) and a lone worker take one; several
    workers updating one shared model lock-free (Hogwild, Hogbatch) do not, since each worker's
    optimizer state (Adam's moments) would follow a model that the others change under it."""
    if isinstance(cfg.optim, TorchOptimConfig) and workers > 1 \
            and not isinstance(hooks, RankLoopHooks):
        raise UserError(f"optim=torch: algo={cfg.algo.name} has {workers} workers update one "
                        "shared model lock-free, which no per-worker optimizer state can follow; "
                        "use optim=sgd, or an algorithm on ranks (sync, local_sgd)")
    check_optimizers(cfg)


def build_engine(plan: Planned, hooks: Hooks, problem: Problem, data: SharedData,
                 master: SharedMaster, on_tick: OnTick | None, journal: Journal | None = None,
                 resume: Checkpoint | None = None) -> Engine:
    """The engine that runs ``plan``'s workers with ``hooks``, keeping what it measures in
    ``journal`` as it goes, from ``resume`` if given."""
    cfg, workers = plan.cfg, plan.workers
    check_optimizer_for(cfg, hooks, len(workers))
    if cfg.devices.simulated:
        profiles = profiles_for(cfg, workers, problem, step_choice(cfg, hooks))
        if isinstance(hooks, RankLoopHooks):
            return VirtualRanks(cfg, workers, problem, data, master, on_tick, hooks.loop,
                                hooks.setup_summary, profiles, journal, resume)
        if resume is not None or cfg.checkpoint.every_s is not None:
            raise UserError("checkpoints on a simulated mix are taken for methods on ranks (sync "
                            "on several workers, local_sgd, a rank loop of your own), not for "
                            "workers on one shared model (a simulated run is deterministic: run "
                            "it again instead): set checkpoint.every_s=null, without resume")
        return VirtualCoordinator(cfg, workers, problem, data, master, on_tick, hooks.link,
                                  hooks.controller, profiles, journal)
    if isinstance(hooks, RankLoopHooks):
        return DistributedCoordinator(cfg, workers, problem, data, master, on_tick, hooks.loop,
                                      hooks.publishing, hooks.setup_summary, resume, journal)
    return Coordinator(cfg, workers, problem, data, master, on_tick,
                       target=partial(worker_process, link_factory=hooks.link),
                       controller=hooks.controller, resume=resume, journal=journal)
