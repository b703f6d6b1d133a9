"""One line as each job of a sweep starts: ``hetsgd: job 3 of 12 (2_algo=hogbatch,seed=1), about
4 min left``, on stderr, plain text (a log or a pipe reads it as a terminal does).

The time left is the sweep's time so far per job done, times the jobs not done yet: one job's
time alone would be a poor guess where the jobs differ (a sweep over mixes). Hydra calls the
callback in the process that launches the jobs; the number of jobs is the basic sweeper's
expansion of the sweep (another sweeper's ``n_trials`` where it has one, else unknown). It is
registered in the primary config beside :class:`~hetsgd.outputs.sweep.SweepReport`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from hetsgd.config.hydra_private import basic_sweep, draws_jobs
from hetsgd.durations import duration
from hetsgd.outputs.safe_text import shown


def job_count(hydra: DictConfig) -> int | None:
    """How many jobs the sweep of ``hydra`` (a multirun's ``hydra`` node) launches: the basic
    sweeper's product of its swept values, another's ``n_trials``; None where unknown."""
    sweeper = hydra.sweeper
    if draws_jobs(sweeper):
        trials = sweeper.get("n_trials")
        return trials if isinstance(trials, int) else None
    params = [f"{key}={value}" for key, value in (sweeper.get("params") or {}).items()]
    return len(basic_sweep([*params, *hydra.overrides.task]))


def progress_line(number: int, total: int | None, folder: str, elapsed_s: float) -> str:
    """The line for job ``number`` (from 0) of ``total``, started ``elapsed_s`` after the first."""
    line = f"hetsgd: job {number + 1}" + (f" of {total}" if total else "") + f" ({folder})"
    if number > 0 and total:
        line += f", about {duration(elapsed_s / number * (total - number))} left"
    return shown(line)


class SweepProgress(Callback):
    """Hydra callback: :func:`progress_line` as each job of a sweep starts."""

    def __init__(self) -> None:
        self.total: int | None = None
        self.first_started: float | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A new sweep (a tuned comparison runs two): its count, and its clock from its first job."""
        try:
            self.total = job_count(config.hydra)
        except Exception:  # noqa: BLE001 - only the count is lost: Hydra reports a bad sweep itself
            self.total = None
        self.first_started = None

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        hydra = HydraConfig.get()
        if hydra.mode != RunMode.MULTIRUN:
            return
        now = time.monotonic()
        if self.first_started is None:
            self.first_started = now
        folder = Path(str(hydra.runtime.output_dir)).name
        print(progress_line(int(hydra.job.num), self.total, folder, now - self.first_started),
              file=sys.stderr, flush=True)
