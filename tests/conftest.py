"""Shared fixtures: composing the project's configs the way `hetsgd run` does, shrunk for tests."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import sys
from pathlib import Path
from types import ModuleType

import psutil
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


def load_script(path: Path) -> ModuleType:
    """A script of scripts/ (no package) as a module, registered under its name (a dataclass
    of it looks its module up there)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def said(stderr: str, prog: str) -> str:
    """The lines of a script's stderr that it wrote itself (``prog: ...``): a library's warning
    on a fresh machine (matplotlib building its font cache, say) is not the script's."""
    return "".join(f"{line}\n" for line in stderr.splitlines() if line.startswith(f"{prog}:"))


def compose_config(*overrides: str) -> DictConfig:
    return compose_run(["progress=false", *overrides])


def run_config(*overrides: str) -> RunConfig:
    return to_run_config(compose_config(*overrides))


# Tiers. `make test` runs the fast tests; `make test-wall` those marked `wall` or `serial`
# (tests/test_tiers.py checks that the two run every test once). A test is `wall`
# (`@pytest.mark.wall`, or a file's `pytestmark` where every test of it is) when its time goes
# to the wall clock or to whole runs rather than to the logic it checks: it trains on
# `budget.seconds` outside the virtual clock, runs `hetsgd` or torchrun as processes and waits
# for them to end, waits on a stall watch or a timeout, or runs every job of a sweep. Unit
# tests, virtual-clock runs and config checks stay unmarked, so that `make test` catches most
# regressions in minutes. `serial` is for the few that time this machine: they run alone.


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


# One short run that keeps its snapshots and writes a checkpoint: the run folder that the tests
# of damaged and crafted run folders change, each in a copy of its own (`run_dir`). On the
# virtual clock, so that it has its 11 snapshots however loaded the machine is.
CHECKPOINTED_RUN = ("algo=sync", "devices=cpu", "devices.groups.cpu.count=2", "dataset=digits",
                    "model=mlp", "devices.simulated=true",
                    "devices.groups.cpu.profile=xeon_e5_2686v4_core", "budget.epochs=null",
                    "budget.seconds=0.5", "eval.every_s=0.05", "eval.every_epochs=null",
                    "eval.keep_snapshots=true", "checkpoint.every_s=600", "progress=false")



def abandoned_write(target: Path) -> Path:
    """Where a writer of ``target`` whose process is gone (this pid, started earlier: a reused
    pid) left its write, as a SIGKILL mid-write leaves it."""
    gone = round((psutil.Process().create_time() - 60.0) * 100)
    return target.with_name(f"{target.name}.0badf00d.{os.getpid()}-{gone}@{socket.gethostname()}.tmp")

@pytest.fixture(scope="session")
def checkpointed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """CHECKPOINTED_RUN, made once per test process (in this process, as `hetsgd run` makes it)."""
    import hetsgd
    from hetsgd.outputs.checkpoint import latest_checkpoint
    from hetsgd.outputs.run_directory import SNAPSHOTS

    results = tmp_path_factory.mktemp("results")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HETSGD_RESULTS", str(results))
        patch.setenv("HETSGD_DATA", str(tmp_path_factory.mktemp("data")))
        done = hetsgd.run(*CHECKPOINTED_RUN)
    assert done.exit_code == 0, done.summary.error
    run_dir, = (results / "runs").iterdir()
    assert latest_checkpoint(run_dir) is not None and len(list((run_dir / SNAPSHOTS).glob("*.pt"))) == 11
    return run_dir


@pytest.fixture
def run_dir(checkpointed_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the checkpointed run, for one test to change, with results and data folders
    of the test's own."""
    monkeypatch.setenv("HETSGD_RESULTS", str(tmp_path / "results"))
    monkeypatch.setenv("HETSGD_DATA", str(tmp_path / "data"))
    return Path(shutil.copytree(checkpointed_run, tmp_path / "run", symlinks=True))


def as_crashed(run_dir: Path) -> None:
    """Make ``run_dir``'s summary that of a run whose coordinator was killed: still `running`,
    its process gone, and no final results (they are written at the end)."""
    from hetsgd.outputs.index import CRASHED, RUNNING, read_summary
    from hetsgd.outputs.run_directory import SUMMARY, RunDirectory

    summary = json.loads((run_dir / SUMMARY).read_text())
    me = psutil.Process()
    gone = {"host": socket.gethostname(), "pid": me.pid, "started": me.create_time() - 60.0}
    RunDirectory(run_dir).write_summary({**summary, "status": RUNNING, "coordinator": gone,
                                         "final": None})
    assert read_summary(run_dir)["status"] == CRASHED
