"""Trackers log what the run directory holds, the same numbers: TensorBoard's event files and
MLflow's runs read back equal convergence.csv; a sweep is one experiment, a run per job tagged
with its swept values; a tracker that cannot log costs a warning, never the run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner, Result

from hetsgd.cli import app
from hetsgd.config.schema import LoggersConfig, MlflowConfig, TensorBoardConfig
from hetsgd.outputs.index import MULTIRUN, OVERRIDES, find_runs
from hetsgd.outputs.run_directory import SUMMARY
from hetsgd.outputs.trackers import track
from hetsgd.outputs.trackers.failures import drop, tried
from hetsgd.outputs.trackers.record import flatten, read_run, swept_values

SHORT = ("budget.epochs=null", "eval.every_s=0.25", "progress=false")


def _hetsgd(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One results folder for the module, so that its one SQLite store is created once."""
    path = tmp_path_factory.mktemp("results")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HETSGD_RESULTS", str(path))
        patch.setenv("HETSGD_DATA", str(tmp_path_factory.mktemp("data")))
        yield path


@pytest.fixture(scope="module")
def tracked(results: Path) -> Path:
    """A one-second run logged to both trackers at their defaults (under the results folder)."""
    before = set(_runs(results))
    result = _hetsgd("run", *SHORT, "budget.seconds=1", "logger=[tensorboard,mlflow]")
    assert result.exit_code == 0, result.output
    run_dir, = set(_runs(results)) - before
    return run_dir


@pytest.fixture(scope="module")
def swept(results: Path) -> Path:
    """A sweep of two half-second jobs, seeds 0 and 1, logged to MLflow."""
    result = _hetsgd("run", "-m", "seed=0,1", *SHORT, "budget.seconds=0.5", "logger=mlflow")
    assert result.exit_code == 0, result.output
    sweep_dir, = (results / "sweeps").iterdir()
    return sweep_dir


def _runs(results: Path) -> list[Path]:
    return list((results / "runs").iterdir()) if (results / "runs").is_dir() else []


def _client(results: Path):  # noqa: ANN202 - mlflow loads only in the tests that need it
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")


def _convergence(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(run_dir / "convergence.csv")


@pytest.mark.integration
def test_tensorboard_events_hold_every_snapshot_of_convergence_csv(results: Path,
                                                                  tracked: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(results / "tensorboard" / tracked.name),
                              size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    conv = _convergence(tracked)
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == [round(1000 * t) for t in conv["time_s"]]  # milliseconds
    np.testing.assert_allclose([e.value for e in loss], conv["train_loss"], rtol=1e-6)
    times = np.array([e.wall_time for e in loss])
    np.testing.assert_allclose(times - times[0], conv["time_s"] - conv["time_s"][0], atol=1e-3)
    # fed live: every snapshot taken, once, those the cap thinned out of convergence.csv too
    fed = [e.step for e in events.Scalars("updates/cpu")]
    assert {round(1000 * t) for t in conv["time_s"]} <= set(fed) and len(set(fed)) == len(fed)
    assert {"test/accuracy", "progress/examples",
            "utilization/workers_cpu_percent"} <= set(events.Tags()["scalars"])
    assert {f"figures/{png.stem}" for png in (tracked / "figures").glob("*.png")} == set(
        events.Tags()["images"]) != set()


@pytest.mark.integration
def test_mlflow_run_holds_the_config_the_metrics_and_the_figures(results: Path,
                                                                 tracked: Path) -> None:
    client = _client(results)
    experiment = client.get_experiment_by_name("hetsgd")
    run, = client.search_runs([experiment.experiment_id])
    config = yaml.safe_load((tracked / "config.yaml").read_text())
    assert run.data.params["optim.lr"] == json.dumps(config["optim"]["lr"])
    assert run.data.params["algo.name"] == "sync"
    assert run.data.tags["seed"] == "0" and run.data.tags["status"] == "completed"
    assert run.info.run_name == tracked.name and run.info.status == "FINISHED"
    conv = _convergence(tracked)
    history = sorted(client.get_metric_history(run.info.run_id, "train/loss"),
                     key=lambda m: m.step)
    assert [m.step for m in history] == [round(1000 * t) for t in conv["time_s"]]
    np.testing.assert_allclose([m.value for m in history], conv["train_loss"], rtol=1e-12)
    stamps = np.array([m.timestamp for m in history])
    np.testing.assert_allclose(stamps - stamps[0], 1000 * (conv["time_s"] - conv["time_s"][0]),
                               atol=1.0)
    summary = json.loads((tracked / SUMMARY).read_text())
    examples = client.get_metric_history(run.info.run_id, "progress/examples")
    assert max(m.value for m in examples) == summary["examples"]
    figures = {f.path for f in client.list_artifacts(run.info.run_id, "figures")}
    assert figures == {f"figures/{png.name}" for png in (tracked / "figures").glob("*.png")}


@pytest.mark.integration
def test_a_sweep_is_one_experiment_with_a_run_per_job_tagged_with_its_seed(results: Path,
                                                                          swept: Path) -> None:
    client = _client(results)
    experiment = client.get_experiment_by_name(swept.name)
    runs = client.search_runs([experiment.experiment_id])
    jobs = sorted(d.name for d in swept.iterdir() if (d / SUMMARY).is_file())
    assert sorted(r.info.run_name for r in runs) == jobs and len(jobs) == 2
    assert sorted(r.data.tags["seed"] for r in runs) == ["0", "1"]
    for run in runs:  # a job draws no figures of its own: the tracker draws them
        figures = {f.path for f in client.list_artifacts(run.info.run_id, "figures")}
        assert figures == {f"figures/{png.name}"
                           for png in (swept / run.info.run_name / "figures").glob("*.png")} != set()
    assert all("budget.seconds" not in r.data.tags for r in runs)  # set, not swept
    assert not (results / "tensorboard").joinpath(swept.name).exists()  # mlflow only
    # MLflow's store under the results holds each run's summary.json and config.yaml again:
    # copies, which listings, reports and figures do not take for runs
    assert list((results / "mlruns").rglob("artifacts/summary.json"))
    assert [p for p in find_runs(results) if p.parent == swept] == [swept / job for job in jobs]
    assert not [p for p in find_runs(results) if "mlruns" in p.parts]


def test_swept_values_are_those_the_command_line_and_the_sweeper_vary(tmp_path: Path) -> None:
    job = tmp_path / "sweep" / "3_+method=hogbatch,seed=1"
    (job / ".hydra").mkdir(parents=True)
    multirun = {"hydra": {"overrides": {"task": ["seed=0,1", "budget.seconds=2"]},
                          "sweeper": {"params": {"+method": "hogwild,hogbatch", "optim.lr": 0.1}}}}
    (job.parent / MULTIRUN).write_text(yaml.safe_dump(multirun))
    (job / OVERRIDES).write_text(yaml.safe_dump(["seed=1", "budget.seconds=2",
                                                 "+method=hogbatch", "optim.lr=0.1"]))
    assert swept_values(job) == {"seed": "1", "method": "hogbatch"}
    assert swept_values(tmp_path) == {}
    # and the job's record is tagged with them, beside its summary's identity
    (job / SUMMARY).write_text(json.dumps({"status": "completed", "seed": 1, "algo": "hogwild"}))
    assert read_run(job).tags == {"algo": "hogwild", "seed": "1", "status": "completed",
                                  "method": "hogbatch"}


def test_flattened_config_keys_are_dotted_and_values_as_typed() -> None:
    assert flatten({"optim": {"lr": 0.1, "momentum": None}, "model": {"hidden": [64, 32]},
                    "algo": {"name": "sync", "fixed": True}, "plan": {}}) == {
        "optim.lr": "0.1", "optim.momentum": "null", "model.hidden": "[64, 32]",
        "algo.name": "sync", "algo.fixed": "true"}


@pytest.mark.integration
def test_an_unreachable_tracking_server_costs_a_warning_not_the_run(results: Path) -> None:
    with socket.socket() as taken:  # bound, not listening: connections to it are refused
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        before, started = set(_runs(results)), time.monotonic()
        result = _hetsgd("run", *SHORT, "budget.seconds=0.3", "logger=mlflow",
                         f"logger.mlflow.tracking_uri=http://127.0.0.1:{port}")
        assert time.monotonic() - started < 120
    assert result.exit_code == 0, result.output
    run_dir, = set(_runs(results)) - before
    assert json.loads((run_dir / SUMMARY).read_text())["status"] == "completed"
    warning, = (line for line in (run_dir / "cli.log").read_text().splitlines()
                if "mlflow:" in line)
    assert "WARNING" in warning
    assert f"could not log the run in {run_dir} to http://127.0.0.1:{port}: " in warning


@pytest.mark.integration
@pytest.mark.serial  # bounds the wall time, mlflow's import included
def test_a_silent_tracking_server_costs_its_timeout(tracked: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as silent:  # accepts connections (the kernel does), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        with caplog.at_level("WARNING", logger="hetsgd"):
            track(tracked, LoggersConfig(mlflow=MlflowConfig(tracking_uri=uri, timeout_s=1)))
        assert time.monotonic() - started < 10
    warning, = (r.getMessage() for r in caplog.records)
    assert warning.startswith(f"mlflow: could not log the run in {tracked} to {uri}: ")
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ  # put back


def test_a_run_directory_that_cannot_be_read_costs_a_warning(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture
                                                             ) -> None:
    with caplog.at_level("WARNING", logger="hetsgd"):
        track(tmp_path, LoggersConfig(mlflow=MlflowConfig(tracking_uri="http://127.0.0.1:1")))
    warning, = (r.getMessage() for r in caplog.records)
    assert warning.startswith(f"trackers: could not read the run in {tmp_path}: ")


@pytest.mark.integration
def test_importing_the_command_loads_no_tracker() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, hetsgd.cli; print(sorted({m.split('.')[0] for m in "
         "sys.modules} & {'mlflow', 'tensorboard'}) + [m for m in sys.modules "
         "if m.startswith('torch.utils.tensorboard')])"],
        capture_output=True, text=True, timeout=120, check=True)
    assert loaded.stdout.strip() == "[]"


@pytest.mark.integration
def test_a_run_record_reads_the_run_directory(tracked: Path) -> None:
    record = read_run(tracked)
    assert record.sweep is None and record.status == "completed"
    assert record.started < record.ended
    assert not any(name.startswith("utilization/cpu0") for name in record.series)


@pytest.mark.parametrize(("status", "ended_as"), [
    ("completed", "FINISHED"), ("interrupted", "KILLED"), ("failed", "FAILED"),
    ("diverged", "FAILED"), ("crashed", "FAILED")])
def test_an_mlflow_run_ends_as_the_run_did_at_its_own_times_in_the_named_experiment(
        tmp_path: Path, status: str, ended_as: str) -> None:
    """A run that failed or was stopped is not FINISHED in MLflow; its start and end are the
    run's own (absolute, in ms), not the logging's; ``logger.mlflow.experiment`` names it."""
    from mlflow import MlflowClient

    from hetsgd.outputs.trackers.mlflow_runs import log_run
    from hetsgd.outputs.trackers.record import RunRecord

    record = RunRecord(run_dir=tmp_path / "x", sweep=None, status=status, started=1_700_000_000.25,
                       ended=1_700_000_060.5, params={"optim.lr": "0.1"},
                       tags={"status": status, "seed": "3"}, series={}, figures=[])
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    run_id = log_run(record, MlflowConfig(tracking_uri=uri, artifact_dir=str(tmp_path / "a"),
                                          experiment="mine"))
    run = MlflowClient(tracking_uri=uri).get_run(run_id)
    assert run.info.status == ended_as
    assert (run.info.start_time, run.info.end_time) == (1_700_000_000_250, 1_700_000_060_500)
    assert run.data.tags["status"] == status and run.data.tags["seed"] == "3"
    assert run.data.params == {"optim.lr": "0.1"}
    assert MlflowClient(tracking_uri=uri).get_experiment(run.info.experiment_id).name == "mine"


def test_a_run_past_mlflow_s_batch_limits_is_logged_whole(tmp_path: Path) -> None:
    """More params and metric points than one MLflow call takes go in several calls (a long
    run's curve, a wide config), and a value past MLflow's length limit is cut to it."""
    from mlflow import MlflowClient

    from hetsgd.outputs.trackers.mlflow_runs import (
        METRICS_PER_CALL,
        PARAM_LENGTH,
        PARAMS_PER_CALL,
        log_run,
    )
    from hetsgd.outputs.trackers.record import Point, RunRecord

    params = {f"key{i}": str(i) for i in range(2 * PARAMS_PER_CALL + 1)}
    params["long"] = "x" * (PARAM_LENGTH + 10)
    points = [Point(step, 1.0 + step / 1000, float(step)) for step in range(2 * METRICS_PER_CALL + 1)]
    record = RunRecord(run_dir=tmp_path / "x", sweep=None, status="completed", started=1.0,
                       ended=9.0, params=params, tags={}, series={"train/loss": points},
                       figures=[])
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    client = MlflowClient(tracking_uri=uri)
    run_id = log_run(record, MlflowConfig(tracking_uri=uri, artifact_dir=str(tmp_path / "a")))
    logged = client.get_run(run_id).data.params
    assert logged == {**params, "long": "x" * PARAM_LENGTH}
    history = client.get_metric_history(run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(2 * METRICS_PER_CALL + 1))


def test_a_failed_sweep_job_is_logged_in_its_sweeps_folder(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    job = tmp_path / "sweep" / "0_seed=0"
    job.mkdir(parents=True)
    (job.parent / MULTIRUN).write_text(yaml.safe_dump({"hydra": {"overrides": {"task": []}}}))
    (job / "config.yaml").write_text(yaml.safe_dump({"optim": {"lr": 0.1}}))
    (job / SUMMARY).write_text(json.dumps({"status": "failed", "error": "no data", "seed": 0}))
    with caplog.at_level("WARNING", logger="hetsgd"):
        track(job, LoggersConfig(tensorboard=TensorBoardConfig(dir=str(tmp_path / "tb"))))
    assert not caplog.records
    events = EventAccumulator(str(tmp_path / "tb" / "sweep" / job.name))
    events.Reload()
    assert events.Tags()["scalars"] == [] and "config/text_summary" in events.Tags()["tensors"]


def test_a_tracker_dropped_in_a_sweep_is_left_out_however_its_folder_is_spelt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The live feed and the final log reach the sweep's folder by different paths (relative,
    resolved): a failure one of them records must hold for the other."""
    (tmp_path / "sweep").mkdir()
    monkeypatch.chdir(tmp_path)
    assert tried(Path("sweep"), "mlflow")
    assert drop(Path("sweep"), "mlflow").endswith("left out for the rest of the sweep")
    assert not tried(tmp_path / "sweep", "mlflow")
    assert not tried(tmp_path / "sweep" / ".." / "sweep", "mlflow")
    assert tried(tmp_path / "sweep", "tensorboard") and tried(None, "mlflow")


def test_mlflow_s_request_limits_hold_while_a_run_is_logged_and_are_put_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's own settings come back (a notebook's later MLflow calls keep theirs), and a
    variable the user had not set is unset again."""
    from hetsgd.outputs.trackers.mlflow_runs import request_limits

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "77")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    with request_limits(MlflowConfig(timeout_s=2.5, retries=3)):
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "3"  # whole seconds, rounded up
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "3"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "77"
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ


def test_tensorboard_s_hparams_are_the_run_s_tags_beside_its_final_results(
        tmp_path: Path) -> None:
    """The HParams tab groups runs by method and seed and shows their final losses: the tags
    as hparams, each result's last point as its metric."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    from hetsgd.outputs.trackers.record import Point, RunRecord
    from hetsgd.outputs.trackers.tensorboard_events import write_events

    series = {"train/loss": [Point(0, 1.0, 2.0), Point(500, 1.5, 0.25)],
              "test/accuracy": [Point(500, 1.5, 0.75)]}
    record = RunRecord(run_dir=tmp_path / "x", sweep=None, status="completed", started=1.0,
                       ended=2.0, params={"optim.lr": "0.1"},
                       tags={"algo": "hogwild", "seed": "3"}, series=series, figures=[])
    folder = write_events(record, TensorBoardConfig(dir=str(tmp_path / "tb")))
    events = EventAccumulator(str(folder))
    events.Reload()

    def plugin(tag: str) -> plugin_data_pb2.HParamsPluginData:
        return plugin_data_pb2.HParamsPluginData.FromString(
            events.SummaryMetadata(tag).plugin_data.content)

    started = plugin("_hparams_/session_start_info").session_start_info
    assert {k: v.string_value for k, v in started.hparams.items()} == {"algo": "hogwild",
                                                                         "seed": "3"}
    metrics = {m.name.tag for m in plugin("_hparams_/experiment").experiment.metric_infos}
    assert metrics == {"train/loss", "test/accuracy"}  # no test/loss was logged
    # what the tab shows for each: the scalar series' last value
    assert {tag: events.Scalars(tag)[-1].value for tag in metrics} == {"train/loss": 0.25,
                                                                       "test/accuracy": 0.75}


@pytest.mark.integration
def test_a_resumed_run_is_logged_to_the_trackers_its_checkpoint_chose(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`resume=RUN_DIR` trains with the checkpoint's config, `logger=mlflow` included: its live
    feed opened an MLflow run that the final log, which read the command's (no logger), never
    ended or filled."""
    from conftest import CHECKPOINTED_RUN

    import hetsgd

    monkeypatch.setenv("HETSGD_RESULTS", str(tmp_path))
    monkeypatch.setenv("HETSGD_DATA", str(tmp_path / "data"))
    first = hetsgd.run(*CHECKPOINTED_RUN, "logger=mlflow")
    assert first.exit_code == 0, first.summary.error
    resumed = hetsgd.run(f"resume={first.summary.run_dir}", "budget.seconds=0.6", "progress=false")
    assert resumed.exit_code == 0, resumed.summary.error
    client = _client(tmp_path)
    runs = client.search_runs([client.get_experiment_by_name("hetsgd").experiment_id])
    assert sorted(run.info.status for run in runs) == ["FINISHED", "FINISHED"]
    for run in runs:  # each with its own final losses, the resumed run's past the checkpoint
        losses = client.get_metric_history(run.info.run_id, "train/loss")
        assert losses and run.data.params["budget.seconds"] in ("0.5", "0.6")
    assert {run.data.params["budget.seconds"] for run in runs} == {"0.5", "0.6"}
