from __future__ import annotations

import math

import pytest
import torch

from hetsgd.model.losses import correct, logits_gradient, loss_fn, num_outputs, per_sample_loss

LN2 = math.log(2)


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def test_binary_is_sigmoid_cross_entropy_on_one_logit():
    logits = torch.tensor([[0.0], [2.0], [-1.0]])
    targets = torch.tensor([1.0, 0.0, 1.0])
    # -log(sigmoid(z)) = softplus(-z); -log(1 - sigmoid(z)) = softplus(z)
    expected = [LN2, softplus(2.0), softplus(1.0)]
    torch.testing.assert_close(per_sample_loss("binary", logits, targets), torch.tensor(expected))
    assert loss_fn("binary")(logits, targets).item() == pytest.approx(sum(expected) / 3)


def test_binary_accepts_integer_targets():
    logits = torch.tensor([[0.0], [2.0]])
    assert loss_fn("binary")(logits, torch.tensor([1, 0])).item() == \
        pytest.approx((LN2 + softplus(2.0)) / 2)


def test_multiclass_is_softmax_cross_entropy():
    logits = torch.tensor([[0.0, 0.0], [math.log(3), 0.0], [0.0, 5.0]])
    targets = torch.tensor([0, 0, 0])
    expected = [LN2, math.log(4 / 3), math.log(1 + math.exp(5))]
    torch.testing.assert_close(per_sample_loss("multiclass", logits, targets),
                               torch.tensor(expected))
    assert loss_fn("multiclass")(logits, targets).item() == pytest.approx(sum(expected) / 3)


def test_multilabel_is_sigmoid_cross_entropy_averaged_over_labels():
    logits = torch.tensor([[0.0, 0.0, 0.0], [2.0, -1.0, 3.0]])
    targets = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    expected = [LN2, (softplus(-2.0) + softplus(1.0) + softplus(3.0)) / 3]
    torch.testing.assert_close(per_sample_loss("multilabel", logits, targets),
                               torch.tensor(expected))
    assert loss_fn("multilabel")(logits, targets).item() == pytest.approx(sum(expected) / 2)


def test_correct_counts():
    # binary: logit 0 predicts class 0
    assert correct("binary", torch.tensor([[0.5], [-1.0], [0.0]]),
                   torch.tensor([1.0, 1.0, 0.0])).item() == 2
    assert correct("multiclass", torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]]),
                   torch.tensor([1, 1, 1])).item() == 2
    # precision@1: only the top-scored label has to be a true one
    assert correct("multilabel", torch.tensor([[0.1, 0.9, 0.5], [0.9, 0.1, 0.5]]),
                   torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 1.0]])).item() == 1
    # the top label (2) is a true one, though not the first true one (1)
    assert correct("multilabel", torch.tensor([[0.1, 0.5, 0.9]]),
                   torch.tensor([[0.0, 1.0, 1.0]])).item() == 1


def test_num_outputs():
    assert num_outputs("binary", 2) == 1
    assert num_outputs("multiclass", 7) == 7
    assert num_outputs("multilabel", 983) == 983


@pytest.mark.parametrize("call", [lambda: loss_fn("regression"),
                                  lambda: num_outputs("auto", 2),
                                  lambda: correct("ranking", torch.zeros(1), torch.zeros(1))])
def test_unknown_task_is_rejected(call):
    with pytest.raises(ValueError, match="binary, multiclass, multilabel"):
        call()


@pytest.mark.parametrize("task,targets", [
    ("binary", torch.tensor([1.0, 0.0, 1.0, 0.0])),
    ("binary", torch.tensor([1, 0, 1, 0])),  # integer labels, as some files give them
    ("multiclass", torch.tensor([2, 0, 1, 2])),
    ("multilabel", torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0],
                                 [0.0, 0.0, 0.0]])),
])
def test_the_closed_form_logits_gradient_is_autograds(task: str, targets: torch.Tensor):
    width = 1 if task == "binary" else 3
    logits = torch.randn(4, width, generator=torch.Generator().manual_seed(1)) * 3
    leaf = logits.clone().requires_grad_(True)
    loss_fn(task)(leaf, targets).backward()
    torch.testing.assert_close(logits_gradient(task, logits, targets), leaf.grad)
