"""Plain SGD (``optim=sgd``) and the run's learning-rate schedule: the update arithmetic, in one
place.

Two kinds of step use it: the autograd step updates the whole flat parameter vector from the flat
gradient in one vector operation (:meth:`SGD.step`), and the fused MLP step updates each layer as
soon as backward reaches it, from the layer's input and output gradient, so the weight gradient
of a linear layer is never materialised (:meth:`SGD.apply_product`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from hetsgd.config import OptimConfig, SGDConfig
from hetsgd.model.flat import FlatModel


def scheduled_lr(optim: OptimConfig, epoch: float, batch_size: int) -> float:
    """The learning rate at ``epoch`` for a step of ``batch_size``: decayed at each milestone,
    scaled by batch size (any optimizer without a scheduler of its own)."""
    lr = optim.lr * optim.lr_decay ** sum(epoch >= m for m in optim.milestones)
    ratio = batch_size / optim.base_batch
    if optim.lr_scaling == "linear":
        lr *= ratio
    elif optim.lr_scaling == "sqrt":
        lr *= math.sqrt(ratio)
    return lr


class SGD:
    """The arithmetic of ``torch.optim.SGD`` (no dampening, no Nesterov) with the learning-rate
    schedule and batch-size scaling of the config. The momentum buffer is one flat vector laid
    out like the parameters, so the fused step can update any parameter's slice of it; a
    checkpoint keeps it as such (``WorkerState.momentum``), so :meth:`state_dict` has nothing
    more."""

    def __init__(self, optim: SGDConfig, flat: FlatModel) -> None:
        self.cfg = optim
        self.flat = flat
        self.momentum_buffer = torch.zeros_like(flat.params) if optim.momentum > 0 else None
        # weight decay spares a frozen parameter (requires_grad=False), which torch.optim never
        # sees: 1 for each trained entry, 0 for each frozen one; None where all are trained
        params = list(flat.module.parameters())
        self.decayed = None if all(p.requires_grad for p in params) else torch.cat([
            torch.full((p.numel(),), float(p.requires_grad), device=flat.params.device)
            for p in params])

    def lr(self, epoch: float, batch_size: int) -> float:
        return scheduled_lr(self.cfg, epoch, batch_size)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing beyond the momentum buffer, which the checkpoint restores itself."""

    def momentum_views(self) -> Sequence[torch.Tensor | None]:
        """Each parameter's slice of the momentum buffer (None for every one without momentum)."""
        if self.momentum_buffer is None:
            return [None] * len(list(self.flat.module.parameters()))
        return self.flat.views(self.momentum_buffer)

    def apply(self, param: torch.Tensor, momentum: torch.Tensor | None, grad: torch.Tensor,
              lr: float, decayed: torch.Tensor | None = None) -> None:
        """One update of ``param`` from its gradient ``grad`` (which may be overwritten); weight
        decay on the entries ``decayed`` marks with 1, where given."""
        if self.cfg.weight_decay:
            grad = grad.add_(param if decayed is None else param * decayed,
                             alpha=self.cfg.weight_decay)
        if momentum is not None:
            grad = momentum.mul_(self.cfg.momentum).add_(grad)
        param.add_(grad, alpha=-lr)

    def apply_product(self, param: torch.Tensor, momentum: torch.Tensor | None,
                      left: torch.Tensor, right: torch.Tensor, lr: float) -> None:
        """One update of ``param`` from the gradient ``left @ right`` without forming it when
        there is no momentum: a linear layer's weight from its output gradient (transposed) and
        its input, one pass over the weight instead of three."""
        decay = self.cfg.weight_decay
        if momentum is None:
            param.addmm_(left, right, beta=1.0 - lr * decay, alpha=-lr)
            return
        momentum.addmm_(left, right, beta=self.cfg.momentum)
        if decay:
            momentum.add_(param, alpha=decay)
        param.add_(momentum, alpha=-lr)

    def step(self, lr: float) -> None:
        """Update every parameter from the flat gradient that backward filled."""
        self.apply(self.flat.params, self.momentum_buffer, self.flat.grads, lr, self.decayed)
