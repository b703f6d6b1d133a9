"""Folders claimed, files safe: a sweep folder claimed once, CSV cells no spreadsheet evaluates,
bidirectional controls and MLflow's own lines made safe, and the unclean cases of a table, a
calibration, a full disk and a sweep's starting job each one line naming the file, column or
value."""

from __future__ import annotations

import errno
import json
import multiprocessing as mp
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import psutil
import pytest
import torch
from conftest import compose_config
from test_cli import hetsgd
from torch import nn

from hetsgd.config import compose_run, to_run_config
from hetsgd.config.labels import dataset_label, model_label
from hetsgd.engines.virtual.profiles import load_calibration
from hetsgd.errors import UserError
from hetsgd.invocation import invoke
from hetsgd.liveness import is_alive, this_process
from hetsgd.model.custom import check_token_ids
from hetsgd.outputs import run_directory
from hetsgd.outputs.index import CLAIM, CRASHED, RUNNING, read_summary
from hetsgd.outputs.run_directory import append_rows, write_csv
from hetsgd.outputs.safe_text import shown, spreadsheet_cell
from hetsgd.outputs.summary import RunSummary
from hetsgd.outputs.sweep import claim_folder
from hetsgd.runs import runner

SHORT = ("dataset=digits", "model=logreg", "devices=single_cpu", "budget.epochs=null",
         "budget.seconds=0.3", "eval.every_s=0.1", "eval.every_epochs=null", "progress=false")


# -- a sweep folder claimed by one sweep ---------------------------------------------------------


def _claim(folder: str, start: mp.Event, results: mp.Queue) -> None:
    start.wait()
    try:
        claim_folder(Path(folder))
        results.put("claimed")
    except UserError as exc:
        results.put(str(exc))


def test_of_sweeps_claiming_one_folder_at_once_one_alone_gets_it(tmp_path: Path) -> None:
    """Eight processes released together: a check-then-create would let several through."""
    ctx = mp.get_context("fork")  # the children need nothing but the function
    start, results = ctx.Event(), ctx.Queue()
    folder = tmp_path / "sweep"
    procs = [ctx.Process(target=_claim, args=(str(folder), start, results)) for _ in range(8)]
    for proc in procs:
        proc.start()
    start.set()
    outcomes = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(60)
    assert outcomes.count("claimed") == 1, outcomes
    refusals = [o for o in outcomes if o != "claimed"]
    assert all(o.startswith(f"hydra.sweep.dir {folder} is claimed by another sweep (process ")
               for o in refusals), refusals
    assert json.loads((folder / CLAIM).read_text())["pid"] in [p.pid for p in procs]


def test_a_folder_that_cannot_be_made_or_claimed_is_one_line_leaving_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file where the folder goes, and a full disk while the claim is written: one line
    naming the setting and the folder (an OSError reached the user whole), and no half-written
    claim left behind."""
    (tmp_path / "taken").write_text("a file")
    with pytest.raises(UserError, match=f"^hydra.sweep.dir {tmp_path / 'taken'}: cannot create "
                                        "it: File exists$"):
        claim_folder(tmp_path / "taken")

    def full(self: Path, *args: object, **kwargs: object) -> int:
        self.write_bytes(b"{")  # the disk filled part way
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(UserError, match=f"^hydra.sweep.dir {tmp_path / 'sweep'}: cannot claim "
                                        "it: No space left on device$"):
        claim_folder(tmp_path / "sweep")
    assert list((tmp_path / "sweep").iterdir()) == []


@pytest.mark.integration
def test_a_sweep_into_a_claimed_folder_is_refused_before_any_job(results_dir: Path,
                                                                  tmp_path: Path) -> None:
    folder = tmp_path / "sweep"
    claim_folder(folder)  # another sweep, this test's process, still running
    claimed = (folder / CLAIM).read_bytes()
    result = hetsgd("run", "-m", "seed=0,1", *SHORT, f"hydra.sweep.dir={folder}")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"hetsgd: error: hydra.sweep.dir {folder} is claimed by another sweep (process "
        f"{os.getpid()} on {this_process()['host']}, running): choose another folder (or leave "
        "it out for a new one under results/), or move that one away first"]
    assert [p.name for p in folder.iterdir()] == [CLAIM] and (folder / CLAIM).read_bytes() == claimed


def test_a_sweep_refused_before_its_first_job_leaves_no_folder_and_no_claim(
        results_dir: Path, tmp_path: Path) -> None:
    """A job that does not compose (a misspelt method) stops the sweep after its folder was
    claimed: an empty sweep left to list, and a claim refusing the folder to the next sweep;
    and the folders created above it (an empty results/sweeps/), not those that were there."""
    (tmp_path / "kept").mkdir()  # empty, and the user's: it stays
    folder = tmp_path / "kept" / "made" / "sweeps" / "sweep"
    refused = invoke(["-m", "algo=sync,hogbach", f"hydra.sweep.dir={folder}"])
    assert refused.code == 1 and len(refused.errors) == 1 and "hogbach" in refused.errors[0]
    assert not (tmp_path / "kept" / "made").exists() and (tmp_path / "kept").is_dir()
    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")  # a folder that holds more is left as it is
    invoke(["-m", "algo=sync,hogbach", f"hydra.sweep.dir={folder}"])
    assert sorted(p.name for p in folder.iterdir()) == [CLAIM, "multirun.yaml", "notes.txt"]


def test_a_run_into_an_earlier_runs_folder_is_refused_leaving_it_whole(
        results_dir: Path, tmp_path: Path) -> None:
    """`hydra.run.dir=DIR` again, as Hydra's users do: the new run overwrote the summary and
    left the earlier run's convergence.csv and figures beside it, read as the new run's."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text('{"status": "completed", "algo": "sync"}')
    before = sorted(p.name for p in run_dir.iterdir())
    refused = invoke([f"hydra.run.dir={run_dir}", "algo=hogwild"])
    assert refused.code == 1 and refused.errors == [
        f"hydra.run.dir {run_dir} holds an earlier run, which this one would overwrite: choose "
        "another folder (or leave hydra.run.dir out for a new one), or continue that run with "
        f"resume={run_dir}"]
    assert sorted(p.name for p in run_dir.iterdir()) == before  # no .hydra/ of the new run
    assert (run_dir / "summary.json").read_text() == '{"status": "completed", "algo": "sync"}'


# -- CSV cells, bidirectional controls -----------------------------------------------------------


def test_texts_that_start_like_formulas_are_neutralised_in_every_csv_numbers_are_not(
        tmp_path: Path) -> None:
    cells = ["=HYPERLINK(\"http://x\")", "+1+2", "-2+3", "@SUM(A1)", "\tx", "ok", "-0.5"]
    write_csv(tmp_path / "table.csv", pd.DataFrame({"text": cells, "number": range(-4, 3)}))
    read = pd.read_csv(tmp_path / "table.csv", keep_default_na=False)
    assert list(read["text"]) == ["'=HYPERLINK(\"http://x\")", "'+1+2", "'-2+3", "'@SUM(A1)",
                                  "'\tx", "ok", "-0.5"]
    assert list(read["number"]) == list(range(-4, 3))  # negative numbers stay numbers
    append_rows(tmp_path / "rows.csv", [{"group": "=cmd|' /C calc'!A0", "time_s": -1.5}])
    assert (tmp_path / "rows.csv").read_text().splitlines()[1] == "'=cmd|' /C calc'!A0,-1.5"
    assert spreadsheet_cell("\r=1") == "'\r=1"
    assert spreadsheet_cell(-3) == -3 and spreadsheet_cell(None) is None


@pytest.mark.parametrize("control", ["\u202e", "\u202a", "\u2066", "\u2069", "\u200e", "\u200f"])
def test_bidirectional_controls_are_escaped_wherever_control_characters_are(control: str) -> None:
    name = f"run{control}gpj.exe"
    assert shown(name) == f"run\\u{ord(control):04x}gpj.exe"
    assert shown(name, lines=True) == f"run\\u{ord(control):04x}gpj.exe"


# -- MLflow's own lines --------------------------------------------------------------------------


def test_mlflow_s_own_view_run_line_is_printed_with_its_password_redacted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """MLflow prints the link itself, for a tracking server, as it ends a run
    (``TrackingServiceClient._log_url``): here for any store, with a password in it."""
    pytest.importorskip("mlflow")
    from mlflow.tracking._tracking_service.client import TrackingServiceClient

    from hetsgd.config.schema import MlflowConfig
    from hetsgd.outputs.trackers.mlflow_runs import log_run
    from hetsgd.outputs.trackers.record import RunRecord

    def log_url(self: TrackingServiceClient, run_id: str) -> None:
        sys.stdout.write(f"\U0001f3c3 View run x at: http://user:s3cret@mlflow.example/#/runs/{run_id}\n")

    monkeypatch.setattr(TrackingServiceClient, "_log_url", log_url)
    record = RunRecord(run_dir=tmp_path / "x", sweep=None, status="completed", started=1.0,
                       ended=2.0, params={}, tags={}, series={}, figures=[])
    run_id = log_run(record, MlflowConfig(tracking_uri=f"sqlite:///{tmp_path / 'm.db'}",
                                          artifact_dir=str(tmp_path / "artifacts")))
    out = capsys.readouterr().out
    assert "s3cret" not in out
    assert f"View run x at: http://user:***@mlflow.example/#/runs/{run_id}" in out


# -- a full disk names the first file that failed ------------------------------------------------


def test_a_full_disk_names_the_first_file_it_refused_not_the_summary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk refuses every write from the first on: convergence.csv, then the summary."""
    replace_file = run_directory.replace_file
    full = []

    def filling(path: Path, write: object, binary: bool = False) -> None:
        if Path(path).name == "convergence.csv" or full:
            full.append(Path(path).name)
            with run_directory.writing(Path(path)):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        replace_file(path, write, binary)

    monkeypatch.setattr(run_directory, "replace_file", filling)
    cfg = compose_config("algo=sync", "dataset=digits", "model=logreg", "devices.simulated=true",
                         "devices.groups.cpu.profile=xeon_e5_2686v4_core", "budget.epochs=null",
                         "budget.seconds=0.05", "eval.every_s=0.01")
    run_dir = tmp_path / "run"
    summary = runner.run(cfg, run_dir, cfg)
    assert full[:2] == ["convergence.csv", "summary.json"]  # both were refused
    assert summary.status == CRASHED
    assert summary.error == (f"no space left on device, writing {run_dir / 'convergence.csv'}: "
                             f"once there is room, `hetsgd recover {run_dir}` evaluates the "
                             "snapshots it left")
    assert list((run_dir / "snapshots").glob("*.pt"))  # nothing measured is lost


# -- a sweep's starting job ----------------------------------------------------------------------


def _job(sweep: Path, name: str) -> Path:
    """A job folder as Hydra makes it before the run writes anything: its .hydra/ files."""
    (sweep / name / ".hydra").mkdir(parents=True)
    (sweep / name / ".hydra" / "overrides.yaml").write_text("- seed=0\n")
    return sweep / name


def test_the_job_a_sweep_is_starting_reads_as_running_not_crashed(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = psutil.Process(other.pid)
        (sweep / CLAIM).write_text(json.dumps(
            {"host": this_process()["host"], "pid": other.pid, "started": me.create_time()}))
        # the newest by number: by name, 9_... would come after 10_...
        earlier, starting = _job(sweep, "9_seed=9"), _job(sweep, "10_seed=10")
        assert read_summary(starting)["status"] == RUNNING
        assert read_summary(starting)["error"] is None
        assert read_summary(earlier)["status"] == CRASHED  # not the newest: it did crash
    finally:
        other.kill()
        other.wait()
    assert read_summary(starting)["status"] == CRASHED  # its sweep is gone


def test_a_process_record_is_alive_only_when_it_names_a_live_process_as_recorded() -> None:
    me = this_process()
    assert is_alive(me)
    # a clock stepped between two processes' reads of the boot time moves one start reading
    assert is_alive({**me, "started": me["started"] + 0.5})
    assert not is_alive({**me, "started": me["started"] - 5.0})  # a reused pid: another start
    # damaged records read as gone, never as a process of another host that still runs
    for damaged in ({**me, "host": None}, {**me, "host": 7}, {**me, "pid": str(me["pid"])},
                    {**me, "pid": True}, {**me, "started": None}, {**me, "started": "0"},
                    {"host": me["host"]}, [], None):
        assert not is_alive(damaged), damaged
    assert is_alive({**me, "host": "another-host"})  # cannot be asked: still running


def test_the_sweeps_own_process_reads_its_last_job_without_a_summary_as_crashed(
        tmp_path: Path) -> None:
    claim_folder(tmp_path / "sweep")
    assert read_summary(_job(tmp_path / "sweep", "0_seed=0"))["status"] == CRASHED


# -- a calibration with a BOM, a table's nested columns, token ids -------------------------------


def test_a_calibration_csv_with_a_utf8_bom_is_read(tmp_path: Path) -> None:
    from test_profiles import CALIBRATION

    path = tmp_path / "calibration.csv"
    path.write_bytes(b"\xef\xbb\xbf" + CALIBRATION.encode())
    assert set(load_calibration(path)) == {"accel", "cpu"}


@pytest.mark.parametrize("kind", ["struct", "map", "list"])
def test_a_parquet_struct_map_or_list_column_is_one_line_naming_it(tmp_path: Path, kind: str,
                                                                    monkeypatch: pytest.MonkeyPatch
                                                                    ) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from hetsgd.data import load_dataset

    monkeypatch.setenv("HETSGD_DATA", str(tmp_path / "data"))
    nested = {"struct": pa.array([{"x": i} for i in range(20)]),
              "map": pa.array([[("k", i)] for i in range(20)], pa.map_(pa.string(), pa.int64())),
              "list": pa.array([[i, i] for i in range(20)])}[kind]
    pq.write_table(pa.table({"a": [float(i) for i in range(20)], "odd": nested,
                             "label": [0, 1] * 10}), tmp_path / "t.parquet")
    cfg = to_run_config(compose_run(["dataset=files", f"dataset.path={tmp_path / 't.parquet'}"]))
    with pytest.raises(UserError) as raised:
        load_dataset(cfg.dataset, 0, progress=False)
    what = "struct" if kind == "struct" else "map or list"
    assert str(raised.value) == (f"{tmp_path / 't.parquet'}: column 'odd' holds a {what} in each "
                                 "cell, not one value: leave it out (dataset.drop=[odd]) or "
                                 "flatten it into columns of its own")


def test_token_ids_past_the_embedding_are_one_line_naming_the_max_id_and_its_size() -> None:
    model = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 2))
    ids = torch.tensor([[1, 2, 3], [4, 5, 12]])
    with pytest.raises(UserError) as raised:
        check_token_ids(model, [ids, torch.tensor([[0, 0, 1]])])
    assert str(raised.value) == ("the data's token ids run from 0 to 12, but the model's largest "
                                 "embedding has 10 rows (ids 0 to 9): build it with num_embeddings "
                                 "of at least 13, or map the ids into its range")
    with pytest.raises(UserError, match="run from -1 to 5"):
        check_token_ids(model, [torch.tensor([[-1, 5, 0]])])
    check_token_ids(model, [torch.tensor([[0, 9, 3]]), None])  # in range: nothing to say
    check_token_ids(model, [torch.full((2, 3), 50.0)])  # float features index nothing


# -- names ---------------------------------------------------------------------------------------


def test_a_custom_model_and_a_file_are_named_by_their_target_and_stem(tmp_path: Path) -> None:
    cfg = compose_run(["dataset=files", "dataset.path=/data/cells.csv.gz", "model=custom",
                       "model._target_=mynets.small_cnn"], hydra_config=True)
    assert model_label(cfg.model) == "small_cnn" and dataset_label(cfg.dataset) == "cells"
    assert Path(str(cfg.hydra.run.dir)).name.endswith("_sync_cells_single_cpu")
    starting = RunSummary.starting(cfg)
    assert (starting.model, starting.dataset) == ("small_cnn", "cells")
    named = compose_run(["model=custom", "model._target_=mynets.small_cnn", "model.name=mine"])
    assert model_label(named.model) == "mine"  # a name the user gave wins
    assert (model_label(compose_run([]).model), dataset_label(compose_run([]).dataset)) == (
        "mlp", "digits")


@pytest.mark.parametrize(("reader", "path", "label"), [("libsvm", "/d/a9a.svm.xz", "a9a"),
                                                        ("folder", "/d/cats/", "cats")])
def test_every_generic_readers_file_is_named_by_its_stem(reader: str, path: str,
                                                          label: str) -> None:
    """Named `libsvm` or `folder`, runs on a9a and on w8a would share one comparison: one best
    loss (a9a's runs never reaching w8a's target) and one sync baseline for both."""
    cfg = compose_run([f"dataset={reader}", f"dataset.path={path}"])
    assert dataset_label(cfg.dataset) == label
    assert dataset_label(compose_run(["dataset=w8a"]).dataset) == "w8a"
