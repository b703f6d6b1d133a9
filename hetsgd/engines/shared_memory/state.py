"""Everything a shared-memory worker receives besides its own spec and the run config."""

from __future__ import annotations

from dataclasses import dataclass
from multiprocessing.synchronize import Event

import torch

from hetsgd.engines.shared_memory.counters import WorkerCounters
from hetsgd.engines.shared_memory.cursor import EpochCursor
from hetsgd.engines.shared_memory.memory import SharedData, SharedMaster

# A worker that has left its loop answers every publish request from then on.
RETIRED = torch.iinfo(torch.int64).max


@dataclass
class Signals:
    """Coordinator <-> worker flags.

    ``go``: every worker is set up, the clock starts. ``stop``: training ends (time budget,
    failure, divergence). ``publish_request`` (a counter) and ``publish_done`` (one entry per
    worker): before a snapshot the coordinator raises the request and waits until every
    accelerator worker has answered it, so the master holds their latest step: a resident
    replica copies itself in, a merging replica answers after its next merge.
    """

    go: Event
    stop: Event
    publish_request: torch.Tensor
    publish_done: torch.Tensor

    @classmethod
    def create(cls, ctx, num_workers: int) -> Signals:  # ctx: a multiprocessing context
        return cls(ctx.Event(), ctx.Event(), torch.zeros(1, dtype=torch.int64).share_memory_(),
                   torch.zeros(num_workers, dtype=torch.int64).share_memory_())

    def answer(self, rank: int) -> None:
        """Worker ``rank``: the master holds everything it has done up to now."""
        self.publish_done[rank] = self.publish_request[0]

    def retire(self, rank: int) -> None:
        """Worker ``rank`` left its loop after its final publish: never wait for it again."""
        self.publish_done[rank] = RETIRED

    def asked(self, rank: int) -> bool:
        """Whether worker ``rank`` has a publish request to answer (once per step: no list)."""
        return int(self.publish_done[rank]) < int(self.publish_request[0])

    def answered(self, ranks: list[int]) -> bool:
        return not any(self.asked(r) for r in ranks)


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
                   WorkerCounters(num_workers), Signals.create(ctx, num_workers))
