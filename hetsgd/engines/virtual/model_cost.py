"""What one training step of a model costs, counted on the model itself: arithmetic, memory traffic
and operator calls. No device enters here; a device profile turns these counts into seconds."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from hetsgd.config.optim import STEP_CHOICES, SGDConfig
from hetsgd.config.problem import TASKS
from hetsgd.errors import UserError
from hetsgd.model.flat import FlatModel, state_sizes
from hetsgd.model.losses import loss_fn
from hetsgd.model.step import FusedMlpStep, Step, build_step

FLOAT_BYTES = 4  # every model is float32
# The batch the counts are taken on: two examples, so that nothing batch-specific (a squeeze of a
# batch of one) hides; every count that grows with the batch is divided by it.
PROBE_BATCH = 2
# Memory passes over each activation per example: the forward writes it and the next layer reads
# it; the backward writes and reads a gradient of the same size.
ACTIVATION_PASSES = 4
# Memory passes over the parameters per step. The fused MLP step (the MLP family's default): the
# forward reads them, the backward reads them for the input gradient, and the in-place update
# reads and writes them. The autograd step adds four passes over its flat gradient: zeroed,
# accumulated into (read and written) and read back by the update.
FUSED_PARAM_PASSES = 4
AUTOGRAD_PARAM_PASSES = 8


@dataclass(frozen=True)
class ModelCost:
    """One training step of a model: FLOPs and bytes that grow with the batch (per example) and
    those paid once per step, and the operator calls that set a device's fixed overhead."""

    flops_per_example: float  # forward + backward, matrix products and convolutions
    update_flops: float  # the SGD update: a multiply and an add per parameter
    param_bytes: int  # parameters and floating buffers: what a replica copies each way
    bytes_per_example: float  # the input and every activation, written and read back
    bytes_per_step: float  # the parameters (and the autograd step's gradient), read and written
    kernels_per_step: int  # aten operator calls that do work (views excluded)

    @classmethod
    def of(cls, module: nn.Module, input_shape: tuple[int, ...], task: str,
           step: str = "auto", input_dtype: torch.dtype = torch.float32) -> ModelCost:
        """Count a step of ``module`` (left untouched: a copy is stepped) on dense zeros of
        ``input_shape`` per example, of the features' ``input_dtype``; its operator calls and
        parameter traffic as the step ``optim.step=step`` builds makes them.

        FLOPs are those torch's flop counter knows (matrix products and convolutions; elementwise
        work shows in the bytes instead), counted on a dense input: for a sparse input, whose
        first layer multiplies only the nonzeros, they are an upper bound.
        """
        if task not in TASKS:
            raise UserError(f"unknown task {task!r}: one of {', '.join(TASKS)}")
        if not input_shape or any(d < 1 for d in input_shape):
            raise UserError(f"input shape {tuple(input_shape)} must be one or more positive sizes")
        if step not in STEP_CHOICES:
            raise UserError(f"unknown step {step!r}: one of {', '.join(STEP_CHOICES)}")
        n_params, n_buffers = state_sizes(module)
        if n_params == 0:
            raise UserError(f"a {type(module).__name__} has no parameters to train")
        model = copy.deepcopy(module).train()
        x = torch.zeros(PROBE_BATCH, *input_shape, dtype=input_dtype)
        elements, logits = _activation_elements(model, x)
        y = _targets(task, logits)
        flops = _train_flops(model, x, y, task)
        train_step = build_step(step, FlatModel(model), SGDConfig(), task)
        passes = FUSED_PARAM_PASSES if isinstance(train_step, FusedMlpStep) else AUTOGRAD_PARAM_PASSES
        return cls(flops_per_example=flops / PROBE_BATCH,
                   update_flops=2.0 * n_params,
                   param_bytes=FLOAT_BYTES * (n_params + n_buffers),
                   bytes_per_example=ACTIVATION_PASSES * FLOAT_BYTES * elements / PROBE_BATCH,
                   bytes_per_step=passes * FLOAT_BYTES * n_params,
                   kernels_per_step=_kernels(train_step, x, y))


def _activation_elements(model: nn.Module, x: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Elements of the input and of every floating tensor the forward's operators write, and the
    logits. Counted per operator, not per module: a functional ``torch.relu`` or a residual
    ``+`` writes an activation too (three of the seven a ResNet20 block writes; module outputs
    alone made its bytes 1.7x too few). An output that shares its input's storage (a view, an
    in-place op) is no new memory."""
    with _ActivationCounter() as counter, torch.no_grad():
        logits = model(x)
    return x.numel() + counter.elements, logits


class _ActivationCounter(TorchDispatchMode):
    """Sums the elements of the new floating outputs of the aten operators that run."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: tuple[type, ...],
                           args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        self.elements += sum(
            o.numel() for o in pytree.tree_leaves(out)
            if isinstance(o, torch.Tensor) and o.is_floating_point()
            and not any(_same_storage(i, o) for i in inputs))
        return out


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _targets(task: str, logits: torch.Tensor) -> torch.Tensor:
    """Zero targets shaped as ``loss_fn(task)`` takes them (see :mod:`hetsgd.model.losses`)."""
    if task == "binary":
        return torch.zeros(logits.shape[0])
    if task == "multiclass":
        return torch.zeros(logits.shape[0], dtype=torch.int64)
    return torch.zeros(logits.shape)


def _train_flops(model: nn.Module, x: torch.Tensor, y: torch.Tensor, task: str) -> int:
    """FLOPs of a forward pass and ``loss.backward()`` on the batch ``x``."""
    with FlopCounterMode(display=False) as counter:
        loss_fn(task)(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


class _KernelCounter(TorchDispatchMode):
    """Counts the aten operators that run, leaving out views (a transpose, a detach, a slice):
    they launch no kernel on a GPU and cost a fraction of one on a CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: tuple[type, ...],
                           args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        if not func.is_view:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def _kernels(train_step: Step, x: torch.Tensor, y: torch.Tensor) -> int:
    """Operator calls of one warm step as a worker takes it: forward, backward and update. The
    first call is left uncounted, since a step may set something up once."""
    train_step(x, y, 0.0, PROBE_BATCH)
    with _KernelCounter() as counter:
        train_step(x, y, 0.0, PROBE_BATCH)
    return counter.calls
