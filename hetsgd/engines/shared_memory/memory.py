"""The training data and the master model in shared memory: one copy whatever the worker count.

Everything here is a torch tensor in shared memory, so that it can be handed to spawned workers
without copying.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from hetsgd.config import ModelConfig
from hetsgd.model.flat import FlatModel
from hetsgd.model.problem import Problem

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
