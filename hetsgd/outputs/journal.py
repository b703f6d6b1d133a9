"""What a run has measured, on disk as it is measured, so that a killed coordinator loses at
most one snapshot interval.

Snapshots are evaluated only after training (evaluation never takes CPU from the workers), so
until then the run directory holds them raw, in ``snapshots/``: one file per snapshot kept
(parameters and buffers, and its own row: time, examples, every worker's updates; named by the
snapshot's time in microseconds) and ``index.csv``, those rows for every snapshot taken, readable
without torch; a snapshot that the in-memory cap thins out loses its file, not its row. Recovery
needs only the files, so a lost or garbled index costs nothing. ``utilization.csv`` grows by a
row per sample and ``workers.csv`` is replaced at each snapshot. One writer thread does every
write, in order, so the coordinator's loop never waits for the disk, and a snapshot's row is
appended only once its file is complete. Checkpoints go through the same writer, after the
snapshots they keep (:mod:`hetsgd.outputs.checkpoint`). The runner removes ``snapshots/`` once it
has evaluated them; recovery (:mod:`hetsgd.runs.recover`) evaluates those of a run that crashed
(:func:`read_snapshots`).
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from types import TracebackType
from typing import Any

from hetsgd.engines.checkpoint import Checkpoint
from hetsgd.engines.snapshots import Snapshot
from hetsgd.outputs.checkpoint import (
    UnreadableFile,
    load_snapshot,
    save_snapshot,
    snapshot_file,
    write_checkpoint,
)
from hetsgd.outputs.run_directory import (
    SNAPSHOTS,
    RunDirectory,
    append_rows,
    replace_file,
    writing,
)
from hetsgd.readback import open_regular
from hetsgd.workers import WorkerSpec

INDEX = "index.csv"
log = logging.getLogger("hetsgd")


def workers_table(specs: list[WorkerSpec], counters: list[dict[str, float]]
                  ) -> list[dict[str, Any]]:
    """The rows of workers.csv: each worker's spec (``label``: its kind as tables show it, see
    :attr:`WorkerSpec.label`) and :func:`counter_columns`."""
    return [{"worker": s.rank, "group": s.group, "device": s.device, "label": s.label,
             "threads": s.threads, **counter_columns(c, s.simulated)}
            for s, c in zip(specs, counters)]


def counter_columns(counters: dict[str, float], simulated: bool) -> dict[str, Any]:
    """A worker's columns of workers.csv that its counters give: its time split four ways:
    computing, copying the master in, merging its result back (or exchanging it), waiting for
    work. ``busy_s`` and ``comm_s`` are the older columns (computing; copying and merging
    together)."""
    c = counters
    return {"first_batch": int(c["first_batch"]), "last_batch": int(c["batch_size"]),
            "updates": int(c["updates"]), "examples": int(c["examples"]), "busy_s": c["busy_s"],
            "wait_s": c["wait_s"], "comm_s": c["comm_s"], "compute_s": c["busy_s"],
            "copy_s": c["copy_s"], "merge_s": c["comm_s"] - c["copy_s"],
            # a simulated worker is the simulator's events, not a process of its own
            "cpu_s": None if simulated else c["cpu_s"],
            "cpu_wait_s": None if simulated else c["cpu_wait_s"]}


def _remove(path: Path) -> None:
    """A thinned snapshot's file gone: one already gone (a user's clean-up) costs nothing, and
    another failure names the file as a write's does."""
    with writing(path):
        path.unlink(missing_ok=True)


class RunJournal:
    """Writes a training run's measurements into its directory as they come: the coordinator's
    ``Journal`` (:meth:`snapshot`, :meth:`drop`, :meth:`checkpoint`) and the utilization
    monitor's ``on_sample`` (:meth:`utilization`). :meth:`close` waits for every write; a write
    that failed (a full disk) stops the journal and raises there, or at the next snapshot."""

    def __init__(self, out: RunDirectory, specs: list[WorkerSpec],
                 on_snapshot: Callable[[Snapshot], None] | None = None) -> None:
        self.out, self.specs = out, specs
        self.on_snapshot = on_snapshot  # told of each snapshot as it is taken (live trackers)
        self.folder = out.path / SNAPSHOTS
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hetsgd-journal")
        self._failure: Exception | None = None
        # wall-clock time the first snapshot came, taken as the training clock starts
        self.training_started_at: float | None = None

    def snapshot(self, snapshot: Snapshot, counters: list[dict[str, float]]) -> None:
        self._raise_failure()
        if self.training_started_at is None:
            self.training_started_at = time.time()
        self._writer.submit(self._write, self._write_snapshot, snapshot, counters)
        if self.on_snapshot is not None:
            self.on_snapshot(snapshot)

    def drop(self, snapshot: Snapshot) -> None:
        self._writer.submit(self._write, _remove, self.folder / snapshot_file(snapshot))

    def checkpoint(self, checkpoint: Checkpoint) -> None:
        """Never raises: the coordinator also checkpoints while it stops its workers, which a
        failure raised here would leave running; it learns of one at the next snapshot."""
        self._writer.submit(self._write, write_checkpoint, self.out.path, checkpoint)

    def utilization(self, row: dict[str, float | None]) -> None:
        self._writer.submit(self._write, append_rows, self.out.path / "utilization.csv", [row])

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self._raise_failure()

    def __enter__(self) -> RunJournal:
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
        replace_file(self.folder / name, lambda handle: save_snapshot(snapshot, handle),
                     binary=True)
        append_rows(self.folder / INDEX, [{
            "file": name, "time_s": snapshot.time_s, "examples": snapshot.examples,
            **{f"updates_{rank}": u for rank, u in enumerate(snapshot.updates)}}])
        self.out.write_table("workers", workers_table(self.specs, counters))


def warn_skipped(err: UnreadableFile) -> None:
    log.warning("%s: skipped", err)


def read_snapshots(run_dir: Path, skip: Callable[[UnreadableFile], None] = warn_skipped,
                   workers: int | None = None) -> list[Snapshot]:
    """The snapshots a run left in ``snapshots/``, oldest first: every file that can be read.
    A file carries its own row; one written before files did takes its row in ``index.csv``,
    or, without one there, its time from its name and NaN examples and updates for each of the
    run's ``workers`` (when given). A file that cannot be read (cut short, overwritten) costs
    only itself: it goes to ``skip`` (by default, :func:`warn_skipped`: a warning naming it)."""
    folder = Path(run_dir) / SNAPSHOTS
    index = _index_rows(folder / INDEX)
    snapshots = []
    for file in sorted(folder.glob("*.pt")):
        row = index.get(file.name)
        if row is None and workers is not None and file.stem.isdigit():
            row = {"time_s": int(file.stem) / 1e6, "examples": math.nan,
                   "updates": [math.nan] * workers}  # the inverse of snapshot_file
        try:
            snapshots.append(load_snapshot(file, row))
        except UnreadableFile as err:
            skip(err)
    return sorted(snapshots, key=lambda snapshot: snapshot.time_s)


def _index_rows(file: Path) -> dict[str, dict[str, Any]]:
    """The rows of ``index.csv`` that parse, by file name (``{}`` without one). A row cut short
    by a power cut, or garbled, is left out: it only matters to a file that does not carry its
    own row, which then says so."""
    rows: dict[str, dict[str, Any]] = {}
    with suppress(OSError, csv.Error), io.TextIOWrapper(  # never a FIFO's writer waited for
            open_regular(file), encoding="utf-8", errors="replace", newline="") as handle:
        for row in csv.DictReader(handle):
            with suppress(KeyError, TypeError, ValueError):
                updates = sorted((int(key.removeprefix("updates_")), float(value))
                                 for key, value in row.items()
                                 if isinstance(key, str) and key.startswith("updates_"))
                rows[row["file"]] = {"time_s": float(row["time_s"]),
                                     "examples": float(row["examples"]),
                                     "updates": [u for _, u in updates]}
    return rows


def remove_snapshots(run_dir: Path) -> None:
    """Delete the raw snapshots once they are evaluated: they are large."""
    shutil.rmtree(Path(run_dir) / SNAPSHOTS, ignore_errors=True)


def restart_snapshots(run_dir: Path, version: Path, checkpoint: Checkpoint) -> None:
    """Make ``snapshots/`` hold what a run resumed from ``checkpoint`` (read from ``version``)
    continues: the checkpoint's own snapshot files and nothing taken after it, so that a resume
    killed before it trains leaves what recovery reads as the checkpointed run. No index: each
    file carries its row."""
    folder = Path(run_dir) / SNAPSHOTS
    remove_snapshots(run_dir)
    with writing(folder):
        folder.mkdir()
        for name in (snapshot_file(snapshot) for snapshot in checkpoint.snapshots):
            try:  # a version holds links to the files: another link costs nothing
                os.link(version / name, folder / name)
            except OSError:  # another file system
                shutil.copyfile(version / name, folder / name)
