"""Typed configuration of one run: the dataclass schemas that hold every default.

Hydra composes the YAML files of ``hetsgd/conf`` on top of these schemas (registered in its
ConfigStore by :mod:`hetsgd.config.compose`); a YAML file states only what its choice changes.
An unknown key or a value of the wrong type is rejected during composition; range checks live in
``__post_init__`` and run when the composed config becomes objects, before any work starts.
The algorithms' schemas are in :mod:`hetsgd.config.algorithms`, the optimizers' in
:mod:`hetsgd.config.optim`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from hetsgd.config.algorithms import AlgoConfig
from hetsgd.config.checks import ConfigError, finite, one_of, positive, require, seconds
from hetsgd.config.optim import OptimConfig
from hetsgd.config.problem import DatasetConfig, ModelConfig

# --------------------------------------------------------------------------------------------
# budget, evaluation, monitoring (the optimizer's schemas: hetsgd/config/optim.py)
# --------------------------------------------------------------------------------------------


@dataclass
class BudgetConfig:
    """When training stops: after `epochs` passes over the data, after `seconds` of training, or
    at whichever comes first when both are set."""

    epochs: float | None = 10.0
    seconds: float | None = None

    def __post_init__(self) -> None:
        positive("budget.epochs", self.epochs, nullable=True)
        seconds("budget.seconds", self.seconds, nullable=True)
        require(self.epochs is not None or self.seconds is not None, "budget",
                 "set budget.epochs, budget.seconds or both", None)


@dataclass
class EvalConfig:
    """Snapshots are copied every `every_s` seconds and every `every_epochs` epochs during
    training (whichever comes first), and evaluated afterwards."""

    every_s: float = 0.5
    every_epochs: float | None = 0.25
    # summary.json times the run to these losses (test loss where the run evaluates one, else
    # training loss); empty: 0.5 / 0.2 / 0.1 x its initial value (the same for every run of
    # one seed, model and dataset)
    target_losses: list[float] = field(default_factory=list)
    train_subset: int = 10000  # training loss is measured on at most this many examples
    batch_size: int = 4096
    # Beyond either cap every other snapshot is dropped and the spacing doubles: evaluation
    # time and memory stay bounded however long the run.
    max_snapshots: int = 80
    max_snapshot_mb: float = 1024.0
    # the raw snapshots a run writes to snapshots/ as it trains are removed once evaluated,
    # unless kept (e.g. to evaluate them otherwise later)
    keep_snapshots: bool = False

    def __post_init__(self) -> None:
        seconds("eval.every_s", self.every_s)
        positive("eval.every_epochs", self.every_epochs, "a positive number of epochs",
                 nullable=True)
        require(self.train_subset > 0, "eval.train_subset", "a positive count", self.train_subset)
        require(all(finite(t) and t > 0 for t in self.target_losses), "eval.target_losses",
                "positive, finite losses", self.target_losses)
        require(self.batch_size > 0, "eval.batch_size", "a positive count", self.batch_size)
        require(self.max_snapshots >= 4, "eval.max_snapshots", "at least 4", self.max_snapshots)
        positive("eval.max_snapshot_mb", self.max_snapshot_mb, "a positive size")


@dataclass
class MonitorConfig:
    """Utilization samples every `interval_s`; a run whose workers got less than
    `contention_threshold` of the CPU time they wanted is flagged in summary.json's
    `contention` (:mod:`hetsgd.observe.contention`; 0 flags none)."""

    interval_s: float = 0.5
    contention_threshold: float = 0.7

    def __post_init__(self) -> None:
        seconds("monitor.interval_s", self.interval_s)
        require(finite(self.contention_threshold) and 0 <= self.contention_threshold <= 1,
                "monitor.contention_threshold", "a share from 0 to 1", self.contention_threshold)


START_METHODS = ("forkserver", "spawn")  # workers.start


@dataclass
class WorkersConfig:
    """Liveness: a worker process that makes no progress (no step, no heartbeat) for `stall_s`
    seconds of training is hung (a stopped process, a CUDA call or a lock that never returns):
    the run ends `failed`, naming it. A worker's first step may take a few times longer (a first
    CUDA step compiles and tunes its kernels). A custom algorithm's `plan`, `hooks` and
    controller calls that do not return within `stall_s` fail the run too (hetsgd/bounded.py).
    Distributed ranks use `dist.timeout_s` instead,
    the limit of their collectives. `start`: how worker and rank processes start
    (hetsgd/engines/processes.py): forked from a forkserver that imported torch once, or each a
    fresh interpreter (`spawn`, which imports torch again per process). A forkserver that has
    not forked a run's workers within `start_timeout_s` (stopped, or stuck) is killed, failing
    the run; the next run starts a new one."""

    stall_s: float = 30.0
    start: str = "forkserver"
    start_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        seconds("workers.stall_s", self.stall_s)
        seconds("workers.start_timeout_s", self.start_timeout_s)
        one_of("workers.start", self.start, START_METHODS)


@dataclass
class DataConfig:
    """How workers walk the data: a seeded permutation per epoch, or file order (the authors')."""

    shuffle: bool = True
    on_device: str = "auto"  # GPU workers: copy the whole training set to the device when it fits
    # training batches only (hetsgd/data/augment.py): none, or crop_flip for image sets (Lim et
    # al.'s CIFAR recipe: a random crop of the image zero-padded by 4 pixels, a flip with p = 0.5)
    augment: str = "none"

    def __post_init__(self) -> None:
        one_of("data.on_device", self.on_device, ("auto", "always", "never"))
        one_of("data.augment", self.augment, ("none", "crop_flip"))


# --------------------------------------------------------------------------------------------
# device mixes
# --------------------------------------------------------------------------------------------

KINDS = ("cpu", "cuda")
ROLES = ("auto", "host", "accel")
# Sanity bounds: a typo such as count=10000 would start that many processes, and an emulated
# device 1000x slower than the real one already sleeps a second after a 1 ms step.
MAX_GROUP_SIZE = 256
MAX_SLOWDOWN = 1000.0
MAX_JITTER = 1.0  # a spread beyond 100% of a step's time is a typo, not a device


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
    # simulated mixes: the named device whose roofline times this group's steps (see
    # hetsgd/engines/virtual/profiles.yaml); null: the group's row of devices.calibration
    profile: str | None = None
    # simulated mixes: the relative spread (coefficient of variation) of each step's virtual
    # time, a seeded lognormal factor of mean 1 (hetsgd/engines/virtual/step_times.py), so that
    # identical simulated workers do not step in lockstep; a real device varies by itself
    jitter: float = 0.0

    def __post_init__(self) -> None:
        one_of("devices.groups.*.kind", self.kind, KINDS)
        one_of("devices.groups.*.role", self.role, ROLES)
        require(0 < self.count <= MAX_GROUP_SIZE, "devices.groups.*.count",
                f"1 to {MAX_GROUP_SIZE} workers", self.count)
        require(0 < self.threads <= MAX_GROUP_SIZE, "devices.groups.*.threads",
                f"1 to {MAX_GROUP_SIZE} threads", self.threads)
        require(self.index >= 0, "devices.groups.*.index", "a CUDA device index", self.index)
        require(self.batch_size > 0, "devices.groups.*.batch_size", "at least 1",
                 self.batch_size)
        require(1.0 <= self.slowdown <= MAX_SLOWDOWN, "devices.groups.*.slowdown",
                f"1 <= x <= {MAX_SLOWDOWN:g}", self.slowdown)
        require(finite(self.jitter) and 0.0 <= self.jitter <= MAX_JITTER,
                "devices.groups.*.jitter", f"0 <= x <= {MAX_JITTER:g}", self.jitter)

    @property
    def accel(self) -> bool:
        return self.role == "accel" or (self.role == "auto" and self.kind == "cuda")


@dataclass
class DevicesConfig:
    name: str = MISSING
    groups: dict[str, GroupConfig] = field(default_factory=dict)
    # train on these groups only (empty: all); e.g. [accel] runs a mix's accelerator alone, so
    # the baseline of a comparison keeps the same mix, and its name, as the other runs
    only: list[str] = field(default_factory=list)
    # run on the virtual clock (hetsgd/engines/virtual): every step's time comes from its group's
    # device profile, and the run says `simulated` everywhere; no GPU is needed for cuda groups
    simulated: bool = False
    # a `hetsgd machine --calibrate` CSV: measured profiles, by group name, for groups without one
    calibration: str | None = None
    # refuse a mix whose worker processes would not fit in the memory available here
    # (hetsgd/workers.py: check_memory); false starts them anyway
    memory_check: bool = True
    # workers, ranks and the virtual engines' math flush denormal floats to zero on the CPU
    # (torch.set_flush_denormal; hetsgd/engines/denormals.py): a saturated sigmoid net computes
    # several times slower on them (docs/how_it_works.md has the measurement)
    flush_denormal: bool = True
    # CUDA workers multiply FP32 matrices on TF32 tensor cores (10-bit mantissa): several times
    # faster, but a deviation from the papers' FP32, so off by default and labelled in the
    # summary (`precision`); no effect on a CPU, emulated or simulated worker
    tf32: bool = False
    # an accelerator worker's whole step (forward, backward, update) captured as one CUDA graph
    # per batch size and replayed (hetsgd/engines/graphs.py): launched at once instead of kernel
    # by kernel. Opt-in until a GPU has measured it faster and equal in results; elsewhere (an
    # emulated or simulated accelerator) steps stay eager, recorded in the summary (`cuda_graphs`)
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        require(len(self.groups) > 0, "devices.groups", "at least one worker group",
                self.groups)
        require(set(self.only) <= set(self.groups), "devices.only",
                "names of groups of the mix (" + ", ".join(self.groups) + ")", self.only)
        for name, group in self.groups.items():
            require(self.simulated or group.jitter == 0.0, f"devices.groups.{name}.jitter",
                    "0 unless devices.simulated=true (it spreads simulated step times; a real "
                    "device's vary by themselves)", group.jitter)



# --------------------------------------------------------------------------------------------
# trackers
# --------------------------------------------------------------------------------------------


@dataclass
class TensorBoardConfig:
    """TensorBoard event files (`logger=tensorboard`): one directory per run under `dir`, a
    sweep's runs under one directory named for the sweep."""

    dir: str = "${results_dir}/tensorboard"


@dataclass
class MlflowConfig:
    """MLflow (`logger=mlflow`): a run per run, a sweep as one experiment. `tracking_uri` is a
    database URI or a server's address (http://...); artifacts of new experiments go to
    `artifact_dir`, except on a server, which keeps its own. A server's requests give up after
    `timeout_s`, retried `retries` times."""

    tracking_uri: str = "sqlite:///${results_dir}/mlflow.db"
    artifact_dir: str = "${results_dir}/mlruns"
    experiment: str | None = None  # null: the sweep's folder name, or "hetsgd" for a single run
    timeout_s: float = 10.0  # for each request to a tracking server
    retries: int = 0  # of a failed request to a tracking server

    def __post_init__(self) -> None:
        seconds("logger.mlflow.timeout_s", self.timeout_s)
        require(0 <= self.retries <= 10, "logger.mlflow.retries", "0 to 10", self.retries)


@dataclass
class LoggersConfig:
    """Where a run's results go besides its run directory (`logger=tensorboard`,
    `logger=[tensorboard,mlflow]`; default none). Loggers are fed each snapshot as it is taken,
    then the rest from the run directory once the run has written it; a logger that fails costs
    a warning, never the run."""

    tensorboard: TensorBoardConfig | None = None
    mlflow: MlflowConfig | None = None


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
        one_of("dist.backend", self.backend, BACKENDS)
        seconds("dist.timeout_s", self.timeout_s)
        require(self.master_port is None or 0 < self.master_port < 65536, "dist.master_port",
                 "a TCP port, or null for a free one", self.master_port)


@dataclass
class CheckpointConfig:
    """Checkpoints for long runs of an algorithm that declares ``CHECKPOINTS`` (`sync`,
    `local_sgd`, a plugin; :func:`hetsgd.algorithms.choose` refuses the others): every
    `every_s` seconds of training and at the end, the workers' whole state (model, momentum, RNG
    streams, counters, position in the data, a rank loop's ``state_dict``) goes to
    `checkpoint/` in the run directory; `resume=RUN_DIR` continues from it."""

    every_s: float | None = None  # null: no checkpoints

    def __post_init__(self) -> None:
        seconds("checkpoint.every_s", self.every_s, nullable=True)


#: A run's objective metrics (its final snapshot's), each with whether higher is better.
OBJECTIVE_METRICS = {"train_loss": False, "test_loss": False, "test_acc": True}


@dataclass
class ObjectiveConfig:
    """The one number a run returns to Hydra's sweeper (an Optuna search ranks its trials by it,
    hetsgd/tuning/objective.py): the run's final `metric`, its worst value (+inf for a loss,
    -inf for test_acc) for a run that did not complete and learn. The sweeper's own
    `hydra.sweeper.direction` must agree with it (minimize a loss, maximize test_acc)."""

    metric: str = "test_loss"

    def __post_init__(self) -> None:
        one_of("objective.metric", self.metric, tuple(OBJECTIVE_METRICS))


@dataclass
class RunConfig:
    algo: AlgoConfig = MISSING
    dataset: DatasetConfig = MISSING
    model: ModelConfig = MISSING
    devices: DevicesConfig = MISSING
    optim: OptimConfig = MISSING
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    workers: WorkersConfig = field(default_factory=WorkersConfig)
    data: DataConfig = field(default_factory=DataConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logger: LoggersConfig = field(default_factory=LoggersConfig)
    resume: str | None = None  # a run directory whose checkpoint this run continues
    seed: int = 0
    results_dir: str = "results"
    progress: bool = True
    # a tuned comparison's search (hetsgd/tuning/spec.py): read by `hetsgd run -m`, which sets
    # it to null in each job it starts, so a run never holds one
    tuning: Any = None
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)

    def __post_init__(self) -> None:
        if self.tuning is not None:
            raise ConfigError("this config tunes before it compares (tuning: ...), which only a "
                              "sweep does: start it with `hetsgd run -m` (or hetsgd.sweep)")
        # numpy and torch seed generators from 32 bits; a larger seed fails deep in a library
        require(0 <= self.seed < 2**32, "seed", "0 <= seed < 2**32", self.seed)


