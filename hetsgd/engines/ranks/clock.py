"""Where a rank's time comes from: the wall clock, or the virtual clock of a simulated mix.

A rank loop reads ``now()`` around its work and says when it has computed a step
(``computed``); on the wall clock the time has simply passed, on a virtual clock
(:mod:`hetsgd.engines.virtual.group`) the device profile's time passes then. The group holds its
rank's clock (``Group.clock``), so a loop, its exchange and its speed measurement read time
through one object whatever the engine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any, Protocol

from hetsgd.engines.step_timing import StepTimer
from hetsgd.workers import WorkerSpec

# A rank's speed measurement before training; the median of the timed steps is its step time.
SPEED_TIMER = StepTimer(warmup=2, min_steps=5, min_seconds=0.3, max_steps=200)


class RankClock(Protocol):
    def now(self) -> float:
        """Seconds on this rank's clock."""
        ...

    def computed(self, batch_size: int) -> None:
        """This rank has just computed a step of ``batch_size`` examples."""
        ...

    def out_of_time(self) -> bool:
        """Whether this rank's clock has passed the time budget (a virtual clock's own; on the
        wall clock the coordinator ends training through its stop flag)."""
        ...

    def step_seconds(self, step: Callable[[int], None], spec: WorkerSpec, batch_size: int
                     ) -> float:
        """Seconds of one training step of ``batch_size`` on this rank's device; ``step(i)``
        takes the i-th throwaway step where it is measured."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this clock (a virtual clock's time and its draws)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A resumed run's clock, as :meth:`state_dict` left it."""
        ...


class WallClock:
    """The real engines' clock."""

    def now(self) -> float:
        return time.perf_counter()

    def computed(self, batch_size: int) -> None:
        return None  # the time has passed by itself

    def out_of_time(self) -> bool:
        return False

    def step_seconds(self, step: Callable[[int], None], spec: WorkerSpec, batch_size: int
                     ) -> float:
        """Measured: the median of a few timed steps, the emulated slowdown included."""
        return statistics.median(SPEED_TIMER.times(step, spec))

    def state_dict(self) -> dict[str, Any]:
        return {}  # the coordinator continues the wall clock from the checkpoint's time

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None
