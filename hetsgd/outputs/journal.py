"""What a run has measured, on disk as it is measured, so that a killed coordinator loses at
most one snapshot interval.

Snapshots are evaluated only after training (evaluation never takes CPU from the workers), so
until then the run directory holds them raw, in ``snapshots/``: one file per snapshot kept
(parameters and buffers, named by the snapshot's time in microseconds) and ``index.csv``, a row
per snapshot taken (time, examples, every worker's updates); a snapshot that the in-memory cap
thins out loses its file, not its row. ``utilization.csv`` grows by a row per sample and
``workers.csv`` is replaced at each snapshot. One writer thread does every write, in order, so
the coordinator's loop never waits for the disk, and a snapshot's row is appended only once its
file is complete. Checkpoints go through the same writer, after the snapshots they keep
(:mod:`hetsgd.outputs.checkpoint`). The runner removes ``snapshots/`` once it has evaluated them; recovery
(:mod:`hetsgd.runs.recover`) evaluates those of a run that crashed (:func:`read_snapshots`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pandas as pd
import torch

from hetsgd.devices import WorkerSpec
from hetsgd.engines.checkpoint import Checkpoint
from hetsgd.engines.shared_memory.snapshots import Snapshot
from hetsgd.outputs.checkpoint import load_snapshot, snapshot_file, write_checkpoint
from hetsgd.outputs.run_directory import SNAPSHOTS, RunDirectory, append_rows, replace_file

INDEX = "index.csv"


def workers_table(specs: list[WorkerSpec], counters: list[dict[str, float]]
                  ) -> list[dict[str, Any]]:
    """The rows of workers.csv: each worker's spec and counters."""
    return [{"worker": s.rank, "group": s.group, "device": s.device, "kind": s.label,
             "threads": s.threads, "first_batch": int(c["first_batch"]),
             "last_batch": int(c["batch_size"]), "updates": int(c["updates"]),
             "examples": int(c["examples"]), "busy_s": c["busy_s"], "wait_s": c["wait_s"],
             "comm_s": c["comm_s"]} for s, c in zip(specs, counters)]


class RunJournal:
    """Writes a training run's measurements into its directory as they come: the coordinator's
    ``Journal`` (:meth:`snapshot`, :meth:`drop`, :meth:`checkpoint`) and the utilization
    monitor's ``on_sample`` (:meth:`utilization`). :meth:`close` waits for every write; a write
    that failed (a full disk) stops the journal and raises there, or at the next snapshot."""

    def __init__(self, out: RunDirectory, specs: list[WorkerSpec]) -> None:
        self.out, self.specs = out, specs
        self.folder = out.path / SNAPSHOTS
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hetsgd-journal")
        self._failure: Exception | None = None

    def snapshot(self, snapshot: Snapshot, counters: list[dict[str, float]]) -> None:
        self._raise_failure()
        self._writer.submit(self._write, self._write_snapshot, snapshot, counters)

    def drop(self, snapshot: Snapshot) -> None:
        self._writer.submit(self._write, (self.folder / snapshot_file(snapshot)).unlink)

    def checkpoint(self, checkpoint: Checkpoint) -> None:
        self._raise_failure()
        self._writer.submit(self._write, write_checkpoint, self.out.path, checkpoint)

    def utilization(self, row: dict[str, float | None]) -> None:
        self._writer.submit(self._write, append_rows, self.out.path / "utilization.csv", [row])

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self._raise_failure()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _write(self, write: Callable[..., None], *args: Any) -> None:
        """Run on the writer thread: after a failure nothing more is written."""
        if self._failure is None:
            try:
                write(*args)
            except Exception as err:  # noqa: BLE001 - raised by the coordinator's thread
                self._failure = err

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _write_snapshot(self, snapshot: Snapshot, counters: list[dict[str, float]]) -> None:
        self.folder.mkdir(exist_ok=True)
        name = snapshot_file(snapshot)
        replace_file(self.folder / name, lambda handle: torch.save(
            {"params": snapshot.params, "buffers": snapshot.buffers}, handle), binary=True)
        append_rows(self.folder / INDEX, [{
            "file": name, "time_s": snapshot.time_s, "examples": snapshot.examples,
            **{f"updates_{rank}": u for rank, u in enumerate(snapshot.updates)}}])
        self.out.write_table("workers", workers_table(self.specs, counters))


def read_snapshots(run_dir: Path) -> list[Snapshot]:
    """The snapshots a run left in ``snapshots/``, oldest first: the rows of its index whose
    file is there (``[]`` when there is none)."""
    folder = Path(run_dir) / SNAPSHOTS
    if not (folder / INDEX).is_file():
        return []
    index = pd.read_csv(folder / INDEX).dropna()  # a row cut short by a power cut reads as NaN
    updates = [column for column in index.columns if column.startswith("updates_")]
    snapshots = []
    for row in index.to_dict("records"):
        file = folder / row["file"]
        if file.is_file():
            snapshots.append(load_snapshot(file, row["time_s"], row["examples"],
                                           [row[column] for column in updates]))
    return snapshots


def remove_snapshots(run_dir: Path) -> None:
    """Delete the raw snapshots once they are evaluated: they are large."""
    shutil.rmtree(Path(run_dir) / SNAPSHOTS, ignore_errors=True)
