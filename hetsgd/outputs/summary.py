"""A run's ``summary.json`` as a typed value, for code that reads runs back (``hetsgd.load``).

The runner writes the file (:mod:`hetsgd.runs.runner`); :func:`hetsgd.outputs.index.read_summary`
reads it, so that a missing, unreadable or orphaned file reads as a failed or crashed run that
says why. :class:`RunSummary` names the fields every run may have; what only some runs have
(an algorithm's own entry such as ``adaptive``, the environment, a resumption) stays in
``extra`` under its key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetsgd.outputs.index import read_summary


@dataclass(frozen=True)
class Losses:
    """Training and test loss, and test accuracy, of one snapshot."""

    train_loss: float
    test_loss: float
    test_acc: float


@dataclass(frozen=True)
class RunSummary:
    """How a run ended and what it measured. Results are None (or empty) for a run that ended
    before its first snapshot was evaluated."""

    status: str  # completed, diverged, failed, interrupted, crashed or running
    error: str | None
    algo: str | None
    dataset: str | None
    model: str | None
    devices: str | None
    seed: int | None
    emulated: bool = False
    simulated: bool = False  # times are virtual (the virtual clock's), not measured
    time_s: float | None = None  # training time
    epochs: float | None = None
    examples: int | None = None
    updates: int | None = None
    updates_by_group: dict[str, int] = field(default_factory=dict)
    update_share: dict[str, float | None] = field(default_factory=dict)
    examples_per_s: float | None = None
    initial: Losses | None = None
    final: Losses | None = None
    # seconds and epochs to each target training loss (keys: the loss, 4 significant digits)
    time_to_loss: dict[str, float | None] = field(default_factory=dict)
    epochs_to_loss: dict[str, float | None] = field(default_factory=dict)
    utilization: dict[str, float | None] = field(default_factory=dict)
    plan: dict[str, Any] = field(default_factory=dict)  # what the algorithm settled
    mix: dict[str, dict[str, Any]] = field(default_factory=dict)  # the groups trained on
    warnings: list[str] = field(default_factory=list)
    run_dir: str | None = None  # where the run was written (it may have moved since)
    extra: dict[str, Any] = field(default_factory=dict)  # every other entry, by its key

    @classmethod
    def from_dict(cls, summary: dict[str, Any]) -> RunSummary:
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {key: value for key, value in summary.items() if key in names}
        for key in ("initial", "final"):
            if isinstance(known.get(key), dict):
                known[key] = Losses(**{k: known[key].get(k) for k in ("train_loss", "test_loss",
                                                                       "test_acc")})
        for key in ("error", "algo", "dataset", "model", "devices", "seed"):
            known.setdefault(key, None)
        extra = {key: value for key, value in summary.items() if key not in names}
        return cls(**known, extra=extra)

    @classmethod
    def read(cls, run_dir: Path) -> RunSummary:
        """The summary of ``run_dir`` as :func:`read_summary` reads it."""
        return cls.from_dict(read_summary(run_dir))
