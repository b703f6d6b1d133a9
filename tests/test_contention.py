"""Contention: the workers' CPU share (got over got + waited for a CPU), the host around a run,
the flag and its warning, the machine facts beside them, and the monitor's one pass over /proc
per sample."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch

from hetsgd import machine
from hetsgd.config import ConfigError
from hetsgd.config.schema import MonitorConfig
from hetsgd.engines import counters
from hetsgd.engines.common.run_queue import COLLECTIVE_THREADS, TASKS, waited_s, waits
from hetsgd.engines.counters import COUNTERS, RANK_COUNTERS, CounterRow
from hetsgd.machine import CORES_OVERRIDE, cgroup_cpu_limit, cpu_sharing, usable_cores
from hetsgd.observe import monitor
from hetsgd.observe.contention import contention, got_share, simulator_share, warning, workers_share
from hetsgd.observe.host import HostLoad, HostReading, cpu_pressure, tree_cpu_s
from hetsgd.observe.monitor import UtilizationMonitor, process_trees

NEEDS_SCHEDSTAT = pytest.mark.skipif(waits() is None,
                                     reason="the kernel does not count run-queue delay")


def worker(group: str, got: float | None, waited: float | None) -> dict:
    """A row of workers.csv, as far as the share reads it."""
    return {"group": group, "device": "cpu", "threads": 1, "busy_s": 9.0, "comm_s": 9.0,
            "cpu_s": got, "cpu_wait_s": waited}


def test_share_is_cpu_got_over_got_plus_the_wait_for_a_cpu_pooled_per_group():
    # workers that wanted different times: the mean of their shares is no pooled share
    rows = [worker("cpu", got=1.8, waited=0.2), worker("cpu", got=1.0, waited=3.0),
            worker("accel", got=3.0, waited=1.0)]
    share, by_group = workers_share(rows)
    # pooled: 5.8 / 10 (the mean of the groups' shares would be 0.608)
    assert share == pytest.approx((1.8 + 1.0 + 3.0) / (2.0 + 4.0 + 4.0))
    # cpu: 2.8 / 6 (the mean of its workers' shares, 0.9 and 0.25, would be 0.575)
    assert by_group == {"cpu": pytest.approx(2.8 / 6.0), "accel": pytest.approx(0.75)}
    # the time computing, copying or in a collective does not enter: only got and waited
    assert workers_share([worker("ranks", got=2.0, waited=0.0)])[0] == 1.0


def test_the_share_never_exceeds_one_and_unknown_is_null_never_zero():
    for got, waited in ((5.0, 0.0), (0.1, 0.0), (1.0, 1e-9), (0.0, 3.0)):
        share = got_share(got, waited)
        assert share is not None and 0.0 <= share <= 1.0
    assert got_share(0.0, 0.0) is None  # nothing wanted
    assert got_share(1.0, None) is None and got_share(-1.0, 2.0) is None
    assert workers_share([]) == (None, {})
    simulated = worker("sim", got=None, waited=None)  # no process of its own: left out
    assert workers_share([simulated, worker("cpu", 0.9, 0.1)]) == (
        pytest.approx(0.9), {"cpu": pytest.approx(0.9)})
    blind = worker("cpu", got=1.0, waited=math.nan)  # an OS that does not count the wait
    assert workers_share([blind, worker("other", 1.0, 1.0)]) == (
        None, {"cpu": None, "other": 0.5})


def schedstat(tasks: Path, waits_ns: dict[str, int]) -> str:
    """A fake /proc/<pid>/task with these threads' run-queue delays (field 2)."""
    for tid, wait in waits_ns.items():
        (tasks / tid).mkdir(exist_ok=True)
        (tasks / tid / "schedstat").write_text(f"123456789 {wait} 42\n")
    return str(tasks)


def test_the_wait_for_a_cpu_is_each_threads_growth_in_schedstat(tmp_path):
    tasks = tmp_path / "task"
    tasks.mkdir()
    before = waits(schedstat(tasks, {"100": 1_000_000_000, "101": 500_000_000}))
    assert before == {"100": 1_000_000_000, "101": 500_000_000}
    (tasks / "101" / "schedstat").unlink()  # a thread that ended: its earlier wait stays counted
    (tasks / "101").rmdir()
    after = waits(schedstat(tasks, {"100": 1_250_000_000, "102": 300_000_000}))  # one born
    assert after is not None and waited_s(before, after) == pytest.approx(0.25 + 0.3)
    reused = waits(schedstat(tasks, {"100": 100_000_000}))  # a new thread under an old id
    assert reused is not None and waited_s(after, reused) == pytest.approx(0.1 + 0.0)
    assert waits(str(tmp_path / "absent")) is None
    (tasks / "100" / "schedstat").write_text("garbled\n")
    (tasks / "102" / "schedstat").unlink()
    assert waits(str(tasks)) is None  # nothing readable: the OS does not say


def test_a_collective_backends_own_threads_are_left_out_of_the_wait(tmp_path):
    """gloo's threads wake for every message: their wakeup latency is not a busy machine."""
    tasks = tmp_path / "task"
    tasks.mkdir()
    schedstat(tasks, {"100": 1_000, "101": 2_000, "102": 4_000, "103": 8_000})
    for tid, name in {"100": "python\n", "101": "gloo_tcp_loop\n", "102": "pt_gloo_runloop\n",
                      "103": "glooish_but_mine\n"}.items():
        (tasks / tid / "comm").write_text(name)
    assert waits(str(tasks)) == {"100": 1_000, "103": 8_000}
    (tasks / "100" / "comm").unlink()  # a name that cannot be read: the thread counts
    assert waits(str(tasks)) == {"100": 1_000, "103": 8_000}


@NEEDS_SCHEDSTAT
def test_the_threads_gloo_starts_are_named_as_left_out():
    """The names COLLECTIVE_THREADS leaves out are those this torch gives gloo's threads."""
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        dist.all_reduce(torch.ones(4))
        names = {(Path(TASKS) / tid / "comm").read_text().strip() for tid in os.listdir(TASKS)}
    finally:
        dist.destroy_process_group()
    assert any(name.startswith(COLLECTIVE_THREADS) for name in names), names


def reading(wall: float, busy: float, tree: float, own: float = 0.0, steal: float | None = 0.0,
            pressure: tuple[float, float] | None = (0.0, 0.0),
            waits_ns: dict[str, int] | None = None) -> HostReading:
    return HostReading(wall, busy, steal, tree, own, pressure, waits_ns)


def test_the_hosts_load_beyond_the_runs_own_tree():
    load = HostLoad(reading(10.0, 100.0, 5.0, steal=1.0, pressure=(1.0, 2e6)),
                    reading(12.0, 103.0, 7.0, own=1.0, steal=1.4, pressure=(30.0, 3.5e6)),
                    cores=2)
    assert load.wall_s == 2.0
    assert load.others_share == pytest.approx((3.0 - 2.0) / 4.0)
    assert load.steal_share == pytest.approx(0.4 / 4.0)
    assert load.pressure_share == pytest.approx(1.5 / 2.0)
    stalled = HostLoad(reading(10.0, 100.0, 5.0, pressure=(1.0, 2e6)),  # a whole share, and more
                       reading(12.0, 103.0, 7.0, pressure=(99.0, 4.0003e6)), cores=2)
    assert stalled.pressure_share == 1.0
    unknown = HostLoad(reading(0.0, 0.0, 0.0, steal=None, pressure=None),
                       reading(1.0, 1.0, 1.0, steal=None, pressure=None), cores=1)
    assert unknown.steal_share is None and unknown.pressure_share is None
    assert simulator_share(load) is None  # its threads' wait unknown
    waited = HostLoad(reading(10.0, 100.0, 5.0, waits_ns={"7": 0}),
                      reading(12.0, 103.0, 7.0, own=1.0, waits_ns={"7": 3_000_000_000}), cores=2)
    assert waited.own_wait_s == pytest.approx(3.0)
    assert simulator_share(waited) == pytest.approx(1.0 / 4.0)  # 1 CPU s got, 4 s wanted


def test_flagged_below_the_threshold_with_what_the_os_does_not_say_null():
    load = HostLoad(reading(0.0, 0.0, 0.0, steal=None, pressure=None),
                    reading(1.0, 1.5, 1.0, steal=None, pressure=None), cores=2)
    entry = contention(0.89, {"cpu": 0.89}, load, 0.9, "workers")
    assert entry["flagged"] is True and entry["workers_cpu_share"] == 0.89
    assert entry["steal_share"] is None and entry["cpu_pressure"] is None
    assert entry["others_busy_share"] == pytest.approx(0.25)
    assert contention(0.9, None, load, 0.9, "workers")["flagged"] is False  # at it: clean
    assert contention(0.5, None, load, 0.0, "workers")["flagged"] is False  # 0 flags none
    unknown = contention(None, {}, load, 0.9, "workers")
    assert unknown["flagged"] is False and unknown["workers_cpu_share"] is None


def test_a_flagged_run_ends_with_one_line_saying_what_its_share_means():
    load = HostLoad(reading(0.0, 0.0, 0.0), reading(1.0, 1.5, 0.5), cores=2)
    line = warning(contention(0.42, None, load, 0.9, "workers"))
    assert line is not None and "\n" not in line
    assert "the workers got 0.42 of the CPU time they wanted (below 0.9)" in line
    assert "50% of the host's cores" in line and "not comparable" in line
    # a simulated run's virtual times do not depend on the host: its share is only recorded
    simulated = contention(0.42, None, load, 0.9, "simulator")
    assert simulated["workers_cpu_share"] == 0.42 and simulated["flagged"] is False
    assert warning(simulated) is None
    assert warning(contention(0.95, None, load, 0.9, "workers")) is None
    assert warning(contention(None, None, load, 0.9, "workers")) is None


def test_the_threshold_is_a_share():
    assert MonitorConfig().contention_threshold == 0.7
    for bad in (-0.1, 1.5, math.nan):
        with pytest.raises(ConfigError, match="monitor.contention_threshold"):
            MonitorConfig(contention_threshold=bad)


def test_cpu_pressure_read_or_null(tmp_path):
    psi = tmp_path / "cpu"
    psi.write_text("some avg10=2.39 avg60=5.72 avg300=2.42 total=12649966\n"
                   "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert cpu_pressure(str(psi)) == (2.39, 12649966.0)
    assert cpu_pressure(str(tmp_path / "absent")) is None
    psi.write_text("garbled\n")
    assert cpu_pressure(str(psi)) is None


def test_cgroup_limit_is_the_quota_over_the_period(tmp_path):
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_limit(str(tmp_path)) is None  # no limit set
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert cgroup_cpu_limit(str(tmp_path)) in (2.5, None)  # None: not on a cgroup v2 host
    facts = cpu_sharing()
    assert set(facts) == {"threads_per_core", "affinity", "cgroup_cpu_limit"}
    assert facts["threads_per_core"] is None or facts["threads_per_core"] >= 1


@pytest.mark.parametrize(("quota", "cores"), [(None, 2), (4.0, 2), (2.5, 2), (1.5, 1),
                                              (0.5, 1)])
def test_the_usable_cores_are_the_affinity_cut_to_the_containers_quota(
        monkeypatch: pytest.MonkeyPatch, quota: float | None, cores: int) -> None:
    """A quota (docker --cpus) leaves the affinity mask as it is: one worker per core of the
    mask would start more workers than the quota runs at once."""
    monkeypatch.delenv(CORES_OVERRIDE, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(machine, "cgroup_cpu_limit", lambda: quota)
    assert usable_cores() == cores


def test_a_counter_row_counts_the_cpu_its_process_used_since_training_began():
    row = CounterRow(torch.zeros(len(COUNTERS), dtype=torch.float64), batch_size=8)
    row.count_cpu()
    assert row["cpu_s"] == 0.0  # nothing counted before training starts
    row.start_cpu()
    spent = time.process_time() + 0.2
    while time.process_time() < spent:
        pass
    time.sleep(0.2)  # asleep: no CPU
    row.count_cpu()
    assert 0.2 <= row["cpu_s"] < 0.35


def test_a_counter_row_adds_its_threads_wait_for_a_cpu_beside_its_cpu_time(monkeypatch):
    readings = iter([{"1": 0}, {"1": 400_000_000, "2": 100_000_000}, {"1": 600_000_000},
                     None])
    monkeypatch.setattr(counters, "waits", lambda: next(readings))
    row = CounterRow(torch.zeros(len(COUNTERS), dtype=torch.float64), batch_size=8)
    row.start_cpu()
    row.count_cpu()
    assert row["cpu_wait_s"] == pytest.approx(0.5)
    row.count_cpu()
    assert row["cpu_wait_s"] == pytest.approx(0.7)
    row.count_cpu()  # the OS stopped saying: unknown, never a wait of 0
    assert math.isnan(row["cpu_wait_s"])
    # appended after cpu_s: a rank's every exchange still carries only the leading counters
    assert COUNTERS[-1] == "cpu_wait_s" and "cpu_wait_s" not in RANK_COUNTERS


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen]]:
    """Three processes, one with a child of its own."""
    code = ["import time; time.sleep(60)",
            "import subprocess, sys; subprocess.run([sys.executable, '-c', "
            "'import time; time.sleep(60)'])"]
    procs = [subprocess.Popen([sys.executable, "-c", c]) for c in (code[0], code[0], code[1])]
    deadline = time.monotonic() + 30
    while not psutil.Process(procs[2].pid).children() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield procs
    for proc in procs:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()


@pytest.mark.integration
def test_the_monitor_scans_proc_once_per_sample_whatever_the_workers(sleepers, monkeypatch):
    pids = [p.pid for p in sleepers]
    old_path = {pid for root in pids
                for pid in (root, *(c.pid for c in psutil.Process(root).children(recursive=True)))}
    assert set(process_trees(pids)) == old_path and len(old_path) == 4
    assert process_trees([sleepers[2].pid, 2**22 + 7]).keys() == {
        sleepers[2].pid, psutil.Process(sleepers[2].pid).children()[0].pid}
    scans = []
    scan = psutil.process_iter

    def counted(*args, **kwargs):
        scans.append(1)
        return scan(*args, **kwargs)

    def per_root(*args, **kwargs):
        raise AssertionError("a pass over /proc for one root")

    monkeypatch.setattr(monitor.psutil, "process_iter", counted)
    monkeypatch.setattr(psutil.Process, "children", per_root)
    mon = UtilizationMonitor(3600.0, lambda: pids)
    for _ in range(3):
        assert mon._workers_cpu() is not None
    assert len(scans) == 3
    assert set(mon._procs) == old_path


@pytest.mark.integration
def test_tree_cpu_counts_a_reaped_childs_time():
    """/proc counts in clock ticks and rounds each of a process's four counts (user, system,
    and its reaped children's) down apiece, so the tree may read up to four ticks short of
    the 0.3 s its child spent; a tree that missed the reaped child reads ~0.3 s shorter."""
    before = tree_cpu_s()
    subprocess.run([sys.executable, "-c",
                    "import time\nwhile time.process_time() < 0.3: pass"], check=True)
    assert tree_cpu_s() - before >= 0.3 - 4 / os.sysconf("SC_CLK_TCK")


@pytest.mark.integration
@pytest.mark.serial
@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
@NEEDS_SCHEDSTAT
def test_workers_squeezed_onto_one_core_are_flagged(tmp_path):
    """Three one-thread Hogwild workers (and their coordinator) pinned to one core ask three
    cores and get one at most: a share of a third or less, far below the default threshold
    (0.7) whatever else the machine runs (other load only lowers it)."""
    run_dir = tmp_path / "run"
    done = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-m", "hetsgd", "run", "algo=hogwild",
         "devices=cpu", "devices.groups.cpu.count=3", "budget.seconds=2", "budget.epochs=null",
         "progress=false", f"hydra.run.dir={run_dir}"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    entry = summary["contention"]
    assert entry["flagged"] is True and entry["measured"] == "workers"
    assert entry["workers_cpu_share"] < 0.5
    assert entry["threshold"] == 0.7 and set(entry["by_group"]) == {"cpu"}
    assert summary["environment"]["cpu_sharing"]["affinity"] == "0"
    assert any(w.startswith("contention: the workers got") for w in summary["warnings"])
    last = done.stdout.strip().splitlines()[-1]  # the run's last word, below its table
    assert "contention: the workers got" in last and "not comparable" in last


@pytest.mark.integration
@NEEDS_SCHEDSTAT
@pytest.mark.wall
def test_gloo_ranks_collective_cpu_is_wanted_and_got_so_their_share_is_at_most_one(tmp_path):
    """Two sync ranks over gloo spend much of their CPU in the allreduce, which the share once
    counted as got but not asked (reading above 1); now each rank's wait is its own."""
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "hetsgd", "run", "algo=sync", "devices=cpu",
         "devices.groups.cpu.count=2", "dataset=digits", "model=logreg", "budget.seconds=2",
         "budget.epochs=null", "progress=false", f"hydra.run.dir={run_dir}"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    entry = json.loads((run_dir / "summary.json").read_text())["contention"]
    assert entry["measured"] == "workers" and set(entry["by_group"]) == {"cpu"}
    rows = (run_dir / "workers.csv").read_text().splitlines()
    header = rows[0].split(",")
    got = waited = 0.0
    for row in rows[1:]:
        values = dict(zip(header, row.split(",")))
        assert float(values["cpu_s"]) > 0 and float(values["cpu_wait_s"]) >= 0
        got, waited = got + float(values["cpu_s"]), waited + float(values["cpu_wait_s"])
    # the summary's share is the ranks' own CPU over what they wanted, nothing else counted in
    assert entry["workers_cpu_share"] == pytest.approx(got / (got + waited), rel=1e-3)
