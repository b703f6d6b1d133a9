"""Stopping a run: SIGTERM (as Ctrl-C) keeps what was measured, Ctrl-C while the workers start
ends quietly, Ctrl-C stops a sweep and summarises the jobs that ran, a killed coordinator takes
its workers along and leaves what it measured for recovery, and the exit code says how the run
ended."""

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

from hetsgd.outputs.index import CRASHED, read_summary
from hetsgd.outputs.run_directory import SNAPSHOTS

pytestmark = pytest.mark.integration  # every test here runs the `hetsgd` command

LONG_RUN = ("run", "algo=hogwild", "dataset=digits", "budget.epochs=null", "budget.seconds=120",
            "eval.every_s=0.2", "eval.every_epochs=null", "progress=false")


def _default_sigint() -> None:
    """Ctrl-C as a terminal's foreground command gets it, even where the tests themselves run in
    the background of a script (which starts them with SIGINT ignored, and children inherit it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(results: Path, *args: str) -> subprocess.Popen:
    """`hetsgd *args` in a process group of its own, as a shell starts a command."""
    env = {**os.environ, "HETSGD_RESULTS": str(results)}
    return subprocess.Popen([sys.executable, "-m", "hetsgd", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            process_group=0, preexec_fn=_default_sigint)


def _workers(proc: subprocess.Popen, count: int, timeout_s: float = 90) -> list[int]:
    """The pids of the run's worker processes, as soon as `count` of them exist."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = [p.pid for p in psutil.Process(proc.pid).children()
                   if "spawn_main" in " ".join(p.cmdline())]
        if len(workers) == count:
            return workers
        time.sleep(0.05)
    raise AssertionError("the workers did not start")


def _await_snapshots(results: Path, count: int, timeout_s: float = 90) -> None:
    """Return once the one run in a folder of `results` (runs/, a sweep) has `count` snapshot
    files on disk."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if len(list(results.glob(f"*/*/{SNAPSHOTS}/*.pt"))) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} snapshots on disk")


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
    workers = _workers(proc, count=2)
    _await_snapshots(results_dir, count=5)
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


def test_ctrl_c_while_the_workers_start_ends_quietly_as_interrupted(results_dir: Path) -> None:
    proc = _start(results_dir, *LONG_RUN)
    workers = _workers(proc, count=2)  # spawned, still importing
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground process group
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    run_dir, = (results_dir / "runs").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    assert _gone(workers, timeout_s=10)


def test_ctrl_c_in_a_sweep_stops_it_and_summarises_the_jobs_that_ran(results_dir: Path) -> None:
    proc = _start(results_dir, "run", "-m", *LONG_RUN[1:], "seed=0,1,2")
    workers = _workers(proc, count=2)
    _await_snapshots(results_dir / "sweeps", count=3)
    os.killpg(proc.pid, signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert "Traceback" not in output, output
    assert "sweep interrupted after 1 job(s); the others did not run" in " ".join(output.split())
    sweep_dir, = (results_dir / "sweeps").iterdir()
    job_dir, = (p for p in sweep_dir.iterdir() if p.is_dir() and (p / "summary.json").exists())
    assert json.loads((job_dir / "summary.json").read_text())["status"] == "interrupted"
    summary = pd.read_csv(sweep_dir / "summary.csv")
    assert summary["status"].tolist() == ["interrupted"]  # seeds 1 and 2 never started
    assert (sweep_dir / "report.md").exists()
    assert _gone(workers, timeout_s=10)


def test_a_killed_coordinator_takes_its_workers_along_and_leaves_what_it_measured(
        results_dir: Path) -> None:
    proc = _start(results_dir, *LONG_RUN, "monitor.interval_s=0.1")
    workers = _workers(proc, count=2)
    _await_snapshots(results_dir, count=6)
    proc.kill()
    proc.communicate(timeout=30)
    assert _gone(workers, timeout_s=10)
    run_dir, = (results_dir / "runs").iterdir()
    left = sorted(p.name for p in (run_dir / SNAPSHOTS).glob("*.pt"))
    index = pd.read_csv(run_dir / SNAPSHOTS / "index.csv")
    # a file's row is appended once the file is complete: a kill in between leaves one file
    # without a row, the newest, which recovery ignores
    assert set(left) - set(index["file"]) <= {max(left)}
    assert len(set(left) & set(index["file"])) >= 6
    assert index["updates_1"].iloc[-1] > 0  # every worker's updates, as the snapshot saw them
    assert len(pd.read_csv(run_dir / "utilization.csv")) >= 1
    assert pd.read_csv(run_dir / "workers.csv")["updates"].sum() > 0
    assert read_summary(run_dir)["status"] == CRASHED

    recovery = _start(results_dir, "recover", str(run_dir))
    output, _ = recovery.communicate(timeout=120)
    assert recovery.returncode == 0, output
    summary = read_summary(run_dir)
    convergence = pd.read_csv(run_dir / "convergence.csv")
    kept = index.set_index("file").loc[left]
    assert convergence["time_s"].tolist() == kept["time_s"].tolist()
    assert convergence["train_loss"].notna().all()
    assert convergence["train_loss"].iloc[-1] < convergence["train_loss"].iloc[0]
    assert summary["status"] == CRASHED and summary["time_s"] == kept["time_s"].iloc[-1]
    assert json.loads((run_dir / "summary.json").read_text())["final"]["train_loss"] == \
        convergence["train_loss"].iloc[-1]
    assert not (run_dir / SNAPSHOTS).exists()  # evaluated: the raw snapshots go


def test_a_diverged_run_exits_non_zero(results_dir: Path) -> None:
    proc = _start(results_dir, "run", "algo=sync", "dataset=digits", "optim.lr=1e9",
                  "budget.epochs=3", "progress=false")
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, output
    run_dir, = (results_dir / "runs").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "diverged"
