"""The setup every kind of run shares: the data loaded once, in shared memory, and the problem
it poses to the model."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from hetsgd.algorithms.base import Plan
from hetsgd.config import RunConfig
from hetsgd.config.plain import config_from_plain, config_to_plain, plain
from hetsgd.data import load_dataset
from hetsgd.data.augment import check_augment
from hetsgd.data.columns import listing
from hetsgd.data.registry import data_seed
from hetsgd.engines.common.memory import SharedArena, SharedData
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
    table: dict[str, Any] | None = None  # a table's columns and encoding (Dataset.table)

    @property
    def features(self) -> dict[str, Any]:
        """What the features are, for summary.json: their dtype and count, and a table's
        columns and encoding."""
        return {"dtype": self.problem.features_dtype, "count": self.problem.num_features,
                **(self.table or {})}

    def summary_line(self) -> str:
        """For the log: what the run trains on."""
        table = self.table or {}
        notes = ["int64, unscaled"] if self.problem.features_dtype == "int64" else []
        if one_hot := table.get("one_hot"):
            notes.append(f"one-hot {listing([f'{n}: {w}' for n, w in one_hot.items()])}")
        if table.get("rows_dropped"):
            notes.append(f"{table['rows_dropped']} row(s) with a missing value left out")
        return (f"{self.name} ({self.train.num_examples} train / {self.test.num_examples} test, "
                f"{self.problem.num_features} features{''.join('; ' + n for n in notes)})")


#: A sweep's jobs that load the same data (the dataset config and the seed that draws its split,
#: ``dataset.split_seed``, fixed by default whatever the run's seed) share one prepared copy in
#: shared memory. Each copy holds a file descriptor per array
#: for as long as it is kept, so the copies kept are bounded by count as well as by bytes: a
#: sweep over methods and a few seeds finds each seed's copy again, and a sweep of any length
#: holds at most REUSE_COPIES of them.
REUSE_BYTES = 1 << 30
REUSE_COPIES = 4


class Prepared:
    """The copies one sweep's jobs prepared, the latest used last. A copy dropped is released
    with its last reference (the engine's ended with the job that used it): torch closes the
    descriptor of each shared array, whose file was unlinked when it was made."""

    def __init__(self) -> None:
        self.sweep: str | None = None  # the sweep folder whose jobs prepared the copies
        self.copies: OrderedDict[str, RunData] = OrderedDict()

    def get(self, sweep: str, key: str) -> RunData | None:
        if sweep != self.sweep:  # a later sweep in this process (tests, notebooks)
            self.sweep, self.copies = sweep, OrderedDict()
        data = self.copies.get(key)
        if data is not None:
            self.copies.move_to_end(key)
        return data

    def keep(self, key: str, data: RunData) -> None:
        """Keep ``data``, dropping the least recently used copies past either bound."""
        self.copies[key] = data
        while len(self.copies) > REUSE_COPIES or sum(
                d.train.nbytes + d.test.nbytes for d in self.copies.values()) > REUSE_BYTES:
            self.copies.popitem(last=False)


_prepared = Prepared()


def load_run_data(cfg: RunConfig, progress: bool,
                  workers: Sequence[WorkerSpec] = ()) -> RunData:
    """The run's data, prepared straight into shared memory (dense sets are never copied there),
    and checked before any worker starts: the training set must fill the smallest batch of
    ``workers`` (a calibration, which sizes its batches to the data, passes none). A job of a
    sweep takes the copy an earlier job of it prepared of the same data: workers only read it."""
    sweep = (str(HydraConfig.get().sweep.dir) if HydraConfig.initialized()
             and HydraConfig.get().mode == RunMode.MULTIRUN else None)
    key = repr((cfg.dataset, data_seed(cfg.dataset, cfg.seed), takes_integers(cfg)))
    data = _prepared.get(sweep, key) if sweep is not None else None
    if data is None:
        data = _prepare(cfg, progress)
        if sweep is not None:
            _prepared.keep(key, data)
    check_augment(cfg.data.augment, data.problem.image_shape)
    check_fills_a_batch(data.train.num_examples, workers)
    return data


def takes_integers(cfg: RunConfig) -> bool:
    """Whether the run's model may take integer features as they are: a user's own may (an
    ``nn.Embedding`` of token ids); the built-in ones multiply their input, as float32."""
    return cfg.model.name == "custom"


def _prepare(cfg: RunConfig, progress: bool) -> RunData:
    arena = SharedArena()
    dataset = load_dataset(cfg.dataset, cfg.seed, progress=progress, allocate=arena.empty,
                           integers=takes_integers(cfg))
    return RunData(Problem.of(dataset), arena.data(dataset.x_train, dataset.y_train),
                   arena.data(dataset.x_test, dataset.y_test), dataset.name,
                   dataset.source, dataset.synthetic, dataset.scaling, dataset.class_names,
                   dataset.table)


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
    """What global rank 0 hands the other torchrun ranks: its plan, or why it has none. It
    travels as plain data (:mod:`hetsgd.engines.ranks.handoff`), rebuilt by the schemas."""

    plan: Plan | None = None
    error: str | None = None

    def to_plain(self) -> dict[str, Any]:
        plan = self.plan
        return {"error": self.error, "plan": None if plan is None else {
            "cfg": config_to_plain(plan.cfg), "workers": plain(plan.workers),
            "settled": plain(plan.settled)}}

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> Handoff:
        """The hand-off :meth:`to_plain` gave; anything else is a one-line UserError."""
        try:
            error, plan = data["error"], data["plan"]
            if plan is None:
                return cls(error=str(error))
            if not isinstance(plan["settled"], dict):
                raise TypeError("its settled values are not a mapping")
            return cls(plan=Plan(config_from_plain(plan["cfg"]),
                                 [_worker(spec) for spec in plan["workers"]], plan["settled"]))
        except (KeyError, TypeError, ValueError) as err:  # ConfigError included
            raise UserError(f"rank 0's hand-off is not a plan: {err}".splitlines()[0]) from err


#: The types a WorkerSpec's fields take in JSON, by their annotation.
_JSON_TYPES: dict[str, type | tuple[type, ...]] = {"int": int, "str": str, "bool": bool,
                                                    "float": (int, float)}


def _worker(spec: Any) -> WorkerSpec:
    """A worker of a hand-off: its fields only, each of its own type."""
    types = {f.name: _JSON_TYPES.get(str(f.type), object) for f in dataclasses.fields(WorkerSpec)}
    if not isinstance(spec, dict) or not set(spec) <= set(types) or not all(
            isinstance(value, types[name]) for name, value in spec.items()):
        raise TypeError(f"not a worker: {str(spec)[:80]}")
    return WorkerSpec(**spec)
