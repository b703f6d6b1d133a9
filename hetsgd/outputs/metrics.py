"""Loss targets and the time to reach them: one definition for summaries, reports and plots.

A run's summary records when its loss reached stated *absolute* losses and stayed there
(:func:`time_to_losses`); normalizing by the best loss of a comparison (:func:`normalized_loss`)
happens only in reports, where that best loss is known.

The time to a target is the *sustained* one: the time after which the raw curve (every snapshot,
no smoothing) stays at or beyond the target to the run's end (:func:`sustained`). A run that
reached a target and then left it (a collapse, a divergence) has no time to it: it is
``unstable`` at that target, and no speedup credits it. The curve is the held-out (test) loss
where the run evaluates one, else the training loss (:func:`timed_loss`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

TARGETS = (0.9, 0.95, 0.99)  # normalized-loss targets of a comparison (reports, figures)
# Without eval.target_losses, a run's absolute targets are these fractions of its initial loss
# (of the curve it is timed on): the seeded initial model is the same for every algorithm and
# device mix of a comparison, so every run of one seed is timed to the same losses.
INITIAL_LOSS_FRACTIONS = (0.5, 0.2, 0.1)
#: The convergence.csv columns a run can be timed on, preferred first.
TIMED_LOSSES = ("test_loss", "train_loss")


def normalized_loss(loss: pd.Series, l0: float, l_best: float | None) -> pd.Series:
    """(L0 - L) / (L0 - L_best); NaN where the loss is not finite (a diverged run), and
    everywhere when L_best is not below L0."""
    span = math.nan if l_best is None else l0 - l_best
    if not span > 0:
        return pd.Series(np.nan, index=loss.index)
    return ((l0 - loss) / span).where(np.isfinite(loss))


def _interpolated(xs: np.ndarray, ys: np.ndarray, i: int, target: float) -> float:
    """The x where the segment from snapshot ``i - 1`` to ``i`` meets ``target`` (snapshot
    ``i``'s x where the one before has no value)."""
    if i == 0 or not np.isfinite(ys[i - 1]):
        return float(xs[i])
    return float(xs[i - 1] + (target - ys[i - 1]) * (xs[i] - xs[i - 1]) / (ys[i] - ys[i - 1]))


def crossing(x: Sequence[float] | pd.Series, y: Sequence[float] | pd.Series,
             target: float) -> float | None:
    """Where ``y`` first reaches ``target``, as an ``x`` interpolated between the snapshots
    around the crossing; None when it never does."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    hits = np.flatnonzero(ys >= target)
    return None if not hits.size else _interpolated(xs, ys, int(hits[0]), target)


@dataclass(frozen=True)
class Reach:
    """How a curve met a target: ``time`` after which it stays at or beyond the target to its
    end (None when it ends short of it), and ``first``, where it first got there."""

    time: float | None
    first: float | None

    @property
    def unstable(self) -> bool:
        """Reached the target, then left it for good: not credited."""
        return self.first is not None and self.time is None


def sustained(x: Sequence[float] | pd.Series, y: Sequence[float] | pd.Series,
              target: float) -> Reach:
    """When ``y`` (higher is better) reached ``target`` for good: interpolated between the last
    snapshot short of it (a NaN counts as short) and the next; a curve whose last snapshot is
    short of it has no time, however early it touched the target."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    first = crossing(xs, ys, target)
    short = np.flatnonzero(~(ys >= target))
    if not len(ys) or (short.size and short[-1] == len(ys) - 1):
        return Reach(None, first)
    return Reach(_interpolated(xs, ys, int(short[-1]) + 1 if short.size else 0, target), first)


def snapshot_spacing(x: Sequence[float] | pd.Series) -> float | None:
    """The median gap between snapshots: a time read between two of them is known to about
    this much. None for a curve of fewer than two snapshots."""
    gaps = np.diff(np.asarray(x, dtype=float))
    return float(np.median(gaps)) if gaps.size else None


def timed_loss(convergence: pd.DataFrame) -> str:
    """The column a run is timed on: the test loss where the run evaluated one (a finite value
    in ``test_loss``), else the training loss."""
    return next((c for c in TIMED_LOSSES[:-1] if c in convergence
                 and np.isfinite(pd.to_numeric(convergence[c], errors="coerce")).any()),
                TIMED_LOSSES[-1])


def loss_name(column: str) -> str:
    """``test_loss`` -> ``test loss``, ``train_loss`` -> ``training loss``."""
    return {"train_loss": "training loss"}.get(column, column.replace("_", " "))


def target_losses(stated: Sequence[float], initial_loss: float,
                  column: str = "train_loss") -> tuple[list[float], str]:
    """The absolute losses (of ``column``) a run is timed to, and what they are relative to."""
    if stated:
        return sorted(stated, reverse=True), "eval.target_losses"
    fractions = " / ".join(f"{f:g}" for f in INITIAL_LOSS_FRACTIONS)
    return ([f * initial_loss for f in INITIAL_LOSS_FRACTIONS],
            f"{fractions} x the initial {loss_name(column)}")


def loss_key(loss: float) -> str:
    """A target loss as a summary.json key."""
    return f"{loss:.4g}"


def reaches(x: Sequence[float] | pd.Series, loss: Sequence[float] | pd.Series,
            targets: Sequence[float]) -> dict[str, Reach]:
    """{"0.1152": how the loss reached 0.1152, ...}; x is time or epochs."""
    falling = -np.asarray(loss, dtype=float)
    return {loss_key(t): sustained(x, falling, -t) for t in targets}


def time_to_losses(x: Sequence[float] | pd.Series, loss: Sequence[float] | pd.Series,
                   targets: Sequence[float]) -> dict[str, float | None]:
    """{"0.1152": x after which the loss stayed at or below 0.1152, ...}; None where it ended
    above it."""
    return {key: reach.time for key, reach in reaches(x, loss, targets).items()}
