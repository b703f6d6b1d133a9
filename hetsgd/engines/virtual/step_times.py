"""A simulated worker's step times: the one place both virtual engines take them from.

A step takes its device profile's time for its batch size, times its group's ``slowdown``, times
a factor of its own, drawn for the step: a group's ``jitter`` is that factor's relative spread
(its coefficient of variation). Without it, identical simulated workers step in lockstep: on the
48 one-example workers of ``paper_hogbatch_v100`` every Hogwild update lands exactly 47 updates
stale, which no real host does (its scheduler, caches and memory bus spread the steps).

The factor is lognormal with mean 1, so a group's throughput is unchanged on average: with
``s = jitter``, ``log factor ~ Normal(-sigma^2 / 2, sigma^2)`` and ``sigma^2 = log(1 + s^2)``, so
that ``E[factor] = 1`` and ``std(factor) = s``. Lognormal because a step cannot take negative
time and step times are skewed toward long ones; the shape is the project's choice, no paper
gives one. Each worker draws from its own stream, seeded by the run's seed and its rank, so the
same seed gives the same run, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from hetsgd.config import RunConfig
from hetsgd.engines.virtual.profiles import DeviceProfile
from hetsgd.workers import WorkerSpec

JITTER_STREAM = 0x6A177E4  # keeps the jitter's streams apart from the run's other seeded ones


class StepTimes:
    """Worker ``spec``'s step times on ``profile``: :meth:`step` for each step it takes."""

    def __init__(self, profile: DeviceProfile, spec: WorkerSpec, cfg: RunConfig) -> None:
        self.profile, self.slowdown = profile, spec.slowdown
        jitter = cfg.devices.groups[spec.group].jitter
        self.sigma = math.sqrt(math.log1p(jitter ** 2))
        self.rng = (np.random.default_rng((JITTER_STREAM, cfg.seed, spec.rank))
                    if jitter > 0 else None)
        self.draws = 0  # factors drawn so far: where a resumed run's stream continues

    def factor(self) -> float:
        """The next step's jitter factor (1 without jitter, and no draw)."""
        if self.rng is None:
            return 1.0
        self.draws += 1
        return float(self.rng.lognormal(-self.sigma ** 2 / 2, self.sigma))

    def skip(self, draws: int) -> None:
        """Draw ``draws`` factors unused: a resumed run's stream continues the checkpoint's."""
        for _ in range(draws):
            self.factor()

    def step(self, batch_size: int, copies: int = 0) -> tuple[float, float]:
        """One step's seconds of compute and of ``copies`` copies of the model, both spread by
        the step's factor (the whole step's time varies)."""
        scale = self.slowdown * self.factor()
        return (self.profile.compute_s(batch_size) * scale,
                copies * self.profile.copy_s() * scale)

    def mean_compute_s(self, batch_size: int) -> float:
        """A step's compute time on average: what a rank that times its steps instead of
        running them (``tau: auto``, a proportional split) takes, drawing nothing."""
        return self.profile.compute_s(batch_size) * self.slowdown

    def copy_s(self) -> float:
        """One copy of the model over the device's link, on average (a collective's cost)."""
        return self.profile.copy_s() * self.slowdown


def step_times(cfg: RunConfig, specs: list[WorkerSpec], profiles: list[DeviceProfile]
               ) -> list[StepTimes]:
    """Every worker's step times, by rank (``profiles``: one a worker)."""
    return [StepTimes(profiles[spec.rank], spec, cfg) for spec in specs]
