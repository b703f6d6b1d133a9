"""The algorithms' config schemas, one per choice of the ``algo`` config group."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING

from hetsgd.config.checks import MAX_SECONDS, finite, one_of, positive, require, seconds
from hetsgd.config.optim import Target

log = logging.getLogger("hetsgd")


@dataclass
class AlgoConfig:
    #: The mix (a choice of the ``devices`` group) the algorithm runs on unless `devices=` or a
    #: `+method=` chooses one; None: config.yaml's default. The one place an algorithm picks a
    #: mix (composition reads it: :func:`hetsgd.config.compose.register_configs`).
    DEVICES: ClassVar[str | None] = None

    name: str = MISSING


@dataclass
class SyncConfig(AlgoConfig):
    """Synchronous data-parallel SGD; with one worker, the single-device baseline."""

    name: str = "sync"
    split: str = "equal"  # equal (as DDP) | proportional (to calibrated speed)
    global_batch: int | None = None  # null: the sum of the workers' batch sizes

    def __post_init__(self) -> None:
        one_of("algo.split", self.split, ("equal", "proportional"))
        require(self.global_batch is None or self.global_batch > 0, "algo.global_batch",
                 "a positive batch size, or null", self.global_batch)


@dataclass
class HogwildConfig(AlgoConfig):
    """CPU-only asynchronous SGD: lock-free in-place updates of the shared master."""

    DEVICES: ClassVar[str | None] = "cpu"  # every core
    name: str = "hogwild"


MERGES = ("delta", "overwrite")


@dataclass
class HogbatchConfig(AlgoConfig):
    """CPU+GPU Hogbatch. `merge`: how an accelerator's replica goes back into the master:
    `delta` adds the replica's own change and keeps concurrent CPU updates (the project's
    default); `overwrite` copies the replica over the master (the authors' released code)."""

    DEVICES: ClassVar[str | None] = "auto"  # the machine's CPU and GPU (emulated without CUDA)
    name: str = "hogbatch"
    merge: str = "delta"
    # delta: a step's change lands in the master at the end of the next step, its device work
    # queued meanwhile (a GPU's overlaps the landing); false: as the step ends, one step fresher
    # for the other workers (a virtual clock lands every step at its end either way)
    pipelined: bool = True

    def __post_init__(self) -> None:
        one_of("algo.merge", self.merge, MERGES)


#: Adaptive Hogbatch's keys renamed to say the role (accel or host), not a device kind: the old
#: name still sets the new key for one release, with a warning.
RENAMED_KEYS: dict[str, str] = {
    "min_gpu_batch": "min_accel_batch", "max_gpu_batch": "max_accel_batch",
    "max_cpu_batch": "max_host_batch"}


@dataclass
class AdaptiveConfig(HogbatchConfig):
    """Adaptive Hogbatch. The paper does not give its rule; this is the project's
    reconstruction (see hetsgd/algorithms/adaptive.py and docs/algorithms.md)."""

    name: str = "adaptive"
    target_share: float = 0.5  # wanted share of model updates made by the accel class
    period_s: float = 0.5  # control period
    window_s: float = 1.0  # update rates are measured over this sliding window
    gamma: float = 0.5  # damping exponent of each resize
    dead_band: float = 1.1  # no resize while the wanted/measured update ratio is this close to 1
    max_factor: float = 4.0  # one resize changes a batch size by at most this factor
    # The paper's "batch size threshold": accel batches never go below it (above the accel
    # group's batch: they never shrink). The values, like the rule, are the project's
    # reconstruction. These defaults keep Adaptive training well on real and emulated mixes;
    # the simulated paper machines take 768 and 432 (+experiment=adaptive_paper), which put the
    # CPU's update share of mlp_paper in the paper's bands (docs/results/adaptive_threshold.md)
    # but slow an emulated mix's training (hosts at batch 432 on digits).
    min_accel_batch: int = 32
    max_accel_batch: int | None = None  # null: the accel group's configured batch size
    max_host_batch: int = 64  # host batches never grow beyond it
    # deprecated names of the three above (RENAMED_KEYS), declared so that old overrides and
    # old runs' config.yaml still compose; null unless given
    min_gpu_batch: int | None = None
    max_gpu_batch: int | None = None
    max_cpu_batch: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for old, new in RENAMED_KEYS.items():
            if (value := getattr(self, old)) is not None:
                log.warning("algo.%s is deprecated: use algo.%s", old, new)
                setattr(self, new, value)
                setattr(self, old, None)
        require(0 < self.target_share < 1, "algo.target_share", "0 < x < 1", self.target_share)
        seconds("algo.period_s", self.period_s)
        require(self.period_s <= self.window_s <= MAX_SECONDS,
                "algo.window_s", f"at least algo.period_s, at most {MAX_SECONDS:,.0f} seconds",
                self.window_s)
        require(0 < self.gamma <= 1, "algo.gamma", "0 < x <= 1", self.gamma)
        require(finite(self.dead_band) and self.dead_band >= 1, "algo.dead_band",
                "a factor of at least 1", self.dead_band)
        require(finite(self.max_factor) and self.max_factor > 1, "algo.max_factor",
                "a factor above 1", self.max_factor)
        require(self.min_accel_batch > 0, "algo.min_accel_batch", "a positive batch size",
                 self.min_accel_batch)
        # a threshold above max_accel_batch is no error: the plan takes the smaller (no shrinking)
        require(self.max_accel_batch is None or self.max_accel_batch > 0,
                "algo.max_accel_batch", "null or a positive batch size", self.max_accel_batch)
        require(self.max_host_batch > 0, "algo.max_host_batch", "a positive batch size",
                 self.max_host_batch)


@dataclass
class BiasedSamplingConfig:
    """Loss-based top-k sampling of the biased local SGD paper."""

    sampling: bool = False
    # by device role: slow = the host (CPU) groups (the authors' code) | fast = the accelerators
    side: str = "slow"
    pool_ratio: float = 4.0

    def __post_init__(self) -> None:
        one_of("algo.biased.side", self.side, ("slow", "fast"))
        require(finite(self.pool_ratio) and self.pool_ratio >= 1, "algo.biased.pool_ratio",
                "a finite x >= 1", self.pool_ratio)


TAU_ALIASES = frozenset({"fast", "slow"})


@dataclass(frozen=True)
class Tau:
    """``algo.tau`` parsed once into what it says, so that no other code reads the raw value.

    ``mode``: ``auto`` (proportional to measured step speed), ``all`` (one number for every group,
    balanced local SGD: ``steps == {"*": n}``), ``groups`` (``{group: steps}``) or ``fast_slow``
    (``{"fast": n, "slow": m}`` on a two-group mix, fast = the faster group as measured).
    """

    mode: str
    steps: dict[str, int]

    @classmethod
    def parse(cls, value: Any) -> Tau:
        if isinstance(value, Tau):
            return value
        if value == "auto":
            return cls("auto", {})
        steps = dict(value) if isinstance(value, dict) else {"*": value}
        require(len(steps) > 0 and all(isinstance(t, int) and not isinstance(t, bool) and t > 0
                                       for t in steps.values()), "algo.tau",
                "auto, a positive step count, or {group: steps} with positive step counts", value)
        if not isinstance(value, dict):
            return cls("all", steps)
        return cls("fast_slow" if set(steps) == TAU_ALIASES else "groups", steps)

    @property
    def measured(self) -> bool:
        """Whether the steps follow from measured step times (auto, or which group is fast)."""
        return self.mode in ("auto", "fast_slow")

    def __str__(self) -> str:
        return "auto" if self.mode == "auto" else str(self.steps.get("*", self.steps))


MOMENTUM_AT_ROUND = ("keep", "reset", "average")


@dataclass
class LocalSGDConfig(AlgoConfig):
    """Local SGD: each worker takes tau_i local steps per round, then replicas are aggregated.

    `tau`: a dict {group: steps} (e.g. {accel: 32, cpu: 1}), or {fast: N, slow: M} on a two-group
    mix (fast = the group with the higher measured step speed), or one number for every group
    (balanced), or "auto": proportional to measured step speed, so that all groups finish a round
    together, the slowest group taking `tau_min` steps. Parsed into a :class:`Tau` on validation.
    `outer`: an outer optimizer stepped on each round's averaged change, DiLoCo's
    (``{_target_: torch.optim.SGD, lr: 0.7, momentum: 0.9, nesterov: true}``); null: the
    average is the next round's model. See hetsgd/algorithms/local_sgd.py."""

    DEVICES: ClassVar[str | None] = "auto"  # the machine's CPU and GPU (emulated without CUDA)
    name: str = "local_sgd"
    tau: Any = "auto"
    tau_min: int = 1  # tau: auto gives the slowest group this many local steps per round
    aggregation: str = "uniform"  # uniform (authors' code) | samples | fast_weighted
    alpha: float = 2.0  # extra weight of fast-group models under fast_weighted
    biased: BiasedSamplingConfig = field(default_factory=BiasedSamplingConfig)
    epoch_accounting: str = "examples"  # examples (N consumed) | authors (their round count)
    outer: Any = None  # a mapping with a _target_ (parsed into a Target), or null
    # plain SGD's momentum at each aggregation: kept local (the authors' code), reset to 0, or
    # averaged with the models' weights; the paper does not say
    momentum_at_round: str = "keep"

    def __post_init__(self) -> None:
        one_of("algo.aggregation", self.aggregation, ("uniform", "samples", "fast_weighted"))
        one_of("algo.epoch_accounting", self.epoch_accounting, ("examples", "authors"))
        one_of("algo.momentum_at_round", self.momentum_at_round, MOMENTUM_AT_ROUND)
        positive("algo.alpha", self.alpha, "a positive weight")
        require(self.tau_min > 0, "algo.tau_min", "a positive step count", self.tau_min)
        self.tau = Tau.parse(self.tau)
        if self.outer is not None:
            Target.parse("algo.outer", self.outer)

    @property
    def outer_optimizer(self) -> Target | None:
        return None if self.outer is None else Target.parse("algo.outer", self.outer)


@dataclass
class CustomAlgoConfig(AlgoConfig):
    """Your own algorithm (`algo=custom algo._target_=PKG.MODULE`): a module or object providing
    ``plan`` and ``hooks`` as the built-ins do (hetsgd/algorithms/plugin.py). Every other key of
    ``algo`` (given as `+algo.NAME=VALUE` or in your own YAML) is one of its settings:
    composition gathers them into ``settings``, typed by the dataclass the algorithm names as its
    ``CONFIG`` when the run chooses it. ``name`` is what summaries and reports call it: the
    algorithm's ``NAME``, else the target's last component."""

    name: str = "custom"
    _target_: str = MISSING
    settings: dict[str, Any] = field(default_factory=dict)


ALGO_SCHEMAS: dict[str, type[AlgoConfig]] = {
    "sync": SyncConfig, "hogwild": HogwildConfig, "hogbatch": HogbatchConfig,
    "adaptive": AdaptiveConfig, "local_sgd": LocalSGDConfig, "custom": CustomAlgoConfig}
