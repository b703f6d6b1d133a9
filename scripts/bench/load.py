"""How busy the rest of the machine was while the bench measured: ratios need a quiet one."""

from __future__ import annotations

import contextlib
import ctypes
import os

import psutil

from hetsgd.observe.host import HostLoad, HostReading

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


class OtherLoad:
    """CPU time that processes outside this bench used meanwhile, as a share of all cores.

    Ratios need a quiet machine; this says whether it was. Ours is this process's tree
    (:func:`hetsgd.observe.host.tree_cpu_s`, orphans adopted); the rest of the system's busy
    time is someone else's, and steal is the hypervisor's (a noisy neighbour on a VM)."""

    def __enter__(self) -> OtherLoad:
        _adopt_orphans()
        self.start = self._read()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end = self._read()

    @staticmethod
    def _read() -> HostReading:
        _reap_adopted()
        return HostReading.now()

    def shares(self) -> tuple[float, float]:
        """(others' share, steal share) of the cores' time over the block."""
        load = HostLoad(self.start, self.end, psutil.cpu_count() or 1)
        return load.others_share, load.steal_share or 0.0
