"""How long a training step takes: one measuring loop for calibration and for the ranks that
set their share of the work from measured speed."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from hetsgd.workers import WorkerSpec


@dataclass(frozen=True)
class StepTimer:
    """Untimed warm-up steps first, then timed ones until there are at least ``min_steps`` of
    them and ``min_seconds`` of wall time have passed since the first began, or until
    ``max_steps``. Wall time, not the steps' sum: a caller waiting for the measurement (the
    calibration) can bound its wait by ``min_seconds``, however much a step's loop adds."""

    warmup: int
    min_steps: int
    min_seconds: float
    max_steps: float = math.inf

    def times(self, step: Callable[[int], None], spec: WorkerSpec) -> list[float]:
        """Wall seconds of each timed call of ``step(i)`` (``i`` counts every call), the emulated
        slowdown's sleep included: an emulated worker sleeps after each step as in training,
        since a step that follows a sleep runs slower than one in a tight loop."""
        timed: list[float] = []
        calls, began = 0, math.inf  # began: when the first timed step did
        while len(timed) < self.max_steps and (
                len(timed) < self.min_steps or time.perf_counter() - began < self.min_seconds):
            started = time.perf_counter()
            step(calls)
            spec.emulate(time.perf_counter() - started)
            if calls >= self.warmup:
                began = min(began, started)
                timed.append(time.perf_counter() - started)
            calls += 1
        return timed
