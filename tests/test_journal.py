"""What a run keeps on disk while it trains: the snapshots kept, their index, the workers'
counters and the utilization samples, and how a run still going reads apart from a crashed one."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from hetsgd.engines.snapshots import Snapshot, Snapshots
from hetsgd.liveness import this_process
from hetsgd.observe.monitor import UtilizationMonitor
from hetsgd.outputs.checkpoint import snapshot_file
from hetsgd.outputs.index import CRASHED, RUNNING, read_summary
from hetsgd.outputs.journal import RunJournal, read_snapshots
from hetsgd.outputs.run_directory import SNAPSHOTS, RunDirectory, WriteError
from hetsgd.workers import WorkerSpec

SPECS = [WorkerSpec(rank, "cpu", "cpu", "cpu", 1, 8, 1.0, False) for rank in range(2)]


def _snapshot(time_s: float) -> Snapshot:
    return Snapshot(time_s, 10 * time_s, [time_s, 2 * time_s], torch.full((3,), time_s),
                    torch.full((1,), -time_s))


def _counters(updates: float) -> list[dict[str, float]]:
    row = {"updates": updates, "examples": 8 * updates, "busy_s": 0.5, "wait_s": 0.0,
           "comm_s": 0.0, "copy_s": 0.0, "batch_size": 8, "first_batch": 8, "loss": 1.0,
           "cpu_s": 0.4, "cpu_wait_s": 0.1}
    return [row, row]


def test_thinning_returns_exactly_the_snapshots_it_drops() -> None:
    snaps = Snapshots(every_s=1.0, every_epochs=None, max_count=4, max_bytes=1e9,
                      snapshot_bytes=1)
    taken = [_snapshot(float(t)) for t in range(5)]
    dropped = [old for s in taken for old in snaps.add(s, 0.0)]
    assert [s.time_s for s in dropped] == [1.0, 3.0]
    assert sorted(s.time_s for s in dropped + snaps.items) == [s.time_s for s in taken]


def test_the_journal_keeps_what_snapshots_keep_and_indexes_every_snapshot(tmp_path: Path) -> None:
    out = RunDirectory(tmp_path / "run")
    with RunJournal(out, SPECS) as journal:
        for t in (0.0, 1.0, 2.0):
            journal.snapshot(_snapshot(t), _counters(updates=t))
        journal.drop(_snapshot(1.0))
        journal.utilization({"time_s": 0.5, "host_cpu_percent": 50.0, "gpu0_util": None})
        journal.utilization({"time_s": 1.0, "host_cpu_percent": 60.0, "gpu0_util": 7.0})
    folder = out.path / SNAPSHOTS
    assert sorted(p.name for p in folder.glob("*.pt")) == [snapshot_file(_snapshot(0.0)),
                                                            snapshot_file(_snapshot(2.0))]
    index = pd.read_csv(folder / "index.csv")
    assert index["time_s"].tolist() == [0.0, 1.0, 2.0]  # a thinned snapshot keeps its row
    kept = read_snapshots(out.path)
    assert [s.time_s for s in kept] == [0.0, 2.0]
    assert kept[1].examples == 20.0 and kept[1].updates == [2.0, 4.0]
    assert torch.equal(kept[1].params, torch.full((3,), 2.0))
    assert torch.equal(kept[1].buffers, torch.full((1,), -2.0))
    workers = pd.read_csv(out.path / "workers.csv")
    assert workers["updates"].tolist() == [2, 2]  # replaced at each snapshot: the last counters
    utilization = pd.read_csv(out.path / "utilization.csv")
    assert utilization["host_cpu_percent"].tolist() == [50.0, 60.0]
    assert utilization["gpu0_util"].isna().tolist() == [True, False]


def test_a_thinned_snapshot_already_gone_costs_nothing_and_another_failure_names_it(
        tmp_path: Path) -> None:
    """A snapshot file removed meanwhile (a user's clean-up) failed the whole run at its end
    with a bare FileNotFoundError; one that cannot be removed is a WriteError naming it."""
    out = RunDirectory(tmp_path / "run")
    with RunJournal(out, SPECS) as journal:
        journal.snapshot(_snapshot(1.0), _counters(updates=1.0))
        journal.drop(_snapshot(5.0))  # never written
    blocked = out.path / SNAPSHOTS / snapshot_file(_snapshot(2.0))
    blocked.mkdir(parents=True)  # a folder where the file is: unlink fails
    (blocked / "x").write_text("x")
    with pytest.raises(WriteError, match=f"^cannot write {blocked}: "):
        with RunJournal(out, SPECS) as journal:
            journal.drop(_snapshot(2.0))


def test_the_monitor_hands_over_each_row_as_it_is_taken() -> None:
    seen: list[dict] = []
    monitor = UtilizationMonitor(0.01, list, on_sample=seen.append).start()
    while len(seen) < 2:
        time.sleep(0.01)
    rows = monitor.stop()
    assert len(rows) >= 3 and seen == rows  # the last row, taken on stop, too


def test_a_failed_write_stops_the_journal_and_raises_at_the_next_snapshot(tmp_path: Path) -> None:
    out = RunDirectory(tmp_path / "run")
    (out.path / SNAPSHOTS).write_text("a file where the folder goes")
    journal = RunJournal(out, SPECS)
    journal.snapshot(_snapshot(0.0), _counters(updates=0))
    journal._writer.submit(lambda: None).result()  # one writer thread: the snapshot's write is done
    with pytest.raises(FileExistsError):
        journal.snapshot(_snapshot(1.0), _counters(updates=1))
    journal.utilization({"time_s": 1.0, "host_cpu_percent": 50.0})
    with pytest.raises(FileExistsError):
        journal.close()
    assert not (out.path / "workers.csv").exists()
    assert not (out.path / "utilization.csv").exists()  # nothing is written after the failure


def test_a_running_summary_reads_as_running_while_its_process_lives(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    RunDirectory(run_dir).write_summary({"status": RUNNING, "coordinator": this_process()})
    assert read_summary(run_dir)["status"] == RUNNING
    gone = {**this_process(), "started": this_process()["started"] - 60.0}  # a reused pid
    RunDirectory(run_dir).write_summary({"status": RUNNING, "coordinator": gone})
    (run_dir / SNAPSHOTS).mkdir()
    summary = read_summary(run_dir)
    assert summary["status"] == CRASHED
    assert f"hetsgd recover {run_dir}" in summary["error"]


def test_a_snapshot_index_that_is_a_fifo_is_never_waited_for(tmp_path: Path) -> None:
    """`hetsgd recover` of a folder whose snapshots/index.csv is a FIFO waited for a writer that
    never came; it reads as no index (each file carries its own row)."""
    (tmp_path / SNAPSHOTS).mkdir()
    os.mkfifo(tmp_path / SNAPSHOTS / "index.csv")
    found: list[list[Snapshot]] = []
    reader = threading.Thread(target=lambda: found.append(read_snapshots(tmp_path)), daemon=True)
    reader.start()
    reader.join(60)  # only a hang takes this long: the old reader never returned
    assert found == [[]]
