"""Whether a run's workers got the CPU time they wanted: ``summary.json``'s ``contention``.

A run whose workers shared their cores with other processes, or with each other beyond the
cores there are, measures a slower machine than the one it names, and its times must not pass
for the machine's. So each run records:

- ``workers_cpu_share``: the CPU time the workers got over the CPU time they wanted, where what
  a worker wanted is what it got plus the time its threads were runnable but waited for a CPU
  (Linux's run-queue delay, :mod:`hetsgd.engines.common.run_queue`): got / (got + waited),
  never above 1 by construction. Each worker counts its own process, every thread's
  (workers.csv's ``cpu_s`` and ``cpu_wait_s``), so torchrun's ranks on other machines count
  too, on every engine alike: a thread asleep (on the epoch cursor's lock, in a collective, in
  an emulated accelerator's sleep, a CUDA worker's host thread blocked on its GPU) wants
  nothing, and a collective's CPU work is both wanted and got. 1.0 is a run whose workers
  ran whenever they were ready; 0.5 one whose workers waited for a core as long as they ran.
  Null where the OS does not count run-queue delay (not Linux). A simulated run (the virtual
  clock) has no worker processes: its share is the simulator's, the coordinator process's
  CPU time over that plus its threads' run-queue delay (``measured: simulator``). It is never
  flagged: a busy host slows the simulation's real seconds, never its virtual times.
- ``coordinator_cpu_s``: the CPU time of the coordinator process (snapshots, the monitor, the
  progress display; in a simulated run, the simulation) over the engine's run.
- the host over the engine's run (its workers' start and end included: the readings are taken
  around it): ``others_busy_share``, the share of all its cores' time that was busy beyond this
  run's own process tree; ``steal_share``, the hypervisor's; ``cpu_pressure``, the kernel's
  pressure stall information (``some``: the share of the time some task waited for a CPU, and
  its ``avg10`` at the end). Each is null where the OS does not expose
  it; under torchrun it is rank 0's machine, whose other ranks count as others.
- ``flagged``: true when the share is below ``monitor.contention_threshold``; false also where
  the share is unknown, which its null says. The default, 0.7, was set under the earlier
  definition (CPU got over threads x the time computing), where a clean ``make run`` Hogwild
  job (two one-thread workers on a quiet 2-core machine, the coordinator's snapshots taking
  about 0.35 of a core) measured 0.79 and runs whose workers got 0.5-0.65 of their cores (the
  runs that distorted results) fell below it. On Hogwild workers the two definitions agree
  closely (loaded runs read 0.118 / 0.383 now against 0.125 / 0.396 then, the new one also
  counting the waits between timed spans); only ranks changed (a collective's CPU, once got
  but not asked, read above 1). The threshold stays at 0.7 until a quiet machine measures a
  clean run under this definition: the machine was shared while it changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hetsgd.config.checks import finite_or_none
from hetsgd.observe.host import HostLoad


def got_share(got: float | None, waited: float | None) -> float | None:
    """CPU got over CPU wanted (got + waited for a CPU): in [0, 1]; None where either is
    unknown or nothing was wanted."""
    if got is None or waited is None or got < 0 or waited < 0 or got + waited <= 0:
        return None
    return got / (got + waited)


def workers_share(workers: Sequence[Mapping[str, Any]]
                  ) -> tuple[float | None, dict[str, float | None]]:
    """The workers' CPU share (see the module), and each group's, from the rows of workers.csv:
    their CPU seconds pooled over their wanted seconds; None where a worker's is unknown.
    A simulated worker (no process, null ``cpu_s``) is left out."""
    sums: dict[str, tuple[float, float] | None] = {}
    for worker in workers:
        if worker.get("cpu_s") is None:
            continue
        group = str(worker.get("group"))
        got, waited = finite_or_none(worker.get("cpu_s")), finite_or_none(worker.get("cpu_wait_s"))
        known = sums.get(group, (0.0, 0.0))
        sums[group] = (None if known is None or got is None or waited is None
                       else (known[0] + got, known[1] + waited))
    by_group = {group: None if t is None else got_share(*t) for group, t in sums.items()}
    known_sums = [t for t in sums.values() if t is not None]
    if not known_sums or len(known_sums) < len(sums):
        return None, by_group
    return got_share(sum(t[0] for t in known_sums), sum(t[1] for t in known_sums)), by_group


def simulator_share(load: HostLoad) -> float | None:
    """The simulator's CPU share: this process's CPU time over that plus its threads' wait for
    a CPU, over the block."""
    return got_share(load.end.own_s - load.start.own_s, load.own_wait_s)


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
            f"wanted (below {entry['threshold']:g}){beside}: the cores were shared, so this "
            "run's times are slower than this machine's and not comparable with a quiet run's")
