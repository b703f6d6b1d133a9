"""Section d: the data and the master exist once, however many workers."""

from __future__ import annotations

import multiprocessing as mp
import subprocess
import sys
import threading
from concurrent.futures import ProcessPoolExecutor

import psutil

from scripts.bench.jobs import FAST_EVAL, Jobs
from scripts.bench.section import Section

MEMORY_SET = ("dataset=synthetic", "dataset.n_samples=300000", "dataset.n_features=400")
MEMORY_NEEDS_BYTES = 4 * 2**30  # the memory run needs about 2 GiB; keep a margin
# the coordinator's peak while loading and evaluating, above its USS before the run: at most this
# many times the training data (its shared copy, the test part, and a few blocks in flight)
MEMORY_GOAL = 1.5
MiB = 2**20


class MemorySampler:
    """Peak USS of this process (the coordinator) and of each spawned worker, and the peak rise
    of system-wide used and shared memory, sampled by a thread while a run executes. Coordinator
    and system peaks are kept apart for the time workers run (training) and the rest (loading
    the data, evaluating)."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self.interval_s = interval_s
        self.before = psutil.virtual_memory()
        self.coordinator_start = psutil.Process().memory_full_info().uss
        self.workers: dict[int, int] = {}
        self.coordinator = {"training": 0, "other": 0}
        self.used = {"training": 0, "other": 0}
        self.shared = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _worker_uss(self, me: psutil.Process) -> dict[int, int]:
        uss = {}
        for child in me.children(recursive=True):
            try:  # workers: spawned interpreters, or the forkserver's forks (which keep its
                # command line); not the forkserver itself, nor the resource tracker
                command = " ".join(child.cmdline())
                forked = "forkserver" in command and child.ppid() != me.pid
                if "spawn_main" in command or forked:
                    uss[child.pid] = child.memory_full_info().uss
            except psutil.Error:  # it ended between listing and reading
                continue
        return uss

    def _loop(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(self.interval_s):
            workers = self._worker_uss(me)
            for pid, uss in workers.items():
                self.workers[pid] = max(self.workers.get(pid, 0), uss)
            phase = "training" if workers else "other"
            vm = psutil.virtual_memory()
            self.used[phase] = max(self.used[phase], vm.used - self.before.used)
            self.shared = max(self.shared, vm.shared - self.before.shared)
            self.coordinator[phase] = max(self.coordinator[phase], me.memory_full_info().uss)


def runtime_floor() -> int:
    """USS of a fresh interpreter that imported what a worker imports: the per-process floor."""
    code = ("import psutil, torch, hetsgd.engines.common.worker; "
            "print(psutil.Process().memory_full_info().uss)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


def bench_memory(jobs: Jobs, seconds: float) -> Section:
    """Measured in a process of its own: the coordinator's USS before the run, which the goal
    counts from, must not depend on what earlier sections allocated and freed."""
    context = mp.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        return pool.submit(_memory_here, Jobs(jobs.folder / "memory", jobs.data),
                           seconds).result()


def _memory_here(jobs: Jobs, seconds: float) -> Section:
    section = Section(
        "memory: one copy of the data and the master, whatever the worker count",
        "Hogwild, 2 workers, on a large synthetic set, in a process of its own (its USS before "
        "the run is a bare runtime's, whatever earlier sections left). USS counts the pages "
        "only this process maps: shared data a worker reads is mapped by the coordinator too, "
        "so it is not in a worker's USS, and a worker holding its own copy of the data would "
        "show it. Floor: USS of a fresh interpreter that imported torch and hetsgd's worker. "
        "The coordinator's USS holds the loaded arrays and shared pages no worker has touched "
        "yet. System view: peak rise over the run's start of used memory (psutil: shared memory"
        " not in it; other processes' too) and of shared memory.",
        ["what", "MiB", "vs data"])
    available = psutil.virtual_memory().available
    if available < MEMORY_NEEDS_BYTES:
        section.error = f"skipped: {available / 2**30:.1f} GiB available, needs ~4 GiB"
        return section
    floor = runtime_floor()
    with MemorySampler() as sampler:
        job = jobs.run("algo=hogwild", "devices=cpu", "devices.groups.cpu.count=2",
                       "devices.groups.cpu.threads=1", *MEMORY_SET, "model=mlp",
                       "budget.epochs=null", f"budget.seconds={seconds}", *FAST_EVAL)
    features = int(MEMORY_SET[2].split("=")[1])
    num_train = round(job.summary["examples"] / job.summary["epochs"])
    data_bytes = num_train * (features + 1) * 4  # float32 rows and labels, as SharedData holds
    peaks = list(sampler.workers.values())
    rise = sampler.coordinator["other"] - sampler.coordinator_start
    met = rise <= MEMORY_GOAL * data_bytes
    section.explanation += (
        f" Goal: the coordinator's peak while loading and evaluating, above its USS before the "
        f"run, at most {MEMORY_GOAL:g}x the training data: {'met' if met else 'NOT met'} "
        f"({rise / data_bytes:.2f}x).")
    rows = [("training data in shared memory", data_bytes)]
    rows += [(f"worker {i} peak USS", uss) for i, uss in enumerate(peaks)]
    rows += [("workers' peak USS, sum", sum(peaks)),
             ("worker runtime floor (USS)", floor),
             (f"workers' sum minus {len(peaks)} floors", sum(peaks) - len(peaks) * floor),
             ("coordinator USS before the run (its runtime)", sampler.coordinator_start),
             ("coordinator peak USS while workers run", sampler.coordinator["training"]),
             ("coordinator peak USS otherwise (load, evaluate)", sampler.coordinator["other"]),
             ("  the same above its USS before the run", rise),
             ("system used memory rise while workers run", sampler.used["training"]),
             ("system used memory rise otherwise", sampler.used["other"]),
             ("system shared memory rise, peak", sampler.shared)]
    section.rows = [[what, f"{value / MiB:,.0f}", f"{value / data_bytes:.2f}x"]
                    for what, value in rows]
    section.data = {"data_bytes": data_bytes, "num_train": num_train,
                    "worker_peak_uss": peaks, "runtime_floor_uss": floor,
                    "coordinator_peak_uss": sampler.coordinator,
                    "coordinator_start_uss": sampler.coordinator_start,
                    "goal": {"coordinator_rise_over_data_max": MEMORY_GOAL, "met": met},
                    "system_used_peak_rise": sampler.used,
                    "system_shared_peak_rise": sampler.shared,
                    "examples_per_s": job.summary["examples_per_s"]}
    return section
