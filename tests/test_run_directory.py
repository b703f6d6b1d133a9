"""Every file of a run directory is replaced atomically: a failed write never leaves a partial file;
a table that grows while the run goes is appended whole rows at a time, synced."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from hetsgd.outputs.run_directory import RunDirectory, append_rows, replace_file


def _leftovers(run_dir: Path) -> list[str]:
    return [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]


def test_every_file_is_synced_and_renamed_into_place(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []  # each file synced before its rename, the folder after it
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (
        events.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"),
        real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(Path(b).name),
                                                     real_replace(a, b))[1])
    out = RunDirectory(tmp_path / "run")
    out.write_config(OmegaConf.create({"algo": {"name": "sync"}, "seed": 0}))
    out.write_table("convergence", [{"time_s": 0.0, "epoch": 0.0, "train_loss": 2.3}])
    out.write_summary({"status": "completed", "loss": float("nan")})
    assert events == [step for name in ("config.yaml", "convergence.csv", "summary.json")
                      for step in ("file", name, "folder")]
    assert json.loads((out.path / "summary.json").read_text())["loss"] is None
    assert pd.read_csv(out.path / "convergence.csv")["train_loss"].tolist() == [2.3]
    assert "name: sync" in (out.path / "config.yaml").read_text()
    assert oct((out.path / "summary.json").stat().st_mode & 0o777) == oct(0o644)
    assert _leftovers(out.path) == []


def test_a_failed_rename_keeps_the_previous_file_and_names_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = RunDirectory(tmp_path / "run")
    out.write_summary({"status": "running"})
    before = (out.path / "summary.json").read_text()

    def full_disk(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match=r"^no space left on device, writing .*summary\.json$"):
        out.write_summary({"status": "completed", "final": {"train_loss": 0.1}})
    assert (out.path / "summary.json").read_text() == before
    assert _leftovers(out.path) == []


def test_a_serializer_that_fails_midway_leaves_the_previous_complete_file(tmp_path: Path) -> None:
    out = RunDirectory(tmp_path / "run")
    out.write_table("convergence", [{"time_s": 0.0, "epoch": 0.0, "train_loss": 2.3}])
    before = (out.path / "convergence.csv").read_text()

    def half(handle) -> None:  # noqa: ANN001 - a text file
        handle.write("time_s,epo")
        raise RuntimeError("killed midway")

    with pytest.raises(RuntimeError, match="killed midway"):
        replace_file(out.path / "convergence.csv", half)
    assert (out.path / "convergence.csv").read_text() == before
    with pytest.raises(TypeError):  # not JSON: nothing is written at all
        out.write_summary({"status": "completed", "bad": object()})
    assert not (out.path / "summary.json").exists()
    assert _leftovers(out.path) == []


def test_a_growing_table_gets_one_header_and_every_row_synced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    table = tmp_path / "utilization.csv"
    append_rows(table, [{"time_s": 0.5, "gpu0_util": None}])
    append_rows(table, [{"time_s": 1.0, "gpu0_util": 30.0}, {"time_s": 1.5, "gpu0_util": 40.0}])
    assert table.read_text().splitlines() == ["time_s,gpu0_util", "0.5,", "1.0,30.0", "1.5,40.0"]
    assert len(synced) == 2
