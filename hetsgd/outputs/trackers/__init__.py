"""Trackers (`logger=tensorboard`, `logger=mlflow`, or both): fed each snapshot's progress and
the method's own numbers while the run trains (:mod:`.live`), then, like the figures, a view of
the finished run directory, logged once the run has written it (the rest: losses, utilization,
config, figures). A tracker that fails (a server down, a full disk) costs one warning and its own output,
never the run: its status and files are already written, and the warning lands in the run's
``cli.log`` with everything else the command logged. In a sweep, a tracker that failed is left
out for the sweep's later jobs, which it would fail alike (and stall, a silent server by its
timeout each): one warning per sweep. A sweep's job draws no figures of its own (the sweep draws
its comparison at its end): a tracker draws the job's, so that each job's tracked run holds its
figures as a single run's does."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from omegaconf import DictConfig, OmegaConf

from hetsgd.config.schema import LoggersConfig
from hetsgd.outputs.drawing import draw_figures
from hetsgd.outputs.trackers.failures import cause, drop, tried

if TYPE_CHECKING:
    from hetsgd.outputs.trackers.live import Followed

log = logging.getLogger("hetsgd")


def track(run_dir: Path, loggers: LoggersConfig | DictConfig) -> None:
    """Log the run in ``run_dir`` to each tracker ``loggers`` chooses."""
    from hetsgd.outputs.trackers.live import followed  # loads the tracker packages lazily
    from hetsgd.outputs.trackers.record import read_run

    live = followed(run_dir)  # what was fed while it trained: written once
    try:
        chosen = (loggers if isinstance(loggers, LoggersConfig)
                  else cast(LoggersConfig, OmegaConf.to_object(loggers)))
        record = read_run(run_dir)
    except Exception as exc:  # noqa: BLE001 - the run is written; say why it is not tracked
        log.warning("trackers: could not read the run in %s: %s", run_dir, cause(exc))
        return
    sweep = run_dir.parent if record.sweep is not None else None
    if sweep is not None and not record.figures:
        record = replace(record, figures=draw_figures(run_dir))  # a job draws none
    if chosen.tensorboard is not None and _tried(sweep, "tensorboard", live):
        try:
            from hetsgd.outputs.trackers.tensorboard_events import write_events

            write_events(record.after(live.fed.get("tensorboard", {})), chosen.tensorboard)
        except Exception as exc:  # noqa: BLE001 - costs the event files, never the run
            log.warning("tensorboard: could not log the run in %s: %s%s", run_dir, cause(exc),
                        drop(sweep, "tensorboard"))
    if chosen.mlflow is not None and _tried(sweep, "mlflow", live):
        try:
            from hetsgd.outputs.trackers.mlflow_runs import log_run

            log_run(record.after(live.fed.get("mlflow", {})), chosen.mlflow, live.mlflow_run)
        except Exception as exc:  # noqa: BLE001 - costs the MLflow run, never the run
            log.warning("mlflow: could not log the run in %s to %s: %s%s", run_dir,
                        chosen.mlflow.tracking_uri, cause(exc), drop(sweep, "mlflow"))


def _tried(sweep: Path | None, tracker: str, live: Followed) -> bool:
    """Whether ``tracker`` logs the run: not where it had failed in the run's sweep before the
    run started, nor where its live feed could not open it (already said). One whose live feed
    failed during the run still logs it: the final log writes what the feed missed, and ends
    the MLflow run the feed opened."""
    started = tried(sweep, tracker) if live.tried is None else tracker in live.tried
    return started and tracker not in live.unopened
