"""Typed configuration: dataclass schemas registered in Hydra's ConfigStore.

Hydra composes YAML from ``conf/`` on top of these schemas, so an unknown key or a value of the
wrong type is rejected during composition. Range checks live in ``__post_init__`` and run when the
composed config is turned into objects (:func:`to_run_config`), before any work starts. Every
error names the field and what is allowed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hetsgd.host import cuda_devices, usable_cores

# The config tree; HETSGD_CONF points elsewhere (e.g. a copy with your own mixes and experiments).
CONF_DIR = Path(os.environ.get("HETSGD_CONF", Path(__file__).resolve().parents[1] / "conf"))


class ConfigError(ValueError):
    """A config value that is out of range or inconsistent; the message names the field."""


def _require(ok: bool, field_name: str, allowed: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{field_name}={value!r} is not allowed: {allowed}")


def _one_of(field_name: str, value: Any, choices: tuple[str, ...]) -> None:
    _require(value in choices, field_name, "choose one of " + ", ".join(choices), value)


# --------------------------------------------------------------------------------------------
# dataset, model, optimizer, budget, evaluation, monitoring
# --------------------------------------------------------------------------------------------

TASKS = ("auto", "binary", "multiclass", "multilabel")
SCALINGS = ("standard", "maxabs", "none")


@dataclass
class DatasetConfig:
    """Which data to train on; see ``hetsgd data list`` for the sources."""

    name: str = MISSING
    path: str | None = None  # a local file (required for `libsvm`, optional override otherwise)
    task: str = "auto"  # auto: inferred from the labels
    test_fraction: float = 0.2  # used only where the source has no published test split
    scale: str = "standard"  # fit on the training part only
    limit: int | None = None  # keep a seeded, stratified subset of this many training examples
    # shape of the `synthetic` source (ignored by the others)
    n_samples: int = 10000
    n_features: int = 100
    n_classes: int = 2

    def __post_init__(self) -> None:
        _one_of("dataset.task", self.task, TASKS)
        _one_of("dataset.scale", self.scale, SCALINGS)
        _require(0.0 < self.test_fraction < 1.0, "dataset.test_fraction", "0 < x < 1",
                 self.test_fraction)
        _require(self.limit is None or self.limit > 0, "dataset.limit", "a positive count",
                 self.limit)
        _require(self.n_samples > 1, "dataset.n_samples", "at least 2", self.n_samples)
        _require(self.n_features > 0, "dataset.n_features", "at least 1", self.n_features)
        _require(self.n_classes > 1, "dataset.n_classes", "at least 2", self.n_classes)


MODELS = ("mlp_paper", "mlp", "logreg", "cnn", "resnet20")
ACTIVATIONS = ("sigmoid", "relu", "tanh")


@dataclass
class ModelConfig:
    name: str = MISSING
    hidden: list[int] = field(default_factory=lambda: [128])  # mlp widths
    activation: str = "relu"
    bias: bool = True
    channels: list[int] = field(default_factory=lambda: [16, 32])  # cnn conv widths

    def __post_init__(self) -> None:
        _one_of("model.name", self.name, MODELS)
        _one_of("model.activation", self.activation, ACTIVATIONS)
        _require(all(w > 0 for w in self.hidden), "model.hidden", "positive widths", self.hidden)
        _require(len(self.channels) > 0 and all(c > 0 for c in self.channels), "model.channels",
                 "a non-empty list of positive widths", self.channels)


LR_SCALINGS = ("none", "linear", "sqrt")


@dataclass
class OptimConfig:
    """Plain SGD. The papers' asynchronous code uses one constant lr for every worker with
    mean-reduced losses; ``lr_scaling`` rescales it by batch size relative to ``base_batch``."""

    lr: float = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    lr_scaling: str = "none"
    base_batch: int = 1
    milestones: list[float] = field(default_factory=list)  # epochs at which lr *= lr_decay
    lr_decay: float = 0.1

    def __post_init__(self) -> None:
        _require(self.lr > 0, "optim.lr", "a positive number", self.lr)
        _require(0 <= self.momentum < 1, "optim.momentum", "0 <= x < 1", self.momentum)
        _require(self.weight_decay >= 0, "optim.weight_decay", "x >= 0", self.weight_decay)
        _one_of("optim.lr_scaling", self.lr_scaling, LR_SCALINGS)
        _require(self.base_batch > 0, "optim.base_batch", "a positive batch size", self.base_batch)
        _require(0 < self.lr_decay <= 1, "optim.lr_decay", "0 < x <= 1", self.lr_decay)


@dataclass
class BudgetConfig:
    """When training stops: after `epochs` passes over the data, after `seconds` of training, or
    at whichever comes first when both are set."""

    epochs: float | None = 10.0
    seconds: float | None = None

    def __post_init__(self) -> None:
        _require(self.epochs is None or self.epochs > 0, "budget.epochs", "a positive number",
                 self.epochs)
        _require(self.seconds is None or self.seconds > 0, "budget.seconds", "a positive number",
                 self.seconds)
        _require(self.epochs is not None or self.seconds is not None, "budget",
                 "set budget.epochs, budget.seconds or both", None)


@dataclass
class EvalConfig:
    """Snapshots are copied every `every_s` seconds and every `every_epochs` epochs during
    training (whichever comes first), and evaluated afterwards."""

    every_s: float = 0.5
    every_epochs: float | None = 0.25
    train_subset: int = 10000  # training loss is measured on at most this many examples
    batch_size: int = 4096
    # Beyond either cap every other snapshot is dropped and the spacing doubles: evaluation
    # time and memory stay bounded however long the run.
    max_snapshots: int = 80
    max_snapshot_mb: float = 1024.0

    def __post_init__(self) -> None:
        _require(self.every_s > 0, "eval.every_s", "a positive number of seconds", self.every_s)
        _require(self.every_epochs is None or self.every_epochs > 0, "eval.every_epochs",
                 "a positive number of epochs, or null", self.every_epochs)
        _require(self.train_subset > 0, "eval.train_subset", "a positive count", self.train_subset)
        _require(self.batch_size > 0, "eval.batch_size", "a positive count", self.batch_size)
        _require(self.max_snapshots >= 4, "eval.max_snapshots", "at least 4", self.max_snapshots)
        _require(self.max_snapshot_mb > 0, "eval.max_snapshot_mb", "a positive size",
                 self.max_snapshot_mb)


@dataclass
class MonitorConfig:
    interval_s: float = 0.5

    def __post_init__(self) -> None:
        _require(self.interval_s > 0, "monitor.interval_s", "a positive number of seconds",
                 self.interval_s)


@dataclass
class DataConfig:
    """How workers walk the data: a seeded permutation per epoch, or file order (the authors')."""

    shuffle: bool = True
    on_device: str = "auto"  # GPU workers: copy the whole training set to the device when it fits

    def __post_init__(self) -> None:
        _one_of("data.on_device", self.on_device, ("auto", "always", "never"))


# --------------------------------------------------------------------------------------------
# device mixes
# --------------------------------------------------------------------------------------------

KINDS = ("cpu", "cuda")
ROLES = ("auto", "host", "accel")


@dataclass
class GroupConfig:
    """A group of identical workers. `role` says which code path they take in the asynchronous
    family: `host` updates the shared master in place (Hogwild), `accel` trains a replica and
    merges it back (the GPU's path); `auto` is `accel` for cuda and `host` for cpu."""

    kind: str = "cpu"
    count: int = 1
    threads: int = 1
    index: int = 0  # first CUDA device of the group
    batch_size: int = 32
    slowdown: float = 1.0  # emulated: sleep (slowdown - 1) x compute time after each step
    role: str = "auto"

    def __post_init__(self) -> None:
        _one_of("devices.groups.*.kind", self.kind, KINDS)
        _one_of("devices.groups.*.role", self.role, ROLES)
        _require(self.count > 0, "devices.groups.*.count", "at least 1", self.count)
        _require(self.threads > 0, "devices.groups.*.threads", "at least 1", self.threads)
        _require(self.index >= 0, "devices.groups.*.index", "a CUDA device index", self.index)
        _require(self.batch_size > 0, "devices.groups.*.batch_size", "at least 1",
                 self.batch_size)
        _require(self.slowdown >= 1.0, "devices.groups.*.slowdown", "x >= 1", self.slowdown)

    @property
    def accel(self) -> bool:
        return self.role == "accel" or (self.role == "auto" and self.kind == "cuda")


@dataclass
class DevicesConfig:
    name: str = MISSING
    groups: dict[str, GroupConfig] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _require(len(self.groups) > 0, "devices.groups", "at least one worker group",
                 self.groups)


# --------------------------------------------------------------------------------------------
# algorithms: one schema per algorithm, selected by the `algo` config group
# --------------------------------------------------------------------------------------------


@dataclass
class AlgoConfig:
    name: str = MISSING


@dataclass
class SyncConfig(AlgoConfig):
    """Synchronous data-parallel SGD; with one worker, the single-device baseline."""

    name: str = "sync"
    split: str = "equal"  # equal (as DDP) | proportional (to calibrated speed)
    global_batch: int | None = None  # null: the sum of the workers' batch sizes

    def __post_init__(self) -> None:
        _one_of("algo.split", self.split, ("equal", "proportional"))
        _require(self.global_batch is None or self.global_batch > 0, "algo.global_batch",
                 "a positive batch size, or null", self.global_batch)


@dataclass
class HogwildConfig(AlgoConfig):
    """CPU-only asynchronous SGD: lock-free in-place updates of the shared master."""

    name: str = "hogwild"


MERGES = ("delta", "overwrite")


@dataclass
class HogbatchConfig(AlgoConfig):
    """CPU+GPU Hogbatch. `merge`: how an accelerator's replica goes back into the master:
    `delta` adds the replica's own change and keeps concurrent CPU updates (the project's
    default); `overwrite` copies the replica over the master (the authors' released code)."""

    name: str = "hogbatch"
    merge: str = "delta"

    def __post_init__(self) -> None:
        _one_of("algo.merge", self.merge, MERGES)


@dataclass
class AdaptiveConfig(HogbatchConfig):
    """Adaptive Hogbatch. The paper does not give its rule; this is the project's
    reconstruction (see hetsgd/algorithms/adaptive.py and the README)."""

    name: str = "adaptive"
    target_share: float = 0.5  # wanted share of model updates made by the accel class
    period_s: float = 0.5  # control period
    window_s: float = 1.0  # update rates are measured over this sliding window
    gamma: float = 0.5  # damping exponent of each resize
    min_gpu_batch: int = 32  # the paper's threshold: accel batches never go below it
    max_gpu_batch: int | None = None  # null: the accel group's configured batch size
    max_cpu_batch: int = 64  # host batches never grow beyond it

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(0 < self.target_share < 1, "algo.target_share", "0 < x < 1", self.target_share)
        _require(self.period_s > 0, "algo.period_s", "a positive number of seconds", self.period_s)
        _require(self.window_s >= self.period_s, "algo.window_s", "at least algo.period_s",
                 self.window_s)
        _require(0 < self.gamma <= 1, "algo.gamma", "0 < x <= 1", self.gamma)
        _require(self.min_gpu_batch > 0, "algo.min_gpu_batch", "a positive batch size",
                 self.min_gpu_batch)
        _require(self.max_gpu_batch is None or self.max_gpu_batch >= self.min_gpu_batch,
                 "algo.max_gpu_batch", "null or at least algo.min_gpu_batch", self.max_gpu_batch)
        _require(self.max_cpu_batch > 0, "algo.max_cpu_batch", "a positive batch size",
                 self.max_cpu_batch)


@dataclass
class BiasedSamplingConfig:
    """Loss-based top-k sampling of the biased local SGD paper."""

    sampling: bool = False
    side: str = "slow"  # slow (the authors' code) | fast (the paper's summary)
    pool_ratio: float = 4.0

    def __post_init__(self) -> None:
        _one_of("algo.biased.side", self.side, ("slow", "fast"))
        _require(self.pool_ratio >= 1, "algo.biased.pool_ratio", "x >= 1", self.pool_ratio)


@dataclass
class LocalSGDConfig(AlgoConfig):
    """Local SGD: each worker takes tau_i local steps per round, then replicas are aggregated.

    `tau`: a dict {group: steps} (e.g. {accel: 32, cpu: 1}), or {fast: N, slow: M} on a two-group
    mix (fast = the group with the higher measured step speed), or one number for every group
    (balanced), or "auto": proportional to measured step speed, so that all groups finish a round
    together, the slowest group taking `tau_min` steps. See hetsgd/algorithms/local_sgd.py."""

    name: str = "local_sgd"
    tau: Any = "auto"
    tau_min: int = 1  # tau: auto gives the slowest group this many local steps per round
    aggregation: str = "uniform"  # uniform (authors' code) | samples | fast_weighted
    alpha: float = 2.0  # extra weight of fast-group models under fast_weighted
    biased: BiasedSamplingConfig = field(default_factory=BiasedSamplingConfig)
    epoch_accounting: str = "examples"  # examples (N consumed) | authors (their round count)

    def __post_init__(self) -> None:
        _one_of("algo.aggregation", self.aggregation, ("uniform", "samples", "fast_weighted"))
        _one_of("algo.epoch_accounting", self.epoch_accounting, ("examples", "authors"))
        _require(self.alpha > 0, "algo.alpha", "a positive weight", self.alpha)
        _require(self.tau_min > 0, "algo.tau_min", "a positive step count", self.tau_min)
        steps = self.tau.values() if isinstance(self.tau, dict) else [self.tau]
        _require(self.tau == "auto" or (len(steps) > 0 and all(
            isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in steps)), "algo.tau",
            "auto, a positive step count, or {group: steps} with positive step counts", self.tau)


ALGO_SCHEMAS: dict[str, type[AlgoConfig]] = {
    "sync": SyncConfig, "hogwild": HogwildConfig, "hogbatch": HogbatchConfig,
    "adaptive": AdaptiveConfig, "local_sgd": LocalSGDConfig}


# --------------------------------------------------------------------------------------------
# the whole run
# --------------------------------------------------------------------------------------------


BACKENDS = ("auto", "gloo", "nccl")


@dataclass
class DistConfig:
    """torch.distributed, for sync on several workers and for local_sgd. `backend: auto` is NCCL
    when every rank is a GPU, else gloo (GPU ranks then stage through pinned host buffers). The
    rendezvous and every collective give up after `timeout_s`, so a dead rank ends the run with an
    error instead of a hang. On one machine the ranks meet at `master_addr`:`master_port` (null: a
    free port); under torchrun, torchrun's rendezvous is used instead."""

    backend: str = "auto"
    timeout_s: float = 60.0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None

    def __post_init__(self) -> None:
        _one_of("dist.backend", self.backend, BACKENDS)
        _require(self.timeout_s > 0, "dist.timeout_s", "a positive number of seconds",
                 self.timeout_s)
        _require(self.master_port is None or 0 < self.master_port < 65536, "dist.master_port",
                 "a TCP port, or null for a free one", self.master_port)


@dataclass
class RunConfig:
    algo: AlgoConfig = MISSING
    dataset: DatasetConfig = MISSING
    model: ModelConfig = MISSING
    devices: DevicesConfig = MISSING
    optim: OptimConfig = field(default_factory=OptimConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    data: DataConfig = field(default_factory=DataConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    seed: int = 0
    results_dir: str = "results"
    progress: bool = True


def register_configs() -> None:
    """Register the schemas so that YAML files can name them in their defaults lists, and the
    resolvers device mixes use: `${hetsgd.cores:}` (one worker per core), `${hetsgd.cores_but:1}`
    (all cores but one, left to a GPU worker's host thread), `${hetsgd.gpus:}`, and
    `${hetsgd.cuda_or:A,B}` (A where a CUDA GPU is usable, else B: the `auto` mixes)."""
    resolvers = {"hetsgd.cores": usable_cores,
                 "hetsgd.cuda_or": lambda with_cuda, without: with_cuda if cuda_devices() else without,
                 "hetsgd.cores_but": lambda n: max(1, usable_cores() - int(n)),
                 "hetsgd.gpus": lambda: max(1, len(cuda_devices()))}
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
    cs = ConfigStore.instance()
    # Schemas live under schema/ so that they do not show up as choices of the config groups.
    cs.store(group="schema", name="run", node=RunConfig)
    cs.store(group="schema", name="dataset", node=DatasetConfig)
    cs.store(group="schema", name="model", node=ModelConfig)
    cs.store(group="schema", name="devices", node=DevicesConfig)
    for algo_name, schema in ALGO_SCHEMAS.items():
        cs.store(group="schema/algo", name=algo_name, node=schema)


def compose_run(overrides: Sequence[str]) -> DictConfig:
    """The config that `hetsgd run OVERRIDES` composes, for code that is not itself a Hydra job
    (calibration, torchrun followers, tests, benchmarks)."""
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def _unknown_keys(node: DictConfig, path: str = "") -> list[str]:
    """Keys that no schema declares (added with `+key=value`): OmegaConf would drop them."""
    schema = OmegaConf.get_type(node)
    declared = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) \
        else None
    unknown = [f"{path}{key}" for key in node.keys() if declared is not None and key not in declared]
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            unknown += _unknown_keys(child, f"{path}{key}.")
    return unknown


def to_run_config(cfg: DictConfig) -> RunConfig:
    """Turn a composed config into typed objects, running every range check."""
    unknown = _unknown_keys(cfg)
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(unknown)}: no schema has them")
    try:
        run = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:  # e.g. a key added with `+` that no schema has
        raise ConfigError(" ".join(str(exc).split())) from exc
    assert isinstance(run, RunConfig)
    return run
