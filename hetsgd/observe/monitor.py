"""CPU and GPU utilization sampled by a daemon thread of the coordinator.

What is the run's own is kept apart from what is the host's: ``workers_cpu_percent`` is the CPU
of the worker process trees (100 = one core), ``host_cpu_percent`` and ``cpuN_percent`` are
host-wide (the coordinator and any other tenant included), and only the GPUs the run's workers
use are sampled, each named by its torch index (``gpu0_util`` is ``cuda:0``, whichever NVML
GPU ``CUDA_VISIBLE_DEVICES`` makes it).

The coordinator never touches CUDA (workers own the CUDA contexts), so GPUs are read through NVML
(the ``nvidia-ml-py`` package, module ``pynvml``), which sees every process's load without a
context of its own; torch is asked only whether it has CUDA at all (:func:`cuda_devices`), and
only by a run with GPU workers. CPU numbers come from psutil. Without NVML (no driver, no GPU)
there are simply no GPU columns.

Samples stop with the workers: once every worker process the monitor has seen is gone, a sample
would count their CPU as 0 after training, so none is kept (but the closing one of a run too
short for any other, with its workers' CPU unknown); the engine stops the monitor as training
ends. A run's first seconds are sampled faster (:meth:`UtilizationMonitor.interval_at`),
so that a run of a few seconds still has a curve to read.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

import psutil

from hetsgd.machine import cuda_devices, nvml, pynvml

Row = dict[str, float | None]
log = logging.getLogger("hetsgd")

_GPU_UTIL = re.compile(r"gpu\d+_util")
_CUDA = re.compile(r"cuda(?::(\d+))?")
# Early in a run the interval between samples is its time so far over EARLY_SAMPLES, at least
# interval_s / FASTEST (psutil's CPU times tick every 10 ms: 0.1 s windows read to 10 %)
EARLY_SAMPLES, FASTEST = 20, 5


def _mean(pairs: list[tuple[float, float]]) -> float | None:
    """The mean of (window, value) pairs weighted by their windows; evenly where none has one."""
    if not pairs:
        return None
    total = sum(window for window, _ in pairs)
    if total <= 0:
        return sum(value for _, value in pairs) / len(pairs)
    return sum(window * value for window, value in pairs) / total


def summarize(rows: list[Row], cores_given: int, start_s: float = 0.0) -> dict[str, float | None]:
    """The means summary.json keeps, each None when no row has it.

    ``workers_cpu_cores_mean``: cores busy with the run's worker process trees;
    ``workers_cpu_share_mean``: that over ``cores_given``, the cores the mix gave its workers;
    ``host_cpu_percent_mean``: host-wide CPU, other processes included;
    ``gpu_util_mean``: utilization over the run's own GPU columns (None without GPUs).

    Each is a mean over time: a row's values cover the seconds since the row before it (since
    ``start_s`` for the first: a resumed run's checkpoint time, where its rows begin), and weigh
    that much. Sampling is faster early in a run
    (:meth:`UtilizationMonitor.interval_at`), so a mean of rows would weigh its first seconds
    several times over.
    """
    windows, previous = [], start_s
    for row in rows:
        now = float(row["time_s"] or 0.0)
        windows.append(max(now - previous, 0.0))
        previous = now

    def column(key: str) -> list[tuple[float, float]]:
        return [(w, v) for w, r in zip(windows, rows) if (v := r.get(key)) is not None]

    workers = _mean(column("workers_cpu_percent"))
    cores = None if workers is None else workers / 100.0
    gpu = [(w, v) for w, r in zip(windows, rows) for k, v in r.items()
           if _GPU_UTIL.fullmatch(k) and v is not None]
    return {"workers_cpu_cores_mean": cores,
            "workers_cpu_share_mean": cores / cores_given if cores is not None and cores_given > 0
            else None,
            "host_cpu_percent_mean": _mean(column("host_cpu_percent")),
            "gpu_util_mean": _mean(gpu)}


def torch_indices(devices: Iterable[str]) -> list[int]:
    """The CUDA indices among torch device strings (``cuda`` alone is ``cuda:0``), sorted, once."""
    return sorted({int(m.group(1) or 0) for d in devices if (m := _CUDA.fullmatch(d.strip()))})


class UtilizationMonitor:
    """Samples host, per-core, worker-tree and the run's GPUs' utilization every ``interval_s`` s.

    ``devices`` are the workers' torch devices (``["cpu", "cuda:0", "cuda:0"]``): each CUDA
    index among them is sampled, found in NVML through :func:`cuda_devices`, and named by that
    index (``gpu0_util``, ``gpu0_mem_mb``); ``gpus`` maps those indices to the NVML GPUs once
    :meth:`start` returns. ``worker_pids`` names the worker processes (asked anew at each
    sample, as workers come and go); their CPU is summed with that of all their descendants,
    100 = one core busy. When it is None, the coordinator's own descendants are the workers.
    ``time_s`` counts from :meth:`set_time_origin` (a ``time.perf_counter()`` value, before or
    after :meth:`start`), by default from :meth:`start`; rows taken before a later origin have
    negative times. ``on_sample`` gets each row as it is taken (from the sampling thread), so
    that the run directory keeps the samples of a run whose coordinator is killed.
    """

    def __init__(self, interval_s: float = 0.5,
                 worker_pids: Callable[[], list[int]] | None = None,
                 devices: Iterable[str] = (),
                 on_sample: Callable[[Row], None] | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s={interval_s} must be positive")
        self.interval_s = interval_s
        self._worker_pids = worker_pids or self._own_children
        self._on_sample = on_sample
        self._origin: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rows: list[Row] = []
        self._procs: dict[int, psutil.Process] = {}
        self._seen_workers = False  # whether a worker process was ever read
        self._torch_indices = torch_indices(devices)
        self.gpus: dict[int, dict[str, Any]] = {}  # torch index -> cuda_devices() entry
        self._failure: Exception | None = None  # what ended the sampling thread, if anything

    @staticmethod
    def _own_children() -> list[int]:
        return [p.pid for p in psutil.Process(os.getpid()).children()]

    def interval_at(self, elapsed_s: float) -> float:
        """The wait before the next sample, ``elapsed_s`` into the run: ``interval_s`` from
        ``EARLY_SAMPLES`` intervals in, faster before (``interval_s=0.5``: 28 samples in a 3 s
        run rather than 6)."""
        return min(self.interval_s, max(self.interval_s / FASTEST, elapsed_s / EARLY_SAMPLES))

    def set_time_origin(self, t0: float) -> None:
        """Measure ``time_s`` from ``t0`` (a ``time.perf_counter()`` reading), e.g. training start."""
        self._origin = t0

    def start(self) -> UtilizationMonitor:
        if self._thread is not None:
            raise RuntimeError("the monitor is already running")
        if self._origin is None:
            self._origin = time.perf_counter()
        self._stop.clear()
        self._rows = []
        self._seen_workers = False
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="hetsgd-monitor",
                                        daemon=True)
        self._thread.start()
        ready.wait()  # the GPUs are known and the CPU counters are primed when start returns
        if self._failure is not None:
            self._thread.join()
            self._thread = None
            raise RuntimeError(f"the utilization monitor could not start: "
                               f"{type(self._failure).__name__}: {self._failure}")
        return self

    def stop(self) -> list[Row]:
        """Stop sampling (within one NVML/psutil call) and return every row taken."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        return list(self._rows)

    def __enter__(self) -> UtilizationMonitor:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def gpu_count(self) -> int:
        """How many GPUs are sampled (those of the run that NVML could be asked about)."""
        return len(self.gpus)

    def _run_gpus(self) -> dict[int, dict[str, Any]]:
        """The run's GPUs that torch can use here, by torch index."""
        if not self._torch_indices:
            return {}
        try:
            visible = cuda_devices()
        except pynvml.NVMLError:
            return {}
        return {i: visible[i] for i in self._torch_indices if i < len(visible)}

    def _run(self, ready: threading.Event) -> None:
        """Sample until stopped. Whatever ends the thread is kept: raised by :meth:`start`
        before the first sample (which would otherwise wait forever for it), said once after."""
        try:
            with nvml() as handles:
                self.gpus = {i: gpu for i, gpu in self._run_gpus().items()
                             if gpu["nvml_index"] < len(handles)}
                gpus = [(i, handles[gpu["nvml_index"]]) for i, gpu in self.gpus.items()]
                # psutil's first reading covers an undefined window: take it and discard it.
                psutil.cpu_percent()
                psutil.cpu_percent(percpu=True)
                self._workers_cpu()
                ready.set()
                while not self._stop.wait(self.interval_at(self._elapsed())):
                    self._keep(self._sample(gpus))
                self._keep(self._sample(gpus), closing=True)  # the end, even of short runs
        except Exception as exc:  # noqa: BLE001 - costs the samples, never the run
            self._failure = exc
            if ready.is_set():
                log.warning("utilization: sampling stopped after %d sample(s): %s: %s",
                            len(self._rows), type(exc).__name__, exc)
        finally:
            ready.set()

    def _keep(self, row: Row, closing: bool = False) -> None:
        """Keep ``row``, unless it was taken once the workers were gone (their CPU unknown,
        ``None``): not theirs to count. A run too short for any sample while its workers ran
        keeps its closing one, whose host columns cover its training."""
        if row["workers_cpu_percent"] is None and (self._rows or not closing):
            return
        self._rows.append(row)
        if self._on_sample is not None:
            self._on_sample(row)

    def _elapsed(self) -> float:
        assert self._origin is not None
        return time.perf_counter() - self._origin

    def _sample(self, gpus: list[tuple[int, Any]]) -> Row:
        """One row (its workers' CPU None once they are gone); ``gpus`` pairs each torch index
        with its NVML handle."""
        row: Row = {"time_s": self._elapsed(),
                    "host_cpu_percent": psutil.cpu_percent()}
        for i, percent in enumerate(psutil.cpu_percent(percpu=True)):
            row[f"cpu{i}_percent"] = percent
        row["workers_cpu_percent"] = self._workers_cpu()
        for i, handle in gpus:
            try:
                util: float | None = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
                mem: float | None = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
            except pynvml.NVMLError:
                util = mem = None
            row[f"gpu{i}_util"] = util
            row[f"gpu{i}_mem_mb"] = mem
        return row

    def _workers_cpu(self) -> float | None:
        """Summed CPU percent of the worker process trees since the previous call; None when
        every process seen before is gone (the workers ended).

        psutil measures a process's CPU between two calls on the same Process object, so the
        objects are kept; a process seen for the first time contributes 0 until its next sample.
        """
        procs: dict[int, psutil.Process] = {}
        for pid, proc in process_trees(self._worker_pids()).items():
            procs[pid] = self._procs.get(pid, proc)
        total = 0.0
        for pid, proc in list(procs.items()):
            try:
                total += proc.cpu_percent()
            except psutil.Error:
                del procs[pid]
        self._procs = procs
        if not procs and self._seen_workers:
            return None
        self._seen_workers = self._seen_workers or bool(procs)
        return total


def process_trees(roots: Iterable[int]) -> dict[int, psutil.Process]:
    """The live processes among ``roots`` and all their descendants, by pid, from one pass over
    /proc (psutil's ``children(recursive=True)`` makes a pass of its own for each root, and a
    machine of many workers and many processes pays for each)."""
    scanned: dict[int, psutil.Process] = {}
    children: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:  # ended, not yet reaped: gone
            continue
        scanned[proc.pid] = proc
        children.setdefault(proc.info["ppid"], []).append(proc.pid)
    tree: dict[int, psutil.Process] = {}
    todo = [pid for pid in roots if pid in scanned]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree[pid] = scanned[pid]
            todo.extend(children.get(pid, ()))
    return tree
