"""The coordinator's watch over its workers' progress and its own scheduling (:class:`Watch`),
and how a worker process that sent no report ended, in words (:func:`ended`)."""

from __future__ import annotations

import signal
import time

import psutil

from hetsgd.engines.base import TICK_S

# A tick longer than its wait and its own CPU time by this much: the coordinator was not
# scheduled (stopped, or starved of CPU), and said so in the summary.
STARVED_S = 1.0


class Watch:
    """The coordinator's watch over the workers' progress and over its own scheduling.

    A worker progresses when its counted updates or its heartbeat (``Signals.beats``) change;
    one that does neither for ``window_s`` seconds (``first_window_s`` before it first did) is
    hung. A tick that came late (the coordinator stopped, starved of CPU, or slow to write a
    snapshot) is not held against the workers: it could not look. A tick longer than its wait
    and its CPU time is time the coordinator was not scheduled at all; it is kept for the
    summary, as a stopped or starved coordinator cannot end training on time either. A tick's
    writes and calls out (:class:`Tick`'s asides: snapshots, checkpoints, the workers' publication,
    the progress callback) are left out of that measure, as their time off the CPU may be the
    disk's or another process's: a stop that lands there goes unreported.
    """

    def __init__(self, ranks: list[int], window_s: float, first_window_s: float) -> None:
        self.ranks, self.window_s, self.first_window_s = ranks, window_s, first_window_s
        self.seen: dict[int, tuple[float, float]] = {}  # rank -> (progress, when it last changed)
        self.stepped: set[int] = set()
        self.last = 0.0  # the previous tick
        self.unscheduled_s = 0.0
        self.longest: tuple[float, float] = (0.0, 0.0)  # (seconds, from what time of training)

    def start(self, now: float, progress: dict[int, float]) -> None:
        self.seen = {rank: (progress[rank], now) for rank in self.ranks}
        self.last = now

    def ticked(self, wall_s: float, cpu_s: float, elapsed: float) -> None:
        """A tick, less its asides, took ``wall_s``, of which ``cpu_s`` on the CPU, until
        ``elapsed`` seconds of training (:meth:`Tick.watched`)."""
        off = wall_s - cpu_s - TICK_S
        if off > STARVED_S:
            self.unscheduled_s += off
            self.longest = max(self.longest, (off, elapsed - off))

    def hung(self, now: float, progress: dict[int, float], ended: set[int]) -> list[int]:
        """The workers not in ``ended`` that are hung now."""
        late = now - self.last - TICK_S
        self.last = now
        if late > STARVED_S:
            self.seen = {rank: (value, when + late) for rank, (value, when) in self.seen.items()}
        hung = []
        for rank in self.ranks:
            value, when = self.seen[rank]
            if progress[rank] != value:
                self.seen[rank] = (progress[rank], now)
                self.stepped.add(rank)
            elif rank not in ended and now - when > self.window(rank):
                hung.append(rank)
        return hung

    def window(self, rank: int) -> float:
        return self.window_s if rank in self.stepped else self.first_window_s

    def warnings(self, time_s: float, budget_s: float | None) -> list[str]:
        if self.unscheduled_s == 0.0:
            return []
        seconds, at = self.longest
        note = (f"the coordinator was not scheduled for {self.unscheduled_s:.1f} s (longest "
                f"{seconds:.1f} s, from {at:.1f} s of training): it could not watch the workers, "
                "take snapshots or end training then")
        if budget_s is not None and time_s > budget_s + STARVED_S:
            note += f"; the {budget_s:g} s budget overran by {time_s - budget_s:.1f} s"
        return [note]


class Tick:
    """One tick of the coordinator's, timed from its start as the watch measures it: wall and
    CPU time less its asides (``with tick.aside:`` around each)."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.thread_time()
        self.aside = _Aside()

    def watched(self, t0: float) -> tuple[float, float, float]:
        """(wall s, CPU s) since the tick began, less its asides, and the training time (from
        ``t0``, on :func:`time.perf_counter`) they reach, its asides left out too."""
        now = time.perf_counter()
        return (now - self.wall - self.aside.wall_s, time.thread_time() - self.cpu
                - self.aside.cpu_s, now - t0 - self.aside.wall_s)


class _Aside:
    """The wall and CPU time of the stretches it is entered around, added up."""

    def __init__(self) -> None:
        self.wall_s = self.cpu_s = 0.0

    def __enter__(self) -> None:
        self._wall, self._cpu = time.perf_counter(), time.thread_time()

    def __exit__(self, *exc: object) -> None:
        self.wall_s += time.perf_counter() - self._wall
        self.cpu_s += time.thread_time() - self._cpu


def cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (0 once it is gone)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def ended(exitcode: int) -> str:
    """How a process that sent no report ended, in words: multiprocessing gives a process that
    a signal killed the signal's number, negated, as its exit code (the OOM killer's: -9)."""
    if exitcode >= 0:
        return f"exited with code {exitcode}"
    try:
        name = signal.Signals(-exitcode).name
    except ValueError:
        return f"was killed by signal {-exitcode}"
    return f"was killed by {name} (signal {-exitcode})"
