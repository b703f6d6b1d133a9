"""How busy the rest of the machine was while the bench measured: ratios need a quiet one."""

from __future__ import annotations

import os
import time

import psutil


class OtherLoad:
    """CPU time that processes outside this bench used meanwhile, as a share of all cores.

    Ratios need a quiet machine; this says whether it was. Ours is this process and the children
    it reaped (the workers); the rest of the system's busy time is someone else's, and steal is
    the hypervisor's (a noisy neighbour on a VM)."""

    def __enter__(self) -> OtherLoad:
        self.start = self._read()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float, float]:
        cpu, mine = psutil.cpu_times(), os.times()
        busy = sum(getattr(cpu, name, 0.0) for name in ("user", "nice", "system", "irq",
                                                         "softirq"))
        ours = mine.user + mine.system + mine.children_user + mine.children_system
        return time.perf_counter(), busy, ours, getattr(cpu, "steal", 0.0)

    def shares(self) -> tuple[float, float]:
        """(others' share, steal share) of the cores' time over the block."""
        (t0, busy0, ours0, steal0), (t1, busy1, ours1, steal1) = self.start, self.end
        capacity = max((t1 - t0) * psutil.cpu_count(), 1e-9)
        return max(0.0, (busy1 - busy0) - (ours1 - ours0)) / capacity, (steal1 - steal0) / capacity
