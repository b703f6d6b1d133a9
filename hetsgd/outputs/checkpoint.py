"""A run's checkpoint on disk: ``checkpoint/<time in µs>/`` in the run directory.

A version folder holds ``state.pt`` (the model, every worker's part, the snapshots' index and
spacing), hard links to the snapshot files kept up to then (a later thinning of ``snapshots/``
leaves them), and copies of the run's ``config.yaml`` and Hydra overrides, so that it can be
resumed whatever has since been written over the run directory. It is written as
``checkpoint/.partial``, synced, then renamed into place, and only then are older versions
removed: a crash at any point leaves the previous checkpoint, or the new one, whole.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from hetsgd.engines.checkpoint import Checkpoint, WorkerState
from hetsgd.engines.shared_memory.snapshots import Snapshot
from hetsgd.outputs.index import CONFIG, OVERRIDES
from hetsgd.outputs.run_directory import SNAPSHOTS, replace_file, sync_folder

CHECKPOINT = "checkpoint"
STATE = "state.pt"
PARTIAL = ".partial"
# The run's files a version keeps, by their name there: not the run directory's own names, so a
# version is never taken for a run directory (hetsgd.outputs.index.is_run_dir).
RUN_FILES = {"run_config.yaml": CONFIG, "run_overrides.yaml": OVERRIDES}


def time_name(time_s: float) -> str:
    """The name of what a run writes at ``time_s`` (a snapshot, a checkpoint version): the time
    in microseconds, unique within a run, and sorting as the times do."""
    return f"{round(time_s * 1e6):012d}"


def snapshot_file(snapshot: Snapshot) -> str:
    """The name of a snapshot's file, in ``snapshots/`` and in a checkpoint version."""
    return f"{time_name(snapshot.time_s)}.pt"


def load_snapshot(file: Path, time_s: float, examples: float, updates: list[float]) -> Snapshot:
    """A snapshot from its file (parameters and buffers) and the row that indexes it."""
    tensors = torch.load(file, weights_only=True)
    return Snapshot(time_s, examples, updates, tensors["params"], tensors["buffers"])


def write_checkpoint(run_dir: Path, checkpoint: Checkpoint) -> None:
    """Make ``checkpoint`` the run's latest; its snapshots' files are those in ``snapshots/``."""
    folder = Path(run_dir) / CHECKPOINT
    partial = folder / PARTIAL
    shutil.rmtree(partial, ignore_errors=True)  # left by a crash mid-write
    partial.mkdir(parents=True)
    files = [snapshot_file(s) for s in checkpoint.snapshots]
    for name in files:
        os.link(Path(run_dir) / SNAPSHOTS / name, partial / name)
    for name, source in RUN_FILES.items():
        if (Path(run_dir) / source).is_file():
            shutil.copyfile(Path(run_dir) / source, partial / name)
    state = {"time_s": checkpoint.time_s, "params": checkpoint.params,
             "buffers": checkpoint.buffers,
             "workers": [vars(worker) for worker in checkpoint.workers],
             "snapshots": [{"file": name, "time_s": s.time_s, "examples": s.examples,
                            "updates": s.updates} for s, name in zip(checkpoint.snapshots, files)],
             "snapshot_spacing": checkpoint.snapshot_spacing}
    replace_file(partial / STATE, lambda handle: torch.save(state, handle), binary=True)
    version = folder / time_name(checkpoint.time_s)
    shutil.rmtree(version, ignore_errors=True)
    os.rename(partial, version)
    sync_folder(folder)
    for old in _versions(folder):
        if old != version:
            shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The folder of the run's latest complete checkpoint, or None."""
    versions = _versions(Path(run_dir) / CHECKPOINT)
    return versions[-1] if versions else None


def read_checkpoint(version: Path) -> Checkpoint:
    """The checkpoint in a version folder (:func:`latest_checkpoint`)."""
    state = torch.load(version / STATE, weights_only=True)
    snapshots = [load_snapshot(version / row["file"], row["time_s"], row["examples"],
                               row["updates"]) for row in state["snapshots"]]
    return Checkpoint(state["time_s"], state["params"], state["buffers"],
                      [WorkerState(**worker) for worker in state["workers"]], snapshots,
                      tuple(state["snapshot_spacing"]))


def run_config(version: Path) -> tuple[DictConfig, list[str]]:
    """The config a checkpoint's run recorded, and the Hydra overrides it was composed from."""
    overrides_file = version / "run_overrides.yaml"
    overrides = yaml.safe_load(overrides_file.read_text()) if overrides_file.is_file() else []
    config = OmegaConf.load(version / "run_config.yaml")
    assert isinstance(config, DictConfig)
    return config, [str(o) for o in overrides or []]


def _versions(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir()
                  if not p.name.startswith(".") and (p / STATE).is_file())
