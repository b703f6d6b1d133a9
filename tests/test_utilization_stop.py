"""Utilization samples stop with the workers: a sample taken once every worker process is gone
would count them as idle after training and pull the run's mean down, so it is not kept. A run's
first seconds are sampled faster, so that a short run has a curve to read."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from hetsgd.observe.monitor import EARLY_SAMPLES, FASTEST, UtilizationMonitor, summarize
from hetsgd.outputs.run_figures import MOST_EPOCH_LINES, epoch_step


def _ended_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


class Workers:
    """The worker pids a monitor asks for: this process for the first ``alive`` asks (the
    monitor's priming read, then its samples), then ``gone`` (ended workers); ``asked`` is set
    once a sample was taken after they ended."""

    def __init__(self, alive: int, gone: list[int]) -> None:
        self.alive, self.gone, self.calls = alive, gone, 0
        self.asked = threading.Event()

    def __call__(self) -> list[int]:
        self.calls += 1
        if self.calls > self.alive + 1:
            self.asked.set()
        return [os.getpid()] if self.calls <= self.alive else self.gone


@pytest.mark.parametrize("gone", [[], "reaped"])
def test_no_sample_is_kept_once_the_workers_are_gone(gone: list[int] | str) -> None:
    workers = Workers(alive=3, gone=[_ended_pid()] if gone == "reaped" else [])
    monitor = UtilizationMonitor(0.05, workers).start()
    assert workers.asked.wait(timeout=120)  # two samples after the workers ended
    rows = monitor.stop()
    assert len(rows) == 2  # the samples taken while the workers were there, none after
    assert all(r["workers_cpu_percent"] is not None for r in rows)
    mean = summarize(rows, cores_given=1)["workers_cpu_cores_mean"]  # over the kept rows' time
    assert mean == pytest.approx(sum(r["workers_cpu_percent"] * w for r, w in zip(
        rows, (rows[0]["time_s"], rows[1]["time_s"] - rows[0]["time_s"]))) / rows[1]["time_s"]
        / 100)


def test_a_run_too_short_for_a_sample_keeps_its_closing_one_without_the_workers_cpu() -> None:
    """Its host columns cover its training; its workers' CPU, unreadable once they are gone,
    is unknown rather than 0, so it pulls no mean down."""
    workers = Workers(alive=1, gone=[_ended_pid()])  # gone by the first sample
    rows = UtilizationMonitor(3600.0, workers).start().stop()
    assert len(rows) == 1 and rows[0]["workers_cpu_percent"] is None
    assert rows[0]["host_cpu_percent"] is not None
    assert summarize(rows, cores_given=1)["workers_cpu_cores_mean"] is None


def test_a_monitor_of_no_workers_keeps_the_hosts_samples() -> None:
    rows = UtilizationMonitor(3600.0, list).start().stop()
    assert len(rows) == 1 and rows[0]["workers_cpu_percent"] == 0.0  # the closing sample


def test_a_runs_first_seconds_are_sampled_faster() -> None:
    monitor = UtilizationMonitor(0.5)
    assert monitor.interval_at(0.0) == 0.5 / FASTEST
    assert monitor.interval_at(3.0) == 3.0 / EARLY_SAMPLES
    assert monitor.interval_at(0.5 * EARLY_SAMPLES) == monitor.interval_at(3600.0) == 0.5
    waits, elapsed = [], 0.0  # the samples of a 3 s run
    while elapsed < 3.0:
        waits.append(monitor.interval_at(elapsed))
        elapsed += waits[-1]
    assert len(waits) > 25


@pytest.mark.parametrize(("epochs", "step"), [(0, 1), (20, 1), (21, 2), (41, 2), (42, 5),
                                               (104, 5), (105, 10), (1000, 50), (5000, 500)])
def test_epoch_boundaries_are_thinned_to_a_readable_number(epochs: int, step: int) -> None:
    assert epoch_step(epochs) == step
    assert epochs // step <= MOST_EPOCH_LINES
