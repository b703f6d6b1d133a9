"""How busy the rest of the machine was while the bench measured: ratios need a quiet one."""

from __future__ import annotations

import contextlib
import ctypes
import os
import time

import psutil

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def _adopt_orphans() -> None:
    """Make this process the reaper of its orphaned descendants (Linux only): a command that
    `hetsgd run` ends leaves its forkserver and workers to end a moment later, and an orphan
    handed to init would be counted as someone else's CPU."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap_adopted() -> None:
    """Reap the adopted descendants that ended, so that their CPU time counts as this
    process's children's. Only ended ones (zombies): the children this bench starts itself are
    waited for by the code that started them (``subprocess.run``)."""
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error, ChildProcessError):
            if child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)


def _tree_cpu() -> float:
    """CPU seconds of this process's tree: itself, the children it reaped, and every live
    descendant with what it reaped in turn (workers forked from a forkserver are its children,
    not this process's)."""
    total = 0.0
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


class OtherLoad:
    """CPU time that processes outside this bench used meanwhile, as a share of all cores.

    Ratios need a quiet machine; this says whether it was. Ours is this process's tree
    (:func:`_tree_cpu`, orphans adopted); the rest of the system's busy time is someone else's,
    and steal is the hypervisor's (a noisy neighbour on a VM)."""

    def __enter__(self) -> OtherLoad:
        _adopt_orphans()
        self.start = self._read()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float, float]:
        _reap_adopted()
        cpu = psutil.cpu_times()
        busy = sum(getattr(cpu, name, 0.0) for name in ("user", "nice", "system", "irq",
                                                         "softirq"))
        return time.perf_counter(), busy, _tree_cpu(), getattr(cpu, "steal", 0.0)

    def shares(self) -> tuple[float, float]:
        """(others' share, steal share) of the cores' time over the block."""
        (t0, busy0, ours0, steal0), (t1, busy1, ours1, steal1) = self.start, self.end
        capacity = max((t1 - t0) * psutil.cpu_count(), 1e-9)
        return max(0.0, (busy1 - busy0) - (ours1 - ours0)) / capacity, (steal1 - steal0) / capacity
