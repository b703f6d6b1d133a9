"""The engine contract: what any engine is handed (a journal, a monitor factory, a callback and
an algorithm's controller to call every tick) and what every engine hands back
(:class:`Training`), so that the runner runs processes, torch.distributed ranks and the virtual
clock alike."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from hetsgd.engines.checkpoint import Checkpoint
from hetsgd.engines.counters import WorkerCounters
from hetsgd.engines.snapshots import Snapshot

OnTick = Callable[[float, WorkerCounters], None]  # (training seconds, counters), every tick


class Controller(Protocol):
    """Steers workers while they train (Adaptive Hogbatch's batch sizes), from the coordinator."""

    log: list[dict[str, float | str]]  # rows of batches.csv

    def tick(self, elapsed: float, counters: WorkerCounters) -> None: ...

    def summary(self) -> dict: ...


@dataclass
class Training:
    """What a training phase leaves behind for evaluation and the results files."""

    status: str = "completed"  # completed | failed | interrupted | diverged | crashed
    error: str | None = None
    time_s: float = 0.0
    snapshots: list[Snapshot] = field(default_factory=list)
    counters: list[dict[str, float]] = field(default_factory=list)
    utilization: list[dict[str, float | None]] = field(default_factory=list)
    resumed_s: float = 0.0  # where this session's clock began (a resumed run's checkpoint)
    batches: list[dict[str, float | str]] = field(default_factory=list)  # batch-size changes, if any
    extra: dict = field(default_factory=dict)  # algorithm-specific summary entries
    warnings: list[str] = field(default_factory=list)  # for summary.json and the log


class Journal(Protocol):
    """Keeps what an engine measures on disk as it is measured (the runner's ``RunJournal``),
    so that a run whose coordinator is killed can still be evaluated."""

    def snapshot(self, snapshot: Snapshot, counters: list[dict[str, float]]) -> None:
        """A snapshot just taken, with every worker's counters at that moment."""

    def drop(self, snapshot: Snapshot) -> None:
        """A snapshot that :class:`~hetsgd.engines.snapshots.Snapshots` thinned out."""

    def checkpoint(self, checkpoint: Checkpoint) -> None:
        """A checkpoint just assembled, to replace the previous one."""

    def utilization(self, row: dict[str, float | None]) -> None:
        """A utilization sample (the virtual engines' own; a process engine's monitor writes
        those it samples)."""


class Monitor(Protocol):
    """Samples the utilization of an engine's processes while they train (the runner's
    ``UtilizationMonitor``)."""

    def start(self) -> object: ...

    def set_time_origin(self, t0: float) -> None: ...

    def stop(self) -> list[dict[str, float | None]]: ...


# Builds the monitor from a callable that lists the pids of the processes to watch.
MonitorFactory = Callable[[Callable[[], list[int]]], Monitor]


class Engine(Protocol):
    """Runs a plan's workers to the end of their budget, taking snapshots of the master into
    its journal on the way."""

    def run(self, monitor_factory: MonitorFactory) -> Training:
        """Train; ``monitor_factory`` is used by the engines whose workers are processes."""
        ...
