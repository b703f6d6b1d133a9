"""What a simulated run costs in real seconds, measured from its first steps.

Every update of a simulated mix runs for real on this machine, in turn, so a virtual second can
cost seconds or many minutes here (48 one-example workers step 48 times where one worker of the
paper's machine waits once). The virtual engines call their periodic duties at known virtual
times (every ``TICK_S``, or at each exchange of the ranks): :class:`CostProbe` sits in that
callback and reads the wall clock from the first call to the first one at least ``PROBE_S``
virtual seconds later, or ``PROBE_SHARE`` of a shorter budget's seconds or epochs later.
Timing that window, rather than the run from its start, leaves out the setup and the first
steps' one-off costs, while it still runs each worker's step many times. From it the whole run
is estimated: its budget's virtual seconds, or the virtual time its epoch budget takes at the
window's pace, whichever ends first. Evaluating the snapshots afterwards is not included.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from hetsgd.config.schema import BudgetConfig
from hetsgd.durations import duration
from hetsgd.engines.counters import WorkerCounters
from hetsgd.engines.training import OnTick

log = logging.getLogger("hetsgd")

PROBE_S = 0.01  # the virtual seconds timed before the estimate is made
PROBE_SHARE = 0.1  # of a budget too short for PROBE_S


class CostProbe:
    """Times the first ``PROBE_S`` virtual seconds after the first tick (or the first
    ``PROBE_SHARE`` of a shorter budget), logs the estimate of the run's real cost once, and
    from then on passes each tick to ``on_tick`` (the progress display, whose first line so
    follows the estimate's); a run too short for that says what it took once it ends."""

    def __init__(self, budget: BudgetConfig, num_examples: int, on_tick: OnTick | None) -> None:
        self.budget, self.num_examples, self.on_tick = budget, num_examples, on_tick
        self.origin: tuple[float, float, float] | None = None  # virtual s, wall s, epochs
        self.estimate: dict[str, float | None] | None = None
        self.started = time.perf_counter()

    def tick(self, elapsed: float, counters: WorkerCounters) -> None:
        wall = time.perf_counter()
        epochs = float(counters.column("examples").sum()) / self.num_examples
        if self.origin is None:
            self.origin = (elapsed, wall, epochs)
        elif self.estimate is None and self._probed(elapsed - self.origin[0],
                                                    epochs - self.origin[2]):
            self.estimate = self._estimate(elapsed, wall, epochs)
            log.info("simulated run: %.3g real s per virtual s (over %.3g virtual s); its "
                     "training should take about %s here, evaluation aside",
                     self.estimate["real_s_per_virtual_s"], self.estimate["probed_virtual_s"],
                     _duration(self.estimate["estimated_real_s"]))
        if self.on_tick is not None and self.estimate is not None:
            self.on_tick(elapsed, counters)

    def _probed(self, window_s: float, epochs: float) -> bool:
        """Whether ``window_s`` virtual seconds that trained ``epochs`` are enough to time."""
        seconds, budget_epochs = self.budget.seconds, self.budget.epochs
        return window_s > 0 and (
            window_s >= PROBE_S or (seconds is not None and window_s >= PROBE_SHARE * seconds)
            or (budget_epochs is not None and epochs >= PROBE_SHARE * budget_epochs))

    def _estimate(self, elapsed: float, wall: float, epochs: float) -> dict[str, float | None]:
        assert self.origin is not None
        virtual, start_wall, start_epochs = self.origin
        window = elapsed - virtual
        ratio = (wall - start_wall) / window
        ends = [] if self.budget.seconds is None else [self.budget.seconds]
        if self.budget.epochs is not None and epochs > start_epochs:
            ends.append(elapsed + (self.budget.epochs - epochs) * window / (epochs - start_epochs))
        until = min(ends, default=math.inf)  # an epoch budget that the window did not advance
        return {"real_s_per_virtual_s": ratio, "probed_virtual_s": window,
                "estimated_real_s": (wall - self.started) + ratio * max(until - elapsed, 0.0)
                if math.isfinite(until) else None}

    def measured(self, virtual_s: float) -> dict[str, Any]:
        """What ``summary.json`` says of the run's cost once it has trained ``virtual_s``: the
        estimate (from the whole run, where it ended before the probe's window), and the real
        seconds training took."""
        real_s = time.perf_counter() - self.started
        if self.estimate is not None:
            return {**self.estimate, "real_s": real_s}
        ratio = real_s / virtual_s if virtual_s > 0 else None
        log.info("simulated run: its training took %.3g real s (%s real s per virtual s), "
                 "too short to estimate", real_s, "an unknown number of" if ratio is None
                 else f"{ratio:.3g}")
        return {"real_s_per_virtual_s": ratio, "probed_virtual_s": virtual_s,
                "estimated_real_s": real_s, "real_s": real_s}


def _duration(seconds: float | None) -> str:
    """The estimate as a person reads it (:func:`duration`), or why there is none."""
    if seconds is None:
        return "an unknown time (its epoch budget has not advanced yet)"
    return duration(seconds)
