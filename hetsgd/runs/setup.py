"""The setup every kind of run shares: the data loaded once, in shared memory, and the problem
it poses to the model."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from hetsgd.algorithms.base import Plan
from hetsgd.config import RunConfig
from hetsgd.data import load_dataset
from hetsgd.data.augment import check_augment
from hetsgd.engines.shared_memory.memory import SharedArena, SharedData
from hetsgd.errors import UserError
from hetsgd.model.problem import Problem
from hetsgd.workers import WorkerSpec


@dataclass
class RunData:
    """A run's training and test sets in shared memory; the loaded arrays are dropped."""

    problem: Problem
    train: SharedData
    test: SharedData
    name: str
    source: str
    synthetic: bool
    scaling: str  # the feature scaling applied (dataset.scale=auto resolved per source)
    # the names of classes 0..C-1 where the data gives them (text labels, image subfolders)
    class_names: tuple[str, ...] | None = None

    def summary_line(self) -> str:
        """For the log: what the run trains on."""
        return (f"{self.name} ({self.train.num_examples} train / {self.test.num_examples} test, "
                f"{self.problem.num_features} features)")


#: A sweep's jobs that load the same data (the dataset config and the seed, which draws the
#: split) share one prepared copy in shared memory; the copies kept total at most this many bytes.
REUSE_BYTES = 1 << 30
_prepared: OrderedDict[str, RunData] = OrderedDict()  # by key, the latest last


def load_run_data(cfg: RunConfig, progress: bool,
                  workers: Sequence[WorkerSpec] = ()) -> RunData:
    """The run's data, prepared straight into shared memory (dense sets are never copied there),
    and checked before any worker starts: the training set must fill the smallest batch of
    ``workers`` (a calibration, which sizes its batches to the data, passes none). A job of a
    sweep takes the copy an earlier job of it prepared of the same data: workers only read it."""
    reuse = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    key = repr((cfg.dataset, cfg.seed))
    data = _prepared.get(key) if reuse else None
    if data is None:
        data = _prepare(cfg, progress)
        if reuse:
            _keep(key, data)
    check_augment(cfg.data.augment, data.problem.image_shape)
    check_fills_a_batch(data.train.num_examples, workers)
    return data


def _prepare(cfg: RunConfig, progress: bool) -> RunData:
    arena = SharedArena()
    dataset = load_dataset(cfg.dataset, cfg.seed, progress=progress, allocate=arena.empty)
    return RunData(Problem.of(dataset), arena.data(dataset.x_train, dataset.y_train),
                   arena.data(dataset.x_test, dataset.y_test), dataset.name,
                   dataset.source, dataset.synthetic, dataset.scaling, dataset.class_names)


def _keep(key: str, data: RunData) -> None:
    """Keep ``data`` for the sweep's later jobs, dropping the oldest copies past REUSE_BYTES."""
    _prepared[key] = data
    while sum(d.train.nbytes + d.test.nbytes for d in _prepared.values()) > REUSE_BYTES:
        _prepared.popitem(last=False)


def check_fills_a_batch(num_train: int, workers: Sequence[WorkerSpec]) -> None:
    """A training set smaller than every worker's batch would be trained on as if it were a
    dataset, and the run would report ``completed``: a UserError instead."""
    if not workers:
        return
    smallest = min(workers, key=lambda spec: spec.batch_size)
    if num_train < smallest.batch_size:
        raise UserError(
            f"the training set has {num_train} example(s), fewer than one batch of group "
            f"'{smallest.group}' ({smallest.batch_size}): train on more data or set "
            f"devices.groups.{smallest.group}.batch_size to at most {num_train}")


@dataclass(frozen=True)
class Handoff:
    """What global rank 0 hands the other torchrun ranks: its plan, or why it has none."""

    plan: Plan | None = None
    error: str | None = None
