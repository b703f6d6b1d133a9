"""Copies of the master model taken while workers train, evaluated after training."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass
class Snapshot:
    time_s: float
    examples: float
    updates: list[float]  # per worker
    params: torch.Tensor
    buffers: torch.Tensor
    logged: dict[str, float] = field(default_factory=dict)  # the method's latest (method_log)


class Snapshots:
    """When to copy the master, and the copies kept.

    A snapshot is due every ``every_s`` seconds and every ``every_epochs`` epochs, whichever
    comes first. Past the count or memory cap, every other snapshot is dropped (keeping the
    first and the newest) and both spacings double, so a long run stays evenly covered at a
    bounded evaluation cost. :meth:`add` returns the snapshots it dropped, so that whoever
    keeps copies of them elsewhere (the run directory's ``snapshots/``) drops those too.
    """

    def __init__(self, every_s: float, every_epochs: float | None, max_count: int,
                 max_bytes: float, snapshot_bytes: int) -> None:
        self.every_s = every_s
        self.every_epochs = every_epochs if every_epochs is not None else math.inf
        self.capacity = max(4, min(max_count, int(max_bytes // max(snapshot_bytes, 1))))
        self.items: list[Snapshot] = []
        self.next_time = self.next_epoch = 0.0

    def due(self, time_s: float, epoch: float) -> bool:
        return time_s >= self.next_time or epoch >= self.next_epoch

    def add(self, snapshot: Snapshot, epoch: float) -> list[Snapshot]:
        self.items.append(snapshot)
        dropped = self._thinned() if len(self.items) > self.capacity else []
        self._next_after(snapshot, epoch)
        return dropped

    def restore(self, items: list[Snapshot], spacing: tuple[float, float],
                epoch: float) -> list[Snapshot]:
        """A checkpoint's snapshots (the last at ``epoch``) at the ``spacing`` they had reached,
        thinned as a whole, once per halving, where this run keeps fewer (a lower
        ``eval.max_snapshots``: re-added one by one, they were thinned at every other add, and
        the spacing doubled as often); returns those dropped."""
        self.items, (self.every_s, self.every_epochs) = list(items), spacing
        dropped = []
        while len(self.items) > self.capacity:
            dropped += self._thinned()
        if self.items:
            self._next_after(self.items[-1], epoch)
        return dropped

    def _thinned(self) -> list[Snapshot]:
        """Every other snapshot dropped (the first and the newest kept), the spacings doubled."""
        dropped = self.items[1:-1:2]
        self.items = self.items[:-1:2] + [self.items[-1]]
        self.every_s *= 2
        self.every_epochs *= 2
        return dropped

    def _next_after(self, snapshot: Snapshot, epoch: float) -> None:
        self.next_time = snapshot.time_s + self.every_s
        self.next_epoch = (math.floor(epoch / self.every_epochs) + 1) * self.every_epochs
