"""Per-worker counters in one shared table: each worker writes its own row, the coordinator
reads them all (epochs, progress, update shares, the Adaptive controller)."""

from __future__ import annotations

import torch

# Per-worker counters: one row per worker, columns below (float64, written by the worker only).
# `loss` is a running average of recent mini-batch losses, for the progress display only;
# LOSS_SMOOTHING is the weight of the newest loss in it.
LOSS_SMOOTHING = 0.1
COUNTERS = ("updates", "examples", "busy_s", "wait_s", "comm_s", "batch_size", "first_batch",
            "loss")


class CounterRow:
    """One worker's counters (a row of ``COUNTERS``): the row of the shared table that a worker
    owns, or a rank's private row that rank 0 later copies into the table."""

    COLUMN = {name: i for i, name in enumerate(COUNTERS)}

    def __init__(self, row: torch.Tensor, batch_size: int) -> None:
        self.row = row
        self.row[self.COLUMN["batch_size"]] = self.row[self.COLUMN["first_batch"]] = batch_size

    def __getitem__(self, column: str) -> float:
        return float(self.row[self.COLUMN[column]])

    def add(self, column: str, amount: float) -> None:
        self.row[self.COLUMN[column]] += amount

    def step(self, examples: int, busy_s: float, loss: float | None) -> None:
        """One update; `loss` feeds the running average the progress display shows."""
        self.add("updates", 1)
        self.add("examples", examples)
        self.add("busy_s", busy_s)
        if loss is not None:
            column = self.COLUMN["loss"]
            first = self["updates"] == 1
            self.row[column] = loss if first else (
                (1 - LOSS_SMOOTHING) * float(self.row[column]) + LOSS_SMOOTHING * loss)


class WorkerCounters:
    def __init__(self, num_workers: int) -> None:
        self.table = torch.zeros(num_workers, len(COUNTERS), dtype=torch.float64).share_memory_()

    def column(self, name: str) -> torch.Tensor:
        return self.table[:, COUNTERS.index(name)]

    def row(self, worker: int) -> dict[str, float]:
        return dict(zip(COUNTERS, self.table[worker].tolist()))
