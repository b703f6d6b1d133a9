"""What a tracker logs of one finished run, read from its run directory alone (the layout in
docs/architecture.md), so that every tracker logs the same numbers the report and figures show.

Each snapshot (a row of ``convergence.csv``) and each utilization sample is logged at step = its
training time in milliseconds (``time_s``, virtual for a simulated run; 0: the initial model) and
at wall time = the run's start + its ``time_s``. Step is the training time rather than a row
number or the updates so that the runs of one budget line up on the trackers' default x axis
(MLflow's "Step", TensorBoard's "STEP"), whatever their number of snapshots; updates, epochs and
examples are series of their own. The run's start is not written down: it is the time
``workers.csv`` was written last (as training ended) less the training time, which is exact to
the time between the end of training and that write.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from hetsgd.config.checks import finite_or_none
from hetsgd.config.swept import sweep_overrides, swept_keys
from hetsgd.outputs.index import (
    MULTIRUN,
    override_values,
    read_config,
    read_overrides,
    read_summary,
)
from hetsgd.outputs.run_directory import SUMMARY

#: convergence.csv's columns and the series they are logged as; ``updates_<group>`` is
#: ``updates/<group>``, a method's own column ``method/<name>`` and any other keeps its name.
CONVERGENCE_SERIES = {"train_loss": "train/loss", "test_loss": "test/loss",
                      "test_acc": "test/accuracy", "updates": "updates/total",
                      "epoch": "progress/epoch"}
#: Utilization columns left out: one per core, as many as the machine has; the run-wide CPU
#: series and the figure cover them.
PER_CORE = re.compile(r"cpu\d+_percent")
IDENTITY = ("algo", "dataset", "model", "devices", "seed", "status")


@dataclass(frozen=True)
class Point:
    step: int  # training milliseconds
    time: float  # wall-clock seconds since the epoch
    value: float


def step_of(time_s: float) -> int:
    """The step a point of training time ``time_s`` is logged at: its training milliseconds."""
    return int(round(1000 * time_s))


@dataclass(frozen=True)
class RunRecord:
    """One run as the trackers log it."""

    run_dir: Path
    sweep: str | None  # the sweep's folder name, for a sweep's job
    status: str
    started: float  # wall-clock seconds at the run's time 0
    ended: float  # when its summary was written
    params: dict[str, str]  # the resolved config, flattened to dotted keys
    tags: dict[str, str]  # identity and status, then the values this job's sweep varies
    series: dict[str, list[Point]]
    figures: list[Path]

    @property
    def name(self) -> str:
        return self.run_dir.name

    def after(self, fed: dict[str, tuple[int, int]]) -> RunRecord:
        """This record less the points a live feed wrote (:mod:`.live`): of each series, those
        before its last step ``fed`` and as many at that step as were fed there."""
        return replace(self, series={name: _unfed(points, *fed.get(name, (-1, 0)))
                                     for name, points in self.series.items()})

    def final(self, series: str) -> float | None:
        points = self.series.get(series)
        return points[-1].value if points else None


def flatten(tree: Any, prefix: str = "") -> dict[str, str]:
    """``{"optim": {"lr": 0.1}}`` -> ``{"optim.lr": "0.1"}``; values other than text are written
    as JSON (``null``, ``true``, ``[64, 32]``), as one would type them in an override."""
    if isinstance(tree, dict):
        flat: dict[str, str] = {}
        for key, value in tree.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: tree if isinstance(tree, str) else json.dumps(tree)}


def swept_values(run_dir: Path) -> dict[str, str]:
    """The values of the keys the job's sweep varies, as the job's overrides set them (``{}`` for
    a run outside a sweep): the keys that name sweep job folders (:mod:`hetsgd.config.swept`)."""
    swept = swept_keys(sweep_overrides(run_dir.parent))
    return {key: value for key, value in override_values(read_overrides(run_dir)).items()
            if key in swept}


def series_name(column: str, logged: dict[str, float]) -> str:
    """The series a convergence column is logged as: a method's own (named in ``logged``,
    summary.json's ``method_log``) under ``method/``, the others as ``CONVERGENCE_SERIES``
    says."""
    if column in logged:
        return f"method/{column}"
    return CONVERGENCE_SERIES.get(column) or re.sub(r"^updates_", "updates/", column)


def _points(frame: pd.DataFrame, column: str, wall: Callable[[float], float]) -> list[Point]:
    """The column's numbers; an empty cell (NaN) has nothing to draw and is left out."""
    return [Point(step_of(time_s), wall(float(time_s)), float(value))
            for time_s, value in zip(frame["time_s"], frame[column])
            if not math.isnan(value) and not math.isnan(time_s)]


def _table(run_dir: Path, name: str) -> pd.DataFrame:
    file = run_dir / f"{name}.csv"
    if not file.is_file():
        return pd.DataFrame({"time_s": []})
    return pd.read_csv(file).apply(pd.to_numeric, errors="coerce")


def _series(run_dir: Path, summary: dict[str, Any],
            wall: Callable[[float], float]) -> dict[str, list[Point]]:
    conv = _table(run_dir, "convergence")
    logged = summary.get("method_log") or {}
    series = {series_name(column, logged): _points(conv, column, wall)
              for column in conv.columns if column != "time_s"}
    if "epoch" in conv and summary.get("epochs") and summary.get("examples"):
        # the summary's epochs are its examples / the training examples, as each row's epoch
        per_epoch = summary["examples"] / summary["epochs"]
        series["progress/examples"] = [Point(p.step, p.time, round(p.value * per_epoch))
                                       for p in series["progress/epoch"]]
    util = _table(run_dir, "utilization")
    series.update({f"utilization/{column}": _points(util, column, wall)
                   for column in util.columns
                   if column != "time_s" and not PER_CORE.fullmatch(column)})
    return series


def read_run(run_dir: Path) -> RunRecord:
    """The run in ``run_dir``, once its summary is final."""
    run_dir = Path(run_dir)
    summary = read_summary(run_dir)
    ended = (run_dir / SUMMARY).stat().st_mtime
    wall = _wall_clock(run_dir, summary, ended)
    config = read_config(run_dir)
    tags = {key: str(summary[key]) for key in IDENTITY if summary.get(key) is not None}
    sweep = run_dir.parent.name if (run_dir.parent / MULTIRUN).is_file() else None
    return RunRecord(run_dir=run_dir, sweep=sweep, status=summary["status"], started=wall(0.0),
                     ended=ended, params=flatten(config or {}),
                     tags={**tags, **swept_values(run_dir)},
                     series=_series(run_dir, summary, wall),
                     figures=sorted((run_dir / "figures").glob("*.png")))


def _wall_clock(run_dir: Path, summary: dict[str, Any], ended: float) -> Callable[[float], float]:
    """The wall-clock time of the run's time ``t``: its training ended when it last wrote
    workers.csv (else the summary). A simulated run's virtual seconds are spread over the real
    seconds its training took (``simulation.real_s``), where its live feed's points were: one
    for one, 0.5 virtual s that took minutes would be logged before the run began."""
    trained = run_dir / "workers.csv"
    end = trained.stat().st_mtime if trained.is_file() else ended
    time_s = finite_or_none(summary.get("time_s")) or 0.0
    simulation = summary.get("simulation")
    real_s = finite_or_none(simulation.get("real_s")) if isinstance(simulation, dict) else None
    rate = real_s / time_s if summary.get("simulated") and real_s and time_s > 0 else 1.0
    return lambda t: end - rate * (time_s - t)


def _unfed(points: list[Point], last: int, at_last: int) -> list[Point]:
    """``points`` (in step order) after the first ``at_last`` at step ``last`` and all before."""
    kept, seen = [], 0
    for point in points:
        if point.step == last:
            seen += 1
        if point.step > last or (point.step == last and seen > at_last):
            kept.append(point)
    return kept
