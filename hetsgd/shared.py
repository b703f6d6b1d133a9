"""State shared by the coordinator and its worker processes, one copy whatever the worker count.

Everything here is a torch tensor in shared memory (or a multiprocessing primitive), so that it
can be handed to spawned workers without copying: the training data, the master model, the
epoch cursor from which free workers claim chunks, and per-worker counters.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from multiprocessing.synchronize import Event, Lock
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
import torch

from hetsgd.config import ModelConfig
from hetsgd.flat import FlatModel
from hetsgd.models import build_model

if TYPE_CHECKING:  # workers import this module: keep the data stack (sklearn, pandas) out
    from hetsgd.data import Dataset

# Sparse sets stay sparse through CSR tensors, whose support torch still labels beta.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


def _shared(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).share_memory_()


@dataclass
class SharedRows:
    """Training features, dense [N, D] or CSR parts, in shared memory."""

    dense: torch.Tensor | None
    indptr: torch.Tensor | None
    indices: torch.Tensor | None
    values: torch.Tensor | None
    num_features: int

    @classmethod
    def from_array(cls, x: np.ndarray | sp.csr_matrix) -> SharedRows:
        if sp.issparse(x):
            x = sp.csr_matrix(x, dtype=np.float32)
            return cls(None, _shared(x.indptr.astype(np.int64)), _shared(x.indices.astype(np.int64)),
                       _shared(x.data.astype(np.float32)), x.shape[1])
        return cls(_shared(np.asarray(x, dtype=np.float32)), None, None, None, x.shape[1])

    @property
    def sparse(self) -> bool:
        return self.dense is None

    @property
    def nbytes(self) -> int:
        parts = (self.dense, self.indptr, self.indices, self.values)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    def to(self, device: torch.device) -> SharedRows:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        return SharedRows(move(self.dense), move(self.indptr), move(self.indices),
                          move(self.values), self.num_features)

    def rows(self, idx: torch.Tensor) -> torch.Tensor:
        """The rows `idx` as a dense tensor or a sparse CSR tensor (sparse sets stay sparse)."""
        if self.dense is not None:
            return self.dense.index_select(0, idx)
        assert self.indptr is not None and self.indices is not None and self.values is not None
        starts, ends = self.indptr[idx], self.indptr[idx + 1]
        lengths = ends - starts
        crow = torch.zeros(len(idx) + 1, dtype=torch.int64, device=idx.device)
        torch.cumsum(lengths, 0, out=crow[1:])
        # position of every selected nonzero in the full arrays: its row start plus its rank
        offsets = (torch.arange(int(crow[-1]), device=idx.device)
                   - torch.repeat_interleave(crow[:-1], lengths))
        take = torch.repeat_interleave(starts, lengths) + offsets
        return torch.sparse_csr_tensor(crow, self.indices[take], self.values[take],
                                       size=(len(idx), self.num_features),
                                       check_invariants=False)


@dataclass(frozen=True)
class Problem:
    """What a worker needs to know about the data to build the model and its loss."""

    task: str
    num_features: int
    num_outputs: int
    image_shape: tuple[int, int, int] | None

    @classmethod
    def of(cls, dataset: Dataset) -> Problem:
        return cls(dataset.task, dataset.num_features, dataset.num_outputs, dataset.image_shape)

    def build_model(self, model: ModelConfig, seed: int) -> torch.nn.Module:
        """The run's seeded initial model for this data: the same in every process."""
        return build_model(model, self.num_features, self.num_outputs, self.image_shape, seed)


@dataclass
class SharedData:
    x: SharedRows
    y: torch.Tensor

    @classmethod
    def from_arrays(cls, x: np.ndarray | sp.csr_matrix, y: np.ndarray) -> SharedData:
        return cls(SharedRows.from_array(x), _shared(y))

    @property
    def num_examples(self) -> int:
        return int(self.y.shape[0])

    @property
    def nbytes(self) -> int:
        return self.x.nbytes + self.y.numel() * self.y.element_size()


class EpochCursor:
    """Hands out the next chunk of the current epoch to whichever worker asks first.

    One epoch is N examples consumed by all workers together; a chunk never crosses an epoch
    boundary, so the last chunk of an epoch may be shorter than the asking worker's batch. The
    budget in examples (``epochs * N``) ends the hand-out.
    """

    def __init__(self, num_examples: int, epochs: float | None, lock: Lock) -> None:
        self.num_examples = num_examples
        self.total = math.inf if epochs is None else round(epochs * num_examples)
        self._state = torch.zeros(1, dtype=torch.int64).share_memory_()  # examples handed out
        self._lock = lock

    def claim(self, batch_size: int) -> tuple[int, int, int] | None:
        """Returns (epoch, start within the epoch's order, size), or None when the budget is spent."""
        with self._lock:
            handed = int(self._state[0])
            if handed >= self.total:
                return None
            epoch, start = divmod(handed, self.num_examples)
            size = int(min(batch_size, self.num_examples - start, self.total - handed))
            self._state[0] = handed + size
        return epoch, start, size


# Per-worker counters: one row per worker, columns below (float64, written by the worker only).
# `loss` is a running average of recent mini-batch losses, for the progress display only.
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
            self.row[column] = loss if first else 0.9 * float(self.row[column]) + 0.1 * loss


class WorkerCounters:
    def __init__(self, num_workers: int) -> None:
        self.table = torch.zeros(num_workers, len(COUNTERS), dtype=torch.float64).share_memory_()

    def column(self, name: str) -> torch.Tensor:
        return self.table[:, COUNTERS.index(name)]

    def row(self, worker: int) -> dict[str, float]:
        return dict(zip(COUNTERS, self.table[worker].tolist()))


@dataclass
class SharedMaster:
    """The master model as two flat float32 vectors (parameters, floating buffers)."""

    params: torch.Tensor
    buffers: torch.Tensor

    @classmethod
    def initial(cls, model: ModelConfig, problem: Problem, seed: int) -> SharedMaster:
        """A run's seeded initial model, flattened into shared memory."""
        flat = FlatModel(problem.build_model(model, seed))
        return cls.from_flat(flat.params, flat.buffers)

    @classmethod
    def from_flat(cls, params: torch.Tensor, buffers: torch.Tensor) -> SharedMaster:
        return cls(params.detach().clone().share_memory_(), buffers.detach().clone().share_memory_())

    def snapshot(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.params.clone(), self.buffers.clone()

    @property
    def nbytes(self) -> int:
        return (self.params.numel() + self.buffers.numel()) * 4


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
