"""Per-worker counters in one shared table: each worker writes its own row, the coordinator
reads them all (epochs, progress, update shares, the Adaptive controller)."""

from __future__ import annotations

import math
import time

import torch

from hetsgd.engines.common.run_queue import waited_s, waits

# Per-worker counters: one row per worker, columns below (float64, written by the worker only).
# `loss` is a running average of the mini-batch losses the worker read (a few per second), for
# the progress display only; LOSS_SMOOTHING is the weight of the newest one in it. `stale_sum`
# and `stale_max` add up and bound the staleness of the worker's updates: how many other
# workers' updates reached the master while each was computed (asynchronous engines only; 0 for
# ranks, which step together). See :mod:`hetsgd.outputs.summary`'s ``Staleness``. `cpu_s` is the
# CPU time the worker's process used while it trained (:meth:`CounterRow.count_cpu`). `comm_s` is
# all the time a worker spent moving the model to or from the master; `copy_s` the part of it
# that copied the master in before a step (a replica's), so the rest (comm_s - copy_s) merged a
# step's result back, published it or, for a rank, exchanged it (workers.csv's `merge_s`).
# `cpu_wait_s` is the time the process's threads were ready to run but waited for a CPU (NaN
# where the OS does not say; :mod:`~hetsgd.engines.common.run_queue`), appended last.
LOSS_SMOOTHING = 0.1
COUNTERS = ("updates", "examples", "busy_s", "wait_s", "comm_s", "batch_size", "first_batch",
            "loss", "stale_sum", "stale_max", "cpu_s", "copy_s", "cpu_wait_s")
# The counters a rank's every exchange carries (the leading ones), so that its modelled size on
# the virtual clock stays that of the model and these: a rank copies no replica in (copy_s stays
# 0) and counts its cpu_s and cpu_wait_s at checkpoints and at the end only, which its last
# exchange (every counter, :meth:`~hetsgd.engines.ranks.rank.Rank.finish`) carries exactly.
RANK_COUNTERS = COUNTERS[:COUNTERS.index("cpu_s")]


class CounterRow:
    """One worker's counters (a row of ``COUNTERS``): the row of the shared table that a worker
    owns, or a rank's private row that rank 0 later copies into the table. Written every step,
    through a numpy view of the row (see :mod:`~hetsgd.engines.common.numpy_views`)."""

    COLUMN = {name: i for i, name in enumerate(COUNTERS)}

    def __init__(self, row: torch.Tensor, batch_size: int) -> None:
        self.row = row
        self.values = row.numpy()
        self.starts_at(batch_size)
        self._cpu_mark: float | None = None
        self._waits: dict[str, int] | None = None

    def __getitem__(self, column: str) -> float:
        return float(self.values[self.COLUMN[column]])

    def starts_at(self, batch_size: int) -> None:
        """The batch size the worker's steps take from the first on (``first_batch``): its
        spec's, or a sync rank's shard of the global batch."""
        self.values[self.COLUMN["batch_size"]] = self.values[self.COLUMN["first_batch"]] = batch_size

    @property
    def batch_size(self) -> int:
        """The batch size to claim next: a controller (Adaptive Hogbatch) may change it."""
        return int(self.values[self.COLUMN["batch_size"]])

    def add(self, column: str, amount: float) -> None:
        self.values[self.COLUMN[column]] += amount

    def step(self, examples: int, busy_s: float, wait_s: float = 0.0, comm_s: float = 0.0,
             copy_s: float = 0.0) -> None:
        """One update: its examples, and the seconds spent computing, waiting for the cursor
        and copying to or from the master (``comm_s``, of which ``copy_s`` copying in)."""
        values, column = self.values, self.COLUMN
        values[column["updates"]] += 1
        values[column["examples"]] += examples
        values[column["busy_s"]] += busy_s
        values[column["wait_s"]] += wait_s
        values[column["comm_s"]] += comm_s
        values[column["copy_s"]] += copy_s

    def staleness(self, total: int, largest: int) -> None:
        """The staleness of the worker's updates so far: their sum and their maximum."""
        values, column = self.values, self.COLUMN
        values[column["stale_sum"]], values[column["stale_max"]] = total, largest

    def start_cpu(self) -> None:
        """Training starts in this worker's process: :meth:`count_cpu` counts from here."""
        self._cpu_mark = time.process_time()
        self._waits = waits()

    def count_cpu(self) -> None:
        """Add the CPU time this process used since the last count (or :meth:`start_cpu`) to
        ``cpu_s``: every thread's (torch's intra-op threads, a collective's), which is what
        a worker with several threads gets; one worker a process, so the process is the
        worker. Beside it, ``cpu_wait_s``: how long its threads waited for a CPU, which makes
        the CPU it wanted (NaN where the OS does not count it). A few times a second and at
        the end: each read is a system call or a few."""
        if self._cpu_mark is None:
            return
        now = time.process_time()
        self.values[self.COLUMN["cpu_s"]] += now - self._cpu_mark
        self._cpu_mark = now
        before, self._waits = self._waits, waits()
        added = math.nan if before is None or self._waits is None else waited_s(before, self._waits)
        self.values[self.COLUMN["cpu_wait_s"]] += added

    def record_loss(self, loss: float) -> None:
        """A mini-batch loss read after a step, into the running average the progress shows."""
        values, column = self.values, self.COLUMN["loss"]
        first = values[self.COLUMN["updates"]] <= 1
        values[column] = loss if first else (1 - LOSS_SMOOTHING) * values[column] + LOSS_SMOOTHING * loss


# Each worker's row gets 128 bytes of its own: workers write their rows every step, and two rows
# in one cache line (or in the pair the adjacent-line prefetcher fetches together) would make the
# workers' cores take the line from each other on every write (false sharing).
ROW_BYTES = 128


class WorkerCounters:
    def __init__(self, num_workers: int) -> None:
        stride = max(len(COUNTERS), ROW_BYTES // 8)
        padded = torch.zeros(num_workers, stride, dtype=torch.float64).share_memory_()
        self.table = padded[:, :len(COUNTERS)]  # [workers, COUNTERS], rows ROW_BYTES apart

    def column(self, name: str) -> torch.Tensor:
        return self.table[:, COUNTERS.index(name)]

    def row(self, worker: int) -> dict[str, float]:
        return dict(zip(COUNTERS, self.table[worker].tolist()))
