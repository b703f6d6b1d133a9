"""Shared fixtures: composing the project's configs the way `hetsgd run` does, shrunk for tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from hetsgd.config import RunConfig, compose_run, to_run_config
from hetsgd.machine import CORES_OVERRIDE, cuda_devices

# One intra-op thread: on small machines, tests of small models run several times faster.
torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
# The real w8a file (LIBSVM's, as published or compressed): the one setting $HETSGD_W8A, by
# default shared/data/w8a.xz in the folder that holds the repository, where CI puts it. The w8a
# tests skip, with the path, where it is absent.
W8A = Path(os.environ.get("HETSGD_W8A", ROOT.parent / "shared" / "data" / "w8a.xz"))
# the name the data cache knows it by: w8a as published, or with its compression's suffix
W8A_NAME = "w8a" + (W8A.suffix if W8A.suffix in (".xz", ".bz2", ".gz") else "")


def compose_config(*overrides: str) -> DictConfig:
    return compose_run(["progress=false", *overrides])


def run_config(*overrides: str) -> RunConfig:
    return to_run_config(compose_config(*overrides))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests (``@pytest.mark.gpu`` or ``gpu(n)`` for n GPUs) skip, with the reason, where
    torch cannot use that many CUDA GPUs; `make test` runs every tier."""
    available = len(cuda_devices())
    for item in items:
        marker = item.get_closest_marker("gpu")
        needed = marker.args[0] if marker is not None and marker.args else 1
        if marker is not None and available < needed:
            item.add_marker(pytest.mark.skip(
                reason=f"needs {needed} CUDA GPU(s); torch can use {available} here"))


@pytest.fixture
def results_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Runs write under a temporary results folder, never the project's."""
    path = tmp_path / "results"
    monkeypatch.setenv("HETSGD_RESULTS", str(path))
    return path


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine says it has 2 cores (HETSGD_CORES, for tests only), so that a mix of one
    worker per core starts 2 workers on any machine: for tests whose method or algorithm brings
    such a mix where an override of its count cannot follow (a sweep over methods)."""
    monkeypatch.setenv(CORES_OVERRIDE, "2")


@pytest.fixture
def w8a_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data cache holding the real w8a file ($HETSGD_W8A), or a skip when it is absent."""
    if not W8A.exists():
        pytest.skip(f"the real w8a file is not at {W8A} (set HETSGD_W8A)")
    home = tmp_path / "data"
    home.mkdir()
    (home / W8A_NAME).symlink_to(W8A.resolve())
    monkeypatch.setenv("HETSGD_DATA", str(home))
    return home
