from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import psutil
import pytest
import torch

from hetsgd import machine
from hetsgd.machine import cuda_devices, describe_gpus
from hetsgd.observe import monitor as monitor_module
from hetsgd.observe.monitor import UtilizationMonitor, process_trees, summarize, torch_indices

# busy until it has used 1 s of CPU, however long a loaded machine makes that take
SPIN = "import time\nwhile time.process_time() < 1.0: pass\n"
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


def _workers_cpu_s(proc: subprocess.Popen, mon: UtilizationMonitor) -> float:
    """The workers' CPU seconds the monitor measured while `proc` ran: each sample's percent
    over the time since the one before."""
    with mon:
        proc.wait()
    rows = mon.stop()
    times = [0.0, *(r["time_s"] for r in rows)]
    return sum(r["workers_cpu_percent"] / 100 * (t - before)
               for r, before, t in zip(rows, times, times[1:]))


# The spinner uses 1 s of CPU; the monitor misses what a process used before its first sample
# and after its last (a tenth of a second each here): half of it is missed only by a monitor
# that does not see the spinner at all (the idle parent, the test process: a tenth at most).
SEEN_S = 0.5


@pytest.mark.integration
def test_workers_cpu_includes_the_children_of_worker_processes(run_python):
    parent = run_python(PARENT)
    assert _workers_cpu_s(parent, UtilizationMonitor(0.1, lambda: [parent.pid])) > SEEN_S


@pytest.mark.integration
def test_without_pids_the_coordinators_children_are_the_workers(run_python):
    child = run_python(SPIN)
    assert _workers_cpu_s(child, UtilizationMonitor(0.1)) > SEEN_S


@pytest.mark.integration
def test_vanished_and_unknown_processes_are_skipped(run_python):
    gone = run_python("pass")
    gone.wait()
    child = run_python(SPIN)
    assert _workers_cpu_s(child, UtilizationMonitor(0.1, lambda: [gone.pid, child.pid])) > SEEN_S


def test_row_keys_and_time_origin():
    mon = UtilizationMonitor(0.05, list)
    mon.set_time_origin(time.perf_counter() - 100.0)
    with mon:
        time.sleep(0.4)
    rows = mon.stop()
    assert rows
    cores = psutil.cpu_count()
    expected = {"time_s", "host_cpu_percent", "workers_cpu_percent",
                *(f"cpu{i}_percent" for i in range(cores))}
    assert all(set(r) == expected for r in rows)  # no GPU worker: no GPU columns, GPUs or not
    assert mon.gpu_count == 0
    assert all(r["time_s"] >= 100.0 for r in rows)
    assert [r["time_s"] for r in rows] == sorted(r["time_s"] for r in rows)
    assert all(0 <= r["host_cpu_percent"] <= 100 for r in rows)


def test_stop_does_not_wait_for_the_interval():
    mon = UtilizationMonitor(3600.0).start()
    began = time.perf_counter()
    rows = mon.stop()
    assert time.perf_counter() - began < 360.0  # a sleeping loop would take the full hour
    assert len(rows) == 1  # the closing sample: even a short run has one
    assert mon.stop() == rows  # stopping twice is harmless


def test_summarize_hand_made_rows():
    rows = [
        {"time_s": 0.5, "host_cpu_percent": 20.0, "cpu0_percent": 95.0, "cpu1_percent": 5.0,
         "workers_cpu_percent": 150.0, "gpu0_util": 10.0, "gpu1_util": 30.0,
         "gpu0_mem_mb": 5000.0},
        {"time_s": 1.0, "host_cpu_percent": 40.0, "cpu0_percent": 90.0, "cpu1_percent": 70.0,
         "workers_cpu_percent": 250.0, "gpu0_util": 50.0, "gpu1_util": None,
         "gpu0_mem_mb": 5000.0},
        {"time_s": 1.5, "host_cpu_percent": None, "workers_cpu_percent": None},
    ]
    assert summarize(rows, cores_given=4) == {
        "workers_cpu_cores_mean": 2.0,  # (150 + 250) / 2 percent of one core
        "workers_cpu_share_mean": 0.5,  # 2 of the 4 cores given
        "host_cpu_percent_mean": 30.0,
        "gpu_util_mean": 30.0,  # (10 + 30 + 50) / 3; memory is not utilization
    }
    assert summarize(rows, cores_given=0)["workers_cpu_share_mean"] is None
    assert summarize([{"time_s": 0.5, "host_cpu_percent": 10.0, "workers_cpu_percent": 50.0}],
                     cores_given=1) == {"workers_cpu_cores_mean": 0.5,
                                        "workers_cpu_share_mean": 0.5,
                                        "host_cpu_percent_mean": 10.0, "gpu_util_mean": None}
    # sampled faster early on: each row weighs the seconds it covers, not one
    uneven = [{"time_s": t, "host_cpu_percent": h, "workers_cpu_percent": w, "gpu0_util": g}
              for t, h, w, g in ((0.1, 0.0, 0.0, 0.0), (0.2, 0.0, 0.0, 0.0), (1.2, 50.0, 200.0, 80.0))]
    assert summarize(uneven, cores_given=2) == {
        "workers_cpu_cores_mean": pytest.approx(2.0 * 1.0 / 1.2),
        "workers_cpu_share_mean": pytest.approx(1.0 / 1.2),
        "host_cpu_percent_mean": pytest.approx(50.0 / 1.2),
        "gpu_util_mean": pytest.approx(80.0 / 1.2)}
    # a resumed run's rows begin at its checkpoint (100 s): its first row covers 0.1 s of this
    # session, not the 100 s before (it read 1.985 cores, mostly that one start-up sample)
    resumed = [{**row, "time_s": row["time_s"] + 100.0} for row in uneven]
    assert summarize(resumed, cores_given=2, start_s=100.0) == pytest.approx(
        summarize(uneven, cores_given=2))
    assert summarize([], cores_given=2) == dict.fromkeys(
        ("workers_cpu_cores_mean", "workers_cpu_share_mean", "host_cpu_percent_mean",
         "gpu_util_mean"))


@pytest.mark.timeout(60)  # the old monitor waited forever for a thread that had ended
def test_a_monitor_that_cannot_start_says_so_instead_of_waiting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    @contextmanager
    def wedged() -> Iterator[list]:
        raise RuntimeError("NVML wedged")
        yield []

    monkeypatch.setattr(monitor_module, "nvml", wedged)
    mon = UtilizationMonitor(0.05, list)
    with pytest.raises(RuntimeError, match="^the utilization monitor could not start: "
                                           "RuntimeError: NVML wedged$"):
        mon.start()
    assert mon.stop() == []


def test_a_process_ended_but_not_reaped_is_no_worker() -> None:
    """A zombie is listed in /proc and psutil reads its CPU (0): counted, the workers would
    never be gone, and their idle samples kept."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 60
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        tree = process_trees([proc.pid, os.getpid()])  # as a root, and as this one's child
        assert os.getpid() in tree and proc.pid not in tree
    finally:
        proc.wait()


def test_torch_indices_of_worker_devices():
    assert torch_indices(["cpu", "cuda:3", "cuda:0", "cuda:3", "cuda", "mps"]) == [0, 3]
    assert torch_indices(["cpu", "cpu"]) == []


def test_no_nvml_means_no_gpus(monkeypatch):
    def fail() -> None:
        raise machine.pynvml.NVMLError_LibraryNotFound()

    monkeypatch.setattr(machine.pynvml, "nvmlInit", fail)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    assert describe_gpus() == [] and cuda_devices() == []
    with UtilizationMonitor(0.05, list, devices=["cpu", "cuda:0"]) as mon:
        time.sleep(0.2)
    assert mon.gpu_count == 0
    assert not any(k.startswith("gpu") for r in mon.stop() for k in r)
    monkeypatch.setattr(machine, "pynvml", None)
    assert describe_gpus() == [] and cuda_devices() == []


def test_a_cuda_torch_without_nvmls_bindings_says_it_sees_no_gpu_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Without nvidia-ml-py every GPU mix would run emulated: said once a process. A CPU build
    of torch has no GPU to find, and says nothing."""
    monkeypatch.setattr(machine, "_say_no_bindings",  # a fresh once, this test's own
                        functools.cache(machine._say_no_bindings.__wrapped__))
    monkeypatch.setattr(machine, "pynvml", None)
    monkeypatch.setattr(torch.version, "cuda", None)
    with caplog.at_level(logging.WARNING, logger="hetsgd"):
        assert cuda_devices() == []
        assert not caplog.records
        monkeypatch.setattr(torch.version, "cuda", "12.4")
        assert cuda_devices() == [] and cuda_devices() == []
    said, = (r.getMessage() for r in caplog.records)
    assert "nvidia-ml-py (module pynvml) is not installed" in said


# Two GPUs whose UUIDs share a prefix ("GPU-5f"), so that prefixes can be ambiguous.
UUIDS = ("GPU-5f1a2c3d-0000-4000-8000-000000000000", "GPU-5f2b9e8d-1111-4111-8111-111111111111")


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NVML code path, exercised without a GPU: two devices, bytes names as old bindings; a
    CUDA build of torch; CUDA_VISIBLE_DEVICES unset."""
    fake = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: b"Fake GPU %d" % h,
        "nvmlDeviceGetUUID": lambda h: UUIDS[h],
        "nvmlDeviceGetPciInfo": lambda h: SimpleNamespace(busId=b"00000000:%02X:00.0" % (0x17 + h)),
        "nvmlSystemGetDriverVersion": lambda: "999.1",
        "nvmlDeviceGetUtilizationRates": lambda h: SimpleNamespace(gpu=40 + 20 * h),
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(used=(h + 1) * 2**20,
                                                             total=8 * 2**30),
    }
    for name, fn in fake.items():
        monkeypatch.setattr(machine.pynvml, name, fn)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def _sample(devices: list[str]) -> tuple[UtilizationMonitor, list[dict]]:
    with UtilizationMonitor(0.05, list, devices=devices) as mon:
        time.sleep(0.2)
    rows = mon.stop()
    assert rows
    return mon, rows


def _gpu_columns(rows: list[dict]) -> set[str]:
    return {k for r in rows for k in r if k.startswith("gpu")}


def test_describe_gpus_lists_every_nvml_gpu(fake_nvml):
    assert describe_gpus() == [
        {"name": f"Fake GPU {i}", "memory_mb": 8192.0, "driver": "999.1", "uuid": UUIDS[i],
         "pci_bus_id": f"00000000:{0x17 + i:02X}:00.0", "nvml_index": i} for i in range(2)]


@pytest.mark.parametrize(("visible", "nvml_indices"), [
    (None, [0, 1]),
    ("1", [1]),  # torch's cuda:0 is NVML's GPU 1
    ("1,0", [1, 0]),
    (" 1 , 0", [1, 0]),
    (UUIDS[1], [1]),
    ("GPU-5f2b,GPU-5f1a2c", [1, 0]),  # unambiguous prefixes
    ("GPU-5f2b,GPU-5f", [1]),  # an ambiguous prefix ends the list
    ("GPU-5f", []),
    ("GPU-ffff", []),
    ("", []),
    ("-1", []),
    ("0,-1,1", [0]),  # a negative index ends the list
    ("1,7,0", [1]),  # so does one past the last GPU
    ("0,1,0", []),  # a GPU named twice: none at all
    ("MIG-5f1a2c3d", []),
])
def test_cuda_devices_follow_cuda_visible_devices(fake_nvml, monkeypatch, visible, nvml_indices):
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    gpus = cuda_devices()
    assert [g["nvml_index"] for g in gpus] == nvml_indices
    assert [g["uuid"] for g in gpus] == [UUIDS[i] for i in nvml_indices]


def test_cuda_devices_are_none_without_a_cuda_build_of_torch(fake_nvml, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert cuda_devices() == []
    assert len(describe_gpus()) == 2  # NVML still sees them


def test_only_the_runs_gpus_are_sampled_by_torch_index(fake_nvml, monkeypatch):
    mon, rows = _sample(["cpu"])
    assert mon.gpu_count == 0 and _gpu_columns(rows) == set()  # NVML sees two, the run used none

    mon, rows = _sample(["cpu", "cuda:1"])
    assert _gpu_columns(rows) == {"gpu1_util", "gpu1_mem_mb"}
    assert all((r["gpu1_util"], r["gpu1_mem_mb"]) == (60, 2.0) for r in rows)

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    mon, rows = _sample(["cpu", "cuda:0", "cuda:0"])
    assert mon.gpu_count == 1 and mon.gpus[0]["nvml_index"] == 1
    assert _gpu_columns(rows) == {"gpu0_util", "gpu0_mem_mb"}
    assert all((r["gpu0_util"], r["gpu0_mem_mb"]) == (60, 2.0) for r in rows)  # NVML's GPU 1
    assert summarize(rows, cores_given=2)["gpu_util_mean"] == 60.0


def test_uuids_in_cuda_visible_devices_map_torch_indices(fake_nvml, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{UUIDS[1]},GPU-5f1a")
    mon, rows = _sample(["cuda:1"])
    assert mon.gpus[1]["uuid"] == UUIDS[0]
    assert _gpu_columns(rows) == {"gpu1_util", "gpu1_mem_mb"}
    assert all((r["gpu1_util"], r["gpu1_mem_mb"]) == (40, 1.0) for r in rows)  # NVML's GPU 0

    mon, rows = _sample(["cuda:0", "cuda:1", "cuda:2"])  # cuda:2 does not exist: no column
    assert [g["nvml_index"] for g in mon.gpus.values()] == [1, 0]
    assert _gpu_columns(rows) == {"gpu0_util", "gpu0_mem_mb", "gpu1_util", "gpu1_mem_mb"}
    assert all((r["gpu0_util"], r["gpu1_util"]) == (60, 40) for r in rows)
    assert summarize(rows, cores_given=3)["gpu_util_mean"] == 50.0


@pytest.mark.gpu
def test_gpu_columns_on_a_real_gpu():
    gpus = cuda_devices()
    with UtilizationMonitor(0.05, list, devices=["cpu", "cuda:0"]) as mon:
        time.sleep(0.3)
    rows = mon.stop()
    assert mon.gpu_count == 1 and mon.gpus[0]["uuid"] == gpus[0]["uuid"]
    assert all(gpu["name"] and gpu["memory_mb"] > 0 and gpu["driver"] for gpu in gpus)
    assert all(gpu["uuid"].startswith("GPU-") and gpu["pci_bus_id"] for gpu in gpus)
    assert rows and all({k for k in r if k.startswith("gpu")} == {"gpu0_util", "gpu0_mem_mb"}
                        for r in rows)
    assert summarize(rows, cores_given=1)["gpu_util_mean"] is not None


NVML_ONLY = ("import time, torch\n"
             "from hetsgd.machine import cuda_devices\n"
             "from hetsgd.observe.monitor import UtilizationMonitor\n"
             "cuda_devices()\n"
             "with UtilizationMonitor(0.05, list, devices=['cpu', 'cuda:0']) as mon:\n"
             "    time.sleep(0.3)\n"
             "assert mon.stop() and not torch.cuda.is_initialized()\n")


@pytest.mark.integration
@pytest.mark.gpu
def test_the_gpus_are_listed_and_sampled_through_nvml_never_cuda():
    """In a child: a GPU test before this one may have started CUDA in this process (found on
    the first GPU machine), and a worker's CUDA context must stay the worker's own."""
    subprocess.run([sys.executable, "-c", NVML_ONLY], check=True)


TORCH_UUIDS = ("import json, torch\n"
               "print(json.dumps([str(torch.cuda.get_device_properties(i).uuid)"
               " for i in range(torch.cuda.device_count())]))")


@pytest.mark.integration
@pytest.mark.gpu
def test_cuda_devices_are_torchs_devices_in_torchs_order(monkeypatch):
    """What CUDA itself enumerates (in a child, to keep CUDA out of this process) is what
    cuda_devices() lists from NVML, with CUDA_VISIBLE_DEVICES unset and naming the last GPU."""
    last = len(describe_gpus()) - 1
    for visible in (None, str(last), describe_gpus()[last]["uuid"][:12]):
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        child = subprocess.run([sys.executable, "-c", TORCH_UUIDS], capture_output=True,
                               text=True, check=True)
        from_torch = [u.lower().removeprefix("gpu-") for u in
                      json.loads(child.stdout.strip().splitlines()[-1])]
        ours = [g["uuid"].lower().removeprefix("gpu-") for g in cuda_devices()]
        assert ours == from_torch, visible


@pytest.mark.integration
def test_a_process_started_at_lies_between_the_moments_around_its_start():
    """psutil's create_time would read whole seconds early on a machine whose boot time is not
    a whole second (0.82 s early on one development VM); the child asks half a second after it
    started, so that the moment of asking does not pass for the start."""
    tick = 1 / os.sysconf("SC_CLK_TCK")  # the kernel counts a process's start in ticks
    before = time.time()
    child = subprocess.run(
        [sys.executable, "-c", "import time; time.sleep(0.5); "
         "from hetsgd.machine import process_started_at as p; print(p(), time.time())"],
        capture_output=True, text=True, check=True)
    after = time.time()
    started, asked = map(float, child.stdout.split())
    assert before - tick <= started <= min(after, asked - 0.5)
