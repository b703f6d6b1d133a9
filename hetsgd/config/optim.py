"""The optimizer's config schemas, one per choice of the ``optim`` config group: plain SGD
(``optim=sgd``, the default, with the fused fast path) and any ``torch.optim`` optimizer by
``_target_`` (``optim=torch``), with an optional LR scheduler; and :class:`Target`, a
``{_target_: ..., kwargs...}`` mapping such as a scheduler or a local method's outer optimizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from hetsgd.config.checks import ConfigError, finite, one_of, positive, require

LR_SCALINGS = ("none", "linear", "sqrt")
STEP_CHOICES = ("auto", "fused", "autograd")


@dataclass(frozen=True)
class Target:
    """A class named by ``_target_`` with its keyword arguments: ``key`` is the config key that
    gave it, for the errors."""

    key: str
    target: str
    kwargs: dict[str, Any]

    @classmethod
    def parse(cls, key: str, value: Any) -> Target:
        """``value`` (``{_target_: torch.optim.SGD, lr: 0.7}``) as a Target, or one line."""
        if not isinstance(value, dict) or not isinstance(value.get("_target_"), str):
            raise ConfigError(f"{key}={value!r} is not allowed: a mapping with a _target_ "
                              f"(e.g. {key}={{_target_:torch.optim.SGD,lr:0.7}})")
        kwargs = {str(k): v for k, v in value.items() if k != "_target_"}
        return cls(f"{key}._target_", value["_target_"], kwargs)


@dataclass
class OptimConfig:
    """What every optimizer choice has: its learning rate under one schedule. The papers'
    asynchronous code uses one constant lr for every worker with mean-reduced losses;
    ``lr_scaling`` rescales it by batch size relative to ``base_batch``, and at each of the
    ``milestones`` (epochs) it is multiplied by ``lr_decay``."""

    name: str = MISSING
    lr: float = 0.1
    lr_scaling: str = "none"
    base_batch: int = 1
    milestones: list[float] = field(default_factory=list)
    lr_decay: float = 0.1
    # How a worker computes a step (same parameters either way, see hetsgd.model.step): `fused`
    # updates an MLP's layers in place during a hand-written backward (plain SGD only);
    # `autograd` runs torch's backward into a flat gradient; `auto` takes `fused` wherever it can.
    step: str = "auto"

    def __post_init__(self) -> None:
        positive("optim.lr", self.lr)
        one_of("optim.step", self.step, STEP_CHOICES)
        require(all(finite(m) and m >= 0 for m in self.milestones), "optim.milestones",
                "finite epochs >= 0", self.milestones)
        one_of("optim.lr_scaling", self.lr_scaling, LR_SCALINGS)
        require(self.base_batch > 0, "optim.base_batch", "a positive batch size", self.base_batch)
        require(0 < self.lr_decay <= 1, "optim.lr_decay", "0 < x <= 1", self.lr_decay)


@dataclass
class SGDConfig(OptimConfig):
    """Plain SGD (``optim=sgd``): the arithmetic of ``torch.optim.SGD`` without dampening or
    Nesterov, in one flat vector operation, or fused into an MLP's backward."""

    name: str = "sgd"
    momentum: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(0 <= self.momentum < 1, "optim.momentum", "0 <= x < 1", self.momentum)
        require(finite(self.weight_decay) and self.weight_decay >= 0, "optim.weight_decay",
                "a finite x >= 0", self.weight_decay)


@dataclass
class TorchOptimConfig(OptimConfig):
    """Any ``torch.optim`` optimizer (``optim=torch optim._target_=torch.optim.AdamW``), built
    over the model's parameters with ``lr`` and every other key of ``optim`` (given as
    ``+optim.NAME=VALUE``; composition gathers them into ``kwargs``). Its steps are autograd's.
    ``scheduler``: a ``torch.optim.lr_scheduler`` class and its arguments
    (``{_target_: torch.optim.lr_scheduler.CosineAnnealingLR, T_max: 1000}``), stepped after
    every optimizer step; without one, the lr follows the schedule above."""

    name: str = "torch"
    _target_: str = "torch.optim.SGD"
    scheduler: Any = None  # a mapping with a _target_ (parsed into a Target), or null
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.step != "fused", "optim.step", "auto or autograd: the fused step is plain "
                "SGD's (optim=sgd)", self.step)
        if self.scheduler is not None:
            Target.parse("optim.scheduler", self.scheduler)
            require(not self.milestones and self.lr_scaling == "none", "optim.scheduler",
                    "a scheduler without optim.milestones or optim.lr_scaling (it sets the lr "
                    "itself)", self.scheduler["_target_"])

    @property
    def optimizer(self) -> Target:
        return Target("optim._target_", self._target_, {"lr": self.lr, **self.kwargs})

    @property
    def lr_scheduler(self) -> Target | None:
        return None if self.scheduler is None else Target.parse("optim.scheduler", self.scheduler)


OPTIM_SCHEMAS: dict[str, type[OptimConfig]] = {"sgd": SGDConfig, "torch": TorchOptimConfig}
