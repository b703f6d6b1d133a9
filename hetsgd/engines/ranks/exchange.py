"""The one all-reduce of a distributed step or round, and the counters it carries.

Besides the model state it carries the ranks' agreement on when to stop and every rank's
counters, so rank 0 can fill the coordinator's table without a collective of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hetsgd.engines.counters import COUNTERS, RANK_COUNTERS, CounterRow, WorkerCounters
from hetsgd.engines.ranks.group import Group

FLAGS = 3  # stop, diverged, checkpoint: summed, so any rank raises each for all


class Ledger(CounterRow):
    """This rank's counters (a row of ``shared.COUNTERS``), and every rank's as last exchanged.

    Rank 0 writes the world's table into the coordinator's shared counters, so the epoch count,
    the progress display and workers.csv cover every rank, on one machine or across several.
    Time spent in collectives (``comm_s``) includes waiting there for slower ranks. Each step
    and exchange also beats this rank's heartbeat (``beat``): the coordinator's table holds the
    ranks' counters only as of the last exchange, so it cannot tell a rank at work between two.
    """

    def __init__(self, rank: int, batch_size: int, shared: WorkerCounters,
                 beat: Callable[[], None]) -> None:
        super().__init__(torch.zeros(len(COUNTERS), dtype=torch.float64), batch_size)
        self.rank, self.beat = rank, beat
        self.shared = shared if rank == 0 else None

    def step(self, examples: int, busy_s: float, wait_s: float = 0.0, comm_s: float = 0.0,
             copy_s: float = 0.0) -> None:
        super().step(examples, busy_s, wait_s, comm_s, copy_s)
        self.beat()

    def publish(self, table: torch.Tensor) -> None:
        """Rank 0: the world's counters ([ranks, columns]) into the coordinator's table."""
        if self.shared is not None:
            table = table.to("cpu", torch.float64)
            table[self.rank] = self.row[:table.shape[1]]  # its own row is always current
            self.shared.table[:, :table.shape[1]].copy_(table)


@dataclass
class Verdict:
    """What the ranks agreed on at an exchange."""

    stop: bool
    diverged: bool
    checkpoint: bool  # every rank takes its part of a checkpoint after this exchange
    seconds: float


class Exchange:
    """The one all-reduce of a step (sync) or a round (local SGD).

    The payload is a weighted flat state, two vectors (gradients and floating buffers, or
    parameters and floating buffers), summed over the ranks; the tail holds a stop flag, a
    divergence flag, a checkpoint flag and every rank's counters (each rank fills its own row;
    the sum is the table).
    """

    def __init__(self, group: Group, ledger: Ledger, sizes: tuple[int, int]) -> None:
        self.group, self.ledger = group, ledger
        self.sizes = sizes
        tail = FLAGS + group.world_size * len(RANK_COUNTERS)
        self.buffer = group.buffer(sum(sizes) + tail)
        self.tail = torch.zeros(tail, dtype=torch.float32)

    def __call__(self, first: torch.Tensor, second: torch.Tensor, weight: float, stop: bool,
                 diverged: bool, checkpoint: bool) -> Verdict:
        """Sum `weight * (first, second)` over the ranks, in place, and agree on the flags."""
        clock = self.group.clock
        started = clock.now()
        payload = self.buffer[:sum(self.sizes)]
        parts = payload.split(self.sizes)
        for part, values in zip(parts, (first, second)):
            part.copy_(values)
        payload.mul_(weight)
        self.tail.zero_()
        self.tail[:FLAGS] = torch.tensor([stop, diverged, checkpoint], dtype=torch.float32)
        columns = len(RANK_COUNTERS)
        start = FLAGS + self.ledger.rank * columns
        self.tail[start:start + columns] = self.ledger.row[:columns]
        self.buffer[sum(self.sizes):].copy_(self.tail)
        self.group.all_reduce_(self.buffer)
        self.ledger.beat()  # through: a long wait there was for the others
        for part, values in zip(parts, (first, second)):
            values.copy_(part)
        tail = self.buffer[sum(self.sizes):].to("cpu")
        self.ledger.publish(tail[FLAGS:].view(self.group.world_size, columns))
        return Verdict(bool(tail[0] > 0), bool(tail[1] > 0), bool(tail[2] > 0),
                       clock.now() - started)
