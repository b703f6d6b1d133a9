"""One training step on a batch: the loss, and the update applied to the model's parameters
(plain SGD's, or a ``torch.optim`` optimizer's under ``optim=torch``: :mod:`.optimizer`).

Two implementations, with the same result under plain SGD (``optim.step``):

- :class:`AutogradStep`, any model: autograd accumulates into the flat gradient, then one vector
  update. Per step it writes the gradient three times over (zeroing, accumulating, reading it back
  for the update), which dominates a small batch on a wide network, where a step is memory-bound.
- :class:`FusedMlpStep`, the MLP family (linear layers with sigmoid, ReLU or tanh between them):
  the forward pass without autograd, keeping each layer's input; then backward by hand, layer by
  layer from the top, updating each weight in place right after its input gradient is computed
  (``W -= lr * g^T a`` as one ``addmm_``, and a bias as ``ones @ g``), so no gradient of a
  parameter is ever materialised. Backward starts from the loss's gradient w.r.t. the logits in
  closed form (:func:`hetsgd.model.losses.logits_gradient`). Every weight is still updated from
  the parameters as they were when the step began, as ``torch.optim.SGD`` does.

Both update in place whatever the parameters are bound to: the shared master (Hogwild) or a
replica (Hogbatch's accelerator). A step returns the loss as a tensor, without reading it, so a
GPU worker does not wait for its device on every step.

A step is two halves: :meth:`compute` reads the parameters and leaves a :class:`Pending` update
(the fused step's per-layer gradient factors, or the autograd step's flat gradient), and
:meth:`land` applies it. The real engines run them back to back; the virtual-clock engine
computes at a step's virtual start and lands at its virtual end, so another worker's update can
land in between, as it would on real hardware.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import cast

import torch
from torch import nn
from torch.nn.modules import module as module_hooks
from torch.nn.utils import parametrize

from hetsgd.config import OptimConfig, SGDConfig
from hetsgd.errors import UserError, out_of_memory
from hetsgd.model.flat import FlatModel
from hetsgd.model.losses import logits_gradient, loss_fn, per_sample_loss
from hetsgd.model.optimizer import Optimizer, build_optimizer
from hetsgd.model.sgd import SGD

Forward = Callable[[torch.Tensor], torch.Tensor]
# Backward of an activation from its output `a`: the gradient `g` arriving at that output becomes,
# in place, the gradient at its input. These are the kernels autograd itself runs for these
# activations (one pass each; composing them from mul and sub takes three, and a masked fill is
# several times slower still), writing into `g` instead of a new tensor.
Backward = Callable[[torch.Tensor, torch.Tensor], object]
_ACTIVATIONS: dict[type[nn.Module], tuple[Forward, Backward]] = {
    nn.Sigmoid: (torch.sigmoid_, lambda g, a: torch.ops.aten.sigmoid_backward.grad_input(
        g, a, grad_input=g)),
    nn.ReLU: (torch.relu_, lambda g, a: torch.ops.aten.threshold_backward.grad_input(
        g, a, 0.0, grad_input=g)),  # the output is > 0 exactly where the input was
    nn.Tanh: (torch.tanh_, lambda g, a: torch.ops.aten.tanh_backward.grad_input(
        g, a, grad_input=g)),
}


# One deferred product update: (parameter, its momentum slice or None, left, right), the gradient
# being left @ right (see SGD.apply_product).
Product = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]


@dataclass
class Pending:
    """A computed step not yet applied: its losses, its learning rate and, for the fused step,
    the gradient factors of every layer (the autograd step keeps its gradient in the flat
    gradient vector, which nothing else writes before the step lands).

    The mean loss is computed when :attr:`loss` is first read (``loss_of``): the fused step's
    backward starts from the logits' gradient in closed form and never needs it, and a worker
    reads it a few times a second, so most steps skip its kernels (and, on a GPU, its launches).
    """

    loss_of: Callable[[], torch.Tensor]
    losses: torch.Tensor | None
    lr: float
    products: list[Product] = field(default_factory=list)
    _loss: torch.Tensor | None = field(default=None, init=False, repr=False)

    @property
    def loss(self) -> torch.Tensor:
        """The batch's mean loss (a 0-dim tensor, not read), computed on first use."""
        if self._loss is None:
            self._loss = self.loss_of()
        return self._loss


class Step:
    """A training step: ``compute`` then ``land``; calling it does both."""

    optimizer: Optimizer

    def compute(self, x: torch.Tensor, y: torch.Tensor, epoch: float, batch_size: int,
                per_sample: bool = False) -> Pending:
        """Read the parameters, and leave the update for :meth:`land`."""
        raise NotImplementedError

    def land(self, pending: Pending) -> None:
        """Apply a computed update to the parameters as they are now."""
        raise NotImplementedError

    def __call__(self, x: torch.Tensor, y: torch.Tensor, epoch: float, batch_size: int,
                 per_sample: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Train on one batch; the mean loss (a 0-dim tensor, not read) and, if asked, the
        per-example losses (biased sampling ranks examples by them)."""
        pending = self.compute(x, y, epoch, batch_size, per_sample)
        self.land(pending)
        return pending.loss, pending.losses


def forward(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``module``'s logits on a training batch. What its forward raises (torch's checks of the
    batch's shape, say) is one line naming the batch, as the probe's is (model/custom.py), not
    a traceback from every worker; running out of memory stays itself, named as such."""
    try:
        return module(x)
    except Exception as exc:
        if out_of_memory(exc) is not None:
            raise
        raise UserError(f"the model's forward on a training batch [{', '.join(map(str, x.shape))}]"
                        f" raised {type(exc).__name__}: {' '.join(str(exc).split())}") from None


class AutogradStep(Step):
    def __init__(self, flat: FlatModel, optimizer: Optimizer, task: str) -> None:
        self.flat, self.optimizer, self.task = flat, optimizer, task
        self.loss = loss_fn(task)

    def compute(self, x: torch.Tensor, y: torch.Tensor, epoch: float, batch_size: int,
                per_sample: bool = False) -> Pending:
        self.flat.zero_grad()
        out = forward(self.flat.module, x)
        losses = per_sample_loss(self.task, out, y) if per_sample else None
        loss = losses.mean() if losses is not None else self.loss(out, y)
        loss.backward()
        return Pending(partial(loss.detach), losses.detach() if losses is not None else None,
                       self.optimizer.lr(epoch, batch_size))

    def on_no_examples(self, epoch: float, batch_size: int) -> Pending:
        """The first half of a step on no examples (a sync rank whose shard of the global batch
        is empty): a zero gradient, so the all-reduced one lands as on every other rank."""
        self.flat.zero_grad()
        return Pending(partial(torch.zeros, ()), None, self.optimizer.lr(epoch, batch_size))

    @torch.no_grad()
    def land(self, pending: Pending) -> None:
        self.optimizer.step(pending.lr)


Activation = tuple[Forward, Backward]


def _plain(module: nn.Module) -> bool:
    """Whether calling ``module`` runs exactly its class's forward and autograd's backward:
    no instance-level ``forward``, no module hooks (its own or global), no parametrization, and
    no hook on a parameter's gradient."""
    hooks = (module._forward_hooks, module._forward_pre_hooks, module._backward_hooks,
             module._backward_pre_hooks)
    return ("forward" not in vars(module) and not any(hooks)
            and not parametrize.is_parametrized(module)
            and not any(getattr(p, "_backward_hooks", None)
                        or getattr(p, "_post_accumulate_grad_hooks", None)
                        for p in module.parameters(recurse=False)))


def _global_module_hooks() -> bool:
    """Hooks registered for every module (``nn.modules.module.register_module_forward_hook``
    and its kin), which the fused step would skip."""
    return any((module_hooks._global_forward_hooks, module_hooks._global_forward_pre_hooks,
                module_hooks._global_backward_hooks, module_hooks._global_backward_pre_hooks))


def mlp_layers(module: nn.Module) -> list[tuple[nn.Linear, Activation | None]] | None:
    """``module``'s linear layers, each with the activation that follows it (None after the
    last), when the fused step provably computes what the module's forward does: a plain
    ``nn.Sequential`` (a subclass may override ``forward``) of ``nn.Linear`` layers with sigmoid,
    ReLU or tanh between them, no buffers, and nothing that changes a call (see :func:`_plain`);
    None otherwise. Every parameter is trained (a frozen one, ``requires_grad=False``, would be
    updated) and every layer used once (a tied one would take its momentum and decay once per
    use)."""
    if type(module) is not nn.Sequential:
        return None
    children = list(module)
    linears, activations = children[0::2], children[1::2]
    if not linears or len(linears) != len(activations) + 1:
        return None
    if not all(type(m) is nn.Linear for m in linears):
        return None
    if len({id(m) for m in linears}) < len(linears):
        return None
    if not all(p.requires_grad for p in module.parameters()):
        return None
    if not all(type(a) in _ACTIVATIONS for a in activations):
        return None
    if next(module.buffers(), None) is not None or _global_module_hooks():
        return None
    if not all(_plain(m) for m in module.modules()):
        return None
    layers = cast(list[nn.Linear], linears)  # each checked above to be exactly nn.Linear
    return list(zip(layers, [_ACTIVATIONS[type(a)] for a in activations] + [None]))


class FusedMlpStep(Step):
    def __init__(self, flat: FlatModel, sgd: SGD, task: str,
                 layers: list[tuple[nn.Linear, Activation | None]]) -> None:
        self.optimizer: SGD = sgd  # the fused step applies plain SGD's arithmetic itself
        self.task = task
        self.loss = loss_fn(task)
        self.activations = [activation for _, activation in layers]
        momentum = dict(zip((id(p) for p in flat.module.parameters()), sgd.momentum_views()))
        # per layer: (weight, its momentum slice, bias as a row or None, its momentum slice)
        self.layers = [(linear.weight, momentum[id(linear.weight)], *self._row(linear.bias, momentum))
                       for linear, _ in layers]
        self.ones = torch.ones(1, 0, device=flat.params.device)  # a bias gradient is ones @ g

    @staticmethod
    def _row(bias: torch.Tensor | None, momentum: dict[int, torch.Tensor | None]
             ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if bias is None:
            return None, None
        slot = momentum[id(bias)]
        return bias.view(1, -1), (slot.view(1, -1) if slot is not None else None)

    @torch.no_grad()
    def compute(self, x: torch.Tensor, y: torch.Tensor, epoch: float, batch_size: int,
                per_sample: bool = False) -> Pending:
        """Forward, then backward from the top; each layer's weight gradient stays two factors
        (its output gradient and its input), applied by :meth:`land`. Every weight is read
        before any is updated, as ``torch.optim.SGD`` reads them."""
        inputs: list[torch.Tensor] = []
        h = x
        for (weight, _, bias, _), activation in zip(self.layers, self.activations):
            inputs.append(h)
            h = torch.nn.functional.linear(h, weight, bias)  # a bias row broadcasts
            if activation is not None:
                h = activation[0](h)
        losses = per_sample_loss(self.task, h, y) if per_sample else None
        loss_of = partial(losses.mean) if losses is not None else partial(self.loss, h, y)
        grad = logits_gradient(self.task, h, y)  # a new tensor: `h` stays the logits
        if self.ones.shape[1] < len(grad):
            self.ones = grad.new_ones(1, len(grad))
        products: list[Product] = []
        for i in range(len(self.layers) - 1, -1, -1):
            weight, weight_momentum, bias, bias_momentum = self.layers[i]
            a = inputs[i]
            products.append((weight, weight_momentum, grad.t(), a))
            if bias is not None:
                products.append((bias, bias_momentum, self.ones[:, :len(grad)], grad))
            if i > 0:
                below = grad @ weight  # a new tensor: `grad` stays this layer's factor
                activation = self.activations[i - 1]
                assert activation is not None  # every layer but the last has one
                activation[1](below, a)
                grad = below
        return Pending(loss_of, losses, self.optimizer.lr(epoch, batch_size), products)

    @torch.no_grad()
    def land(self, pending: Pending) -> None:
        for param, momentum, left, right in pending.products:
            self.optimizer.apply_product(param, momentum, left, right, pending.lr)


def _fused_layers(module: nn.Module, step_choice: str, optim: OptimConfig
                  ) -> list[tuple[nn.Linear, Activation | None]] | None:
    """The layers of the fused step when ``optim.step=step_choice`` gets it for ``module``
    (plain SGD only: its update is fused into backward), None for the autograd step; ``fused``
    on a model it cannot run is an error."""
    fusable = step_choice != "autograd" and isinstance(optim, SGDConfig)
    layers = mlp_layers(module) if fusable else None
    if layers is None and step_choice == "fused":
        raise UserError(f"optim.step=fused needs an MLP (linear layers with sigmoid, relu or tanh "
                        f"between them); this model is a {type(module).__name__}: use "
                        "optim.step=auto")
    return layers


def resolved_step(module: nn.Module, step_choice: str, optim: OptimConfig) -> str:
    """Which step (``fused`` or ``autograd``) :func:`build_step` gives ``module`` under
    ``optim.step=step_choice``: what a run's summary reports."""
    return "fused" if _fused_layers(module, step_choice, optim) is not None else "autograd"


def build_step(step_choice: str, flat: FlatModel, optim: OptimConfig, task: str) -> Step:
    """The step ``optim.step`` (``step_choice``, one of ``config.schema.STEP_CHOICES``) asks
    for: ``fused`` where the model allows it under ``auto``."""
    optimizer = build_optimizer(optim, flat)
    layers = _fused_layers(flat.module, step_choice, optim)
    if layers is not None:
        assert isinstance(optimizer, SGD)  # only plain SGD is fused
        return FusedMlpStep(flat, optimizer, task, layers)
    return AutogradStep(flat, optimizer, task)
