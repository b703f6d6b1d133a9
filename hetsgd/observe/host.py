"""How busy the host was around a block of work: its cores' busy and steal time, its CPU pressure,
the CPU this process's own tree used and how long its threads waited for a CPU, read at the
block's two ends.

A run (:mod:`hetsgd.observe.contention`) and the bench (``scripts/bench/load.py``) both read
the host this way: what the host's cores were busy with beyond this process tree was someone
else's, and steal is the hypervisor's (a noisy neighbour on a VM). Each reading is a few files
of ``/proc``, so the two ends cost nothing the block would notice.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import psutil

from hetsgd.engines.common.run_queue import waited_s, waits

PRESSURE = "/proc/pressure/cpu"
# what the kernel counts as a core's busy time (guest time is inside user's)
BUSY = ("user", "nice", "system", "irq", "softirq")


def tree_cpu_s(root: psutil.Process | None = None) -> float:
    """CPU seconds of a process tree (this process's by default): the process, the children it
    reaped, and every live descendant with what it reaped in turn (workers forked from a
    forkserver are its children, not the coordinator's, and are counted once it reaps them)."""
    total = 0.0
    root = root or psutil.Process()
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


def cpu_pressure(path: str = PRESSURE) -> tuple[float, float] | None:
    """The ``some`` line of the kernel's CPU pressure stall information: (``avg10``, the share
    of the last 10 s in which some runnable task waited for a CPU, in percent; ``total``, the
    microseconds of such waiting since boot); None where the kernel does not expose it (not
    Linux, older than 4.20, or booted with ``psi=0``)."""
    try:
        with open(path) as f:
            for line in f:
                kind, *fields = line.split()
                if kind == "some":
                    values = dict(field.split("=", 1) for field in fields)
                    return float(values["avg10"]), float(values["total"])
    except (OSError, ValueError, KeyError):
        return None
    return None


@dataclass(frozen=True)
class HostReading:
    """The host's counters at one moment, in seconds (but the pressure's)."""

    wall_s: float  # time.perf_counter()
    busy_s: float  # every core's busy time
    steal_s: float | None  # None where the OS does not count it
    tree_s: float  # this process tree's CPU time (tree_cpu_s)
    own_s: float  # this process's own CPU time, every thread's
    pressure: tuple[float, float] | None  # cpu_pressure()
    own_waits: dict[str, int] | None = None  # this process's threads' run-queue delay (waits())

    @classmethod
    def now(cls) -> HostReading:
        cpu = psutil.cpu_times()
        own = psutil.Process().cpu_times()
        steal = getattr(cpu, "steal", None)
        return cls(time.perf_counter(), sum(getattr(cpu, name, 0.0) for name in BUSY),
                   None if steal is None else float(steal), tree_cpu_s(), own.user + own.system,
                   cpu_pressure(), waits())


@dataclass(frozen=True)
class HostLoad:
    """The host between two readings, as shares of the time its cores had (wall x cores)."""

    start: HostReading
    end: HostReading
    cores: int  # every core of the host (its other tenants may run on any)

    @property
    def wall_s(self) -> float:
        return self.end.wall_s - self.start.wall_s

    @property
    def capacity_s(self) -> float:
        return max(self.wall_s * self.cores, 1e-9)

    @property
    def others_share(self) -> float:
        """The cores' busy time beyond this process tree's."""
        ours = self.end.tree_s - self.start.tree_s
        return max(0.0, (self.end.busy_s - self.start.busy_s) - ours) / self.capacity_s

    @property
    def own_wait_s(self) -> float | None:
        """How long this process's threads were runnable but waited for a CPU; None where the
        OS does not say."""
        if self.start.own_waits is None or self.end.own_waits is None:
            return None
        return waited_s(self.start.own_waits, self.end.own_waits)

    @property
    def steal_share(self) -> float | None:
        if self.start.steal_s is None or self.end.steal_s is None:
            return None
        return (self.end.steal_s - self.start.steal_s) / self.capacity_s

    @property
    def pressure_share(self) -> float | None:
        """The share of the wall time in which some task waited for a CPU (the workers
        themselves included, where they are more than the cores); at most 1: the kernel's
        total and the wall clock are read a moment apart, and a fully stalled run read
        1.00015."""
        if self.start.pressure is None or self.end.pressure is None:
            return None
        return min(1.0, (self.end.pressure[1] - self.start.pressure[1]) / 1e6
                   / max(self.wall_s, 1e-9))


class HostWatch:
    """``with HostWatch() as watch: ...`` then ``watch.load``: the host over the block."""

    def __enter__(self) -> HostWatch:
        self.start = HostReading.now()
        return self

    def __exit__(self, *exc: object) -> None:
        self.load = HostLoad(self.start, HostReading.now(), psutil.cpu_count() or 1)
