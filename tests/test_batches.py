"""Streamed batches (data gathered on the host and copied to the worker's device each step) are
the rows of the epoch's order, the same as batches indexed from data resident on the device:
dense features, integer features (token ids) and sparse ones, with their labels beside them. On
a GPU every streamed batch is queued behind a busy device before any is read, so a pinned
block reused before its copy is done would show as wrong rows."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from hetsgd.engines.batches import Batches
from hetsgd.engines.common.memory import SharedData

ROWS, FEATURES, BATCH = 23, 5, 4
CPU = torch.device("cpu")


def _features(kind: str) -> np.ndarray | sp.csr_matrix:
    rng = np.random.default_rng(0)
    dense = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    if kind == "tokens":
        return rng.integers(0, 1000, size=(ROWS, FEATURES), dtype=np.int64)
    if kind == "sparse":
        dense[rng.random(dense.shape) < 0.6] = 0.0
        return sp.csr_matrix(dense)
    return dense


def _dense(x: torch.Tensor) -> torch.Tensor:
    return (x.to_dense() if x.layout == torch.sparse_csr else x).cpu()


def _queue(batches: Batches) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every batch of two epochs, requested one after the other."""
    return [batches.get(epoch, start, BATCH) for epoch in range(2)
            for start in range(0, ROWS, BATCH)]


def _read(queued: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, ...]]:
    return [(_dense(x), y.cpu()) for x, y in queued]


@pytest.mark.parametrize("kind", ["dense", "tokens", "sparse"])
def test_streamed_batches_are_the_rows_of_the_order(kind: str) -> None:
    features = _features(kind)
    labels = np.arange(ROWS) * 7 % 3
    data = SharedData.from_arrays(features, labels)
    streamed = Batches(data, CPU, shuffle=True, seed=3, on_device="never")
    resident = Batches(data, CPU, shuffle=True, seed=3, on_device="always")
    assert streamed.stream and not resident.stream
    table = torch.as_tensor(features.toarray() if sp.issparse(features) else features)
    expected = [(table[order[start:start + BATCH]], torch.as_tensor(labels)[order[start:start + BATCH]])
                for order in map(streamed.order, range(2)) for start in range(0, ROWS, BATCH)]
    assert not torch.equal(expected[0][0], table[:BATCH])  # shuffled: a wrong order would show
    for batches in (streamed, resident):
        for (x, y), (want_x, want_y) in zip(_read(_queue(batches)), expected, strict=True):
            assert torch.equal(x, want_x.to(x.dtype)) and torch.equal(y, want_y)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_batches_streamed_to_a_gpu_are_the_ones_indexed_on_the_host(kind: str) -> None:
    data = SharedData.from_arrays(_features(kind), np.arange(ROWS) % 3)
    on_gpu = Batches(data, torch.device("cuda:0"), shuffle=True, seed=1, on_device="never")
    on_host = Batches(data, CPU, shuffle=True, seed=1, on_device="never")
    torch.cuda._sleep(200_000_000)  # the device busy a while: every copy below waits its turn
    queued = _queue(on_gpu)
    assert all(x.is_cuda and y.is_cuda for x, y in queued)
    for (x, y), (want_x, want_y) in zip(_read(queued), _read(_queue(on_host)), strict=True):
        assert torch.equal(x, want_x) and torch.equal(y, want_y)
