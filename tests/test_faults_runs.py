"""Commands that refuse change nothing, recovery takes every snapshot it can read, and a full
disk is named: faults met by `resume=RUN_DIR`, `hetsgd recover` and the files a run writes."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pandas as pd
import psutil
import pytest
import torch
import yaml
from processes import as_a_terminal_starts_it
from typer.testing import CliRunner, Result

import hetsgd
from hetsgd.cli import app
from hetsgd.engines.snapshots import Snapshot
from hetsgd.errors import UserError
from hetsgd.outputs import journal
from hetsgd.outputs.checkpoint import (
    CHECKPOINT,
    STATE,
    latest_checkpoint,
    load_snapshot,
    read_checkpoint,
    snapshot_file,
    time_name,
    write_checkpoint,
)
from hetsgd.outputs.index import CRASHED, OVERRIDES, RUNNING, read_summary
from hetsgd.outputs.journal import INDEX, RunJournal, read_snapshots
from hetsgd.outputs.run_directory import SNAPSHOTS, RunDirectory, WriteError, writing
from hetsgd.runs import runner
from hetsgd.runs.recover import recover
from hetsgd.runs.resume import resume
from hetsgd.workers import WorkerSpec
from tests.conftest import CHECKPOINTED_RUN, abandoned_write, as_crashed, compose_config

# every_s past the run's end: its one checkpoint is the one taken as it ends, with every snapshot


def _snapshot_files(run_dir: Path) -> list[Path]:
    return sorted((run_dir / SNAPSHOTS).glob("*.pt"))


def _contents(folder: Path) -> dict[str, str]:
    """Every file and folder under ``folder``, each file by the hash of its bytes."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            if path.is_file() else "folder" for path in sorted(folder.rglob("*"))}


def _hetsgd(*args: str) -> Result:
    """The `hetsgd` command, in this process (a refused resume trains nothing)."""
    return CliRunner().invoke(app, list(args))


def _refused(run_dir: Path, *overrides: str) -> str:
    """`hetsgd run resume=RUN_DIR OVERRIDES`, which must fail and leave RUN_DIR byte-identical;
    the line it printed."""
    before = _contents(run_dir)
    result = _hetsgd("run", f"resume={run_dir}", "progress=false", *overrides)
    assert result.exit_code == 1, result.output
    assert _contents(run_dir) == before
    line, = result.stderr.splitlines()  # one line, no traceback
    assert line.startswith("hetsgd: error: ") and not result.stdout
    return line


@pytest.mark.integration
def test_a_resume_that_changes_the_model_is_refused_and_writes_nothing(run_dir: Path) -> None:
    assert "so model cannot change" in _refused(run_dir, "model=logreg")
    assert "so model cannot change" in _refused(run_dir, "model.hidden=[3]")


@pytest.mark.integration
def test_a_resume_of_a_run_still_going_is_refused(run_dir: Path) -> None:
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        coordinator = {"host": socket.gethostname(), "pid": live.pid,
                       "started": psutil.Process(live.pid).create_time()}
        RunDirectory(run_dir).write_summary({"status": RUNNING, "coordinator": coordinator})
        assert f"the run is still going (process {live.pid}" in _refused(run_dir,
                                                                         "budget.seconds=2")
    finally:
        live.kill()
        live.wait(timeout=30)


@pytest.mark.integration
def test_a_resume_from_a_corrupt_checkpoint_names_the_file(run_dir: Path) -> None:
    version = latest_checkpoint(run_dir)
    assert version is not None
    state = version / STATE
    state.write_bytes(state.read_bytes()[:len(state.read_bytes()) // 2])
    assert f"cannot read {state}: " in _refused(run_dir, "budget.seconds=2")


@pytest.mark.integration
def test_one_process_at_a_time_resumes_a_run(run_dir: Path) -> None:
    """Two resumes of one crashed run both read it as crashed; the second one is refused while
    the first holds it (both wrote into it), and the run is free again once the first ends."""
    as_crashed(run_dir)
    held = resume(run_dir, ["budget.seconds=0.6"])
    assert "another process is resuming the run" in _refused(run_dir, "budget.seconds=0.6")
    held.release()
    leftover = abandoned_write(run_dir / "workers.csv")  # the killed run's write: the resume tidies it
    leftover.write_text("worker,gro")
    done = hetsgd.run(f"resume={run_dir}", "budget.seconds=0.6", "progress=false")
    assert done.exit_code == 0, done.summary.error
    assert not leftover.exists()
    resume(run_dir, ["budget.seconds=0.7"]).release()  # the resumed run let go of it at its end
    # a simulated run resumed keeps sampling its devices' busy shares (it took none: its only
    # closing sample waited for a first one dated 0)
    utilization = done.summary.utilization
    assert utilization is not None and utilization["gpu_util_mean"] is None
    assert utilization["workers_cpu_cores_mean"] is not None


def test_a_run_being_resumed_is_not_recovered_meanwhile(run_dir: Path) -> None:
    """A recover started while a resume restores the crashed run removed the snapshots the
    resume had just restored and wrote over its summary: both runs were lost."""
    as_crashed(run_dir)
    before = sorted(p.name for p in (run_dir / "snapshots").iterdir())
    held = resume(run_dir, ["budget.seconds=0.6"])
    try:
        with pytest.raises(UserError, match=f"^cannot recover {re.escape(str(run_dir))}: another "
                                            "process is resuming the run, or recovering it"):
            recover(run_dir)
    finally:
        held.release()
    assert sorted(p.name for p in (run_dir / "snapshots").iterdir()) == before


def test_a_resume_of_a_run_at_its_time_budget_is_refused_leaving_it(run_dir: Path) -> None:
    """It trained one step or round past the budget on every such resume, a model and counters
    no straight run ends on."""
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint is not None
    at = read_checkpoint(checkpoint).time_s
    assert at >= 0.5  # the run's budget.seconds: its last checkpoint is its end
    assert _refused(run_dir) == (
        f"hetsgd: error: resume={run_dir}: its checkpoint is at {at:.3g} s, at "
        "budget.seconds=0.5 already: raise budget.seconds to train on (a run that stopped "
        "during its final evaluation: hetsgd recover)")



@pytest.mark.integration
def test_a_sweep_jobs_folder_resumes_in_place_quoted_and_unquoted_is_told_so(
        run_dir: Path, tmp_path: Path) -> None:
    """A sweep job's folder holds `=` (1_seed=1): quoted, as Hydra needs it, the resume trained
    into a new folder under results/runs/, leaving the job interrupted in its sweep; unquoted,
    Hydra's grammar error did not say how to give it."""
    job = Path(shutil.copytree(run_dir, tmp_path / "sweep" / "1_seed=1", symlinks=True))
    as_crashed(job)
    unquoted = _hetsgd("run", f"resume={job}", "budget.seconds=0.6", "progress=false")
    assert unquoted.exit_code == 1
    assert unquoted.stderr.strip().endswith(f"a value holding '=' is quoted: resume='{job}'")
    done = hetsgd.run(f"resume='{job}'", "budget.seconds=0.6", "progress=false")
    assert done.exit_code == 0, done.summary.error
    assert Path(done.summary.run_dir).resolve() == job.resolve()
    assert read_summary(job)["status"] == "completed" and not (tmp_path / "results").exists()


def test_a_resume_of_a_run_at_its_epoch_budget_is_refused_leaving_it(run_dir: Path) -> None:
    """Only budget.seconds was checked: at its epoch budget a resume trained nothing, exited 0
    and rewrote the run with one more last row, later in time, the same in all else."""
    epochs = read_summary(run_dir)["epochs"]
    checkpoint = read_checkpoint(latest_checkpoint(run_dir))  # type: ignore[arg-type]
    assert checkpoint.time_s >= 0.5  # the run's end: its epochs are the checkpoint's
    assert _refused(run_dir, "budget.seconds=null", f"budget.epochs={math.floor(epochs)}") == (
        f"hetsgd: error: resume={run_dir}: its checkpoint is at {epochs:.4g} epochs, at "
        f"budget.epochs={math.floor(epochs)} already: raise budget.epochs to train on (a run "
        "that stopped during its final evaluation: hetsgd recover)")


@pytest.mark.integration
def test_a_resume_killed_before_it_trains_leaves_the_checkpointed_run_to_recover(
        run_dir: Path) -> None:
    """A resume makes the folder the checkpoint's as it starts: one killed during its setup
    (data, worker processes) took the crashed run's snapshots with it, so recovery found
    none. It keeps the checkpoint's own, and its workers' counters."""
    as_crashed(run_dir)
    checkpoint = read_checkpoint(latest_checkpoint(run_dir))  # type: ignore[arg-type]
    kept = [snapshot_file(snapshot) for snapshot in checkpoint.snapshots]
    later = [file.name for file in _snapshot_files(run_dir) if file.name not in kept]
    assert len(kept) >= 5 and later  # the run's last snapshot came after its checkpoint
    counted_on = pd.read_csv(run_dir / "workers.csv")
    counted_on["updates"] += 1000  # counted after the checkpoint too
    counted_on.to_csv(run_dir / "workers.csv", index=False)
    resumption = resume(run_dir, ["budget.seconds=2"])
    resumption.start_in(run_dir)  # as the runner does first; then its process is killed
    resumption.release()
    assert [file.name for file in _snapshot_files(run_dir)] == kept

    summary = recover(run_dir)
    assert summary["status"] == CRASHED
    assert len(pd.read_csv(run_dir / "convergence.csv")) == len(kept)
    updates = [row["updates"] for row in checkpoint.counter_rows()]
    assert pd.read_csv(run_dir / "workers.csv")["updates"].tolist() == updates
    # the summary counts what the curve's last row counts: the last snapshot kept
    assert summary["updates"] == sum(checkpoint.snapshots[-1].updates)
    assert summary["time_s"] == checkpoint.snapshots[-1].time_s


@pytest.mark.wall  # three resumes, each a whole run
def test_a_resume_takes_the_evaluation_spacing_it_is_given(run_dir: Path) -> None:
    """Its snapshots were taken at the checkpoint's spacing whatever eval.* said; the new
    spacing is doubled as often as thinning had doubled the old (never here: 11 snapshots)."""
    spacing = read_checkpoint(latest_checkpoint(run_dir)).snapshot_spacing  # type: ignore[arg-type]
    assert spacing == (0.05, math.inf)  # CHECKPOINTED_RUN's eval
    for overrides, expected in [([], spacing), (["eval.every_s=0.2", "eval.every_epochs=1"],
                                                (0.2, 1.0))]:
        resumption = resume(run_dir, ["budget.seconds=2", *overrides])
        resumption.release()
        assert resumption.checkpoint.snapshot_spacing == expected
    thinned = replace(read_checkpoint(latest_checkpoint(run_dir)),  # type: ignore[arg-type]
                      snapshot_spacing=(0.2, math.inf))  # as if thinned twice
    write_checkpoint(run_dir, thinned)
    resumption = resume(run_dir, ["budget.seconds=2", "eval.every_s=0.1", "eval.every_epochs=1"])
    resumption.release()
    assert resumption.checkpoint.snapshot_spacing == (0.4, 4.0)
    write_checkpoint(run_dir, replace(thinned, snapshot_spacing=spacing))
    resumed = hetsgd.run(f"resume={run_dir}", "budget.seconds=0.9", "eval.every_s=0.1",
                         "progress=false")
    assert resumed.status == "completed", resumed.summary.error
    times = pd.read_csv(run_dir / "convergence.csv")["time_s"]
    later = times[times > spacing[0] * 10 + 0.01].diff().dropna()
    assert len(later) >= 3 and (later.iloc[:-1] >= 0.1 - 1e-9).all()
    # fewer snapshots kept: the checkpoint's are thinned as a whole, n -> n // 2 + 1 until they
    # fit, the spacing doubled as often (re-added one by one, they were thinned at almost
    # every add, the spacing doubled past the run's end and the resumed part took none)
    kept, halvings = len(read_checkpoint(latest_checkpoint(run_dir)).snapshots), 0  # type: ignore[arg-type]
    while kept > 4:
        kept, halvings = kept // 2 + 1, halvings + 1
    assert halvings >= 2
    fewer = hetsgd.run(f"resume={run_dir}", "budget.seconds=1.0", "eval.max_snapshots=4",
                       "progress=false")
    assert fewer.status == "completed", fewer.summary.error
    end = read_checkpoint(latest_checkpoint(run_dir))  # type: ignore[arg-type]
    assert end.snapshot_spacing[0] in (0.1 * 2**halvings, 0.1 * 2**(halvings + 1))  # its end's


def test_a_run_folder_this_user_cannot_open_is_a_one_line_refusal(
        run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: object) -> int:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(run_dir))

    monkeypatch.setattr("hetsgd.runs.resume.os.open", refused)  # root reads a mode-000 folder
    with pytest.raises(UserError, match=f"^resume={re.escape(str(run_dir))}: cannot open it: "
                                        "Permission denied$"):
        resume(run_dir, [])


@pytest.mark.integration
def test_recover_works_after_a_refused_resume(run_dir: Path) -> None:
    as_crashed(run_dir)
    _refused(run_dir, "model=logreg")
    summary = recover(run_dir)
    assert summary["status"] == CRASHED
    assert len(pd.read_csv(run_dir / "convergence.csv")) == len(_snapshot_files(run_dir))


@pytest.mark.integration
def test_recover_refuses_a_run_evaluated_already_and_changes_nothing(run_dir: Path) -> None:
    """An interrupted run that kept its snapshots (eval.keep_snapshots) was evaluated when it
    stopped: recovering it would call it unevaluated, and add its warnings again."""
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final"] is not None and _snapshot_files(run_dir)
    RunDirectory(run_dir).write_summary({**summary, "status": "interrupted"})
    before = _contents(run_dir)
    with pytest.raises(UserError, match="was evaluated already .*: nothing to recover$"):
        recover(run_dir)
    assert _contents(run_dir) == before


@pytest.mark.integration
def test_recover_ignores_overrides_that_a_refused_resume_wrote(run_dir: Path) -> None:
    """Hydra of an earlier version wrote a refused resume's overrides over the run's: recovery
    takes those its checkpoint kept."""
    as_crashed(run_dir)
    (run_dir / OVERRIDES).write_text(yaml.safe_dump(
        ["progress=false", f"resume={run_dir}", "model=logreg"]))
    assert recover(run_dir)["model"] == "mlp"
    assert len(pd.read_csv(run_dir / "convergence.csv")) == len(_snapshot_files(run_dir))


@pytest.mark.integration
def test_recover_skips_a_truncated_snapshot_and_names_it(run_dir: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    as_crashed(run_dir)
    files = _snapshot_files(run_dir)
    bad = files[len(files) // 2]
    bad.write_bytes(bad.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, logger="hetsgd"):
        summary = recover(run_dir)
    warning, = (r.getMessage() for r in caplog.records if bad.name in r.getMessage())
    assert warning.startswith(f"cannot read {bad}: ") and warning.endswith(": skipped")
    assert "\n" not in warning
    convergence = pd.read_csv(run_dir / "convergence.csv")
    assert len(convergence) == len(files) - 1
    assert f"1 unreadable one(s) skipped: {bad.name}" in summary["error"]


@pytest.mark.integration
@pytest.mark.timeout(120)  # a FIFO opened to be read waits for a writer that never comes
@pytest.mark.parametrize("damage", ["fifo", "logged_list"])
def test_recover_skips_a_snapshot_that_is_no_file_or_not_as_written(run_dir: Path,
                                                                    damage: str) -> None:
    as_crashed(run_dir)
    files = _snapshot_files(run_dir)
    bad = files[len(files) // 2]
    if damage == "fifo":
        bad.unlink()
        os.mkfifo(bad)
        why = "not a regular file but a FIFO or pipe"
    else:
        tensors = torch.load(bad, weights_only=True)
        torch.save({**tensors, "logged": [1]}, bad)
        why = "not as hetsgd writes it (AttributeError"
    summary = recover(run_dir)
    assert summary["status"] == CRASHED
    assert f"1 unreadable one(s) skipped: {bad.name}" in summary["error"]
    assert len(pd.read_csv(run_dir / "convergence.csv")) == len(files) - 1
    with pytest.raises(UserError, match=re.escape(f"cannot read {bad}: {why}")):
        load_snapshot(bad)


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["relative", "absolute", "fifo"])
def test_a_checkpoint_reads_no_snapshot_outside_its_version(run_dir: Path, tmp_path: Path,
                                                           where: str) -> None:
    """state.pt names its snapshots' files; a name that is a path elsewhere (or a FIFO there,
    which a read would wait on forever) is refused, the file unread."""
    version = latest_checkpoint(run_dir)
    assert version is not None
    state = torch.load(version / STATE, weights_only=True)
    outside = tmp_path / "outside.pt"
    if where == "fifo":
        os.mkfifo(outside)
    else:
        shutil.copyfile(version / state["snapshots"][0]["file"], outside)
    state["snapshots"][0]["file"] = (str(outside) if where != "relative"
                                     else os.path.relpath(outside, version))
    torch.save(state, version / STATE)
    with pytest.raises(UserError, match=re.escape(f"cannot read {version / STATE}: not as hetsgd "
                                                  "writes it (ValueError: it names a snapshot")):
        read_checkpoint(version)


def test_the_latest_checkpoint_is_the_latest_past_a_million_seconds(tmp_path: Path) -> None:
    for seconds in (999_999.0, 1_000_001.0, 5.0):
        (tmp_path / CHECKPOINT / time_name(seconds)).mkdir(parents=True)
        (tmp_path / CHECKPOINT / time_name(seconds) / STATE).touch()
    assert latest_checkpoint(tmp_path) == tmp_path / CHECKPOINT / time_name(1_000_001.0)


@pytest.mark.integration
def test_a_checkpoint_written_again_at_its_time_replaces_it_only_once_whole(
        run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A resumed run that trains no further writes its final checkpoint at the time of the one
    it resumed from: a failed write leaves that one, a finished one replaces it."""
    version = latest_checkpoint(run_dir)
    assert version is not None
    checkpoint = read_checkpoint(version)
    save = torch.save

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(WriteError, match=f"^no space left on device, writing {version / STATE}$"):
        write_checkpoint(run_dir, checkpoint)
    assert latest_checkpoint(run_dir) == version
    assert torch.equal(read_checkpoint(version).params, checkpoint.params)
    monkeypatch.setattr(torch, "save", save)
    (run_dir / OVERRIDES).write_text(yaml.safe_dump(["progress=false", "budget.epochs=3"]))
    write_checkpoint(run_dir, checkpoint)
    assert [p.name for p in (run_dir / CHECKPOINT).iterdir()] == [version.name]
    assert yaml.safe_load((version / "run_overrides.yaml").read_text())[-1] == "budget.epochs=3"
    assert torch.equal(read_checkpoint(version).params, checkpoint.params)


@pytest.mark.integration
@pytest.mark.parametrize("damage", ["deleted", "garbled"])
def test_recover_needs_no_index(run_dir: Path, damage: str) -> None:
    """Each snapshot file carries its own row: time, examples, every worker's updates."""
    as_crashed(run_dir)
    index_file = run_dir / SNAPSHOTS / INDEX
    if damage == "deleted":
        index_file.unlink()
    else:
        lines = index_file.read_text().splitlines()
        lines[2] = "not,a,row,of,this,index,at,all"
        lines.insert(4, "\x00\x00garbage")
        index_file.write_text("\n".join(lines) + "\n")
    evaluated = pd.read_csv(run_dir / "convergence.csv")  # by the run, from its own rows
    recover(run_dir)
    pd.testing.assert_frame_equal(pd.read_csv(run_dir / "convergence.csv"), evaluated)


SPECS = [WorkerSpec(rank, "cpu", "cpu", "cpu", 1, 8, 1.0, False) for rank in range(2)]


def _snapshot(time_s: float) -> Snapshot:
    return Snapshot(time_s, 10 * time_s, [time_s, 2 * time_s], torch.full((3,), time_s),
                    torch.full((1,), -time_s))


def test_a_snapshot_file_without_its_row_takes_the_index_row_or_is_named(tmp_path: Path) -> None:
    """Files written before snapshots carried their row: index.csv's row, if one parses."""
    folder = tmp_path / SNAPSHOTS
    folder.mkdir()
    for t in (1.0, 2.0):
        torch.save({"params": torch.zeros(3), "buffers": torch.zeros(1)},
                   folder / snapshot_file(_snapshot(t)))
    (folder / INDEX).write_text(f"file,time_s,examples,updates_0,updates_1\n"
                                f"{snapshot_file(_snapshot(1.0))},1.0,10.0,1.0,2.0\n"
                                f"{snapshot_file(_snapshot(2.0))},2.0,garbled\n")
    skipped: list[Exception] = []
    snapshot, = read_snapshots(tmp_path, skipped.append)
    assert (snapshot.time_s, snapshot.examples, snapshot.updates) == (1.0, 10.0, [1.0, 2.0])
    assert [str(err) for err in skipped] == [
        f"cannot read {folder / snapshot_file(_snapshot(2.0))}: it holds no time, examples or "
        "updates, and no row of index.csv names it"]
    # told how many workers the run had, recovery keeps its time, from its name
    first, second = read_snapshots(tmp_path, skipped.append, workers=2)
    assert first.examples == 10.0 and second.time_s == 2.0
    assert math.isnan(second.examples) and len(second.updates) == 2
    assert all(math.isnan(u) for u in second.updates)


class _FullDisk:
    """A file handle on a disk that fills after a few bytes."""

    def __init__(self, handle: object) -> None:
        self.handle, self.written = handle, 0

    def write(self, data: bytes) -> int:
        self.written += len(data)
        if self.written > 64:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.handle.write(data)  # type: ignore[attr-defined]

    def flush(self) -> None:
        self.handle.flush()  # type: ignore[attr-defined]


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save on a full disk: torch turns the failed write into `[enforce fail at
    inline_container.cc] unexpected pos`."""
    save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, handle: save(obj, _FullDisk(handle)))


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if p.name.endswith(".tmp")]


def test_a_full_disk_while_writing_a_snapshot_names_the_file(tmp_path: Path,
                                                              full_disk: None) -> None:
    out = RunDirectory(tmp_path / "run")
    journal_ = RunJournal(out, SPECS)
    journal_.snapshot(_snapshot(0.5), [{"updates": 0, "examples": 0}] * 2)
    with pytest.raises(WriteError) as raised:
        journal_.close()
    assert str(raised.value) == ("no space left on device, writing "
                                 f"{out.path / SNAPSHOTS / snapshot_file(_snapshot(0.5))}")
    assert raised.value.errno == errno.ENOSPC
    assert not _snapshot_files(out.path) and _leftovers(out.path) == []


def test_a_full_disk_while_writing_a_checkpoint_names_the_file(tmp_path: Path,
                                                                full_disk: None) -> None:
    from hetsgd.engines.checkpoint import Checkpoint, WorkerState

    out = RunDirectory(tmp_path / "run")
    part = WorkerState(0, 0.0, torch.zeros(3), None, {"cpu": torch.get_rng_state()})
    journal_ = RunJournal(out, SPECS)
    journal_.checkpoint(Checkpoint(1.0, torch.zeros(3), torch.zeros(1), [part], [], (1.0, 1.0)))
    with pytest.raises(WriteError) as raised:
        journal_.close()
    assert str(raised.value) == ("no space left on device, writing "
                                 f"{out.path / 'checkpoint' / time_name(1.0) / STATE}")
    assert latest_checkpoint(out.path) is None and _leftovers(out.path) == []


@pytest.mark.integration
def test_a_run_that_fills_the_disk_ends_crashed_and_recovers(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """As a killed run: its files hold what it measured until then, for `hetsgd recover`."""
    append_rows = journal.append_rows

    def full_disk(path: Path, rows: list) -> None:  # the utilization samples fill the disk
        if path.name != "utilization.csv":
            return append_rows(path, rows)
        with writing(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(journal, "append_rows", full_disk)
    cfg = compose_config("algo=sync", "dataset=digits", "model=logreg", "devices.simulated=true",
                         "devices.groups.cpu.profile=xeon_e5_2686v4_core", "budget.epochs=null",
                         "budget.seconds=0.05", "eval.every_s=0.01")
    run_dir = tmp_path / "run"
    summary = runner.run(cfg, run_dir, cfg).to_dict()
    expected = (f"no space left on device, writing {run_dir / 'utilization.csv'}: once there is "
                f"room, `hetsgd recover {run_dir}` evaluates the snapshots it left")
    assert summary["status"] == CRASHED and summary["error"] == expected
    assert read_summary(run_dir)["error"] == expected
    assert not (run_dir / "error.log").exists()  # no traceback: the message says it all
    monkeypatch.undo()  # room again
    assert recover(run_dir)["status"] == CRASHED
    assert len(pd.read_csv(run_dir / "convergence.csv")) >= 2


# `hetsgd ARGS` in a process whose third snapshot (while it trains) and second evaluation of a
# snapshot (while it evaluates them) each get a Ctrl-C, as a user's two keystrokes would
_CTRL_C_TWICE = """
import os, signal, sys
from hetsgd.engines.base import EngineBase
from hetsgd.observe.evaluate import Evaluator

FIRST, SECOND = os.environ.get("STOPS", "SIGINT,SIGINT").split(",")

def stop_at(method, call, name):
    calls = []
    def patched(*args, **kwargs):
        calls.append(call)
        if len(calls) == call:
            os.kill(os.getpid(), signal.Signals[name])
        return method(*args, **kwargs)
    return patched

EngineBase._take_snapshot = stop_at(EngineBase._take_snapshot, 3, FIRST)
Evaluator.__call__ = stop_at(Evaluator.__call__, 2, SECOND)
from hetsgd.cli import main
main()
"""


@pytest.mark.integration
@pytest.mark.wall
def test_a_second_ctrl_c_during_the_final_evaluation_keeps_the_snapshots_for_recover(
        results_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CTRL_C_TWICE, "run", "devices=paper_hogbatch_v100",
         "devices.groups.cpu.count=2", "model=mlp", "budget.seconds=0.05", "budget.epochs=null",
         "eval.every_s=0.01", "progress=false"], capture_output=True, text=True, timeout=300,
        env={**os.environ, "HETSGD_RESULTS": str(results_dir)},
        preexec_fn=as_a_terminal_starts_it)
    run_dir, = (results_dir / "runs").iterdir()
    why = ("interrupted by the user during the final evaluation; its snapshots are kept: "
           f"`hetsgd recover {run_dir}` evaluates them")
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines()[-1] == f"hetsgd: {why}" and "Traceback" not in done.stderr
    assert all(line.startswith("[") for line in done.stdout.splitlines())  # log lines: no table
    summary = read_summary(run_dir)
    assert (summary["status"], summary["error"], summary.get("final")) == ("interrupted", why, None)
    kept = _snapshot_files(run_dir)
    assert len(kept) >= 3 and not (run_dir / "convergence.csv").exists()

    recovered = _hetsgd("recover", str(run_dir))
    assert recovered.exit_code == 0, recovered.output
    summary = read_summary(run_dir)
    assert summary["status"] == "interrupted" and summary["final"]["train_loss"] > 0
    assert summary["error"].startswith("the run was interrupted before its snapshots were "
                                       f"evaluated after {summary['time_s']:.1f} s of training; these "
                                       f"results were recovered from the {len(kept)} snapshot(s)")
    assert len(pd.read_csv(run_dir / "convergence.csv")) == len(kept)
    assert not (run_dir / SNAPSHOTS).exists()  # evaluated: they went, as a run's do
    again = _hetsgd("recover", str(run_dir))
    assert again.exit_code == 1 and "was evaluated already" in again.output


@pytest.mark.integration
@pytest.mark.wall
@pytest.mark.parametrize("stops, code, cause", [("SIGTERM,SIGINT", 143, "stopped by SIGTERM"),
                                                ("SIGINT,SIGTERM", 130, "interrupted by the user"),
                                                ("SIGTERM,SIGHUP", 143, "stopped by SIGTERM")])
def test_the_stop_that_ended_training_names_the_run_s_error_and_exit_code(
        results_dir: Path, stops: str, code: int, cause: str) -> None:
    """A second stop during the final evaluation only cuts it short: the error and the exit
    code both name the first, which ended training."""
    done = subprocess.run(
        [sys.executable, "-c", _CTRL_C_TWICE, "run", "devices=paper_hogbatch_v100",
         "devices.groups.cpu.count=2", "model=mlp", "budget.seconds=0.05", "budget.epochs=null",
         "eval.every_s=0.01", "progress=false"], capture_output=True, text=True, timeout=300,
        env={**os.environ, "HETSGD_RESULTS": str(results_dir), "STOPS": stops},
        preexec_fn=as_a_terminal_starts_it)
    run_dir, = (results_dir / "runs").iterdir()
    why = (f"{cause} during the final evaluation; its snapshots are kept: "
           f"`hetsgd recover {run_dir}` evaluates them")
    assert done.returncode == code, done.stderr
    assert done.stderr.splitlines()[-1] == f"hetsgd: {why}" and "Traceback" not in done.stderr
    assert read_summary(run_dir)["error"] == why


@pytest.fixture
def own_model_dir(tmp_path: Path) -> Iterator[Path]:
    """A user's config dir as docs/own_problem.md has it, ``model/mynet.yaml`` naming a factory
    of the module ``ownnets``, on sys.path and PYTHONPATH (a rank process imports it)."""
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "ownnets.py").write_text(
        "from torch import nn\n\n\ndef mlp(in_features, num_classes, width):\n"
        "    return nn.Sequential(nn.Linear(in_features, width), nn.ReLU(),\n"
        "                         nn.Linear(width, num_classes))\n")
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "mynet.yaml").write_text(
        "defaults: [custom, _self_]\nname: mynet\n_target_: ownnets.mlp\nwidth: 5\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(tmp_path / "code"))
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path / "code"),
                                                               os.environ.get("PYTHONPATH")])))
        yield tmp_path / "conf"
        sys.modules.pop("ownnets", None)


@pytest.mark.integration
@pytest.mark.wall
def test_a_run_of_a_users_config_dir_recovers_and_resumes_without_it(
        own_model_dir: Path, results_dir: Path, tmp_path: Path) -> None:
    """Both rebuild the run from its recorded config.yaml, which holds every value of
    ``model=mynet``: no --config-dir is needed, only the factory named."""
    first = hetsgd.run("--config-dir", str(own_model_dir), "model=mynet",
                       *(o for o in CHECKPOINTED_RUN if not o.startswith("model=")))
    assert first.status == "completed", first.summary.error
    assert first.summary.model == "mynet"

    crashed = tmp_path / "crashed"
    shutil.copytree(first.run_dir, crashed)
    as_crashed(crashed)
    snapshots = _snapshot_files(crashed)
    recovered = _hetsgd("recover", str(crashed), "--model-target", "ownnets.mlp")
    assert recovered.exit_code == 0, recovered.output
    assert read_summary(crashed)["status"] == CRASHED
    assert len(pd.read_csv(crashed / "convergence.csv")) == len(snapshots) >= 2

    resumed = hetsgd.run(f"resume={first.run_dir}", "model=custom", "model._target_=ownnets.mlp",
                         "budget.seconds=1", "progress=false")
    assert resumed.status == "completed", resumed.summary.error
    assert resumed.run_dir == first.run_dir and resumed.summary.model == "mynet"
    assert resumed.summary.time_s is not None and resumed.summary.time_s > first.summary.time_s
    recorded = yaml.safe_load((first.run_dir / "config.yaml").read_text())["model"]
    assert (recorded["_target_"], recorded["width"]) == ("ownnets.mlp", 5)
