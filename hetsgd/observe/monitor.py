"""CPU and GPU utilization sampled by a daemon thread of the coordinator.

The coordinator never touches CUDA (workers own the CUDA contexts), so GPUs are read through NVML
(the ``nvidia-ml-py`` package, module ``pynvml``), which sees every process's load without a
context of its own; this module does not import torch at all. CPU numbers come from psutil.
Without NVML (no driver, no GPU) there are simply no GPU columns.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

import psutil

from hetsgd.machine import nvml, pynvml

Row = dict[str, float | None]

_GPU_UTIL = re.compile(r"gpu\d+_util")


def summarize(rows: list[Row]) -> dict[str, float | None]:
    """Mean host CPU percent and mean GPU utilization over all GPU columns (None without GPUs)."""
    cpu = [r["cpu_percent"] for r in rows if r.get("cpu_percent") is not None]
    gpu = [v for r in rows for k, v in r.items() if _GPU_UTIL.fullmatch(k) and v is not None]
    return {"cpu_mean": sum(cpu) / len(cpu) if cpu else None,
            "gpu_mean": sum(gpu) / len(gpu) if gpu else None}


class UtilizationMonitor:
    """Samples host, per-core, worker-tree and GPU utilization every ``interval_s`` seconds.

    ``worker_pids`` names the worker processes (asked anew at each sample, as workers come and
    go); their CPU is summed with that of all their descendants, 100 = one core busy. When it is
    None, the coordinator's own descendants are the workers. ``time_s`` counts from
    :meth:`set_time_origin` (a ``time.perf_counter()`` value, before or after :meth:`start`), by
    default from :meth:`start`; rows taken before a later origin have negative times.
    """

    def __init__(self, interval_s: float = 0.5,
                 worker_pids: Callable[[], list[int]] | None = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s={interval_s} must be positive")
        self.interval_s = interval_s
        self._worker_pids = worker_pids or self._own_children
        self._origin: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rows: list[Row] = []
        self._procs: dict[int, psutil.Process] = {}
        self.gpu_count = 0

    @staticmethod
    def _own_children() -> list[int]:
        return [p.pid for p in psutil.Process(os.getpid()).children()]

    def set_time_origin(self, t0: float) -> None:
        """Measure ``time_s`` from ``t0`` (a ``time.perf_counter()`` reading), e.g. training start."""
        self._origin = t0

    def start(self) -> Self:
        if self._thread is not None:
            raise RuntimeError("the monitor is already running")
        if self._origin is None:
            self._origin = time.perf_counter()
        self._stop.clear()
        self._rows = []
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="hetsgd-monitor",
                                        daemon=True)
        self._thread.start()
        ready.wait()  # gpu_count is known and the CPU counters are primed when start returns
        return self

    def stop(self) -> list[Row]:
        """Stop sampling (within one NVML/psutil call) and return every row taken."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        return list(self._rows)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _run(self, ready: threading.Event) -> None:
        with nvml() as gpus:
            try:
                self.gpu_count = len(gpus)
                # psutil's first reading covers an undefined window: take it and discard it.
                psutil.cpu_percent()
                psutil.cpu_percent(percpu=True)
                self._workers_cpu()
            finally:
                ready.set()
            while not self._stop.wait(self.interval_s):
                self._rows.append(self._sample(gpus))
            self._rows.append(self._sample(gpus))  # the end is always covered, even of short runs

    def _sample(self, gpus: list[Any]) -> Row:
        assert self._origin is not None
        row: Row = {"time_s": time.perf_counter() - self._origin,
                    "cpu_percent": psutil.cpu_percent()}
        for i, percent in enumerate(psutil.cpu_percent(percpu=True)):
            row[f"cpu{i}_percent"] = percent
        row["workers_cpu_percent"] = self._workers_cpu()
        for i, handle in enumerate(gpus):
            try:
                util: float | None = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
                mem: float | None = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
            except pynvml.NVMLError:
                util = mem = None
            row[f"gpu{i}_util"] = util
            row[f"gpu{i}_mem_mb"] = mem
        return row

    def _workers_cpu(self) -> float:
        """Summed CPU percent of the worker process trees since the previous call.

        psutil measures a process's CPU between two calls on the same Process object, so the
        objects are kept; a process seen for the first time contributes 0 until its next sample.
        """
        procs: dict[int, psutil.Process] = {}
        for pid in self._worker_pids():
            try:
                root = self._procs.get(pid) or psutil.Process(pid)
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for proc in tree:
                procs.setdefault(proc.pid, self._procs.get(proc.pid, proc))
        total = 0.0
        for pid, proc in list(procs.items()):
            try:
                total += proc.cpu_percent()
            except psutil.Error:
                del procs[pid]
        self._procs = procs
        return total
