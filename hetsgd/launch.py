"""Starting the ranks of a torch.distributed run, on one machine or under torchrun.

On one machine the coordinator starts every rank itself (spawned processes meeting at a free
port on ``dist.master_addr``). Across machines, ``torchrun ... -m hetsgd run ...`` starts one
``hetsgd run`` per rank on every node: global rank 0 runs the whole run as usual (data, the
coordinator, snapshots, evaluation, the one run directory) but its coordinator starts only
rank 0; every other rank :func:`follow`\\ s: it composes the same config, loads the data, trains
its rank in-process and writes nothing.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp
import queue
import sys
from collections.abc import Callable
from functools import partial

import torch

from hetsgd.config import RunConfig, compose_run, to_run_config
from hetsgd.data import load_dataset
from hetsgd.devices import WorkerSpec, expand
from hetsgd.distributed import free_port, torchrun
from hetsgd.engine import Coordinator, OnTick, Training
from hetsgd.ranks import rank_process
from hetsgd.shared import Problem, SharedData, SharedMaster, SharedState, WorkerCounters

Describe = Callable[[list[WorkerSpec], list[list[float]]], dict]
# Numbers per rank that rank 0 notes at setup for summary.json: two of the algorithm's own
# (local SGD: tau and aggregation weight; sync: share of the global batch) and the step time
# measured in the warm-up (NaN when nothing needed it).
NOTES = 3


def per_group(world: list[WorkerSpec], values: list[float], total: bool = False
              ) -> dict[str, float | None]:
    """Per-rank values by group: their mean (or their sum); None where they are NaN."""
    out: dict[str, float | None] = {}
    for group in dict.fromkeys(spec.group for spec in world):
        mine = [v for spec, v in zip(world, values) if spec.group == group]
        value = sum(mine) if total else sum(mine) / len(mine)
        out[group] = None if math.isnan(value) else value
    return out


class RanksCoordinator(Coordinator):
    """The coordinator of a distributed run.

    On one machine it starts every rank; under torchrun only global rank 0 (torchrun starts the
    others on their nodes). Either way it keeps a counters row for every rank, which rank 0
    fills from the exchanges, and adds what rank 0 settled at setup (``describe(world, notes)``,
    e.g. the tau that ``tau: auto`` chose) to summary.json. ``publishing``: rank 0 keeps its
    replica on a GPU and copies it into the master when asked; otherwise it writes the master
    itself and the coordinator never waits for it.
    """

    def __init__(self, cfg: RunConfig, specs: list[WorkerSpec], problem: Problem,
                 data: SharedData, master: SharedMaster, on_tick: OnTick | None,
                 publishing: bool, describe: Describe) -> None:
        started_here, launch = specs, torchrun()
        if launch is not None:
            started_here = [specs[launch.rank]]  # global rank 0: the other ranks follow()
        elif cfg.dist.master_port is None:
            port = free_port(cfg.dist.master_addr)
            cfg = dataclasses.replace(cfg, dist=dataclasses.replace(cfg.dist, master_port=port))
        self.notes = torch.full((len(specs), NOTES), math.nan, dtype=torch.float64).share_memory_()
        super().__init__(cfg, started_here, problem, data, master, on_tick,
                         target=partial(rank_process, world=specs, notes=self.notes))
        self.world, self.describe = specs, describe
        self.state.counters = WorkerCounters(len(specs))
        self.publishing = publishing

    def run(self, monitor_factory) -> Training:
        training = super().run(monitor_factory)
        training.counters = [self.state.counters.row(spec.rank) for spec in self.world]
        if not self.notes.isnan().all():
            training.extra = {**training.extra, **self.describe(self.world, self.notes.tolist())}
        return training


def world_specs(cfg: RunConfig) -> list[WorkerSpec]:
    """Every rank's spec, as the runner computes them on global rank 0."""
    from hetsgd import algorithms  # the algorithm modules import this one

    return algorithms.get(cfg.algo.name).plan(cfg, expand(cfg.devices))


def follow(overrides: list[str]) -> int:
    """A torchrun rank other than 0: train this rank with the same config; write nothing.
    Returns the process exit code (1 when the rank failed, the error on stderr)."""
    launch = torchrun()
    assert launch is not None, "follow() runs under torchrun only"
    cfg = to_run_config(compose_run(overrides))
    specs = world_specs(cfg)
    dataset = load_dataset(cfg.dataset, cfg.seed, progress=False)
    problem = Problem.of(dataset)
    data = SharedData.from_arrays(dataset.x_train, dataset.y_train)
    state = SharedState.create(data, SharedMaster.initial(cfg.model, problem, cfg.seed),
                               cfg.budget.epochs, len(specs), mp.get_context("spawn"))
    state.signals.go.set()  # nobody else here to wait for: the first collective meets rank 0
    reports: queue.SimpleQueue = queue.SimpleQueue()
    notes = torch.zeros(len(specs), NOTES, dtype=torch.float64)  # rank 0's to keep
    rank_process(specs[launch.rank], cfg, problem, state, reports, world=specs, notes=notes)
    while not reports.empty():
        kind, rank, message = reports.get()
        if kind in ("failed", "diverged"):
            print(f"hetsgd: rank {rank} {kind}: {message}", file=sys.stderr)
            return 1
    return 0
