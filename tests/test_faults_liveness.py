"""Liveness: a worker or rank that makes no progress ends its run `failed`, named, with nothing
left running and the sweep going on; a coordinator that was not scheduled says so; a rendezvous
port in use is one line. The watch itself is checked on a made-up clock."""

from __future__ import annotations

import copy
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_config
from processes import await_snapshots, gone, start, workers

from hetsgd.bounded import Stopped, Terminated, stop_cause, stop_verb
from hetsgd.config import ConfigError, DistConfig
from hetsgd.engines.base import TICK_S
from hetsgd.engines.common.watch import STARVED_S, Tick, Watch, ended
from hetsgd.engines.ranks.group import check_port, free_port
from hetsgd.engines.virtual.watch import Progress
from hetsgd.errors import UserError

# two workers on any machine (devices=cpu has one per core): the tests wait for both
RUN = ("run", "algo=hogwild", "devices=cpu", "devices.groups.cpu.count=2", "dataset=digits",
       "budget.epochs=null", "eval.every_s=0.2", "eval.every_epochs=null", "progress=false")


def _summary(results: Path) -> dict:
    run_dir, = (results / "runs").iterdir()
    return json.loads((run_dir / "summary.json").read_text())


# -- the watch, on a made-up clock --------------------------------------------------------------

def _ticks(watch: Watch, since: float, until: float, progress: dict[int, float],
           ended: frozenset[int] = frozenset()) -> list[int]:
    """Tick every TICK_S from `since` to `until` with `progress`: the hung at the last tick."""
    hung: list[int] = []
    for i in range(1, round((until - since) / TICK_S) + 1):
        hung = watch.hung(since + i * TICK_S, progress, set(ended))
    return hung


def test_the_watch_names_only_the_worker_that_stopped_progressing() -> None:
    watch = Watch([0, 1], window_s=2.0, first_window_s=8.0)
    watch.start(0.0, {0: 0.0, 1: 0.0})
    assert _ticks(watch, 0.0, 1.0, {0: 0.0, 1: 0.0}) == []
    assert _ticks(watch, 1.0, 1.01, {0: 1.0, 1: 1.0}) == []  # both step at 1 s
    assert _ticks(watch, 1.01, 2.5, {0: 2.0, 1: 1.0}) == []  # worker 1: 1.5 s without
    assert _ticks(watch, 2.5, 3.2, {0: 3.0, 1: 1.0}, ended=frozenset({1})) == []  # it reported
    assert _ticks(watch, 3.2, 3.3, {0: 3.3, 1: 1.0}) == [1]  # 2.3 s without a step or a beat


def test_a_first_step_gets_its_longer_window() -> None:
    watch = Watch([0], window_s=2.0, first_window_s=8.0)
    watch.start(0.0, {0: 0.0})
    assert _ticks(watch, 0.0, 7.0, {0: 0.0}) == []
    assert _ticks(watch, 7.0, 8.5, {0: 0.0}) == [0]


def test_a_late_tick_is_not_held_against_the_workers() -> None:
    """A coordinator stopped for 10 s saw no progress then: the workers are not hung for it."""
    watch = Watch([0], window_s=2.0, first_window_s=2.0)
    watch.start(0.0, {0: 0.0})
    assert watch.hung(10.0 + TICK_S, {0: 0.0}, ended=set()) == []  # one tick, 10 s late
    assert _ticks(watch, 10.0 + TICK_S, 11.5, {0: 0.0}) == []
    assert _ticks(watch, 11.5, 12.5, {0: 0.0}) == [0]  # from then on the clock runs


def test_time_not_scheduled_is_reported_with_the_overrun() -> None:
    watch = Watch([0], window_s=2.0, first_window_s=2.0)
    watch.ticked(TICK_S + STARVED_S / 2, 0.0, elapsed=1.0)  # a little late: not reported
    assert watch.warnings(time_s=4.0, budget_s=4.0) == []
    watch.ticked(20.0 + TICK_S, 0.001, elapsed=21.0)  # stopped 20 s, from 1 s of training
    watch.ticked(TICK_S + 3.0, 3.0, elapsed=22.0)  # 3 s on the CPU: busy, not unscheduled
    warning, = watch.warnings(time_s=24.0, budget_s=4.0)
    assert "not scheduled for 20.0 s (longest 20.0 s, from 1.0 s of training)" in warning
    assert "the 4 s budget overran by 20.0 s" in warning
    # an end within STARVED_S of the budget is no overrun
    assert "overran" not in watch.warnings(time_s=4.0 + STARVED_S, budget_s=4.0)[0]
    watch.ticked(TICK_S + 2.0, 0.0, elapsed=24.0)  # a shorter stop later: the longest stays
    warning, = watch.warnings(time_s=26.0, budget_s=None)  # an epochs budget: no seconds
    assert "not scheduled for 22.0 s (longest 20.0 s, from 1.0 s of training)" in warning
    assert "overran" not in warning


def _busy(seconds: float) -> None:
    until = time.thread_time() + seconds
    while time.thread_time() < until:
        pass


def test_a_ticks_asides_are_left_out_of_its_wall_and_cpu_time() -> None:
    """A tick's asides (a sleep: wall time only; a busy loop: CPU time too) add up, and what
    the tick's watch measures is what is left when they are taken out: bracketed by clocks
    read just outside and just inside the tick, with the training time counted from ``t0``."""
    wall, cpu = time.perf_counter(), time.thread_time()
    tick = Tick()
    inner_wall, inner_cpu = time.perf_counter(), time.thread_time()
    _busy(0.05)  # watched work
    with tick.aside:
        time.sleep(0.05)
    with tick.aside:
        _busy(0.05)
    assert tick.aside.wall_s >= 0.1
    assert tick.aside.cpu_s >= 0.05  # the busy stretch's CPU time, not the sleep's
    last_wall, last_cpu = time.perf_counter(), time.thread_time()
    t0 = wall - 1.0  # training began a second before the tick
    wall_s, cpu_s, elapsed = tick.watched(t0)
    outer_wall, outer_cpu = time.perf_counter() - wall, time.thread_time() - cpu
    inner = last_wall - inner_wall - tick.aside.wall_s
    # the watched work's 0.05 CPU s, less what a slewed wall clock may shave off it
    assert 0.045 <= inner <= wall_s <= outer_wall - tick.aside.wall_s
    assert 0.05 <= last_cpu - inner_cpu - tick.aside.cpu_s <= cpu_s <= outer_cpu - tick.aside.cpu_s
    assert 1.0 + inner <= elapsed <= 1.0 + outer_wall - tick.aside.wall_s


def test_stall_s_must_be_positive_and_finite() -> None:
    assert run_config("workers.stall_s=5").workers.stall_s == 5.0
    for value in ("0", "-1", "inf", "nan"):
        with pytest.raises(ConfigError, match="workers.stall_s"):
            run_config(f"workers.stall_s={value}")


def test_a_rendezvous_port_in_use_is_one_line_naming_it() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError, match=f"dist.master_port={port} on 127.0.0.1"):
            check_port(DistConfig(master_port=port))
    check_port(DistConfig(master_port=port))  # free again


def test_a_rendezvous_address_not_of_this_machine_is_one_line_naming_it() -> None:
    """It was a bare OSError naming no setting, or, with a port given, the advice to free the
    port and set dist.master_port=null, which then gave the bare error."""
    elsewhere = "192.0.2.1"  # TEST-NET-1 (RFC 5737): no machine's address
    for port in (29511, None):
        with pytest.raises(UserError, match=f"^dist.master_addr={elsewhere} is not an address "
                                            "of this machine"):
            if port is None:
                free_port(elsewhere)
            else:
                check_port(DistConfig(master_addr=elsewhere, master_port=port))


# -- processes ----------------------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.wall
def test_a_worker_stopped_while_it_sets_up_fails_the_run_before_training(
        results_dir: Path) -> None:
    """While it imports and builds, a worker counts no step; getting no CPU time either, it is
    hung (rather than left to the 600 s startup timeout). Spawned, so that it is stopped while
    it still imports: a fork of the forkserver can be ready before the stop lands."""
    proc = start(results_dir, *RUN, "budget.seconds=120", "workers.stall_s=3",
                 "workers.start=spawn")
    pids = workers(proc, count=2)  # spawned, still importing
    os.kill(pids[1], signal.SIGSTOP)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, output
    summary = _summary(results_dir)
    assert summary["error"] == "worker 1 (cpu) made no progress for 3 s while setting up: killed"
    assert summary["updates"] == 0  # nobody trained
    assert gone(pids, timeout_s=10)


@pytest.mark.integration
@pytest.mark.wall
@pytest.mark.parametrize(("algo", "signum", "rank", "says"), [
    ("local_sgd", signal.SIGSTOP, 1, "rank 1 (cpu) made no progress for 7 s"),
    # sync's rank 0, an accelerator, publishes its replica before each snapshot: stopped, it
    # held each wait for it, whose late tick restarted its stall window (25-29 s, blaming rank 2)
    ("sync", signal.SIGSTOP, 0, "rank 0 (accel) made no progress for 7 s"),
    # killed: the others' broken collectives were reported first, and blamed
    ("sync", signal.SIGKILL, 1, "rank 1 (cpu) was killed by SIGKILL"),
], ids=["stopped", "stopped_publisher", "killed"])
def test_a_stopped_or_killed_rank_fails_the_run_naming_it_and_the_command_exits(
        results_dir: Path, algo: str, signum: int, rank: int, says: str) -> None:
    """Rank 0 gives up on the stopped rank within dist.timeout_s; the rank is named and killed
    (the multiprocessing exit handler would otherwise join it forever)."""
    proc = start(results_dir, *RUN, f"algo={algo}", "devices=emulated",
                 "devices.groups.cpu.count=2", "budget.seconds=120", "dist.timeout_s=2")
    pids = workers(proc, count=3)
    await_snapshots(results_dir, count=3)
    os.kill(pids[rank], signum)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, output
    assert "Traceback" not in output, output
    summary = _summary(results_dir)
    assert summary["status"] == "failed"
    assert summary["error"].startswith(says), summary["error"]
    assert gone(pids, timeout_s=10)


def test_how_a_process_ended_is_said_in_words() -> None:
    assert ended(3) == "exited with code 3"
    assert ended(-signal.SIGKILL) == "was killed by SIGKILL (signal 9)"
    assert ended(-200) == "was killed by signal 200"  # no such signal here


@pytest.mark.integration
@pytest.mark.wall
@pytest.mark.serial  # workers.stall_s=3: on a loaded machine a starved healthy worker reads as hung
@pytest.mark.parametrize(("signum", "says"), [
    # hung: a stopped process never handles SIGTERM again
    (signal.SIGSTOP, "worker 1 (cpu) made no progress for 3 s"),
    # dead without its report (say the OOM killer's SIGKILL): failed at the next tick
    (signal.SIGKILL, "worker 1 (cpu) was killed by SIGKILL (signal 9)"),
], ids=["stopped", "killed"])
def test_a_stopped_or_killed_worker_fails_its_job_naming_it_leaves_nothing_and_the_sweep_goes_on(
        results_dir: Path, signum: int, says: str) -> None:
    proc = start(results_dir, "run", "-m", *RUN[1:], "budget.seconds=3", "workers.stall_s=3",
                 "seed=0,1")
    pids = workers(proc, count=2)
    await_snapshots(results_dir / "sweeps", count=3)  # job 0's training under way
    os.kill(pids[1], signum)
    output, _ = proc.communicate(timeout=180)
    assert proc.returncode == 1, output  # a job failed
    assert "Traceback" not in output, output
    assert gone(pids, timeout_s=10)
    sweep_dir, = (results_dir / "sweeps").iterdir()
    jobs = pd.read_csv(sweep_dir / "summary.csv")
    assert jobs["status"].tolist() == ["failed", "completed"], output
    error = jobs["error"].iloc[0]
    assert error.startswith(says), error
    assert "worker 0" not in error  # the one still stepping is not blamed
    assert says in output
    job_dir, = (p for p in sweep_dir.iterdir() if p.name.startswith("0_"))
    curve = pd.read_csv(job_dir / "convergence.csv")
    assert len(curve) >= 3  # the curves are kept
    if signum == signal.SIGKILL:  # a death is seen at once, not after the 3 s stall window
        assert curve["time_s"].iloc[-1] < 3


@pytest.mark.integration
@pytest.mark.wall
def test_a_killed_accelerator_fails_the_run_at_once_not_after_the_stall_window(
        results_dir: Path) -> None:
    """Before each snapshot the coordinator waits for the accelerator to publish its replica:
    one killed during that wait held it for workers.stall_s, while the CPU workers trained on
    past the budget."""
    proc = start(results_dir, "run", "algo=hogbatch", "devices=emulated", "dataset=digits",
                 "budget.epochs=null", "budget.seconds=300", "workers.stall_s=120",
                 "progress=false")  # a budget no loaded machine reaches before the kill
    try:
        pids = workers(proc, count=2)
        await_snapshots(results_dir, count=3)
        os.kill(pids[0], signal.SIGKILL)  # rank 0: the accelerator
        output, _ = proc.communicate(timeout=100)
    finally:
        proc.kill()
    assert proc.returncode == 1, output
    summary = _summary(results_dir)
    assert summary["error"].startswith("worker 0 (accel) was killed by SIGKILL"), summary["error"]
    # at the next tick: the wait for its publish held the run 60 s (min(60 s, stall_s))
    assert summary["time_s"] < 60


@pytest.mark.integration
@pytest.mark.wall
@pytest.mark.serial  # workers.stall_s=2: on a loaded machine a starved healthy worker reads as hung
def test_a_stopped_coordinator_says_so_and_its_workers_are_not_blamed(results_dir: Path) -> None:
    """Stopped 5 s, longer than workers.stall_s: it saw no progress then, and must not call the
    workers hung for it. It stopped after 1.5 s of training at least, so it overran its 3 s
    budget by 3.5 s at least."""
    proc = start(results_dir, *RUN[:-3], "eval.every_s=1", *RUN[-2:], "budget.seconds=3",
                 "workers.stall_s=2")
    workers(proc, count=2)
    await_snapshots(results_dir, count=2)  # at 0 s and 1 s of training
    # halfway to the next snapshot: a stop while the coordinator writes one is not measured
    # (that tick's time off the CPU may be the disk's)
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGSTOP)
    time.sleep(5)
    os.kill(proc.pid, signal.SIGCONT)
    output, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, output
    summary = _summary(results_dir)
    assert summary["status"] == "completed"
    warning = next(w for w in summary["warnings"] if "not scheduled for" in w)
    assert float(re.search(r"not scheduled for ([\d.]+) s", warning).group(1)) >= 4.5
    assert float(re.search(r"the 3 s budget overran by ([\d.]+) s", warning).group(1)) >= 2.0
    assert "not scheduled for" in output


# a snapshot's write (the third: at 0.4 s of training) takes 1.5 s, as on a slow disk
_SLOW_SNAPSHOT = """
import time
from hetsgd.engines.base import EngineBase

taken = EngineBase._take_snapshot
calls = []

def slow(*args, **kwargs):
    calls.append(None)
    if len(calls) == 3:
        time.sleep(1.5)
    return taken(*args, **kwargs)

EngineBase._take_snapshot = slow
from hetsgd.cli import main
main()
"""


@pytest.mark.integration
@pytest.mark.wall
@pytest.mark.serial  # a coordinator starved 1 s on a loaded machine would say so, rightly
def test_a_slow_snapshot_write_is_not_time_the_coordinator_was_not_scheduled(
        results_dir: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _SLOW_SNAPSHOT, *RUN, "budget.seconds=2"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HETSGD_RESULTS": str(results_dir)})
    assert done.returncode == 0, done.stderr
    summary = _summary(results_dir)
    assert summary["status"] == "completed"
    assert not any("not scheduled" in w for w in summary.get("warnings", [])), summary
    assert "not scheduled" not in done.stderr + done.stdout


def test_a_virtual_call_past_its_bound_is_named_with_the_bound() -> None:
    """The virtual clock's watch, on a made-up clock: a first step gets 4x the bound, and what
    the engine does not watch (``None``) is never late."""
    progress = Progress(2.0, "workers.stall_s")
    progress.since -= 100.0
    assert progress.late() is None  # nothing watched yet
    progress.beat("worker 1 (cpu)'s link's after_step or publish", allowance=4.0)
    progress.since -= 5.0  # within a first step's 8 s
    assert progress.late() is None
    progress.since -= 5.0
    assert progress.late() == ("worker 1 (cpu)'s link's after_step or publish did not return "
                               "within 8 s (4x workers.stall_s=2 s, a first step's) on the "
                               "virtual clock (raise workers.stall_s if it is only slow)")
    progress.beat("worker 1 (cpu)'s link's publish")
    progress.since -= 3.0
    assert progress.late() == ("worker 1 (cpu)'s link's publish did not return within "
                               "workers.stall_s=2 s on the virtual clock (raise workers.stall_s "
                               "if it is only slow)")
    progress.beat(None)
    progress.since -= 100.0
    assert progress.late() is None


def test_a_stop_keeps_its_cause_through_pickling_and_copies() -> None:
    """``hetsgd.run`` in a worker process of the caller's sends a stop back pickled."""
    for stop in (Stopped(), Terminated(signal.SIGTERM), Terminated(signal.SIGHUP)):
        for again in (pickle.loads(pickle.dumps(stop)), copy.copy(stop), copy.deepcopy(stop)):
            assert type(again) is type(stop) and stop_cause(again) == stop_cause(stop)
    assert [stop_cause(s) for s in (KeyboardInterrupt(), Stopped(), Terminated(signal.SIGHUP))] \
        == ["interrupted by the user", "interrupted by the user", "stopped by SIGHUP"]
    assert [stop_verb(s) for s in (Stopped(), Terminated(signal.SIGTERM))] == [
        "interrupted", "stopped by SIGTERM"]
