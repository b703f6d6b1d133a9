"""Trackers fed while the run trains: each snapshot's progress and the method's own numbers
(``updates/*``, ``progress/epoch``, ``method/<name>``) as the engine takes it, so that a long run
is followed in TensorBoard or MLflow as it goes. The losses are evaluated only after training
(evaluation never takes CPU from the workers), so they come with the run's final log, with the
utilization, config and figures (:func:`hetsgd.outputs.trackers.track`), which writes only the
points not fed here, into the same TensorBoard folder and the same MLflow run.

Writes run on a thread of their own, so a slow tracking server never delays the engine. A
tracker that cannot be opened costs one warning and is not tried again for the run; one that
fails while fed costs one warning and is fed no more (the final log writes what it missed); in
a sweep it is left out for the later jobs, as the final log leaves it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from hetsgd.config.schema import LoggersConfig, MlflowConfig
from hetsgd.engines.snapshots import Snapshot
from hetsgd.outputs.index import MULTIRUN
from hetsgd.outputs.summary import progress_columns
from hetsgd.outputs.trackers.failures import cause, drop, tried
from hetsgd.outputs.trackers.record import Point, series_name, step_of

log = logging.getLogger("hetsgd")


class Feed(Protocol):
    """One tracker, open for the run's points as they come."""

    def write(self, points: dict[str, Point]) -> None: ...

    def close(self) -> None: ...


class TensorBoardFeed:
    """An event file in the run's TensorBoard folder, flushed at each snapshot."""

    def __init__(self, folder: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(folder))

    def write(self, points: dict[str, Point]) -> None:
        for name, point in points.items():
            self.writer.add_scalar(name, point.value, point.step, walltime=point.time)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MlflowFeed:
    """The run's MLflow run, created as training starts; the final log ends it."""

    def __init__(self, cfg: MlflowConfig, experiment: str, name: str) -> None:
        from mlflow import MlflowClient

        from hetsgd.outputs.trackers.mlflow_runs import experiment_id, open_store, quiet

        with quiet():
            open_store(cfg.tracking_uri)
            self.client = MlflowClient(tracking_uri=cfg.tracking_uri)
            self.run_id: str = self.client.create_run(
                experiment_id(self.client, experiment, cfg), run_name=name).info.run_id

    def write(self, points: dict[str, Point]) -> None:
        from mlflow.entities import Metric

        from hetsgd.outputs.trackers.mlflow_runs import ms

        self.client.log_batch(self.run_id, metrics=[
            Metric(name, p.value, ms(p.time), p.step) for name, p in points.items()])

    def close(self) -> None:
        """Nothing to close: the final log logs the rest and ends the run."""


@dataclass
class Followed:
    """What the live feed left for the final log: per tracker, the last step fed of each
    series with how many points it fed at that step (two snapshots can share a step: the
    last of a run's meetings and its final snapshot), and the MLflow run it opened."""

    fed: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    mlflow_run: str | None = None
    unopened: set[str] = field(default_factory=set)  # failed to open: said, not tried again
    # the trackers the run's sweep still tried as it started (None: a run not followed); one
    # whose feed then failed is left out for the later jobs, not for this one's final log
    tried: set[str] | None = None


#: Runs whose trackers were fed live, by run folder, until the final log takes them.
_followed: dict[Path, Followed] = {}


def followed(run_dir: Path) -> Followed:
    """What the live feed of the run in ``run_dir`` left (nothing for a run not followed)."""
    return _followed.pop(Path(run_dir).resolve(), Followed())


def snapshot_points(snapshot: Snapshot, groups: list[str], num_examples: int,
                    wall: float) -> dict[str, Point]:
    """A snapshot's live series, at its training milliseconds and wall time ``wall``."""
    step = step_of(snapshot.time_s)
    return {series_name(column, snapshot.logged): Point(step, wall, float(value))
            for column, value in progress_columns(snapshot, groups, num_examples).items()}


class LiveFeed:
    """The trackers a run feeds as it trains, on a thread of their own."""

    def __init__(self, feeds: dict[str, Feed], points: Callable[[Snapshot], dict[str, Point]],
                 sweep: Path | None) -> None:
        self.feeds, self.points, self.sweep = feeds, points, sweep
        mlflow = feeds.get("mlflow")
        self.state = Followed({name: {} for name in feeds},
                              mlflow.run_id if isinstance(mlflow, MlflowFeed) else None)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hetsgd-trackers")

    def snapshot(self, snapshot: Snapshot) -> None:
        """A snapshot just taken (the journal's listener): its points go to every tracker."""
        points = self.points(snapshot)
        self._pool.submit(self._write, points)

    def _write(self, points: dict[str, Point]) -> None:
        for name, feed in list(self.feeds.items()):
            try:
                feed.write(points)
            except Exception as exc:  # noqa: BLE001 - costs the live feed, never the run
                log.warning("%s: could not follow the run live: %s%s", name, cause(exc),
                            drop(self.sweep, name))
                del self.feeds[name]
                continue
            fed = self.state.fed[name]
            for series, point in points.items():
                step, count = fed.get(series, (-1, 0))
                fed[series] = (step, count + 1) if point.step == step else (point.step, 1)

    def close(self) -> Followed:
        self._pool.shutdown(wait=True)
        for feed in self.feeds.values():
            feed.close()
        return self.state


def _open(loggers: LoggersConfig, run_dir: Path, sweep: Path | None) -> dict[str, Feed]:
    from hetsgd.outputs.trackers.mlflow_runs import SINGLE_RUNS
    from hetsgd.outputs.trackers.tensorboard_events import events_dir

    sweep_name = sweep.name if sweep is not None else None
    openers: dict[str, Callable[[], Feed]] = {}
    if loggers.tensorboard is not None:
        tensorboard = loggers.tensorboard
        openers["tensorboard"] = lambda: TensorBoardFeed(
            events_dir(tensorboard, sweep_name, run_dir.name))
    if (mlflow := loggers.mlflow) is not None:
        openers["mlflow"] = lambda: MlflowFeed(
            mlflow, mlflow.experiment or sweep_name or SINGLE_RUNS, run_dir.name)
    where = {"mlflow": f" to {mlflow.tracking_uri}" if mlflow is not None else ""}
    feeds = {}
    for name, opener in openers.items():
        if tried(sweep, name):
            try:
                feeds[name] = opener()
            except Exception as exc:  # noqa: BLE001 - costs the tracker, never the run
                log.warning("%s: could not log the run in %s%s: %s%s", name, run_dir,
                            where.get(name, ""), cause(exc), drop(sweep, name))
    return feeds


@contextmanager
def following(run_dir: Path, loggers: LoggersConfig, groups: list[str],
              num_examples: int) -> Iterator[Callable[[Snapshot], None] | None]:
    """While training: the listener that feeds each snapshot to the trackers ``loggers``
    chooses (None where it chooses none); afterwards, what was fed is left for the final log
    (:func:`followed`)."""
    if loggers.tensorboard is None and loggers.mlflow is None:
        yield None
        return
    run_dir = Path(run_dir).resolve()
    sweep = run_dir.parent if (run_dir.parent / MULTIRUN).is_file() else None
    with ExitStack() as stack:
        if loggers.mlflow is not None:  # set once here: workers copy the environment meanwhile
            from hetsgd.outputs.trackers.mlflow_runs import request_limits

            stack.enter_context(request_limits(loggers.mlflow))
        chosen = [name for name in ("tensorboard", "mlflow") if getattr(loggers, name) is not None]
        started = {name for name in chosen if tried(sweep, name)}
        feeds = _open(loggers, run_dir, sweep)
        unopened = {name for name in chosen if name not in feeds}
        feed = LiveFeed(feeds,
                        lambda s: snapshot_points(s, groups, num_examples, time.time()), sweep)
        try:
            yield feed.snapshot
        finally:
            _followed[run_dir] = replace(feed.close(), unopened=unopened, tried=started)
