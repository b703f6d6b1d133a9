"""Stopping a run: SIGTERM (as Ctrl-C) keeps what was measured, a killed coordinator takes its
workers along, and the exit code says how the run ended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

pytestmark = pytest.mark.integration  # every test here runs the `hetsgd` command

LONG_RUN = ("run", "algo=hogwild", "dataset=digits", "budget.epochs=null", "budget.seconds=120",
            "eval.every_s=0.2", "eval.every_epochs=null", "progress=false")


def _start(results: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "HETSGD_RESULTS": str(results)}
    return subprocess.Popen([sys.executable, "-m", "hetsgd", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _workers_training(proc: subprocess.Popen, count: int, timeout_s: float = 90) -> list[int]:
    """The pids of the run's worker processes, once `count` of them exist and had time to train."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = [p for p in psutil.Process(proc.pid).children()
                   if "spawn_main" in " ".join(p.cmdline())]
        if len(workers) == count:
            time.sleep(4.0)  # set-up, then a few snapshots of training
            return [p.pid for p in workers]
        time.sleep(0.2)
    raise AssertionError("the workers did not start")


def _gone(pids: list[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
                   for pid in pids):
            return True
        time.sleep(0.2)
    return False


def test_sigterm_keeps_the_curves_writes_interrupted_and_exits_143(results_dir: Path) -> None:
    proc = _start(results_dir, *LONG_RUN)
    workers = _workers_training(proc, count=2)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, output
    run_dir, = (results_dir / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["time_s"] < 100  # stopped long before its 120 s budget
    convergence = pd.read_csv(run_dir / "convergence.csv")
    assert len(convergence) >= 5 and convergence["train_loss"].notna().all()
    assert _gone(workers, timeout_s=10)


def test_a_killed_coordinator_takes_its_workers_along(results_dir: Path) -> None:
    proc = _start(results_dir, *LONG_RUN)
    workers = _workers_training(proc, count=2)
    proc.kill()
    proc.communicate(timeout=30)
    assert _gone(workers, timeout_s=10)


def test_a_diverged_run_exits_non_zero(results_dir: Path) -> None:
    proc = _start(results_dir, "run", "algo=sync", "dataset=digits", "optim.lr=1e9",
                  "budget.epochs=3", "progress=false")
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, output
    run_dir, = (results_dir / "runs").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "diverged"
