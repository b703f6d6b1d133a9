"""A worker's batches: rows of the current epoch's seeded order, on the worker's device."""

from __future__ import annotations

import torch

from hetsgd.engines.shared_memory.memory import SharedData

# data.on_device=auto: the training set moves to a GPU when it takes under this share of the
# device's free memory.
RESIDENT_SHARE_OF_FREE_MEMORY = 0.5
# Epoch e of seed s shuffles with generator seed s * EPOCH_SEED_STRIDE + e: a prime stride keeps
# the streams of different seeds apart for any realistic epoch count.
EPOCH_SEED_STRIDE = 1_000_003


class Batches:
    """Rows of the current epoch's order, on the worker's device.

    A GPU worker copies the whole training set to its device once when ``data.on_device`` allows
    (``auto``: when it takes under half the free device memory); otherwise each batch is gathered
    on the host and sent through pinned memory.
    """

    def __init__(self, data: SharedData, device: torch.device, shuffle: bool, seed: int,
                 on_device: str) -> None:
        self.device = device
        self.shuffle = shuffle
        self.seed = seed
        self.n = data.num_examples
        resident = device.type == "cpu" or on_device == "always" or (
            on_device == "auto"
            and data.nbytes < RESIDENT_SHARE_OF_FREE_MEMORY * torch.cuda.mem_get_info(device)[0])
        self.x = data.x.to(device) if resident else data.x
        self.y = data.y.to(device) if resident else data.y
        self.stream = not resident
        self._order_epoch = -1
        self._order = torch.arange(self.n)

    def order(self, epoch: int) -> torch.Tensor:
        """The seeded permutation of an epoch; the same in every worker, file order if unshuffled."""
        if self.shuffle and epoch != self._order_epoch:
            generator = torch.Generator().manual_seed(self.seed * EPOCH_SEED_STRIDE + epoch)
            self._order = torch.randperm(self.n, generator=generator)
            self._order_epoch = epoch
        return self._order

    def get(self, epoch: int, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.order(epoch)[start:start + size]
        if not self.stream:
            idx = idx.to(self.device, non_blocking=True)
        x, y = self.x.rows(idx), self.y.index_select(0, idx)
        if self.stream:
            x = x.pin_memory().to(self.device, non_blocking=True)
            y = y.pin_memory().to(self.device, non_blocking=True)
        return x, y
