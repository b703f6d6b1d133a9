"""How long a process's threads were ready to run but waited for a CPU: the kernel's run-queue
delay, the half of contention that CPU time alone cannot show.

A thread that got 1 s of CPU may have wanted 1 s or 3 s; the difference is the time it sat
runnable on a run queue behind other threads. Linux counts it per thread in
``/proc/<pid>/task/<tid>/schedstat`` (second field, nanoseconds; the first is the CPU time),
so a worker reads its own threads' and the share of the CPU it got, got / (got + waited), can
never exceed 1 (:mod:`hetsgd.observe.contention`). A thread that sleeps (on a lock, in a
collective, in an emulated accelerator's sleep) is not runnable and adds to neither.

A collective backend's own threads (gloo's, named by it) are left out: they wake for every
message, and each wakeup waits for its CPU to be scheduled even on an idle machine (on a quiet
2-core VM, two sync ranks over gloo waited 0.5-0.7 s over 6 s of training, most of it in those
threads, which computed about 0.1 s), so their delay is the wakeup's latency, not a busy machine.
The threads that train (the rank's own and torch's intra-op threads) wait behind other work
whenever the machine is busy, and their delay is what is counted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

TASKS = "/proc/self/task"
# The name prefixes of the threads a collective backend starts for itself (gloo's TCP loop and
# torch's gloo work loops): their waits are not counted.
COLLECTIVE_THREADS = ("gloo_", "pt_gloo_")


def waits(tasks: str = TASKS) -> dict[str, int] | None:
    """Each live thread's run-queue delay so far in ns, by thread id, a collective backend's
    threads aside; None where the kernel does not count it (not Linux, or built without
    ``CONFIG_SCHED_INFO``)."""
    try:
        threads = os.listdir(tasks)
    except OSError:
        return None
    read = {}
    for tid in threads:
        if _name(os.path.join(tasks, tid)).startswith(COLLECTIVE_THREADS):
            continue
        try:
            with open(os.path.join(tasks, tid, "schedstat")) as f:
                read[tid] = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended between the listing and the read
    return read or None


def _name(task: str) -> str:
    """A thread's name ("" where it cannot be read: the thread is then counted)."""
    try:
        with open(os.path.join(task, "comm")) as f:
            return f.read()
    except OSError:
        return ""


def waited_s(before: Mapping[str, int], after: Mapping[str, int]) -> float:
    """The seconds of run-queue delay added between two :func:`waits` readings: each thread's
    growth; a thread born since (or a thread id reused, whose count went down) from its start.
    A thread that ended in between keeps what the earlier readings counted of it."""
    added = 0
    for tid, wait in after.items():
        last = before.get(tid, 0)
        added += wait - last if wait >= last else wait
    return added / 1e9
