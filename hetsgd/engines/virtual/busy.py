"""Each simulated device's busy time on the virtual clock, sampled into utilization rows.

A simulated worker is busy while it computes; while its replica is copied to or from the host,
the device waits for the link. Rows use the real monitor's columns, so the run's tables and
figures read them unchanged: host workers add up to ``workers_cpu_percent`` (100 = one core
busy; a busy worker of t threads keeps t cores busy), and accelerator worker ``k`` (k-th among
the accelerators) is ``gpu<k>_util``.
"""

from __future__ import annotations

from hetsgd.workers import WorkerSpec


class BusyTime:
    """Busy seconds per worker up to any virtual time, from the compute interval of every step.

    A worker computes one step at a time, so its busy time up to ``t`` is the compute of its
    finished steps plus the part of its current step's compute that lies before ``t``.
    """

    def __init__(self, specs: list[WorkerSpec]) -> None:
        self.specs = specs
        self.finished = [0.0] * len(specs)
        self.current = [(0.0, 0.0)] * len(specs)  # (start, end) of each worker's latest compute
        self.columns = self._columns(specs)
        self.last_time = 0.0
        self.sampled = False  # none yet in this session (a resumed one's starts past 0)
        self.last_busy = [0.0] * len(specs)

    @staticmethod
    def _columns(specs: list[WorkerSpec]) -> list[str]:
        accel = [s.rank for s in specs if s.accel]
        return [f"gpu{accel.index(s.rank)}_util" if s.accel else "workers_cpu_percent"
                for s in specs]

    def compute(self, rank: int, start: float, end: float) -> None:
        """Worker ``rank`` computes from ``start`` to ``end`` (after its previous compute)."""
        begun, ended = self.current[rank]
        self.finished[rank] += ended - begun
        self.current[rank] = (start, end)

    def busy(self, rank: int, time_s: float) -> float:
        begun, ended = self.current[rank]
        return self.finished[rank] + min(max(time_s - begun, 0.0), ended - begun)

    def due(self, time_s: float, interval_s: float, closing: bool = False) -> bool:
        """Whether a sample is due at ``time_s``: every ``interval_s``; at the end of training
        (``closing``) for what is left since the last one, unless that is under half an
        interval, which would weigh as much as a whole one in the run's mean."""
        if closing:
            return time_s - self.last_time >= interval_s / 2 or not self.sampled
        return time_s >= self.last_time + interval_s

    def sample(self, time_s: float) -> dict[str, float]:
        """A utilization row for the interval since the previous sample, in percent."""
        span = time_s - self.last_time
        row = {"time_s": time_s, **{column: 0.0 for column in self.columns}}
        for spec, column in zip(self.specs, self.columns):
            busy = self.busy(spec.rank, time_s)
            cores = 1 if spec.accel else spec.threads
            row[column] += 100.0 * cores * (busy - self.last_busy[spec.rank]) / span if span else 0.0
            self.last_busy[spec.rank] = busy
        self.last_time, self.sampled = time_s, True
        return row
