"""A run's checkpoint on disk: ``checkpoint/<time in µs>/`` in the run directory.

A version folder holds ``state.pt`` (the model, every worker's part, the snapshots' index and
spacing), hard links to the snapshot files kept up to then (a later thinning of ``snapshots/``
leaves them), and copies of the run's ``config.yaml`` and Hydra overrides, so that it can be
resumed whatever has since been written over the run directory. It is made atomically
(:func:`hetsgd.atomic.replace_folder`: written aside, synced, renamed into place), and only then
are older versions removed: a crash at any point leaves the previous checkpoint, or the new one,
whole. (A version of the same time, which a resumed run that trains no further writes again, is
swapped for the new one by two renames once that is whole: only between those is neither
there.)

A version is read back as data: its snapshots are named only as ``snapshots/`` names them (a
time in µs, ``.pt``), never by a path that leads elsewhere, and only regular files are read.
"""

from __future__ import annotations

import math
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import IO, Any

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hetsgd.atomic import remove_abandoned, replace_folder, writing_path
from hetsgd.data.files import reason
from hetsgd.engines.checkpoint import Checkpoint, WorkerState
from hetsgd.engines.snapshots import Snapshot
from hetsgd.errors import UserError
from hetsgd.outputs.index import CONFIG, OVERRIDES
from hetsgd.outputs.run_directory import SNAPSHOTS, writing
from hetsgd.readback import load_yaml, open_regular

CHECKPOINT = "checkpoint"
STATE = "state.pt"
# The run's files a version keeps, by their name there: not the run directory's own names, so a
# version is never taken for a run directory (hetsgd.outputs.index.is_run_dir).
RUN_FILES: dict[str, str | Path] = {"run_config.yaml": CONFIG, "run_overrides.yaml": OVERRIDES}
# what snapshot_file names, and all that a version's index may name
_SNAPSHOT_NAME = re.compile(r"\d{12,}\.pt")
# what a malformed file that torch loads raises when read as hetsgd's (a key missing, a list
# where a dict or tensor was written, a number that is not one)
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError)


def time_name(time_s: float) -> str:
    """The name of what a run writes at ``time_s`` (a snapshot, a checkpoint version): the time
    in microseconds, unique within a run, and sorting as the times do."""
    return f"{round(time_s * 1e6):012d}"


def snapshot_file(snapshot: Snapshot) -> str:
    """The name of a snapshot's file, in ``snapshots/`` and in a checkpoint version."""
    return f"{time_name(snapshot.time_s)}.pt"


class UnreadableFile(UserError):
    """A snapshot or checkpoint file that torch cannot load (truncated, overwritten, not one of
    ours), named in the message; recovery skips it, a resume stops at it."""

    def __init__(self, file: Path, reason: str) -> None:
        super().__init__(f"cannot read {file}: {reason}".splitlines()[0])
        self.file, self.reason = Path(file), reason

    def __reduce__(self) -> tuple[type, tuple[Path, str]]:
        return type(self), (self.file, self.reason)


def load_tensors(file: Path) -> dict[str, Any]:
    """What torch.save wrote to ``file`` (tensors, numbers, lists, dicts only). torch reports a
    damaged file as whatever failed inside it (a RuntimeError from the zip reader, an
    UnpicklingError, an EOFError...), never naming the file: an :class:`UnreadableFile`."""
    try:
        with open_regular(file) as handle:  # never a FIFO's writer waited for
            loaded = torch.load(handle, weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as err:
        # the OS's words, or torch's first sentence: what follows is advice about checkpoints
        raise UnreadableFile(file, reason(err).split(". ")[0]) from err
    if not isinstance(loaded, dict):
        raise UnreadableFile(file, "not a file hetsgd wrote")
    return loaded


def _malformed(file: Path, err: Exception) -> UnreadableFile:
    """A file torch loads that is not what hetsgd wrote there (a key missing, a wrong type)."""
    return UnreadableFile(file, f"not as hetsgd writes it ({type(err).__name__}: {err})")


def snapshot_row(snapshot: Snapshot) -> dict[str, Any]:
    """What indexes a snapshot besides its tensors: its time, examples, each worker's updates
    and the method's logged values."""
    return {"time_s": snapshot.time_s, "examples": snapshot.examples,
            "updates": list(snapshot.updates), "logged": dict(snapshot.logged)}


def save_snapshot(snapshot: Snapshot, handle: IO[bytes]) -> None:
    """A snapshot's file: its tensors and its own row, so that it is read back whole without
    any index (:func:`load_snapshot`)."""
    torch.save({"params": snapshot.params, "buffers": snapshot.buffers,
                **snapshot_row(snapshot)}, handle)


def load_snapshot(file: Path, row: dict[str, Any] | None = None) -> Snapshot:
    """The snapshot in ``file``, with the row it carries; a file from before snapshots carried
    their row takes ``row`` (its line in index.csv or state.pt), and is unreadable without."""
    tensors = load_tensors(file)
    row = tensors if "time_s" in tensors else row
    if row is None:
        raise UnreadableFile(file, "it holds no time, examples or updates, and no row of "
                             "index.csv names it")
    try:
        params, buffers = tensors["params"], tensors["buffers"]
        if not isinstance(params, torch.Tensor) or not isinstance(buffers, torch.Tensor):
            raise TypeError("its model is not tensors")
        return Snapshot(float(row["time_s"]), float(row["examples"]),
                        [float(u) for u in row["updates"]], params, buffers,
                        {str(k): float(v) for k, v in row.get("logged", {}).items()})
    except _MALFORMED as err:
        raise _malformed(file, err) from err


def write_checkpoint(run_dir: Path, checkpoint: Checkpoint) -> None:
    """Make ``checkpoint`` the run's latest; its snapshots' files are those in ``snapshots/``.
    Any I/O error is a :class:`WriteError` naming the file or the folder being written."""
    folder = Path(run_dir) / CHECKPOINT
    version = folder / time_name(checkpoint.time_s)
    files = [snapshot_file(s) for s in checkpoint.snapshots]
    state = {"time_s": checkpoint.time_s, "params": checkpoint.params,
             "buffers": checkpoint.buffers,
             "workers": [vars(worker) for worker in checkpoint.workers],
             "snapshots": [{"file": name, **snapshot_row(s)}
                           for s, name in zip(checkpoint.snapshots, files)],
             "snapshot_spacing": checkpoint.snapshot_spacing}

    def fill(staging: Path) -> None:
        for name in files:
            os.link(Path(run_dir) / SNAPSHOTS / name, staging / name)
        for name, source in RUN_FILES.items():
            if (Path(run_dir) / source).is_file():
                _copy_synced(Path(run_dir) / source, staging / name)
        with writing(version / STATE):  # named as it will be, not as the staging folder is
            with open(staging / STATE, "wb") as handle:
                torch.save(state, handle)
                handle.flush()
                os.fsync(handle.fileno())

    with writing(version):
        folder.mkdir(parents=True, exist_ok=True)
        remove_abandoned(folder)  # what a crash mid-write left
        if version.is_dir():  # a version of the same time: this one wins, once it is whole
            new, old = writing_path(version), writing_path(version)
            replace_folder(new, fill)
            os.rename(version, old)
            os.rename(new, version)
            shutil.rmtree(old, ignore_errors=True)
        else:
            replace_folder(version, fill)
    for old in _versions(folder):
        if old != version:
            shutil.rmtree(old, ignore_errors=True)


def _copy_synced(source: Path, target: Path) -> None:
    """``source`` copied to ``target`` and synced, as ``state.pt`` is: a version renamed into
    place holds whole files."""
    with open(source, "rb") as read, open(target, "wb") as write:
        shutil.copyfileobj(read, write)
        write.flush()
        os.fsync(write.fileno())


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The folder of the run's latest complete checkpoint, or None."""
    versions = _versions(Path(run_dir) / CHECKPOINT)
    return versions[-1] if versions else None


def read_checkpoint(version: Path) -> Checkpoint:
    """The checkpoint in a version folder (:func:`latest_checkpoint`); a damaged file is an
    :class:`UnreadableFile` naming it."""
    file = version / STATE
    state = load_tensors(file)
    try:
        snapshots = [load_snapshot(version / _snapshot_name(row["file"]), row)
                     for row in state["snapshots"]]
        time_s, params, buffers = float(state["time_s"]), state["params"], state["buffers"]
        if not (math.isfinite(time_s) and time_s >= 0):
            raise ValueError(f"its time is {time_s} s")
        if not isinstance(params, torch.Tensor) or not isinstance(buffers, torch.Tensor):
            raise TypeError("its model is not tensors")
        workers = [WorkerState(**worker) for worker in state["workers"]]
        if not workers:
            raise ValueError("it holds no worker")
        return Checkpoint(time_s, params, buffers, workers, snapshots,
                          tuple(state["snapshot_spacing"]))
    except _MALFORMED as err:
        raise _malformed(file, err) from err


def _snapshot_name(name: Any) -> str:
    """A snapshot's file name as a version's index gives it, refused unless it is one that
    :func:`snapshot_file` makes: no path, so nothing outside the version is read."""
    if not isinstance(name, str) or not _SNAPSHOT_NAME.fullmatch(name):
        raise ValueError(f"it names a snapshot {str(name)[:80]!r}, not a file of its own")
    return name


def run_config(version: Path) -> tuple[DictConfig, list[str]]:
    """The config a checkpoint's run recorded, and the Hydra overrides it was composed from; an
    unreadable one is a UserError naming its file."""
    overrides_file, config_file = version / "run_overrides.yaml", version / "run_config.yaml"
    try:
        overrides = load_yaml(overrides_file) if overrides_file.is_file() else []
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {overrides_file}: {reason(err)}".splitlines()[0]) from err
    try:
        config = OmegaConf.create(load_yaml(config_file))
    except (OSError, ValueError, OmegaConfBaseException) as err:
        raise UserError(f"cannot read {config_file}: {reason(err)}".splitlines()[0]) from err
    if not isinstance(config, DictConfig) or not isinstance(overrides or [], list):
        raise UserError(f"cannot read the config in {version}: not a mapping and a list")
    return config, [str(o) for o in overrides or []]


def _versions(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.iterdir()  # not one being written (replace_folder)
                   if p.name.isdigit() and (p / STATE).is_file()), key=lambda p: int(p.name))
