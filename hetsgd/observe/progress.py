"""A live progress display for the coordinator: epochs, recent loss and examples/s per group."""

from __future__ import annotations

import time
from types import TracebackType

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from hetsgd.config import RunConfig
from hetsgd.data.download_progress import stderr_console
from hetsgd.engines.counters import WorkerCounters
from hetsgd.workers import WorkerSpec


class TrainingProgress:
    """Shown on stderr by the parent process only; silent when ``progress: false``. Live on a
    terminal; elsewhere (a file, a pipe, a Jupyter notebook) its last state is printed once, as
    training ends."""

    REFRESH_S = 0.25  # wall seconds: a simulated run's virtual second can take minutes

    def __init__(self, cfg: RunConfig, specs: list[WorkerSpec], num_examples: int) -> None:
        self.specs = specs
        self.num_examples = num_examples
        self.epochs = cfg.budget.epochs
        self.seconds = cfg.budget.seconds
        self.enabled = cfg.progress
        # a simulated run's display starts at its first update, after its cost estimate's log
        # line (hetsgd/engines/virtual/cost.py), which a live display would overwrite
        self.deferred = cfg.devices.simulated
        self.progress = Progress(
            TextColumn("{task.description}", style="bold", markup=False), BarColumn(),
            TextColumn("{task.fields[stats]}", markup=False),  # group names are the user's
            TimeElapsedColumn(), console=stderr_console(), disable=not self.enabled)
        self.task = self.progress.add_task("training", total=100.0, stats="starting workers")
        self.last_refresh = -float("inf")  # time.monotonic() of the last update
        # the last update's arguments, drawn as training ends: the refresh's limit skipped it
        self.last: tuple[float, WorkerCounters] | None = None

    def __enter__(self) -> TrainingProgress:
        if not self.deferred:
            self.progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.last is not None and self.progress.live.is_started:  # training's end, not a
            self._draw(*self.last)  # state up to REFRESH_S older (a short run's first tick)
        self.progress.stop()

    def update(self, elapsed_s: float, counters: WorkerCounters) -> None:
        if not self.enabled:
            return
        self.last = (elapsed_s, counters)
        now = time.monotonic()
        if now - self.last_refresh < self.REFRESH_S:
            return
        self.last_refresh = now
        if self.deferred and not self.progress.live.is_started:
            self.progress.start()
        self._draw(elapsed_s, counters)

    def _draw(self, elapsed_s: float, counters: WorkerCounters) -> None:
        examples = counters.column("examples").tolist()
        losses, updates = counters.column("loss").tolist(), counters.column("updates").tolist()
        epoch = sum(examples) / self.num_examples
        done = [epoch / self.epochs if self.epochs else 0.0,
                elapsed_s / self.seconds if self.seconds else 0.0]
        parts = [f"epoch {epoch:.2f}"]
        for group in dict.fromkeys(s.group for s in self.specs):
            ranks = [s.rank for s in self.specs if s.group == group]
            rate = sum(examples[r] for r in ranks) / max(elapsed_s, 1e-9)
            # a worker that has not stepped yet has no loss: its 0 is no reading
            read = [losses[r] for r in ranks if updates[r] > 0]
            loss = f"{sum(read) / len(read):.4f}" if read else "—"
            parts.append(f"{group}: loss {loss} {rate:,.0f} ex/s")
        self.progress.update(self.task, completed=100.0 * min(1.0, max(done)),
                             stats=" | ".join(parts))
