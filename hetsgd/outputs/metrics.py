"""Loss targets and the time to reach them: one definition for summaries, reports and plots.

A run's summary records when its training loss first reached stated *absolute* losses
(:func:`time_to_losses`); normalizing by the best loss of a comparison (:func:`normalized_loss`)
happens only in reports, where that best loss is known.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

TARGETS = (0.9, 0.95, 0.99)  # normalized-loss targets of a comparison (reports, figures)
# Without eval.target_losses, a run's absolute targets are these fractions of its initial
# training loss: the seeded initial model is the same for every algorithm and device mix of a
# comparison, so every run of one seed is timed to the same losses.
INITIAL_LOSS_FRACTIONS = (0.5, 0.2, 0.1)


def normalized_loss(loss: pd.Series, l0: float, l_best: float | None) -> pd.Series:
    """(L0 - L) / (L0 - L_best); NaN where the loss is not finite (a diverged run), and
    everywhere when L_best is not below L0."""
    span = math.nan if l_best is None else l0 - l_best
    if not span > 0:
        return pd.Series(np.nan, index=loss.index)
    return ((l0 - loss) / span).where(np.isfinite(loss))


def crossing(x: Sequence[float] | pd.Series, y: Sequence[float] | pd.Series,
             target: float) -> float | None:
    """Where ``y`` first reaches ``target``, as an ``x`` interpolated between the snapshots
    around the crossing; None when it never does."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    hits = np.flatnonzero(ys >= target)
    if not hits.size:
        return None
    i = int(hits[0])
    if i == 0 or not np.isfinite(ys[i - 1]):
        return float(xs[i])
    return float(xs[i - 1] + (target - ys[i - 1]) * (xs[i] - xs[i - 1]) / (ys[i] - ys[i - 1]))


def target_losses(stated: Sequence[float], initial_loss: float) -> tuple[list[float], str]:
    """The absolute training losses a run is timed to, and what they are relative to."""
    if stated:
        return sorted(stated, reverse=True), "eval.target_losses"
    fractions = " / ".join(f"{f:g}" for f in INITIAL_LOSS_FRACTIONS)
    return ([f * initial_loss for f in INITIAL_LOSS_FRACTIONS],
            f"{fractions} x the initial training loss")


def loss_key(loss: float) -> str:
    """A target loss as a summary.json key."""
    return f"{loss:.4g}"


def time_to_losses(x: Sequence[float] | pd.Series, loss: Sequence[float] | pd.Series,
                   targets: Sequence[float]) -> dict[str, float | None]:
    """{"0.1152": x at which the loss first fell to 0.1152, ...}; x is time or epochs; None
    where it never did."""
    falling = -np.asarray(loss, dtype=float)
    return {loss_key(t): crossing(x, falling, -t) for t in targets}
