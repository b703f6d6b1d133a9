"""Trackers fed while the run trains: a tracker double sees each snapshot's progress and the
method's own numbers before the run has evaluated anything (convergence.csv not yet written);
TensorBoard and a file-based MLflow store then hold every snapshot once, the live points and the
final log's together, in one folder and one run; a live feed that fails costs a warning, and
the final log writes the points it missed."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from test_method_log import SIMULATED, _run, plugins  # noqa: F401 - the fixture

from hetsgd.outputs.trackers import live
from hetsgd.outputs.trackers.record import Point, RunRecord, step_of

CENTRE = ("mymethods.centre", *SIMULATED, "+algo.tau=4")


class Recorder:
    """A tracker double: what it was fed, and whether the run had evaluated its snapshots
    (written convergence.csv) by then."""

    def __init__(self, run_dir: Path, fail_after: int | None = None) -> None:
        self.run_dir, self.fail_after = run_dir, fail_after
        self.calls: list[tuple[dict[str, Point], bool]] = []
        self.closed = False

    def write(self, points: dict[str, Point]) -> None:
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise OSError("disk full")
        self.calls.append((points, (self.run_dir / "convergence.csv").exists()))

    def close(self) -> None:
        self.closed = True


def _recording(monkeypatch: pytest.MonkeyPatch, name: str,
               fail_after: int | None = None) -> list[Recorder]:
    """The live feed's trackers replaced by one double called ``name``; returns where it
    will be once the run opens it."""
    opened: list[Recorder] = []

    def _open(loggers: object, run_dir: Path, sweep: Path | None) -> dict[str, Recorder]:
        opened.append(Recorder(run_dir, fail_after))
        return {name: opened[-1]}

    monkeypatch.setattr(live, "_open", _open)
    return opened


def _steps(time_s: list[float]) -> list[int]:
    return [step_of(t) for t in time_s]


def test_the_tracker_is_fed_each_snapshot_before_the_run_has_evaluated_any(
        plugins: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    opened = _recording(monkeypatch, "double")
    result = _run(*CENTRE, "logger=tensorboard")
    assert result.status == "completed" and result.convergence is not None
    recorder, = opened
    assert recorder.closed and len(recorder.calls) == len(result.convergence)
    assert not any(evaluated for _, evaluated in recorder.calls)  # all while it trained
    fed = [points for points, _ in recorder.calls]
    assert [p["updates/total"].step for p in fed] == _steps(result.convergence["time_s"])
    assert [p["updates/total"].value for p in fed] == result.convergence["updates"].tolist()
    distance = [p["method/replica_distance"].value for p in fed
                if "method/replica_distance" in p]
    assert distance == pytest.approx(result.convergence["replica_distance"].dropna().tolist())
    assert live._followed == {}  # the final log took what was fed


def _scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    """The scalars of ``tag`` in the TensorBoard folder of a run (``folder``: its name, or
    its sweep's and its name)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(Path(os.environ["HETSGD_RESULTS"]) / "tensorboard"
                                  / folder))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_tensorboard_holds_every_snapshot_once_live_and_final_together(
        plugins: Path) -> None:  # noqa: F811
    result = _run(*CENTRE, "logger=tensorboard")
    conv = result.convergence
    assert result.status == "completed" and conv is not None
    steps, folder = _steps(conv["time_s"]), Path(result.run_dir.name)
    assert _scalars(folder, "updates/total") == list(zip(steps, conv["updates"]))
    assert [s for s, _ in _scalars(folder, "train/loss")] == steps  # the final log's
    logged = conv["replica_distance"].notna()
    distance = _scalars(folder, "method/replica_distance")
    assert [s for s, _ in distance] == [s for s, k in zip(steps, logged) if k]
    assert [v for _, v in distance] == pytest.approx(conv["replica_distance"][logged].tolist())


def test_a_file_based_mlflow_store_holds_one_run_with_each_snapshot_once(
        plugins: Path) -> None:  # noqa: F811
    from mlflow import MlflowClient

    result = _run(*CENTRE, "logger=mlflow")
    conv = result.convergence
    assert result.status == "completed" and conv is not None
    results = Path(os.environ["HETSGD_RESULTS"])
    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    run, = client.search_runs([client.get_experiment_by_name("hetsgd").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["status"] == "completed"

    def holds_each_once(name: str, column: str) -> bool:
        """Every snapshot's point of ``column``, none more often than the snapshots hold it:
        the run's last two snapshots may share a millisecond step and their values, and MLflow
        keeps one of two equal points where they were also logged in the same millisecond."""
        points = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, name)]
        expected = [(s, v) for s, v in zip(steps, conv[column]) if v == v]  # not NaN
        return set(points) == set(expected) and not Counter(points) - Counter(expected)

    steps = _steps(conv["time_s"])
    assert holds_each_once("updates/total", "updates")
    assert holds_each_once("train/loss", "train_loss")  # the final log's
    assert holds_each_once("method/replica_distance", "replica_distance")


@pytest.mark.parametrize("in_a_sweep", [False, True])
def test_a_live_feed_that_fails_costs_a_warning_and_the_final_log_writes_what_it_missed(
        plugins: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        capsys: pytest.CaptureFixture[str], in_a_sweep: bool) -> None:
    """In a sweep, the tracker is left out for the later jobs; this job's final log still
    writes what its feed missed (and would end the MLflow run the feed opened)."""
    runs = Path(os.environ["HETSGD_RESULTS"]) / "runs"
    if in_a_sweep:  # the run's folder is then a job's, as the live feed and the final log see
        runs.mkdir(parents=True)
        (runs / "multirun.yaml").write_text("hydra: {overrides: {task: []}}\n")
    opened = _recording(monkeypatch, "tensorboard", fail_after=1)
    result = _run(*CENTRE, "logger=tensorboard")
    conv = result.convergence
    assert result.status == "completed" and conv is not None
    assert len(opened[0].calls) == 1  # the first snapshot, then it failed and was fed no more
    warnings = [line.partition(" - ")[2] for line in capsys.readouterr().out.splitlines()
                if "could not follow the run live" in line]
    assert warnings == ["tensorboard: could not follow the run live: OSError: disk full" +
                        ("; tensorboard is left out for the rest of the sweep" if in_a_sweep
                         else "")]
    steps = _steps(conv["time_s"])  # the real event files: all but the point the double took
    folder = Path("runs", result.run_dir.name) if in_a_sweep else Path(result.run_dir.name)
    assert _scalars(folder, "updates/total") == list(zip(steps, conv["updates"]))[1:]


def test_the_final_log_writes_a_snapshot_the_feed_missed_at_a_step_it_fed(tmp_path: Path) -> None:
    """A run's last meeting and its final snapshot can share a step: the feed may have written
    the first and not the second, which the final log must still write, once."""
    points = [Point(0, 0.0, 0.0), Point(50, 1.0, 690.0), Point(50, 2.0, 696.0)]
    record = RunRecord(run_dir=tmp_path, sweep=None, status="completed", started=0.0, ended=1.0,
                       params={}, tags={}, series={"updates/total": points, "train/loss": points},
                       figures=[])
    left = record.after({"updates/total": (50, 1)})
    assert left.series["updates/total"] == [Point(50, 2.0, 696.0)]
    assert left.series["train/loss"] == points  # never fed: all of it
    assert record.after({"updates/total": (50, 2)}).series["updates/total"] == []
    assert record.after({"updates/total": (0, 1)}).series["updates/total"] == points[1:]

