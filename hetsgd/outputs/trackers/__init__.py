"""Trackers (`logger=tensorboard`, `logger=mlflow`, or both): like the figures, a view of a
finished run directory, logged by the coordinator once the run has written it, never while it
trains. A tracker that fails (a server down, a full disk) costs one warning and its own output,
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
from typing import cast

from omegaconf import DictConfig, OmegaConf

from hetsgd.config.schema import LoggersConfig
from hetsgd.outputs.drawing import draw_figures

log = logging.getLogger("hetsgd")
#: The trackers that failed in a sweep, by (sweep folder, tracker): each is tried once per sweep,
#: as a tracker that failed (a server down or silent, a store that cannot be written) would fail
#: every later job alike, and a silent server would stall each by its timeout.
_failed: set[tuple[Path, str]] = set()


def _cause(exc: BaseException) -> str:
    """The exception on one line, with the install that a missing tracker package needs."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    cause = f"{type(exc).__name__}: {' '.join(lines)[:500]}" if lines else type(exc).__name__
    return cause + (" (pip install 'hetsgd[tracking]')" if isinstance(exc, ImportError) else "")


def track(run_dir: Path, loggers: LoggersConfig | DictConfig) -> None:
    """Log the run in ``run_dir`` to each tracker ``loggers`` chooses."""
    from hetsgd.outputs.trackers.record import read_run

    try:
        chosen = (loggers if isinstance(loggers, LoggersConfig)
                  else cast(LoggersConfig, OmegaConf.to_object(loggers)))
        record = read_run(run_dir)
    except Exception as exc:  # noqa: BLE001 - the run is written; say why it is not tracked
        log.warning("trackers: could not read the run in %s: %s", run_dir, _cause(exc))
        return
    sweep = run_dir.parent if record.sweep is not None else None
    if sweep is not None and not record.figures:
        record = replace(record, figures=draw_figures(run_dir))  # a job draws none
    if chosen.tensorboard is not None and _tried(sweep, "tensorboard"):
        try:
            from hetsgd.outputs.trackers.tensorboard_events import write_events

            write_events(record, chosen.tensorboard)
        except Exception as exc:  # noqa: BLE001 - costs the event files, never the run
            log.warning("tensorboard: could not log the run in %s: %s%s", run_dir, _cause(exc),
                        _drop(sweep, "tensorboard"))
    if chosen.mlflow is not None and _tried(sweep, "mlflow"):
        try:
            from hetsgd.outputs.trackers.mlflow_runs import log_run

            log_run(record, chosen.mlflow)
        except Exception as exc:  # noqa: BLE001 - costs the MLflow run, never the run
            log.warning("mlflow: could not log the run in %s to %s: %s%s", run_dir,
                        chosen.mlflow.tracking_uri, _cause(exc), _drop(sweep, "mlflow"))


def _tried(sweep: Path | None, tracker: str) -> bool:
    """Whether ``tracker`` is to log this run: not once it failed in the run's sweep."""
    return (sweep, tracker) not in _failed


def _drop(sweep: Path | None, tracker: str) -> str:
    """Leave ``tracker`` out for the rest of ``sweep`` (none: a run of its own); what the
    warning adds."""
    if sweep is None:
        return ""
    _failed.add((sweep, tracker))
    return f"; {tracker} is left out for the rest of the sweep"
