"""Everything a shared-memory worker receives besides its own spec and the run config."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from multiprocessing.synchronize import Event

import numpy as np
import numpy.typing as npt
import torch

from hetsgd.engines.checkpoint import Checkpoint, WorkerState
from hetsgd.engines.common.cursor import EpochCursor
from hetsgd.engines.common.memory import SharedData, SharedMaster
from hetsgd.engines.common.numpy_views import SharedFlag, SharedViews
from hetsgd.engines.counters import WorkerCounters
from hetsgd.engines.method_log import MethodLog

# A worker that has left its loop answers every publish request from then on.
RETIRED = torch.iinfo(torch.int64).max


@dataclass
class Signals(SharedViews):
    """Coordinator <-> worker flags.

    ``go``: every worker is set up, the clock starts (waited for once). ``stop``: training ends
    (time budget, failure, divergence); workers read it every step. ``publish_request`` (a
    counter) and ``publish_done`` (one entry per worker): before a snapshot the coordinator
    raises the request and waits until every accelerator worker has answered it, so the master
    holds their latest step: a resident replica copies itself in, a merging replica answers
    after its next merge. ``checkpoint_request`` and ``checkpoint_done`` work the same way for
    checkpoints, without the coordinator waiting: each worker answers at its next consistent point
    by sending its part (:mod:`hetsgd.engines.checkpoint`). ``beats`` (one counter per worker)
    is a worker's heartbeat where it gets on without counting a step (setting up, an emulated
    device's sleep, a wait for the cursor's lock, a rank's local steps and exchanges): with the
    updates it counts, the coordinator tells a slow worker from a hung one. Workers read and
    write them through numpy views (every step).
    """

    go: Event | threading.Event
    stop: SharedFlag
    publish_request: torch.Tensor
    publish_done: torch.Tensor
    checkpoint_request: torch.Tensor
    checkpoint_done: torch.Tensor
    beats: torch.Tensor

    VIEWS = {"_request": "publish_request", "_done": "publish_done",
             "_checkpoint_request": "checkpoint_request", "_checkpoint_done": "checkpoint_done",
             "_beats": "beats"}

    def __post_init__(self) -> None:
        # The views, set by _build_views: declared here, not in the class body, where they would
        # be dataclass fields.
        self._request: npt.NDArray[np.int64]
        self._done: npt.NDArray[np.int64]
        self._checkpoint_request: npt.NDArray[np.int64]
        self._checkpoint_done: npt.NDArray[np.int64]
        self._beats: npt.NDArray[np.int64]
        self._build_views()

    @classmethod
    def create(cls, ctx, num_workers: int) -> Signals:  # ctx: see SharedState.create
        def counter(size: int) -> torch.Tensor:
            return torch.zeros(size, dtype=torch.int64).share_memory_()

        return cls(ctx.Event(), SharedFlag(), counter(1), counter(num_workers), counter(1),
                   counter(num_workers), counter(num_workers))

    def answer(self, rank: int) -> None:
        """Worker ``rank``: the master holds everything it has done up to now."""
        self._done[rank] = self._request[0]

    def retire(self, rank: int) -> None:
        """Worker ``rank`` left its loop after its final publish: never wait for it again."""
        self._done[rank] = RETIRED

    def asked(self, rank: int) -> bool:
        """Whether worker ``rank`` has a publish request to answer (checked every step)."""
        return bool(self._done[rank] < self._request[0])

    def answered(self, ranks: list[int]) -> bool:
        return not any(self.asked(r) for r in ranks)

    def beat(self, rank: int) -> None:
        """Worker ``rank`` is alive and getting on (see ``beats``)."""
        self._beats[rank] += 1

    def waiting(self, rank: int) -> bool:
        """The check of worker ``rank``'s wait, every slice of an emulated sleep or of a wait for
        the cursor's lock: a heartbeat (waiting is not hung), then whether training has ended."""
        self.beat(rank)
        return self.stop.is_set()

    def request_checkpoint(self) -> None:
        self._checkpoint_request[0] += 1

    def checkpoint_asked(self, rank: int) -> bool:
        """Whether worker ``rank`` has a checkpoint request to answer (checked every step)."""
        return bool(self._checkpoint_done[rank] < self._checkpoint_request[0])

    def answer_checkpoint(self, rank: int) -> None:
        self._checkpoint_done[rank] = self._checkpoint_request[0]


@dataclass
class SharedState:
    """Everything a worker receives besides its own spec and the run config."""

    data: SharedData
    master: SharedMaster
    cursor: EpochCursor
    counters: WorkerCounters
    signals: Signals
    log: MethodLog  # the method's own numbers (``log(name, value)``)
    checkpointing: bool = False  # workers send their part of a checkpoint when asked, and at the end
    restored: list[WorkerState] | None = None  # by rank: each worker's part, when resuming

    @classmethod
    def create(cls, data: SharedData, master: SharedMaster, epochs: float | None,
               num_workers: int, ctx) -> SharedState:
        """``ctx`` makes the lock and event: a multiprocessing context for worker processes,
        the ``threading`` module for workers that share this process (the virtual engines)."""
        return cls(data, master, EpochCursor(data.num_examples, epochs, ctx.Lock()),
                   WorkerCounters(num_workers), Signals.create(ctx, num_workers),
                   MethodLog(ctx.Lock()))

    def restore(self, checkpoint: Checkpoint) -> None:
        """Start where ``checkpoint`` left: the model, the counters, the cursor's hand-out and
        every worker's own part (which each worker takes back as it sets up)."""
        self.master.params.copy_(checkpoint.params)
        self.master.buffers.copy_(checkpoint.buffers)
        self.counters.table.copy_(checkpoint.counters)
        self.cursor.handed_out = checkpoint.position
        self.restored = checkpoint.workers
