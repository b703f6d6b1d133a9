from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace

import psutil
import pytest

from hetsgd import machine
from hetsgd.machine import describe_gpus
from hetsgd.observe.monitor import UtilizationMonitor, summarize

SPIN = "import time\nend = time.perf_counter() + 0.8\nwhile time.perf_counter() < end: pass\n"
# a parent that idles while its child spins: only the child's CPU shows the work
PARENT = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {SPIN!r}])\n"


@pytest.fixture
def run_python() -> Iterator:
    procs: list[subprocess.Popen] = []

    def start(code: str) -> subprocess.Popen:
        procs.append(subprocess.Popen([sys.executable, "-c", code]))
        return procs[-1]

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def _sample_while_running(proc: subprocess.Popen, mon: UtilizationMonitor) -> list[dict]:
    with mon:
        proc.wait()
    return mon.stop()


@pytest.mark.integration
def test_workers_cpu_includes_the_children_of_worker_processes(run_python):
    parent = run_python(PARENT)
    rows = _sample_while_running(parent, UtilizationMonitor(0.1, lambda: [parent.pid]))
    assert rows
    assert max(r["workers_cpu_percent"] for r in rows) > 0


@pytest.mark.integration
def test_without_pids_the_coordinators_children_are_the_workers(run_python):
    child = run_python(SPIN)
    rows = _sample_while_running(child, UtilizationMonitor(0.1))
    assert max(r["workers_cpu_percent"] for r in rows) > 0


@pytest.mark.integration
def test_vanished_and_unknown_processes_are_skipped(run_python):
    gone = run_python("pass")
    gone.wait()
    child = run_python(SPIN)
    rows = _sample_while_running(child, UtilizationMonitor(0.1, lambda: [gone.pid, child.pid]))
    assert max(r["workers_cpu_percent"] for r in rows) > 0


def test_row_keys_and_time_origin():
    mon = UtilizationMonitor(0.05, list)
    mon.set_time_origin(time.perf_counter() - 100.0)
    with mon:
        time.sleep(0.4)
    rows = mon.stop()
    assert rows
    cores = psutil.cpu_count()
    expected = {"time_s", "cpu_percent", "workers_cpu_percent",
                *(f"cpu{i}_percent" for i in range(cores))}
    expected |= {f"gpu{i}_{k}" for i in range(mon.gpu_count) for k in ("util", "mem_mb")}
    assert all(set(r) == expected for r in rows)
    assert all(r["time_s"] >= 100.0 for r in rows)
    assert [r["time_s"] for r in rows] == sorted(r["time_s"] for r in rows)
    assert all(0 <= r["cpu_percent"] <= 100 for r in rows)


def test_stop_does_not_wait_for_the_interval():
    mon = UtilizationMonitor(3600.0).start()
    began = time.perf_counter()
    rows = mon.stop()
    assert time.perf_counter() - began < 360.0  # a sleeping loop would take the full hour
    assert len(rows) == 1  # the closing sample: even a short run has one
    assert mon.stop() == rows  # stopping twice is harmless


def test_summarize_hand_made_rows():
    rows = [
        {"time_s": 0.5, "cpu_percent": 20.0, "gpu0_util": 10.0, "gpu1_util": 30.0,
         "gpu0_mem_mb": 5000.0},
        {"time_s": 1.0, "cpu_percent": 40.0, "gpu0_util": 50.0, "gpu1_util": None,
         "gpu0_mem_mb": 5000.0},
    ]
    assert summarize(rows) == {"cpu_mean": 30.0, "gpu_mean": 30.0}
    assert summarize([{"time_s": 0.5, "cpu_percent": 10.0}]) == {"cpu_mean": 10.0,
                                                                 "gpu_mean": None}
    assert summarize([]) == {"cpu_mean": None, "gpu_mean": None}


def test_no_nvml_means_no_gpus(monkeypatch):
    def fail() -> None:
        raise machine.pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(machine.pynvml, "nvmlInit", fail)
    assert describe_gpus() == []
    with UtilizationMonitor(0.05, list) as mon:
        time.sleep(0.2)
    assert mon.gpu_count == 0
    assert not any(k.startswith("gpu") for r in mon.stop() for k in r)
    monkeypatch.setattr(machine, "pynvml", None)
    assert describe_gpus() == []


def test_gpu_columns_from_a_fake_nvml(monkeypatch):
    """The NVML code path, exercised without a GPU: two devices, bytes names as old bindings."""
    fake = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: b"Fake GPU %d" % h,
        "nvmlSystemGetDriverVersion": lambda: "999.1",
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=40 + 20 * h),
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(used=(h + 1) * 2**20,
                                                             total=8 * 2**30),
    }
    for name, fn in fake.items():
        monkeypatch.setattr(machine.pynvml, name, fn)
    assert describe_gpus() == [{"name": f"Fake GPU {i}", "memory_mb": 8192.0, "driver": "999.1"}
                               for i in range(2)]
    with UtilizationMonitor(0.05, list) as mon:
        time.sleep(0.2)
    rows = mon.stop()
    assert mon.gpu_count == 2
    assert rows
    assert all((r["gpu0_util"], r["gpu1_util"], r["gpu0_mem_mb"], r["gpu1_mem_mb"])
               == (40, 60, 1.0, 2.0) for r in rows)
    assert summarize(rows)["gpu_mean"] == 50.0


@pytest.mark.gpu
def test_gpu_columns_on_a_real_gpu():
    import torch

    gpus = describe_gpus()
    with UtilizationMonitor(0.05, list) as mon:
        time.sleep(0.3)
    rows = mon.stop()
    assert mon.gpu_count == len(gpus)
    assert all(gpu["name"] and gpu["memory_mb"] > 0 and gpu["driver"] for gpu in gpus)
    assert rows and all(f"gpu{i}_util" in r and f"gpu{i}_mem_mb" in r
                        for r in rows for i in range(len(gpus)))
    assert summarize(rows)["gpu_mean"] is not None
    assert not torch.cuda.is_initialized()  # the sampler reads NVML, never CUDA
