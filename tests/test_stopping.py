"""Stopping a run: SIGTERM (as Ctrl-C) keeps what was measured, Ctrl-C while the workers start
ends quietly, Ctrl-C stops a sweep and summarises the jobs that ran, a killed coordinator takes
its workers along and leaves what it measured for recovery, and the exit code says how the run
ended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import psutil
import pytest
from processes import await_snapshots, gone, start, workers

from hetsgd.outputs.checkpoint import load_snapshot
from hetsgd.outputs.index import CRASHED, read_summary
from hetsgd.outputs.run_directory import SNAPSHOTS

pytestmark = [pytest.mark.integration, pytest.mark.wall]  # each runs `hetsgd` and waits on its exit

# two workers on any machine (hogwild's mix has one per core): the tests wait for both
LONG_RUN = ("run", "algo=hogwild", "devices.groups.cpu.count=2", "dataset=digits",
            "budget.epochs=null", "budget.seconds=120", "eval.every_s=0.2", "eval.every_epochs=null",
            "progress=false")


def _kill_command(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)  # `kill PID`, a scheduler's end of a job


def _hang_up_terminal(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGHUP)  # a closed terminal hangs up its whole foreground group


@pytest.mark.parametrize(("stop", "code", "signal_name"),
                         [(_kill_command, 143, "SIGTERM"), (_hang_up_terminal, 129, "SIGHUP")])
def test_sigterm_and_a_hangup_keep_the_curves_write_interrupted_and_exit_128_plus_signal(
        results_dir: Path, stop: Callable[[subprocess.Popen], None], code: int,
        signal_name: str) -> None:
    """The run's error names the signal: one its user may not have sent (a scheduler's,
    torchrun's agent's when another rank ended) does not read as the user's Ctrl-C."""
    proc = start(results_dir, *LONG_RUN)
    pids = workers(proc, count=2)
    await_snapshots(results_dir, count=5)
    stop(proc)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == code, output
    assert "Traceback" not in output, output
    run_dir, = (results_dir / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["error"]) == ("interrupted", f"stopped by {signal_name}")
    assert summary["time_s"] < 100  # stopped long before its 120 s budget
    convergence = pd.read_csv(run_dir / "convergence.csv")
    assert len(convergence) >= 5 and convergence["train_loss"].notna().all()
    assert gone(pids, timeout_s=10)


def test_ctrl_c_while_the_workers_start_ends_quietly_as_interrupted(results_dir: Path) -> None:
    proc = start(results_dir, *LONG_RUN)
    pids = workers(proc, count=2)  # forked from the forkserver, still setting up
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground process group
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    run_dir, = (results_dir / "runs").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    assert gone(pids, timeout_s=10)


def _child_commands(proc: subprocess.Popen) -> list[str]:
    """The command line of each child of ``proc``; one that ends while it is read is left out."""
    commands = []
    try:
        children = psutil.Process(proc.pid).children()
    except psutil.Error:  # it ended meanwhile
        return []
    for child in children:
        try:
            commands.append(" ".join(child.cmdline()))
        except psutil.Error:  # a child that ended (or is a zombie) between the two reads
            continue
    return commands


def test_ctrl_c_as_the_run_starts_writes_it_interrupted(results_dir: Path) -> None:
    """Ctrl-C while the run starts its workers' server and loads torch, before its summary
    existed: the folder held only Hydra's files and read as crashed."""
    proc = start(results_dir, *LONG_RUN)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(  # the forkserver: the run has begun
            "forkserver" in command for command in _child_commands(proc)):
        time.sleep(0.005)
    # to the command alone: the forkserver, itself starting, would print Python's own report of
    # a KeyboardInterrupt during its interpreter's start-up
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert "Traceback" not in output, output
    run_dir, = (results_dir / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert summary["error"].startswith("interrupted by the user"), summary["error"]
    # the console says so too (it printed nothing where the stop came before the runner's
    # own; a stop just after it says the same through the runner)
    assert output.splitlines()[-1].startswith("hetsgd: interrupted by the user"), output


def _ctrl_c(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground process group


@pytest.mark.parametrize(("stop", "code", "said", "cause"), [
    (_ctrl_c, 130, "sweep interrupted", "interrupted by the user"),
    (_kill_command, 143, "sweep stopped by SIGTERM", "stopped by SIGTERM")])
def test_ctrl_c_in_a_sweep_stops_it_and_summarises_the_jobs_that_ran(
        results_dir: Path, stop: Callable[[subprocess.Popen], None], code: int, said: str,
        cause: str) -> None:
    """A sweep's line, as its job's error, names the stop: a SIGTERM is not its user's Ctrl-C."""
    proc = start(results_dir, "run", "-m", *LONG_RUN[1:], "seed=0,1,2")
    pids = workers(proc, count=2)
    await_snapshots(results_dir / "sweeps", count=3)
    stop(proc)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == code, output
    assert "Traceback" not in output, output
    assert f"{said} after 1 job(s); the others did not run" in " ".join(output.split())
    sweep_dir, = (results_dir / "sweeps").iterdir()
    job_dir, = (p for p in sweep_dir.iterdir() if p.is_dir() and (p / "summary.json").exists())
    job = json.loads((job_dir / "summary.json").read_text())
    assert (job["status"], job["error"]) == ("interrupted", cause)
    summary = pd.read_csv(sweep_dir / "summary.csv")
    assert summary["status"].tolist() == ["interrupted"]  # seeds 1 and 2 never started
    assert (sweep_dir / "report.md").exists()
    assert gone(pids, timeout_s=10)


def test_a_killed_coordinator_takes_its_workers_along_and_leaves_what_it_measured(
        results_dir: Path) -> None:
    proc = start(results_dir, *LONG_RUN, "monitor.interval_s=0.1")
    pids = workers(proc, count=2)
    await_snapshots(results_dir, count=6)
    proc.kill()
    proc.communicate(timeout=30)
    assert gone(pids, timeout_s=10)
    run_dir, = (results_dir / "runs").iterdir()
    left = sorted((run_dir / SNAPSHOTS).glob("*.pt"))
    index = pd.read_csv(run_dir / SNAPSHOTS / "index.csv")
    # a file's row is appended to the index once the file is complete: a kill in between leaves
    # the newest without one, and recovery reads it from the file, which carries its own row
    names = [file.name for file in left]
    assert len(left) >= 6 and set(names) - set(index["file"]) <= {max(names)}
    times = [load_snapshot(file).time_s for file in left]
    updates = [column for column in index if column.startswith("updates_")]
    assert len(updates) >= 2 and (index[updates].iloc[-1] > 0).all()  # each worker's, as seen
    assert len(pd.read_csv(run_dir / "utilization.csv")) >= 1
    assert pd.read_csv(run_dir / "workers.csv")["updates"].sum() > 0
    assert read_summary(run_dir)["status"] == CRASHED

    recovery = start(results_dir, "recover", str(run_dir))
    output, _ = recovery.communicate(timeout=120)
    assert recovery.returncode == 0, output
    summary = read_summary(run_dir)
    convergence = pd.read_csv(run_dir / "convergence.csv")
    assert convergence["time_s"].tolist() == times
    assert convergence["train_loss"].notna().all()
    assert convergence["train_loss"].iloc[-1] < convergence["train_loss"].iloc[0]
    assert summary["status"] == CRASHED and summary["time_s"] == times[-1]
    assert json.loads((run_dir / "summary.json").read_text())["final"]["train_loss"] == \
        convergence["train_loss"].iloc[-1]
    assert not (run_dir / SNAPSHOTS).exists()  # evaluated: the raw snapshots go


def test_a_diverged_run_exits_non_zero(results_dir: Path) -> None:
    proc = start(results_dir, "run", "algo=sync", "dataset=digits", "optim.lr=1e9",
                  "budget.epochs=3", "progress=false")
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, output
    run_dir, = (results_dir / "runs").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "diverged"
