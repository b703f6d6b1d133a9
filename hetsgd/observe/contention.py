"""Whether a run's workers got the CPU time they asked for: ``summary.json``'s ``contention``.

A run whose workers shared their cores with other processes, or with each other beyond the
cores there are, measures a slower machine than the one it names, and its times must not pass
for the machine's. So each run records:

- ``workers_cpu_share``: the CPU time the workers got over the CPU time they asked for. A worker
  asks for ``threads`` cores while it computes: its threads x the wall seconds of its steps
  (workers.csv's ``busy_s``) and, in the asynchronous engine, of its copies to and from the
  master (``comm_s``, CPU work there). It does not ask while it waits: for the epoch cursor's
  lock (``wait_s``), in an emulated accelerator's sleep (the ``slowdown``), or for the other
  ranks in a collective (a rank's ``comm_s``). What it got is its process's CPU time over
  training, every thread's (workers.csv's ``cpu_s``, each worker counting its own, so that
  torchrun's ranks on other machines count too). Only workers that compute on the CPU count: a
  CUDA worker's host thread mostly waits on its GPU, spinning or asleep as CUDA chooses, which
  says nothing about its cores. 1.0 is a worker that ran whenever it wanted to; a little above
  1 is the CPU it also spent outside its timed spans (a claim, a loss read); 0.5 is one that
  waited as long as it ran. A simulated run (the virtual clock) has no worker processes: its
  share is the simulator's, the coordinator process's CPU time over the real seconds of
  training x the threads the simulated math runs on (``measured: simulator``). It is never
  flagged: a busy host slows the simulation's real seconds, never its virtual times.
- ``coordinator_cpu_s``: the CPU time of the coordinator process (snapshots, the monitor, the
  progress display; in a simulated run, the simulation) over the engine's run.
- the host over training: ``others_busy_share``, the share of all its cores' time that was busy
  beyond this run's own process tree; ``steal_share``, the hypervisor's; ``cpu_pressure``, the
  kernel's pressure stall information (``some``: the share of the time some task waited for a
  CPU, over training and its ``avg10`` at the end). Each is null where the OS does not expose
  it; under torchrun it is rank 0's machine, whose other ranks count as others.
- ``flagged``: true when the share is below ``monitor.contention_threshold``; false also where
  the share is unknown (a run of CUDA workers only), which its null says. The default, 0.7, is
  set so that a clean run on a quiet 2-core machine is not flagged: a mix that asks for every
  core (``make run``'s Hogwild: two one-thread workers on 2 cores) leaves the coordinator's own
  CPU (snapshots, the monitor, the progress display: about 0.35 of a core, measured quiet) to
  come out of the workers' time; such a run measured 0.79. Workers getting 0.5-0.65 of their
  cores (the runs that distorted results) stay below it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from hetsgd.observe.host import HostLoad


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def asked_s(worker: Mapping[str, Any], copies_are_work: bool) -> float | None:
    """The CPU seconds a worker (a row of workers.csv) asked for; None for one that does not
    compute on the CPU. ``copies_are_work``: its ``comm_s`` is copying (the asynchronous engine),
    not waiting in a collective (ranks)."""
    if str(worker.get("device", "")) != "cpu":
        return None
    busy, comm = _finite(worker.get("busy_s")), _finite(worker.get("comm_s")) or 0.0
    threads = _finite(worker.get("threads"))
    if busy is None or threads is None:
        return None
    return threads * (busy + (comm if copies_are_work else 0.0))


def workers_share(workers: Sequence[Mapping[str, Any]], copies_are_work: bool
                  ) -> tuple[float | None, dict[str, float | None]]:
    """The workers' CPU share (got over asked, see the module), and each group's; None where
    nothing was asked or a worker's CPU time is unknown."""
    sums: dict[str, list[float]] = {}
    unknown: set[str] = set()
    for worker in workers:
        asked = asked_s(worker, copies_are_work)
        if asked is None:
            continue
        group = str(worker.get("group"))
        got = _finite(worker.get("cpu_s"))
        if got is None:
            unknown.add(group)
        totals = sums.setdefault(group, [0.0, 0.0])
        totals[0] += got or 0.0
        totals[1] += asked
    by_group = {g: None if g in unknown or not asked else got / asked
                for g, (got, asked) in sums.items()}
    got, asked = (sum(t[i] for t in sums.values()) for i in (0, 1))
    share = None if unknown or not asked else got / asked
    return share, by_group


def simulator_share(load: HostLoad, threads: int) -> float | None:
    """The simulator's CPU share: this process's CPU time over the block's wall seconds x the
    threads its math runs on."""
    asked = load.wall_s * threads
    return (load.end.own_s - load.start.own_s) / asked if asked > 0 else None


def contention(share: float | None, by_group: Mapping[str, float | None] | None,
               load: HostLoad, threshold: float, measured: str) -> dict[str, Any]:
    """The ``contention`` entry of summary.json (the module says what each key means)."""
    pressure = load.end.pressure
    return {"workers_cpu_share": share, "by_group": dict(by_group) if by_group else None,
            "measured": measured, "threshold": threshold,
            "flagged": measured == "workers" and share is not None and share < threshold,
            "coordinator_cpu_s": load.end.own_s - load.start.own_s,
            "others_busy_share": load.others_share, "steal_share": load.steal_share,
            "cpu_pressure": None if pressure is None else {
                "some_share": load.pressure_share, "some_avg10": pressure[0]}}


def warning(entry: Mapping[str, Any]) -> str | None:
    """The one line a flagged run ends with: its share, and what that means for its times."""
    if not entry.get("flagged"):
        return None
    others = entry.get("others_busy_share")
    beside = f"; other processes kept {others:.0%} of the host's cores busy" if others else ""
    return (f"contention: the workers got {entry['workers_cpu_share']:.2f} of the CPU time they "
            f"asked for (below {entry['threshold']:g}){beside}: the cores were shared, so this "
            "run's times are slower than this machine's and not comparable with a quiet run's")
