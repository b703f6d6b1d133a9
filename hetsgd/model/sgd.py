"""Plain SGD on a flat parameter vector, with the run's learning-rate schedule."""

from __future__ import annotations

import math

import torch

from hetsgd.config import OptimConfig
from hetsgd.model.flat import FlatModel


class SGD:
    """Plain SGD on flat vectors, the same arithmetic as ``torch.optim.SGD`` (no dampening,
    no Nesterov), with the learning-rate schedule and batch-size scaling of the config."""

    def __init__(self, optim: OptimConfig, flat: FlatModel) -> None:
        self.cfg = optim
        self.flat = flat
        self.momentum_buffer = torch.zeros_like(flat.params) if optim.momentum > 0 else None

    def lr(self, epoch: float, batch_size: int) -> float:
        lr = self.cfg.lr * self.cfg.lr_decay ** sum(epoch >= m for m in self.cfg.milestones)
        ratio = batch_size / self.cfg.base_batch
        if self.cfg.lr_scaling == "linear":
            lr *= ratio
        elif self.cfg.lr_scaling == "sqrt":
            lr *= math.sqrt(ratio)
        return lr

    def step(self, epoch: float, batch_size: int) -> None:
        grads = self.flat.grads
        if self.cfg.weight_decay:
            grads.add_(self.flat.params, alpha=self.cfg.weight_decay)
        if self.momentum_buffer is not None:
            grads = self.momentum_buffer.mul_(self.cfg.momentum).add_(grads)
        self.flat.params.add_(grads, alpha=-self.lr(epoch, batch_size))
