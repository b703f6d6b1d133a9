"""Trackers log every point at step = its training time in milliseconds, so that the runs of one
budget line up on MLflow's and TensorBoard's default x axis whatever their number of snapshots;
a sweep's job, which draws no figures of its own, is tracked with its figures."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from hetsgd.config.schema import LoggersConfig, MlflowConfig, TensorBoardConfig
from hetsgd.outputs.index import MULTIRUN
from hetsgd.outputs.run_directory import SUMMARY
from hetsgd.outputs.trackers import track
from hetsgd.outputs.trackers.record import read_run

# snapshot times of a run, unevenly spaced, and the milliseconds they are logged at
TIMES = [0.0, 0.2514, 0.5, 1.0007, 2.25]
STEPS = [0, 251, 500, 1001, 2250]
UTILIZATION_TIMES = [0.1, 0.35, 2.3]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> MlflowConfig:
    """One SQLite store for the module: creating one takes seconds."""
    folder = tmp_path_factory.mktemp("mlflow")
    return MlflowConfig(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}",
                        artifact_dir=str(folder / "mlruns"))


def _run_dir(parent: Path) -> Path:
    """A completed run's files: its summary, 5 snapshots (one without a test loss) and 3
    utilization samples."""
    run = parent / "0_seed=0"
    run.mkdir(parents=True)
    (run / SUMMARY).write_text(json.dumps({"status": "completed", "seed": 0, "algo": "sync",
                                           "time_s": TIMES[-1]}))
    pd.DataFrame({"time_s": TIMES, "train_loss": [2.3, 1.0, 0.5, 0.3, 0.2],
                  "test_loss": [2.3, 1.1, None, 0.4, 0.3], "test_acc": [0.1, 0.6, 0.8, 0.9, 0.9],
                  "epoch": [0.0, 1.0, 2.0, 4.0, 9.0]}).to_csv(run / "convergence.csv", index=False)
    pd.DataFrame({"time_s": UTILIZATION_TIMES, "host_cpu_percent": [50.0, 60.0, 70.0],
                  "workers_cpu_percent": [90.0, 95.0, 99.0]}).to_csv(run / "utilization.csv",
                                                                      index=False)
    return run


def test_every_point_is_logged_at_its_training_milliseconds(tmp_path: Path) -> None:
    record = read_run(_run_dir(tmp_path))
    assert [p.step for p in record.series["train/loss"]] == STEPS
    assert [p.step for p in record.series["test/loss"]] == [0, 251, 1001, 2250]  # one empty
    assert [p.step for p in record.series["utilization/workers_cpu_percent"]] == [100, 350, 2300]
    loss = record.series["train/loss"]
    assert [round(p.time - record.started, 4) for p in loss] == TIMES


def test_tensorboard_and_mlflow_read_back_the_milliseconds(tmp_path: Path,
                                                          store: MlflowConfig) -> None:
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = _run_dir(tmp_path / "runs")
    track(run, LoggersConfig(tensorboard=TensorBoardConfig(dir=str(tmp_path / "tb")),
                             mlflow=store))
    events = EventAccumulator(str(tmp_path / "tb" / run.name), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == STEPS
    assert [e.step for e in events.Scalars("utilization/host_cpu_percent")] == [100, 350, 2300]
    client = MlflowClient(tracking_uri=store.tracking_uri)
    mlflow_run, = client.search_runs([client.get_experiment_by_name("hetsgd").experiment_id])
    history = client.get_metric_history(mlflow_run.info.run_id, "train/loss")
    assert sorted(m.step for m in history) == STEPS


def test_a_sweeps_job_is_tracked_with_its_figures(tmp_path: Path, store: MlflowConfig) -> None:
    from mlflow import MlflowClient

    sweep = tmp_path / "sweep"
    job = _run_dir(sweep)
    (sweep / MULTIRUN).write_text(yaml.safe_dump({"hydra": {"overrides": {"task": ["seed=0,1"]}}}))
    assert not (job / "figures").exists()  # a sweep's job draws none of its own
    track(job, LoggersConfig(mlflow=store))
    drawn = {f"figures/{png.name}" for png in (job / "figures").glob("*.png")}
    assert {"figures/loss_vs_time.png", "figures/utilization.png"} <= drawn
    client = MlflowClient(tracking_uri=store.tracking_uri)
    mlflow_run, = client.search_runs([client.get_experiment_by_name("sweep").experiment_id])
    logged = {f.path for f in client.list_artifacts(mlflow_run.info.run_id, "figures")}
    assert logged == drawn


@pytest.mark.parametrize("simulated", [False, True])
def test_each_point_is_at_its_wall_time_a_simulated_runs_spread_over_its_real_seconds(
        tmp_path: Path, simulated: bool) -> None:
    """Training ended when workers.csv was last written; a simulated run's 2.25 virtual s took
    90 real s, over which its points lie (where its live feed put them): laid one for one,
    they came before the run began."""
    import os

    run = _run_dir(tmp_path)
    summary = json.loads((run / SUMMARY).read_text())
    if simulated:
        summary.update(simulated=True, simulation={"real_s": 90.0, "probed_virtual_s": 0.01,
                                                   "real_s_per_virtual_s": 40.0,
                                                   "estimated_real_s": 90.0})
    (run / SUMMARY).write_text(json.dumps(summary))
    (run / "workers.csv").write_text("worker,group\n0,cpu\n")
    end = 1_800_000_000.0
    os.utime(run / "workers.csv", (end, end))
    rate = 40.0 if simulated else 1.0
    record = read_run(run)
    assert record.started == pytest.approx(end - rate * TIMES[-1], abs=1e-3)
    assert [p.time for p in record.series["train/loss"]] == pytest.approx(
        [end - rate * (TIMES[-1] - t) for t in TIMES], abs=1e-3)  # rel: 1.8e3 s at 1.8e9
