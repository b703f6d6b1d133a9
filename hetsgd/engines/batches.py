"""A worker's batches: rows of the current epoch's seeded order, on the worker's device."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from hetsgd.config.schema import DataConfig
from hetsgd.engines import device_ops
from hetsgd.engines.common.memory import SharedData
from hetsgd.model.problem import Problem

Augment = Callable[[torch.Tensor], torch.Tensor]

# data.on_device=auto: the training set moves to a GPU when it takes under this share of the
# device's free memory.
RESIDENT_SHARE_OF_FREE_MEMORY = 0.5
# Epoch e of seed s shuffles with generator seed s * EPOCH_SEED_STRIDE + e: a prime stride keeps
# the streams of different seeds apart for any realistic epoch count.
EPOCH_SEED_STRIDE = 1_000_003


def min_rows(module: nn.Module) -> int:
    """The fewest rows a training batch of ``module`` may have: 2 where it holds batch norm,
    which in training normalises each feature over the batch (one row has no variance, and
    torch refuses it), else 1."""
    return 2 if any(isinstance(m, _BatchNorm) for m in module.modules()) else 1


class Batches:
    """Rows of the current epoch's order, on the worker's device.

    The training set moves to the device once when ``data.on_device`` allows (``auto``: when it
    takes under half the device's free memory; on the CPU the "copy" is the shared tensors
    themselves); otherwise each batch is gathered on the host and staged to the device.
    ``augment`` (:func:`training_augment`) transforms every batch :meth:`get` returns, on the
    device; the stored rows are never changed.

    A chunk shorter than ``min_rows`` (under batch norm, :func:`min_rows`: the last of an epoch,
    or a sync rank's share of it) is merged with its neighbours in the order (the rows after it,
    or before it at the order's end) into ``min_rows`` rows; the examples counted stay the
    chunk's.
    """

    def __init__(self, data: SharedData, device: torch.device, shuffle: bool, seed: int,
                 on_device: str, augment: Augment | None = None, min_rows: int = 1) -> None:
        self.device = device
        self.augment = augment
        self.min_rows = min_rows
        self.shuffle = shuffle
        self.seed = seed
        self.n = data.num_examples
        resident = on_device == "always" or (
            on_device == "auto"
            and data.nbytes < RESIDENT_SHARE_OF_FREE_MEMORY * device_ops.free_bytes(device))
        self.x = data.x.to(device) if resident else data.x
        self.y = data.y.to(device) if resident else data.y
        self.stream = not resident
        self._order_epoch = -1
        self._order = torch.arange(self.n)
        # resident data is indexed on the device: an order (what `order` returns) moves there
        # once, not a batch's indices every step (a copy from pageable memory, on a GPU)
        self._placed: tuple[torch.Tensor, torch.Tensor] | None = None  # (order, on the device)

    def order(self, epoch: int) -> torch.Tensor:
        """The seeded permutation of an epoch; the same in every worker, file order if unshuffled."""
        if self.shuffle and epoch != self._order_epoch:
            generator = torch.Generator().manual_seed(self.seed * EPOCH_SEED_STRIDE + epoch)
            self._order = torch.randperm(self.n, generator=generator)
            self._order_epoch = epoch
        return self._order

    def _on_device(self, order: torch.Tensor) -> torch.Tensor:
        """``order`` where the resident data is, copied once per order."""
        if self._placed is None or self._placed[0] is not order:
            self._placed = order, order.to(self.device)
        return self._placed[1]

    def span(self, length: int, start: int, size: int) -> tuple[int, int]:
        """The (start, size) of the rows :meth:`get` reads for a chunk of an order of ``length``:
        the chunk's, or its merge with its neighbours; a caller that records something per row
        (biased sampling's losses) needs the rows the step trained on."""
        if size < self.min_rows <= length:  # merged with its neighbours
            return min(start, length - self.min_rows), self.min_rows
        return start, size

    def get(self, epoch: int, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        order = self.order(epoch)
        start, size = self.span(len(order), start, size)
        if self.stream:
            idx = order[start:start + size]
            x, y = self.x.staged(idx, self.device), device_ops.gather(self.y, idx, self.device)
        else:
            idx = self._on_device(order)[start:start + size]
            x, y = self.x.rows(idx), self.y.index_select(0, idx)
        if self.augment is not None:
            x = self.augment(x)
        return x, y


def training_augment(data: DataConfig, problem: Problem, seed: int, rank: int) -> Augment | None:
    """Worker ``rank``'s ``data.augment`` of its training batches, seeded from the run's seed and
    the rank; None for ``none``. A one-line UserError where it cannot apply (flat features)."""
    if data.augment == "none":
        return None
    # imported only when asked for: hetsgd.data's __init__ loads the data stack (sklearn, pandas),
    # which workers otherwise never import
    from hetsgd.data.augment import training_augment as build

    return build(data.augment, problem.image_shape, problem.channel_fill, seed, rank)
