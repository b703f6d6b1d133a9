"""A run's ``summary.json`` as one typed value: what the runner writes, and what readers read back.

The runner (:mod:`hetsgd.runs.runner`) fills a :class:`RunSummary` as the run goes and writes it
with :meth:`RunSummary.to_dict`; :meth:`RunSummary.read` reads it back through
:func:`hetsgd.outputs.index.read_summary`, so that a missing, unreadable or orphaned file reads as
a failed or crashed run that says why. A field is None until the run has reached the step that
measures it, and is left out of the file while it is: a run that failed before training has only
its identity, status and error. What only some algorithms write (``adaptive``, ``sync``,
``local_sgd``) stays in ``extra`` under its key.

The index of runs (:func:`hetsgd.outputs.index.index_dirs`) flattens the same file into columns
named after these fields, with dots (``final.train_loss``, ``update_share.cpu``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hetsgd.config.labels import dataset_label, model_label
from hetsgd.outputs.index import RUNNING, read_summary

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from hetsgd.config import RunConfig
    from hetsgd.engines.ranks.torchrun import Torchrun
    from hetsgd.engines.snapshots import Snapshot

#: The fields every summary writes, None or not: which run it is and how it ended.
IDENTITY = ("status", "error", "algo", "dataset", "model", "devices", "seed")


R = TypeVar("R", bound="_Record")


@dataclass(frozen=True)
class _Record:
    """A part of ``summary.json`` kept as a frozen dataclass (its subclasses)."""

    @classmethod
    def from_dict(cls: type[R], values: Mapping[str, Any]) -> R:
        """Each field from ``values``, None where they lack it: a file edited by hand or written
        by an earlier version still reads."""
        return cls(**{f.name: values.get(f.name) for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class Losses(_Record):
    """Training and test loss, and test accuracy, of one snapshot."""

    train_loss: float
    test_loss: float
    test_acc: float



@dataclass(frozen=True)
class TargetLosses(_Record):
    """The absolute losses a run is timed to, what they are relative to
    (:func:`hetsgd.outputs.metrics.target_losses`) and the convergence.csv column they are
    losses of (``test_loss`` where the run evaluates one; None in a run written before)."""

    losses: list[float]
    reference: str
    curve: str | None = None



@dataclass(frozen=True)
class GroupMix(_Record):
    """One group of workers a run trained on."""

    label: str  # what the run reports its workers as: cpu, cuda, emulated or simulated
    role: str  # accel (trains a replica and merges it) or host (updates the master in place)
    count: int
    threads: int  # each worker's
    batch_size: int
    devices: list[str]  # one a worker



@dataclass(frozen=True)
class Mix:
    """The groups of workers a run trained on, by name, and what they add up to."""

    groups: dict[str, GroupMix]

    @property
    def cores(self) -> int | None:
        """The cores the mix gave its workers (threads x workers over its groups); None when a
        group does not say."""
        try:
            return sum(int(g.threads) * int(g.count) for g in self.groups.values())
        except (TypeError, ValueError):
            return None

    @property
    def host_cores(self) -> int | None:
        """:attr:`cores` of the host groups alone, which update the master in place."""
        return Mix({name: g for name, g in self.groups.items() if g.role == "host"}).cores

    @classmethod
    def from_dict(cls, mix: Mapping[str, Any]) -> Mix:
        return cls({name: GroupMix.from_dict(group if isinstance(group, Mapping) else {})
                    for name, group in mix.items()})

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: dataclasses.asdict(group) for name, group in self.groups.items()}


@dataclass(frozen=True)
class Staleness(_Record):
    """How stale the updates of an asynchronous run were. The staleness of an update is the
    number of other workers' updates that reached the master between its step's read of the
    parameters and its own landing. The virtual clock counts exactly that; shared-memory worker
    processes count the other workers' steps begun meanwhile (the same on average; see
    :mod:`hetsgd.engines.common.worker`).

    Where every worker steps again as soon as it has landed, each landing falls in exactly one
    step of each other worker, so the mean over the run is pinned by the counts alone:
    ``(W - 1) (1 - W / (2 N))`` for W workers and N updates, whatever their speeds. What the
    devices' speeds and a simulated mix's jitter change is how the staleness spreads (``max``)
    and how it splits between the groups (``by_group``: a slow accelerator's few updates are
    each stale by many of the hosts')."""

    mean: float
    max: int
    by_group: dict[str, float | None]  # the mean over each group's updates

    @classmethod
    def of(cls, groups: Sequence[str], counters: Sequence[Mapping[str, float]]
           ) -> Staleness | None:
        """From the workers' final counters (``groups``: each worker's); None for a run
        without an update."""
        updates = sum(row["updates"] for row in counters)
        if not updates:
            return None
        stale = by_group(groups, (row["stale_sum"] for row in counters))
        steps = by_group(groups, (row["updates"] for row in counters))
        return cls(sum(stale.values()) / updates, int(max(row["stale_max"] for row in counters)),
                   {g: stale[g] / steps[g] if steps[g] else None for g in stale})



@dataclass(frozen=True)
class Launch(_Record):
    """Where a run's workers ran: ``nodes`` machines with ``ranks_per_node`` workers each (under
    torchrun its nodes and the ranks on rank 0's node; else this machine and every worker of
    the mix), and whether torchrun started them."""

    torchrun: bool
    nodes: int
    ranks_per_node: int

    @classmethod
    def of(cls, launch: Torchrun | None, workers: int) -> Launch:
        if launch is None:
            return cls(torchrun=False, nodes=1, ranks_per_node=workers)
        return cls(torchrun=True, nodes=launch.nodes, ranks_per_node=launch.local_world_size)


@dataclass(frozen=True)
class Timing(_Record):
    """What a run cost around its training, in wall seconds: from the job's start (the
    process's, for the first run of the `hetsgd` command: the interpreter and its imports are
    that run's cost; else the runner's entry, as for a sweep's later jobs or ``hetsgd.run``) to
    the training clock's start,
    its first snapshot; and from the end of training to the summary's last write (evaluation
    and the results files). Figures and the process's exit come after both."""

    before_training_s: float
    after_training_s: float


@dataclass(frozen=True)
class Simulation(_Record):
    """What a simulated run cost in real seconds on this machine
    (:mod:`hetsgd.engines.virtual.cost`): real seconds per virtual second over the first
    ``probed_virtual_s`` of training, the training's real seconds estimated from them, and the
    real seconds it took."""

    real_s_per_virtual_s: float | None
    probed_virtual_s: float
    estimated_real_s: float | None
    real_s: float


#: A run that ends having given back more than this fraction of the drop to its own best
#: training loss has not learnt, however low it once got (a collapse).
GAVE_BACK = 0.5


def learnt_between(first: float, last: float, best: float | None = None) -> bool:
    """Whether a run's training loss went down and stayed down: False where it ended no lower
    than it began, or either is NaN (an untrainable lr or model, or too short a budget), or it
    ended above its own ``best`` by more than :data:`GAVE_BACK` of the drop from ``first`` to
    ``best``."""
    if not last < first:
        return False
    return best is None or not last - best > GAVE_BACK * (first - best)


def by_group(groups: Sequence[str], values: Iterable[float]) -> dict[str, float]:
    """``values`` (one a worker) summed over the workers of each group (``groups``: each
    worker's), every group in the order it first comes; a worker without a value (a snapshot
    row of fewer workers) counts for nothing."""
    sums: dict[str, float] = dict.fromkeys(groups, 0)
    for group, value in zip(groups, values, strict=False):
        sums[group] += value
    return sums


def progress_columns(snapshot: Snapshot, groups: Sequence[str],
                     num_examples: int) -> dict[str, float]:
    """A snapshot's convergence.csv columns known before it is evaluated: its epoch, updates in
    all and of each group, and the method's own numbers (``method_log``, after the others)."""
    row = {"epoch": snapshot.examples / num_examples, "updates": sum(snapshot.updates)}
    row.update({f"updates_{group}": n for group, n in by_group(groups, snapshot.updates).items()})
    return {**row, **snapshot.logged}


def shares(counts: Mapping[str, float]) -> dict[str, float | None]:
    """Each group's share of the counts' total; None for every group when the total is 0."""
    total = sum(counts.values())
    return {group: (n / total if total else None) for group, n in counts.items()}


@dataclass(frozen=True)
class RunSummary:
    """How a run ended and what it measured, in the order the run learns it (and the file lists
    it). Results are None for a run that ended before its first snapshot was evaluated."""

    status: str  # completed, diverged, failed, interrupted, crashed or running
    error: str | None
    algo: str | None
    dataset: str | None
    model: str | None
    devices: str | None
    seed: int | None
    resumed_from: dict[str, Any] | None = None  # the run and the checkpoint it continues
    environment: dict[str, Any] | None = None  # torch, python, CPU model, cores, GPUs, driver
    emulated: bool | None = None
    simulated: bool | None = None  # times are virtual (the virtual clock's), not measured
    # the CUDA workers' matmul precision: fp32, or tf32 (devices.tf32, a deviation from the papers)
    precision: str | None = None
    # devices.cuda_graphs: off, on (CUDA accelerators replay captured steps), or eager and why
    cuda_graphs: str | None = None
    plan: dict[str, Any] | None = None  # what the algorithm settled, and the step taken
    mix: Mix | None = None  # the groups trained on
    launch: Launch | None = None  # nodes, and ranks (workers) per node
    dataset_source: str | None = None
    synthetic: bool | None = None
    scaling: str | None = None  # the feature scaling applied
    # the features: dtype (float32, or int64 for a file's integers kept), count, and a table's
    # columns used, those one-hot encoded (features each), rows left out for a missing value
    features: dict[str, Any] | None = None
    classes: list[str] | None = None  # text labels, in the order numbered
    warnings: list[str] | None = None  # e.g. a coordinator that was not scheduled for a while
    time_s: float | None = None  # training time
    epochs: float | None = None
    examples: int | None = None
    updates: int | None = None
    updates_by_group: dict[str, int] | None = None
    update_share: dict[str, float | None] | None = None
    # asynchronous runs of several workers (Hogwild, Hogbatch, Adaptive): None where no update
    # can be stale, a lone worker's or ranks' that step together (sync, local SGD)
    staleness: Staleness | None = None
    examples_per_s: float | None = None  # None also in a run with no training time
    initial: Losses | None = None
    final: Losses | None = None
    learnt: bool | None = None  # the training loss went down and stayed down (learnt_between)
    target_losses: TargetLosses | None = None
    # seconds and epochs after which the loss stayed at or below each target (keys: the loss, 4
    # significant digits; hetsgd.outputs.metrics.sustained); None where it ended above it
    time_to_loss: dict[str, float | None] | None = None
    epochs_to_loss: dict[str, float | None] | None = None
    unstable_losses: list[str] | None = None  # targets reached, then left (keys as above)
    snapshot_spacing_s: float | None = None  # median seconds between snapshots: the resolution
    # the last value a method logged under each name (hetsgd.engines.method_log)
    method_log: dict[str, float] | None = None
    utilization: dict[str, float | None] | None = None  # the run's own means
    # whether the workers got the CPU they wanted (hetsgd.observe.contention)
    contention: dict[str, Any] | None = None
    timing: Timing | None = None  # the cost around training (a run that trained)
    simulation: Simulation | None = None  # a simulated run's real cost
    extra: dict[str, Any] = field(default_factory=dict)  # every other entry, by its key
    coordinator: dict[str, Any] | None = None  # the process writing it, while it runs
    run_dir: str | None = None  # where the run was written (it may have moved since)

    def __post_init__(self) -> None:
        """``extra`` never stands for the run's own entries (a user's algorithm's go under
        ``plugin``: :mod:`hetsgd.algorithms.watched`); an entry named ``extra`` is one of them,
        written back in its place."""
        clash = set(self.extra) & {f.name for f in dataclasses.fields(self)} - {"extra"}
        if clash:
            raise ValueError(f"summary entries {sorted(clash)} would overwrite the run's own")

    @property
    def cores_sampled(self) -> int | None:
        """The cores the workers' sampled CPU (``workers_cpu_percent``) can come from: the
        mix's, its host groups' alone in a simulated run, whose accelerators are GPU columns
        (counted in both, a lone host worker busy throughout read half busy); under torchrun,
        rank 0's (worker 0's, of the mix's first group), the one process its monitor samples
        (the mix's: half the CPU of two ranks read as a quarter); None where the summary does
        not say."""
        if self.mix is None:
            return None
        if self.launch is not None and self.launch.torchrun:
            first = next(iter(self.mix.groups.values()), None)
            return Mix({"rank0": dataclasses.replace(first, count=1)}).cores if first else None
        return (self.mix.host_cores if self.simulated else self.mix.cores) or None

    @classmethod
    def starting(cls, cfg: RunConfig | DictConfig) -> RunSummary:
        """The summary of a run that has just started: its identity, from its config (the
        composed one or the checked one)."""
        return cls(status=RUNNING, error=None, algo=cfg.algo.name,
                   dataset=dataset_label(cfg.dataset), model=model_label(cfg.model),
                   devices=cfg.devices.name, seed=cfg.seed)

    def to_dict(self) -> dict[str, Any]:
        """What ``summary.json`` holds: each field that is not None, ``extra`` in its place; the
        identity always, and ``examples_per_s`` with the results."""
        written = {*IDENTITY, *(("examples_per_s",) if self.final is not None else ())}
        summary: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "extra":
                summary.update(value)
            elif isinstance(value, Mix):
                summary[f.name] = value.to_dict()
            elif isinstance(value, _Record):
                summary[f.name] = dataclasses.asdict(value)
            elif value is not None or f.name in written:
                summary[f.name] = value
        return summary

    @classmethod
    def from_dict(cls, summary: Mapping[str, Any]) -> RunSummary:
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {key: value for key, value in summary.items() if key in names}
        for key in ("initial", "final"):
            if isinstance(known.get(key), Mapping):
                known[key] = Losses.from_dict(known[key])
        parsers = {"target_losses": TargetLosses.from_dict, "mix": Mix.from_dict,
                   "staleness": Staleness.from_dict, "timing": Timing.from_dict,
                   "launch": Launch.from_dict,
                   "simulation": Simulation.from_dict}
        for key, parse in parsers.items():
            known[key] = parse(known[key]) if isinstance(known.get(key), Mapping) else None
        for key in IDENTITY[1:]:
            known.setdefault(key, None)
        extra = {key: value for key, value in summary.items() if key not in names}
        return cls(**known, extra=extra)

    @classmethod
    def read(cls, run_dir: Path) -> RunSummary:
        """The summary of ``run_dir`` as :func:`read_summary` reads it."""
        return cls.from_dict(read_summary(run_dir))
