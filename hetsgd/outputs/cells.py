"""Times and speedups as every table shows them: ``mean [low, high] n=k``.

The intervals come from :mod:`hetsgd.outputs.intervals`; this module only writes them, so the
report, the paper table and the reproduction scripts print one format.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from hetsgd.outputs.intervals import Interval, mean_interval


def bracket(low: float, high: float, fmt: str) -> str:
    """``[low, high]``; empty where the interval is unknown (NaN)."""
    return f"[{low:{fmt}}, {high:{fmt}}]" if math.isfinite(low) and math.isfinite(high) else ""


def cell(mean: float, interval: Interval | None, n: int, fmt: str, of: int | None = None,
         unit: str = "") -> str:
    """A time or a speedup as every table shows one: ``mean [low, high] n=k``, ``n=k/m`` where
    only k of m runs count; no interval where there is none (one run) or it is unknown."""
    spread = "" if interval is None else bracket(*interval, fmt)
    counted = f"n={n}" + (f"/{of}" if of is not None and n < of else "")
    return " ".join(part for part in (f"{mean:{fmt}}{unit}", spread, counted) if part)


def mean_cell(values: Sequence[float | None], fmt: str, of: int | None = None,
              unit: str = "", at_least: float = 0.0) -> str:
    """:func:`cell` of the values that exist (None or NaN: a run without one), ``n=k/m`` with m
    ``of`` runs (all the values by default); a dash where none exists. The interval is cut at
    ``at_least``: by default 0, below which no time or epoch count is."""
    present = [v for v in values if v is not None and math.isfinite(v)]
    if not present:
        return "—"
    return cell(statistics.fmean(present), mean_interval(present, at_least), len(present), fmt,
                len(values) if of is None else of, unit)
