"""Checkpoint and resume: a run stopped at a checkpoint and resumed ends where one straight run
ends, its curves continue the old ones, and a resume that cannot be says why in one line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

import hetsgd
from hetsgd.errors import UserError
from hetsgd.outputs.checkpoint import latest_checkpoint, read_checkpoint
from hetsgd.outputs.index import read_summary
from hetsgd.runs.resume import resume

SYNC = ("algo=sync", "dataset=digits", "model=mlp", "optim.momentum=0.9", "optim.lr=0.05")
LOCAL = ("algo=local_sgd", "dataset=digits", "model=mlp", "devices=cpu",
         "devices.groups.cpu.count=2", "devices.groups.cpu.batch_size=16", "algo.tau=3",
         "optim.momentum=0.9", "optim.lr=0.05")
# local SGD by its target: an algorithm that declares CHECKPOINTS, not a name on a list
LOCAL_BY_TARGET = ("algo=custom", "algo._target_=hetsgd.algorithms.local_sgd", "+algo.tau=3",
                   *(o for o in LOCAL[1:] if not o.startswith("algo.")))
# every_s longer than the run: the one checkpoint is the one taken at its end, a fixed point
CHECKPOINTS = ("checkpoint.every_s=600", "progress=false")


def _hetsgd(results: Path, *args: str) -> subprocess.CompletedProcess:
    """`hetsgd run ARGS` as a command, with results under `results`: for what only the command
    shows (its exit status and error line)."""
    env = {**os.environ, "HETSGD_RESULTS": str(results)}
    return subprocess.run([sys.executable, "-m", "hetsgd", "run", *args], env=env,
                          capture_output=True, text=True, timeout=300)


def _new_run(*args: str) -> Path:
    """`hetsgd run ARGS` in this process (the command's own path, without a process's start),
    under the test's results folder; the run directory of a run that completed."""
    result = hetsgd.run(*args)
    assert result.exit_code == 0 and result.status == "completed", result.summary.error
    return result.run_dir


def _version(run_dir: Path) -> Path:
    version = latest_checkpoint(run_dir)
    assert version is not None
    return version


def _final_model(run_dir: Path) -> torch.Tensor:
    return read_checkpoint(_version(run_dir)).params


@pytest.mark.integration
@pytest.mark.parametrize("algo", [SYNC, LOCAL, LOCAL_BY_TARGET],
                         ids=["sync", "local_sgd", "local_sgd_by_target"])
def test_a_resumed_run_ends_where_a_straight_run_ends(results_dir: Path,
                                                      algo: tuple[str, ...]) -> None:
    straight = _new_run(*algo, *CHECKPOINTS, "budget.epochs=2")
    first = _new_run(*algo, *CHECKPOINTS, "budget.epochs=1")
    old, before = read_summary(first), pd.read_csv(first / "convergence.csv")
    checkpointed = _final_model(first)
    runs = set((results_dir / "runs").iterdir())
    named = [o for o in algo if o.startswith("algo._target_")]  # a target is called if named
    if named:
        named.insert(0, "algo=custom")
    assert _new_run(f"resume={first}", *named, "budget.epochs=2", "progress=false") == first
    assert set((results_dir / "runs").iterdir()) == runs  # it continued in its own directory

    assert torch.allclose(_final_model(first), _final_model(straight), atol=1e-6)
    assert not torch.equal(checkpointed, _final_model(straight))
    summary = read_summary(first)
    assert summary["status"] == "completed" and summary["algo"] == old["algo"]
    assert summary["epochs"] == pytest.approx(2.0, abs=0.01)
    assert summary["resumed_from"]["examples"] == old["examples"]

    after = pd.read_csv(first / "convergence.csv")
    kept = before[before["time_s"] <= summary["resumed_from"]["time_s"]]
    assert len(kept) >= 1
    pd.testing.assert_frame_equal(after.iloc[:len(kept)], kept)  # the old curve, unchanged
    assert after["time_s"].is_monotonic_increasing
    assert after["epoch"].iloc[-1] == pytest.approx(2.0, abs=0.01)
    assert after["time_s"].iloc[len(kept)] >= summary["resumed_from"]["time_s"]


@pytest.mark.integration
@pytest.mark.wall  # a run killed after real seconds, and its resume
def test_a_killed_run_resumes_from_its_last_periodic_checkpoint(results_dir: Path) -> None:
    env = {**os.environ, "HETSGD_RESULTS": str(results_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "hetsgd", "run", *SYNC, "budget.epochs=null",
                             "budget.seconds=120", "checkpoint.every_s=0.3", "eval.every_s=0.1",
                             "eval.every_epochs=null", "progress=false"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while not list(results_dir.glob("runs/*/checkpoint/[0-9]*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # a few more snapshots past the checkpoint, which the resume must drop
    proc.kill()
    proc.wait(timeout=30)
    run_dir, = (results_dir / "runs").iterdir()
    version = latest_checkpoint(run_dir)
    assert version is not None and read_summary(run_dir)["status"] == "crashed"
    checkpoint_s = read_checkpoint(version).time_s

    assert _new_run(f"resume={run_dir}", f"budget.seconds={checkpoint_s + 1}",
                    "progress=false") == run_dir
    summary = read_summary(run_dir)
    assert summary["status"] == "completed"
    assert summary["resumed_from"]["time_s"] == pytest.approx(checkpoint_s)
    curve = pd.read_csv(run_dir / "convergence.csv")
    assert curve["time_s"].is_monotonic_increasing and curve["time_s"].iloc[0] < 0.1
    assert (curve["time_s"] <= checkpoint_s).sum() >= 2  # the old curve, up to the checkpoint
    assert curve["time_s"].iloc[-1] >= checkpoint_s + 1 - 0.05
    assert curve["train_loss"].iloc[-1] < curve["train_loss"].iloc[0]


@pytest.mark.integration
@pytest.mark.wall  # a run and its resume, whole
def test_a_simulated_run_resumes_from_a_checkpoint_holding_a_snapshot_of_its_own_time(
        results_dir: Path) -> None:
    """The virtual clock's last meeting may snapshot the model at the checkpoint's very time:
    a resume took that snapshot again as its first, and its next checkpoint linked the one file
    twice (crashed: File exists)."""
    run = ("algo=local_sgd", "dataset=digits", "model=mlp", "devices=paper_biased_local",
           "devices.groups.accel.count=1", "budget.seconds=null", "checkpoint.every_s=0.001",
           "progress=false")
    first = _new_run(*run, "budget.epochs=1")
    checkpoint = read_checkpoint(_version(first))
    assert checkpoint.snapshots[-1].time_s == checkpoint.time_s
    assert _new_run(f"resume={first}", "budget.epochs=2", "progress=false") == first
    times = pd.read_csv(first / "convergence.csv")["time_s"]
    assert times.is_monotonic_increasing and not times.duplicated().any()


@pytest.mark.integration
def test_bad_resumes_are_one_line_errors(results_dir: Path, tmp_path: Path) -> None:
    no_checkpoint = _new_run(*SYNC, "budget.epochs=0.2", "progress=false")
    with_checkpoint = _new_run(*SYNC, *CHECKPOINTS, "budget.epochs=0.2")
    nowhere = tmp_path / "nowhere"
    done = _hetsgd(results_dir, f"resume={nowhere}", "progress=false")
    assert done.returncode == 1 and "no such directory" in done.stderr, done.stderr
    assert not nowhere.exists()  # a mistyped path creates nothing there
    cases = {tmp_path / "nowhere": "no such directory", tmp_path: "not a run directory",
             no_checkpoint: "left no checkpoint"}
    for source, message in cases.items():
        with pytest.raises(UserError, match=message) as raised:
            resume(source, [])
        assert "\n" not in str(raised.value)
    with pytest.raises(UserError, match="optim cannot change") as raised:
        resume(with_checkpoint, ["optim.lr=0.5"])
    assert "\n" not in str(raised.value)
    with pytest.raises(UserError, match="seed cannot change"):  # its data order would
        resume(with_checkpoint, ["seed=1"])
    assert resume(with_checkpoint, ["budget.epochs=3"]).cfg.budget.epochs == 3


@pytest.mark.parametrize("algo", [("algo=hogwild",), (
    "algo=custom", "algo._target_=hetsgd.algorithms.hogbatch")])
def test_checkpoints_need_an_algorithm_that_declares_them(algo: tuple[str, ...]) -> None:
    from hetsgd import algorithms
    from hetsgd.config import ConfigError
    from tests.conftest import run_config

    with pytest.raises(ConfigError, match=r"^checkpoint\.every_s=5: algo=hog\w+ does not "
                                          r"checkpoint \(an algorithm declares CHECKPOINTS = True "
                                          r"where .*: sync, local_sgd\)$"):
        algorithms.choose(run_config(*algo, "checkpoint.every_s=5"))
    for declared in (("algo=local_sgd",), ("algo=custom",
                                           "algo._target_=hetsgd.algorithms.local_sgd")):
        algorithms.choose(run_config(*declared, "checkpoint.every_s=5"))  # accepted


def test_composing_inside_a_hydra_job_gives_the_job_its_hydra_back() -> None:
    """A resume composes the checkpoint's config from inside `hetsgd run`'s own Hydra job."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from hetsgd.config import CONF_DIR, compose_run

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        held = GlobalHydra.instance().hydra
        assert compose_run(["seed=3"]).seed == 3
        assert GlobalHydra.instance().hydra is held


def test_a_checkpoint_from_before_the_staleness_counters_restores_them_from_zero() -> None:
    from hetsgd.engines.checkpoint import WorkerState
    from hetsgd.engines.counters import COUNTERS

    old = torch.arange(8, dtype=torch.float64)  # the 8 counters a checkpoint of 0.1 holds
    part = WorkerState.from_bytes(WorkerState(0, 0.0, old, None, {}).to_bytes())
    assert part.counters.tolist() == [*old.tolist(), *[0.0] * (len(COUNTERS) - 8)]
    assert COUNTERS[:8] == ("updates", "examples", "busy_s", "wait_s", "comm_s", "batch_size",
                            "first_batch", "loss")


def test_a_checkpoint_s_streams_include_numpy_s_and_python_s() -> None:
    """A researcher's model that draws from numpy's or Python's global stream continues it on
    resume, as torch's does (it began again from the run's start); a checkpoint written
    before these streams were kept restores torch's alone."""
    import random

    import numpy as np

    from hetsgd.engines.checkpoint import restore_rng, rng_state

    def draws() -> tuple:
        return (torch.rand(2).tolist(), np.random.rand(2).tolist(), np.random.randn(),
                random.random(), random.gauss(0, 1))

    with torch.random.fork_rng(devices=[]):
        saved_numpy, saved_random = np.random.get_state(), random.getstate()
        try:
            np.random.seed(3)
            random.seed(4)
            np.random.randn(), random.gauss(0, 1)  # each keeps a second normal for later
            state = rng_state(torch.device("cpu"), None)
            first = draws()
            restore_rng(state, torch.device("cpu"), None)
            assert draws() == first
            older = {"cpu": state["cpu"]}
            restore_rng(older, torch.device("cpu"), None)
            assert draws()[0] == first[0]
        finally:
            np.random.set_state(saved_numpy)
            random.setstate(saved_random)
