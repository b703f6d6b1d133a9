"""One SGD step: the fused MLP step and the autograd step give torch.optim.SGD's parameters,
in place on whatever storage the model is bound to; the loop's shared scalars pickle as shared."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from conftest import run_config
from torch import nn

from hetsgd.engines.common.cursor import EpochCursor
from hetsgd.engines.common.numpy_views import SharedFlag
from hetsgd.errors import UserError
from hetsgd.model.flat import FlatModel
from hetsgd.model.losses import loss_fn, per_sample_loss
from hetsgd.model.step import AutogradStep, FusedMlpStep, build_step, mlp_layers

LR = 0.5  # large, so that a step that updates from a wrong gradient is far off after 3 steps
STEPS = 3


def _mlp(activation: type[nn.Module], bias: bool, outputs: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5, bias=bias), activation(), nn.Linear(5, 4, bias=bias),
                         activation(), nn.Linear(4, outputs, bias=bias))


def _batch(task: str, step: int, sparse: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(8, 6, generator=generator)
    if sparse:
        x = (x * (x > 0.5)).to_sparse_csr()
    if task == "binary":
        return x, (torch.rand(8, generator=generator) > 0.5).float()
    if task == "multiclass":
        return x, torch.randint(0, 3, (8,), generator=generator)
    return x, (torch.rand(8, 3, generator=generator) > 0.5).float()


def _reference(module: nn.Module, task: str, momentum: float, weight_decay: float,
               sparse: bool = False, lr: float = LR) -> list[torch.Tensor]:
    optimizer = torch.optim.SGD(module.parameters(), lr=lr, momentum=momentum,
                                weight_decay=weight_decay)
    for step in range(STEPS):
        x, y = _batch(task, step, sparse)
        optimizer.zero_grad()
        loss_fn(task)(module(x), y).backward()
        optimizer.step()
    return [p.detach() for p in module.parameters()]


def _ours(module: nn.Module, step_choice: str, task: str, momentum: float, weight_decay: float,
          sparse: bool = False, params: torch.Tensor | None = None,
          device: str = "cpu", schedule: tuple[str, ...] = (), epoch: float = 0.0) -> FlatModel:
    cfg = run_config(f"optim.lr={LR}", f"optim.momentum={momentum}",
                     f"optim.weight_decay={weight_decay}", *schedule).optim
    flat = FlatModel(module, params, torch.zeros(0) if params is not None else None)
    step = build_step(step_choice, flat, cfg, task)
    for i in range(STEPS):
        x, y = _batch(task, i, sparse)
        step(x.to(device), y.to(device), epoch=epoch, batch_size=8)
    return flat


@pytest.mark.parametrize("activation,bias,task,momentum,weight_decay", [
    (nn.Sigmoid, False, "binary", 0.0, 0.0),  # the papers' net: sigmoid, no bias
    (nn.ReLU, True, "multiclass", 0.0, 0.0),
    (nn.Tanh, True, "multilabel", 0.0, 0.0),
    (nn.Sigmoid, True, "binary", 0.0, 0.01),
    (nn.ReLU, True, "multiclass", 0.9, 0.0),
    (nn.Tanh, False, "binary", 0.9, 0.01),
])
@pytest.mark.parametrize("step_choice", ["fused", "autograd"])
def test_a_step_gives_torch_optim_sgds_parameters(step_choice: str, activation: type[nn.Module],
                                                  bias: bool, task: str, momentum: float,
                                                  weight_decay: float) -> None:
    outputs = 1 if task == "binary" else 3
    expected = _reference(_mlp(activation, bias, outputs), task, momentum, weight_decay)
    module = _mlp(activation, bias, outputs)
    _ours(module, step_choice, task, momentum, weight_decay)
    for ours, theirs in zip(module.parameters(), expected):
        torch.testing.assert_close(ours.detach(), theirs, rtol=0, atol=1e-6)


@pytest.mark.parametrize("step_choice", ["fused", "autograd"])
@pytest.mark.parametrize("epoch,decay", [(0.99, 1.0), (1.0, 0.1), (1.5, 0.1)])
def test_a_step_takes_the_learning_rate_of_the_schedule(step_choice: str, epoch: float,
                                                        decay: float) -> None:
    """From a milestone on (x0.1) with linear scaling from batch 4 to 8 (x2): lr = LR / 5."""
    expected = _reference(_mlp(nn.ReLU, True, 3), "multiclass", 0.9, 0.01, lr=LR * 2 * decay)
    module = _mlp(nn.ReLU, True, 3)
    _ours(module, step_choice, "multiclass", 0.9, 0.01, epoch=epoch,
          schedule=("optim.lr_scaling=linear", "optim.base_batch=4", "optim.milestones=[1.0]"))
    for ours, theirs in zip(module.parameters(), expected):
        torch.testing.assert_close(ours.detach(), theirs, rtol=0, atol=1e-6)


@pytest.mark.gpu
def test_the_fused_step_on_a_gpu_gives_torch_optim_sgds_parameters() -> None:
    expected = _reference(_mlp(nn.Sigmoid, True, 3), "multiclass", 0.9, 0.01)
    module = _mlp(nn.Sigmoid, True, 3).cuda()
    _ours(module, "fused", "multiclass", 0.9, 0.01, device="cuda")
    for ours, theirs in zip(module.parameters(), expected):
        torch.testing.assert_close(ours.detach().cpu(), theirs, rtol=0, atol=1e-5)


def test_the_fused_step_takes_sparse_rows() -> None:
    expected = _reference(_mlp(nn.Sigmoid, True, 1), "binary", 0.0, 0.0, sparse=True)
    module = _mlp(nn.Sigmoid, True, 1)
    _ours(module, "fused", "binary", 0.0, 0.0, sparse=True)
    for ours, theirs in zip(module.parameters(), expected):
        torch.testing.assert_close(ours.detach(), theirs, rtol=0, atol=1e-6)


def test_the_fused_step_updates_the_storage_the_model_is_bound_to() -> None:
    """Hogwild: a worker's parameters are views of the shared master, updated in place."""
    expected = _reference(_mlp(nn.ReLU, True, 3), "multiclass", 0.0, 0.0)
    module = _mlp(nn.ReLU, True, 3)
    master = torch.cat([p.detach().flatten() for p in module.parameters()]).share_memory_()
    _ours(module, "fused", "multiclass", 0.0, 0.0, params=master)
    torch.testing.assert_close(master, torch.cat([p.flatten() for p in expected]), rtol=0,
                               atol=1e-6)


def test_both_steps_return_the_loss_before_the_update_and_per_example_losses() -> None:
    x, y = _batch("multilabel", 0)
    cfg = run_config(f"optim.lr={LR}").optim
    for step_choice in ("fused", "autograd"):
        module = _mlp(nn.Tanh, True, 3)
        with torch.no_grad():
            out = module(x)
            expected = per_sample_loss("multilabel", out, y)
        loss, losses = build_step(step_choice, FlatModel(module), cfg, "multilabel")(
            x, y, 0.0, 8, per_sample=True)
        assert losses is not None and not loss.requires_grad
        torch.testing.assert_close(losses, expected)
        torch.testing.assert_close(loss, expected.mean())
        # the workers' step (no per-example losses): the same loss, taken before the update
        loss, losses = build_step(step_choice, FlatModel(_mlp(nn.Tanh, True, 3)), cfg,
                                  "multilabel")(x, y, 0.0, 8)
        assert losses is None
        torch.testing.assert_close(loss, expected.mean())


def test_auto_fuses_mlps_only_and_fused_refuses_other_models() -> None:
    cfg = run_config().optim
    mlp = FlatModel(_mlp(nn.ReLU, True, 3))
    assert isinstance(build_step("auto", mlp, cfg, "multiclass"), FusedMlpStep)
    assert isinstance(build_step("autograd", mlp, cfg, "multiclass"), AutogradStep)
    normed = FlatModel(nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.Linear(4, 3)))
    assert isinstance(build_step("auto", normed, cfg, "multiclass"), AutogradStep)
    with pytest.raises(UserError, match="optim.step=fused needs an MLP"):
        build_step("fused", normed, cfg, "multiclass")


@pytest.mark.parametrize("module", [
    nn.Sequential(nn.Linear(3, 3), nn.GELU(), nn.Linear(3, 1)),  # an activation it cannot invert
    nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1)),  # no activation between the layers
    nn.Sequential(nn.Linear(3, 3), nn.ReLU()),  # ends in an activation
    nn.Sequential(nn.Unflatten(1, (1, 3)), nn.Flatten(), nn.Linear(3, 1)),
])
def test_models_other_than_plain_mlps_are_not_fused(module: nn.Module) -> None:
    assert mlp_layers(module) is None


def _tied() -> nn.Sequential:
    torch.manual_seed(0)
    shared = nn.Linear(6, 6)
    return nn.Sequential(nn.Linear(6, 6), nn.ReLU(), shared, nn.ReLU(), shared, nn.ReLU(),
                         nn.Linear(6, 3))


def _frozen() -> nn.Sequential:
    module = _mlp(nn.ReLU, True, 3)
    module[0].requires_grad_(False)  # fine-tuning the layers above a fixed one
    return module


@pytest.mark.parametrize("make", [_frozen, _tied], ids=["frozen", "tied"])
def test_frozen_and_tied_layers_train_as_torch_optim_sgd_trains_them(
        make: Callable[[], nn.Sequential]) -> None:
    """The fused step updated a frozen layer with its whole gradient, and took a tied layer's
    momentum and decay once per use; a frozen parameter was weight-decayed by the autograd
    step's flat update. Such models take the autograd step, which decays the trained ones."""
    assert mlp_layers(make()) is None
    module, reference = make(), make()
    expected = torch.optim.SGD([p for p in reference.parameters() if p.requires_grad], lr=LR,
                               momentum=0.9, weight_decay=0.01)
    before = [p.detach().clone() for p in reference.parameters()]
    for step in range(STEPS):
        x, y = _batch("multiclass", step)
        expected.zero_grad()
        loss_fn("multiclass")(reference(x), y).backward()
        expected.step()
    _ours(module, "auto", "multiclass", 0.9, 0.01)
    for ours, theirs, start in zip(module.parameters(), reference.parameters(), before):
        torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=0, atol=1e-6)
        assert theirs.requires_grad != torch.equal(theirs.detach(), start)


def test_an_optimizer_of_torch_never_sees_a_frozen_parameter() -> None:
    """AdamW decays every parameter it is given, gradient or not."""
    module = _frozen()
    frozen = [p.detach().clone() for p in module[0].parameters()]
    cfg = run_config("optim=torch", "optim._target_=torch.optim.AdamW", "optim.lr=0.01",
                     "+optim.weight_decay=0.1").optim
    step = build_step("auto", FlatModel(module), cfg, "multiclass")
    for i in range(STEPS):
        step(*_batch("multiclass", i), epoch=0.0, batch_size=8)
    for ours, start in zip(module[0].parameters(), frozen):
        assert torch.equal(ours.detach(), start)


def _through_a_pipe(value: object) -> object:
    """What a spawned worker receives: pickled as multiprocessing does, shared tensors by handle."""
    return pickle.loads(ForkingPickler.dumps(value))


class _FreeLock:
    """A lock that is always free, and pickles."""

    def acquire(self, blocking: bool = True, timeout: float = -1, /) -> bool:
        return True

    def release(self) -> None:
        pass


def test_the_stop_flag_and_the_cursor_stay_shared_when_pickled() -> None:
    flag = SharedFlag()
    copy = _through_a_pipe(flag)
    assert not copy.is_set()
    flag.set()
    assert copy.is_set()  # a numpy array pickled by value would still read False
    # a multiprocessing lock pickles only while spawning: stand in for it here
    cursor = EpochCursor(num_examples=10, epochs=1.0, lock=_FreeLock())
    other = _through_a_pipe(cursor)
    assert cursor.claim(4) == (0, 0, 4)
    assert other.claim(4) == (0, 4, 4)  # it continues where the original left off
    assert cursor.claim(4) == (0, 8, 2)
