"""Loss, per-sample loss and correct-prediction count for each task.

The dataset's task decides the loss, not the model:

- ``binary``: one output logit, sigmoid cross-entropy; targets are floats in {0, 1}, shape ``[N]``.
- ``multiclass``: softmax cross-entropy over ``num_classes`` logits; targets are int64 class ids.
- ``multilabel``: sigmoid cross-entropy on every label of a multi-hot float target ``[N, L]``,
  averaged over examples x labels as in Ma & Rusu's released code.

Losses are mean-reduced (the papers' code uses one lr with mean losses); the per-sample form is
the same loss before the mean over examples, which biased local SGD ranks examples by.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from hetsgd.config.problem import TASKS

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _check(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}: choose one of {', '.join(TASKS)}")


def _binary_logits(logits: torch.Tensor) -> torch.Tensor:
    # A binary model has one output column: [N, 1] -> [N], matching the targets' shape.
    return logits.squeeze(1) if logits.dim() == 2 else logits


def num_outputs(task: str, num_classes: int) -> int:
    """Width of the model's output layer: one logit for binary, one per class or label otherwise."""
    _check(task)
    return 1 if task == "binary" else num_classes


def per_sample_loss(task: str, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Unreduced loss, shape ``[N]``; its mean is ``loss_fn(task)(logits, targets)``."""
    _check(task)
    if task == "binary":
        logits = _binary_logits(logits)
        return F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype),
                                                  reduction="none")
    if task == "multiclass":
        return F.cross_entropy(logits, targets, reduction="none")
    return F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype),
                                              reduction="none").mean(dim=1)


def loss_fn(task: str) -> LossFn:
    """The mean-reduced training loss of ``task``."""
    _check(task)
    if task == "multiclass":
        return F.cross_entropy

    def sigmoid_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if task == "binary":
            logits = _binary_logits(logits)
        return F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype))

    return sigmoid_ce


def logits_gradient(task: str, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The gradient of the mean-reduced loss with respect to the logits, in closed form: the
    fused MLP step starts its hand-written backward here (autograd would get the same with a
    graph built and walked on every step). The difference of the predicted probabilities and the
    targets, over the number of terms the loss averages."""
    _check(task)
    if task == "multiclass":
        grad = torch.softmax(logits, dim=1)
        grad.scatter_add_(1, targets.unsqueeze(1), torch.full_like(grad[:, :1], -1.0))
        return grad.div_(logits.shape[0])
    targets = targets.to(logits.dtype).view_as(logits)  # binary: [N] targets, [N, 1] logits
    return torch.sigmoid(logits).sub_(targets).div_(logits.numel())


def correct(task: str, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Number of correct predictions (a 0-dim int64 tensor).

    binary: logit > 0 agrees with the target; multiclass: the argmax is the target; multilabel:
    precision@1, i.e. the top-scored label is one of the true labels.
    """
    _check(task)
    if task == "binary":
        return ((_binary_logits(logits) > 0) == (targets > 0.5)).sum()
    if task == "multiclass":
        return (logits.argmax(dim=1) == targets).sum()
    top = logits.argmax(dim=1, keepdim=True)
    return (targets.gather(1, top) > 0.5).sum()
