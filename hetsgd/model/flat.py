"""A model whose parameters, gradients and floating buffers live in flat vectors.

Binding every parameter to a slice of one vector turns an SGD update into a single in-place
vector operation, makes the shared master model one block of shared memory, and makes copying a
replica in or merging it back one ``copy_``/``add_`` instead of a loop over tensors. Autograd keeps
accumulating into ``p.grad`` in place when it is already defined, so gradients stay views too.
"""

from __future__ import annotations

import torch
from torch import nn


def _floating_buffers(module: nn.Module) -> list[torch.Tensor]:
    # Integer buffers (BatchNorm's num_batches_tracked) are counters, not state to share or average.
    return [b for b in module.buffers() if b.is_floating_point()]


def state_sizes(module: nn.Module) -> tuple[int, int]:
    """Number of parameter and floating-buffer elements of a module."""
    return (sum(p.numel() for p in module.parameters()),
            sum(b.numel() for b in _floating_buffers(module)))


class FlatModel:
    """Rebinds a module's parameters, gradients and floating buffers to flat vectors.

    ``params``/``buffers`` may be given (e.g. the shared master in shared memory, so that a Hogwild
    worker updates it in place); otherwise fresh vectors are allocated on the module's device and
    the module's current values are copied into them.
    """

    def __init__(self, module: nn.Module, params: torch.Tensor | None = None,
                 buffers: torch.Tensor | None = None) -> None:
        self.module = module
        n_params, n_buffers = state_sizes(module)
        device = next(module.parameters()).device
        self.params = self._bind(list(module.parameters()), params, n_params, device)
        self.buffers = self._bind(_floating_buffers(module), buffers, n_buffers, device)
        self.grads = torch.zeros_like(self.params)
        for p, grad in zip(module.parameters(), self.views(self.grads)):
            p.grad = grad

    @staticmethod
    def _bind(tensors: list[torch.Tensor], storage: torch.Tensor | None, size: int,
              device: torch.device) -> torch.Tensor:
        if storage is None:
            storage = torch.empty(size, dtype=torch.float32, device=device)
            fill = True
        else:
            if storage.numel() != size:
                raise ValueError(f"flat storage holds {storage.numel()} values, model needs {size}")
            fill = False
        offset = 0
        for t in tensors:
            view = storage[offset:offset + t.numel()].view_as(t)
            if fill:
                view.copy_(t.detach())
            t.data = view
            offset += t.numel()
        return storage

    def views(self, vector: torch.Tensor) -> list[torch.Tensor]:
        """A vector laid out like ``params`` (the gradient, a momentum buffer), cut into views
        shaped like each parameter, in registration order."""
        views, offset = [], 0
        for p in self.module.parameters():
            views.append(vector[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        return views

    def zero_grad(self) -> None:
        self.grads.zero_()

    def load_(self, params: torch.Tensor, buffers: torch.Tensor) -> None:
        """Copy another flat state (e.g. the master) into this one."""
        self.params.copy_(params, non_blocking=True)
        self.buffers.copy_(buffers, non_blocking=True)
