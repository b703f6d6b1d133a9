"""One MLflow run per run (`logger=mlflow`), in the sweep's experiment (named for its folder) or
``hetsgd``: tags for its identity and swept values (to group by in the UI), the flattened config
as params, every series as metrics at its step and wall time, the figures, config and summary as
artifacts; it ends FINISHED, KILLED (interrupted) or FAILED as the run did."""

from __future__ import annotations

import io
import logging
import math
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, redirect_stdout, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from hetsgd.config.schema import MlflowConfig
from hetsgd.outputs.index import CONFIG
from hetsgd.outputs.run_directory import SUMMARY
from hetsgd.outputs.safe_text import redacted, shown
from hetsgd.outputs.trackers.record import RunRecord

SINGLE_RUNS = "hetsgd"  # the experiment of runs outside a sweep
RUN_STATUS = {"completed": "FINISHED", "interrupted": "KILLED"}  # any other: FAILED
# MLflow's limits (mlflow/utils/validation.py): params and metrics per log_batch call, a
# param's length
PARAMS_PER_CALL, METRICS_PER_CALL, PARAM_LENGTH = 100, 1000, 6000


@contextmanager
def request_limits(cfg: MlflowConfig) -> Iterator[None]:
    """MLflow's HTTP timeout and retries set from the config while the run is logged, so that a
    tracking server that is down or silent costs seconds, not MLflow's default minutes; the
    variables are put back after."""
    limits = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, math.ceil(cfg.timeout_s))),
              "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(cfg.retries),
              "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
    before = {name: os.environ.get(name) for name in limits}
    os.environ.update(limits)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


#: The loggers of MLflow and of the database layer under it, which report a failure of a store
#: with its whole traceback (65 lines for a read-only SQLite file) before MLflow raises it.
STORE_LOGGERS = ("mlflow", "sqlalchemy", "alembic")


@contextmanager
def quiet() -> Iterator[None]:
    """MLflow's own log lines and warnings held back while a run is logged: a failure is the
    exception MLflow raises, which the tracker reports on one line. What MLflow prints itself
    ("View run ... at: URL", with the tracking URI's password in the URL) is held too, and
    printed after with its secrets redacted and its control characters escaped."""
    loggers = [logging.getLogger(name) for name in STORE_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    printed = io.StringIO()
    try:
        with warnings.catch_warnings(), redirect_stdout(printed):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
        sys.stdout.write(shown(redacted(printed.getvalue()), lines=True))


def _is_server(uri: str) -> bool:
    return urlparse(uri).scheme in ("http", "https")


def _artifact_location(cfg: MlflowConfig, experiment: str) -> str | None:
    """``artifact_dir/<experiment>`` on this machine; a tracking server keeps its own (a path
    here means nothing to the server's other clients)."""
    if _is_server(cfg.tracking_uri):
        return None
    return (Path(cfg.artifact_dir).expanduser().resolve() / experiment).as_uri()


def experiment_id(client: Any, name: str, cfg: MlflowConfig) -> str:
    """The experiment called ``name``, created if new; a sweep's job running at the same time
    may create it first."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(name, artifact_location=_artifact_location(cfg, name)))
    except MlflowException:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return str(found.experiment_id)


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def ms(seconds: float) -> int:
    return int(round(1000 * seconds))


def open_store(uri: str) -> None:
    """A SQLite store's folder, made if missing (SQLite creates the file, not its folder)."""
    path = uri.removeprefix("sqlite:///")
    if path != uri and path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)


def log_run(record: RunRecord, cfg: MlflowConfig, run_id: str | None = None) -> str:
    """Log the run as a new MLflow run, or into ``run_id`` (the run its live feed opened:
    :mod:`.live`); return its id."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    experiment = cfg.experiment or record.sweep or SINGLE_RUNS
    with request_limits(cfg), quiet():
        open_store(cfg.tracking_uri)
        client = MlflowClient(tracking_uri=cfg.tracking_uri)
        if run_id is None:
            run_id = client.create_run(experiment_id(client, experiment, cfg),
                                       start_time=ms(record.started), tags=dict(record.tags),
                                       run_name=record.name).info.run_id
        else:
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in record.tags.items()])
        try:
            params = [Param(key, value[:PARAM_LENGTH]) for key, value in record.params.items()]
            for chunk in _chunks(params, PARAMS_PER_CALL):
                client.log_batch(run_id, params=chunk)
            metrics = [Metric(name, point.value, ms(point.time), point.step)
                       for name, points in record.series.items() for point in points]
            for chunk in _chunks(metrics, METRICS_PER_CALL):
                client.log_batch(run_id, metrics=chunk)
            for figure in record.figures:
                client.log_artifact(run_id, str(figure), "figures")
            for file in (record.run_dir / CONFIG, record.run_dir / SUMMARY):
                if file.is_file():
                    client.log_artifact(run_id, str(file))
        except BaseException:
            with suppress(Exception):  # the cause is what is reported, not this
                client.set_terminated(run_id, "FAILED")
            raise
        client.set_terminated(run_id, RUN_STATUS.get(record.status, "FAILED"),
                              end_time=ms(record.ended))
    return run_id
