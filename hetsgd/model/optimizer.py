"""Optimizers beyond plain SGD: any ``torch.optim`` optimizer and LR scheduler as a step's update
(``optim=torch``), and the outer optimizer of a local method (``algo.outer``: DiLoCo's Nesterov
step on each round's averaged change). Classes are named by ``_target_`` and found by the
project's one resolver (:mod:`hetsgd.targets`); a wrong class or argument is one line.

A torch optimizer updates the model's own parameters, which are views of the flat parameter
vector, from their gradients, views of the flat gradient (:mod:`hetsgd.model.flat`), so the rest
of a step (the flat all-reduce of sync SGD, the replica's merge) is unchanged.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch.optim.lr_scheduler import LRScheduler

from hetsgd.config import (
    LocalSGDConfig,
    OptimConfig,
    RunConfig,
    SGDConfig,
    Target,
    TorchOptimConfig,
)
from hetsgd.errors import UserError
from hetsgd.model.flat import FlatModel
from hetsgd.model.sgd import SGD, scheduled_lr
from hetsgd.targets import locate, raised


class Optimizer(Protocol):
    """What a training step needs of its update: the lr of a step, the update from the flat
    gradient, and the state a checkpoint keeps (plain SGD's momentum is one flat vector,
    ``momentum_buffer``; anything else is in :meth:`state_dict`)."""

    @property
    def momentum_buffer(self) -> torch.Tensor | None: ...

    def lr(self, epoch: float, batch_size: int) -> float: ...

    def step(self, lr: float) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def copied(state: Any) -> Any:
    """A state dict with every tensor copied to the CPU: what a checkpoint keeps, not the live
    tensors that the next step changes."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {key: copied(value) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(copied(value) for value in state)
    return state


def saved_state(optimizer: Optimizer) -> tuple[torch.Tensor | None, dict[str, Any]]:
    """What a checkpoint keeps of ``optimizer``: a copy of plain SGD's momentum (None without
    one) and the rest of its state."""
    momentum = optimizer.momentum_buffer
    return (None if momentum is None else copied(momentum)), optimizer.state_dict()


def restore_state(optimizer: Optimizer, momentum: torch.Tensor | None,
                  state: dict[str, Any]) -> None:
    """``optimizer`` as :func:`saved_state` found it (an empty ``state``: nothing beyond the
    momentum, as an older checkpoint or plain SGD has)."""
    if optimizer.momentum_buffer is not None and momentum is not None:
        optimizer.momentum_buffer.copy_(momentum)
    if state:
        optimizer.load_state_dict(state)


def _built(spec: Target, base: type, *args: Any) -> Any:
    """The ``base`` subclass ``spec`` names, built from ``args`` and its keyword arguments."""
    cls = locate(spec.key, spec.target)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise UserError(f"{spec.key}={spec.target}: not a {base.__module__}.{base.__qualname__}"
                        " class")
    try:
        return cls(*args, **spec.kwargs)
    except Exception as exc:  # noqa: BLE001 - a wrong argument, said in one line
        raise raised(spec.key, spec.target, exc, "building it") from None


def torch_optimizer(spec: Target, params: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The ``torch.optim.Optimizer`` that ``spec`` names, over ``params``."""
    optimizer: torch.optim.Optimizer = _built(spec, torch.optim.Optimizer, params)
    return optimizer


class TorchOptimizer:
    """A ``torch.optim`` optimizer (and scheduler) over a flat model's parameters. Without a
    scheduler, every step sets the run's scheduled lr (milestones, batch scaling) first."""

    momentum_buffer: torch.Tensor | None = None  # its state is the optimizer's own

    def __init__(self, optim: TorchOptimConfig, params: list[torch.Tensor]) -> None:
        self.cfg = optim
        self.optimizer = torch_optimizer(optim.optimizer, params)
        schedule = optim.lr_scheduler
        self.scheduler: LRScheduler | None = (None if schedule is None
                                              else _built(schedule, LRScheduler, self.optimizer))

    def lr(self, epoch: float, batch_size: int) -> float:
        return scheduled_lr(self.cfg, epoch, batch_size)

    def step(self, lr: float) -> None:
        if self.scheduler is None:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        state = {"optimizer": self.optimizer.state_dict()}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        return copied(state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])


def build_optimizer(optim: OptimConfig, flat: FlatModel) -> SGD | TorchOptimizer:
    """The update ``optim`` (the run's ``optim`` group) asks for, over ``flat``'s parameters."""
    if isinstance(optim, TorchOptimConfig):
        # a frozen parameter (requires_grad=False) is no optimizer's: it would be decayed
        return TorchOptimizer(optim, [p for p in flat.module.parameters() if p.requires_grad])
    assert isinstance(optim, SGDConfig), f"an optim schema without an update: {optim.name}"
    return SGD(optim, flat)


class OuterOptimizer:
    """A local method's outer step (DiLoCo's): the change of the averaged replica over a round is
    the pseudo-gradient of an outer model, which a ``torch.optim`` optimizer steps (say SGD with
    Nesterov momentum); the replica then restarts from the outer model. Every rank builds one
    from the same model and steps it on the same average, so the outer models stay equal.
    ``torch.optim.SGD`` at lr 1 without momentum is plain model averaging."""

    def __init__(self, spec: Target, params: torch.Tensor) -> None:
        self.params = params
        self.outer = params.detach().clone()
        self.outer.grad = torch.zeros_like(self.outer)
        self.optimizer = torch_optimizer(spec, [self.outer])

    def step(self) -> None:
        """After an average: the outer step, whose result becomes the replica."""
        assert self.outer.grad is not None  # set once, written in place
        torch.sub(self.outer, self.params, out=self.outer.grad)
        self.optimizer.step()
        self.params.copy_(self.outer)

    def state_dict(self) -> dict[str, Any]:
        return copied({"outer": self.outer, "optimizer": self.optimizer.state_dict()})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.outer.copy_(state["outer"])
        self.optimizer.load_state_dict(state["optimizer"])


def check_optimizers(cfg: RunConfig) -> None:
    """Before any worker starts (and in a dry run): the run's optimizer, scheduler and outer
    optimizer (local SGD's ``algo.outer``) built once on a throwaway parameter, so that a wrong
    class or argument is one line here, not a failure in every worker."""
    if isinstance(cfg.optim, TorchOptimConfig):
        TorchOptimizer(cfg.optim, [torch.zeros(1, requires_grad=True)])
    if isinstance(cfg.algo, LocalSGDConfig) and cfg.algo.outer_optimizer is not None:
        OuterOptimizer(cfg.algo.outer_optimizer, torch.zeros(1))
