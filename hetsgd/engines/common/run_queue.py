"""How long a process's threads were ready to run but waited for a CPU: the kernel's run-queue
delay, the half of contention that CPU time alone cannot show.

A thread that got 1 s of CPU may have wanted 1 s or 3 s; the difference is the time it sat
runnable on a run queue behind other threads. Linux counts it per thread in
``/proc/<pid>/task/<tid>/schedstat`` (second field, nanoseconds; the first is the CPU time),
so a worker reads its own threads' and the share of the CPU it got, got / (got + waited), can
never exceed 1 (:mod:`hetsgd.observe.contention`). A thread that sleeps (on a lock, in a
collective, in an emulated accelerator's sleep) is not runnable and adds to neither.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

TASKS = "/proc/self/task"


def waits(tasks: str = TASKS) -> dict[str, int] | None:
    """Each live thread's run-queue delay so far in ns, by thread id; None where the kernel does
    not count it (not Linux, or built without ``CONFIG_SCHED_INFO``)."""
    try:
        threads = os.listdir(tasks)
    except OSError:
        return None
    read = {}
    for tid in threads:
        try:
            with open(os.path.join(tasks, tid, "schedstat")) as f:
                read[tid] = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended between the listing and the read
    return read or None


def waited_s(before: Mapping[str, int], after: Mapping[str, int]) -> float:
    """The seconds of run-queue delay added between two :func:`waits` readings: each thread's
    growth; a thread born since (or a thread id reused, whose count went down) from its start.
    A thread that ended in between keeps what the earlier readings counted of it."""
    added = 0
    for tid, wait in after.items():
        last = before.get(tid, 0)
        added += wait - last if wait >= last else wait
    return added / 1e9
