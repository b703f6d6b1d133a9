"""The training data and the master model in shared memory: one copy whatever the worker count.

Everything here is a torch tensor in shared memory, so that it can be handed to spawned workers
without copying.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from hetsgd.config import ModelConfig
from hetsgd.engines import device_ops
from hetsgd.model.flat import FlatModel
from hetsgd.model.problem import Problem

# Sparse sets stay sparse through CSR tensors, whose support torch still labels beta.
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


class SharedArena:
    """Hands out numpy arrays whose memory is a tensor in shared memory (``empty``), so that data
    prepared into them is handed to the workers as it is: ``share`` returns that very tensor, and
    copies into shared memory only an array the arena did not hand out."""

    def __init__(self) -> None:
        self._tensors: dict[int, torch.Tensor] = {}

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        # allocated shared, not shared after (``share_memory_`` would copy, touching every page):
        # the pages are untouched until written, so nothing is resident for an array not yet filled
        storage = torch.UntypedStorage._new_shared(math.prod(shape) * np.dtype(dtype).itemsize)
        torch_dtype = torch.from_numpy(np.empty(0, dtype)).dtype
        # torch's stubs require the stride, which the op defaults to contiguous
        tensor = torch.empty(0, dtype=torch_dtype).set_(storage, 0, shape)  # type: ignore[call-overload]
        array = tensor.numpy()
        self._tensors[array.__array_interface__["data"][0]] = tensor
        return array

    def share(self, array: np.ndarray) -> torch.Tensor:
        tensor = self._tensors.get(array.__array_interface__["data"][0])
        if tensor is not None and tensor.shape == array.shape and tensor.numpy().dtype == array.dtype:
            return tensor
        return torch.from_numpy(np.ascontiguousarray(array)).share_memory_()

    def data(self, x: np.ndarray | sp.csr_matrix, y: np.ndarray) -> SharedData:
        return SharedData(SharedRows.from_array(x, self), self.share(y))


@dataclass
class SharedRows:
    """Training features, dense [N, D] or CSR parts, in shared memory."""

    dense: torch.Tensor | None
    indptr: torch.Tensor | None
    indices: torch.Tensor | None
    values: torch.Tensor | None
    num_features: int

    @classmethod
    def from_array(cls, x: np.ndarray | sp.csr_matrix,
                   arena: SharedArena | None = None) -> SharedRows:
        """Dense features from ``arena`` are taken as they are; others are copied once. Dense
        features are float32, or int64 as a ``Dataset`` keeps integers for the model (token
        ids)."""
        share = (arena or SharedArena()).share
        if sp.issparse(x):
            x = sp.csr_matrix(x, dtype=np.float32)
            return cls(None, share(np.asarray(x.indptr, dtype=np.int64)),
                       share(np.asarray(x.indices, dtype=np.int64)), share(x.data), x.shape[1])
        dtype = np.int64 if x.dtype == np.int64 else np.float32
        return cls(share(np.asarray(x, dtype=dtype)), None, None, None, x.shape[1])

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

    def staged(self, idx: torch.Tensor, device: torch.device) -> torch.Tensor:
        """The rows ``idx`` of host features, on ``device`` (:meth:`rows`, then copied there):
        dense rows are gathered straight into the copy's buffer, sparse ones staged whole."""
        if self.dense is not None:
            return device_ops.gather(self.dense, idx, device)
        return device_ops.stage(self.rows(idx), device)

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
        """A shared copy of ``x`` and ``y``."""
        return SharedArena().data(x, y)

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
