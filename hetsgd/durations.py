"""A duration as a person reads it, for the lines the command prints (a simulated run's estimate,
a sweep's time left): below every layer, so that an engine and the outputs both say it alike
without the outputs loading an engine (and torch with it)."""

from __future__ import annotations


def duration(seconds: float) -> str:
    """``seconds`` as a person reads a duration: 45 s, 12 min, 3.2 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"
