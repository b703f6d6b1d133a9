"""Normalized loss and time-to-target: one definition for summaries, reports and plots."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

TARGETS = (0.9, 0.95, 0.99)


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


def time_to_targets(x: Sequence[float] | pd.Series, normalized: Sequence[float] | pd.Series,
                    targets: Sequence[float] = TARGETS) -> dict[str, float | None]:
    """{"0.9": x at which the normalized loss first reaches 0.9, ...}; x is time or epochs."""
    return {str(t): crossing(x, normalized, t) for t in targets}
