"""Everything a shared-memory worker receives besides its own spec and the run config."""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.synchronize import Event

import torch

from hetsgd.engines.shared_memory.counters import WorkerCounters
from hetsgd.engines.shared_memory.cursor import EpochCursor
from hetsgd.engines.shared_memory.memory import SharedData, SharedMaster


@dataclass
class Signals:
    """Coordinator <-> worker flags.

    ``go``: every worker is set up, the clock starts. ``stop``: training ends (time budget,
    failure, divergence). ``publish_request`` and
    ``publish_done``: a worker that trains a private replica (on a GPU) copies it into the master
    when the coordinator asks, so snapshots see it without a copy after every step.
    """

    go: Event
    stop: Event
    publish_request: torch.Tensor
    publish_done: torch.Tensor

    @classmethod
    def create(cls, ctx) -> Signals:  # ctx: a multiprocessing context
        return cls(ctx.Event(), ctx.Event(), torch.zeros(1, dtype=torch.int64).share_memory_(),
                   torch.zeros(1, dtype=torch.int64).share_memory_())


@dataclass
class SharedState:
    """Everything a worker receives besides its own spec and the run config."""

    data: SharedData
    master: SharedMaster
    cursor: EpochCursor
    counters: WorkerCounters
    signals: Signals

    @classmethod
    def create(cls, data: SharedData, master: SharedMaster, epochs: float | None,
               num_workers: int, ctx) -> SharedState:  # ctx: a multiprocessing context
        return cls(data, master, EpochCursor(data.num_examples, epochs, ctx.Lock()),
                   WorkerCounters(num_workers), Signals.create(ctx))
