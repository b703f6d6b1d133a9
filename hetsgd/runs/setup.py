"""The setup every kind of run shares: the data loaded once, in shared memory, and the problem
it poses to the model."""

from __future__ import annotations

from dataclasses import dataclass

from hetsgd.algorithms.base import Plan
from hetsgd.config import RunConfig
from hetsgd.data import load_dataset
from hetsgd.data.augment import check_augment
from hetsgd.engines.shared_memory.memory import SharedData
from hetsgd.model.problem import Problem


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

    def summary_line(self) -> str:
        """For the log: what the run trains on."""
        return (f"{self.name} ({self.train.num_examples} train / {self.test.num_examples} test, "
                f"{self.problem.num_features} features)")


def load_run_data(cfg: RunConfig, progress: bool) -> RunData:
    dataset = load_dataset(cfg.dataset, cfg.seed, progress=progress)
    check_augment(cfg.data.augment, dataset.image_shape)  # before any worker starts
    return RunData(Problem.of(dataset), SharedData.from_arrays(dataset.x_train, dataset.y_train),
                   SharedData.from_arrays(dataset.x_test, dataset.y_test), dataset.name,
                   dataset.source, dataset.synthetic, dataset.scaling)


@dataclass(frozen=True)
class Handoff:
    """What global rank 0 hands the other torchrun ranks: its plan, or why it has none."""

    plan: Plan | None = None
    error: str | None = None
