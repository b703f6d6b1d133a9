"""Sweeps: over config groups that bring other groups, and through Hydra's submitit launcher,
whose jobs run in other processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from hetsgd.config.compose import with_first_group_choices

SHORT = ("dataset=digits", "budget.seconds=1", "budget.epochs=null", "progress=false")


def hetsgd_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetsgd", "run", *args], capture_output=True,
                          text=True, timeout=300)


def the_sweep(results: Path) -> tuple[Path, pd.DataFrame]:
    sweep, = (results / "sweeps").iterdir()
    return sweep, pd.read_csv(sweep / "summary.csv")


def test_a_swept_group_is_given_its_first_choice_before_the_sweep() -> None:
    args = ["-m", "+method=sync,hogwild", "seed=0,1", "devices=choice(cpu,auto)",
            "hydra/launcher=basic,submitit_local", "devices.groups.accel.batch_size=64", "algo=sync"]
    assert with_first_group_choices(args) == [
        "-m", "+method=sync", "+method=sync,hogwild", "seed=0,1", "devices=cpu",
        "devices=choice(cpu,auto)", "hydra/launcher=basic,submitit_local",
        "devices.groups.accel.batch_size=64", "algo=sync"]


@pytest.mark.integration
def test_a_sweep_over_methods_takes_overrides_of_the_mix_they_bring(results_dir: Path) -> None:
    result = hetsgd_run("-m", "+method=hogbatch,sync", "devices.groups.accel.batch_size=64", *SHORT)
    assert result.returncode == 0, result.stderr
    sweep, summary = the_sweep(results_dir)
    assert list(summary["status"]) == ["completed", "completed"]
    assert list(summary["algo"]) == ["hogbatch", "sync"]
    for run_dir in summary["run_dir"]:
        mix = json.loads((Path(run_dir) / "summary.json").read_text())["mix"]
        assert mix["accel"]["batch_size"] == 64


@pytest.mark.integration
def test_a_sweep_job_that_cannot_take_an_override_stops_the_sweep_before_any_job(
        results_dir: Path) -> None:
    # hogwild brings the cpu mix, which has no accel group
    result = hetsgd_run("-m", "+method=hogbatch,hogwild", "devices.groups.accel.batch_size=64",
                        *SHORT)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    error, = result.stderr.strip().splitlines()
    assert error.startswith("hetsgd: error:") and "devices.groups.accel.batch_size" in error
    assert not list((results_dir / "sweeps").rglob("summary.json"))


@pytest.mark.integration
def test_a_submitit_sweep_summarises_and_exits_from_the_jobs_folders(results_dir: Path) -> None:
    result = hetsgd_run("-m", "hydra/launcher=submitit_local", "algo=sync,hogwild", *SHORT)
    assert result.returncode == 0, result.stderr
    sweep, summary = the_sweep(results_dir)
    assert list(summary["status"]) == ["completed", "completed"]
    assert list(summary["algo"]) == ["sync", "hogwild"]
    assert (sweep / "report.md").exists()


@pytest.mark.integration
def test_a_failed_submitit_job_fails_the_sweep(results_dir: Path) -> None:
    """The jobs ran in other processes: the exit code can only come from their folders."""
    result = hetsgd_run("-m", "hydra/launcher=submitit_local", "dataset=digits,libsvm",
                        *SHORT[1:])
    assert result.returncode == 1, result.stderr
    _, summary = the_sweep(results_dir)
    assert list(summary["status"]) == ["completed", "failed"]
