"""How fast each worker group of a mix runs the configured model, over a range of batch sizes,
as it trains: with the rest of the mix stepping at the same time.

Every worker of the mix is a spawned process, all on one shared master, as in training. For each
group in turn, its first worker sweeps the batch sizes while every other worker steps at its own
batch size, so the measurement carries what the mix costs itself on this machine (cores, memory
bandwidth, the shared model's cache lines); a group measured alone runs faster than it trains.
Each step is the one the group's workers take in training — the replica copy and merge of an
accelerator, and an emulated group's slowdown, included. A mix of several workers also gets its
all-reduce measured: the ranks' gloo (or NCCL) all-reduce of the model, which local SGD and sync
on several workers pay every round or step. The coordinator stays CUDA-free.
"""

from __future__ import annotations

import statistics
import time
from functools import partial
from pathlib import Path

import torch
import torch.multiprocessing as mp

from hetsgd.algorithms.hogbatch import hogbatch_link
from hetsgd.config import RunConfig
from hetsgd.devices import WorkerSpec, expand
from hetsgd.engines import device_ops
from hetsgd.engines.distributed.group import Group, with_free_port
from hetsgd.engines.shared_memory.memory import SharedMaster
from hetsgd.engines.shared_memory.state import SharedState
from hetsgd.engines.shared_memory.worker import Worker
from hetsgd.engines.step_timing import StepTimer
from hetsgd.model.problem import Problem
from hetsgd.runs.setup import load_run_data

BATCH_SIZES = (1, 4, 16, 64, 256, 1024)
WARMUP_STEPS = 3
ALLREDUCE_WARMUP, ALLREDUCE_TIMED = 5, 30


def _worker(spec: WorkerSpec, cfg: RunConfig, problem: Problem, state: SharedState) -> Worker:
    torch.set_num_threads(spec.threads)
    return Worker(spec, cfg, problem, state, partial(hogbatch_link, merge="delta"))


def _measure(spec: WorkerSpec, cfg: RunConfig, problem: Problem, state: SharedState,
             batch_sizes: list[int], seconds: float, results) -> None:
    """The measured worker: every batch size in turn, then None (or the error's line)."""
    try:
        worker = _worker(spec, cfg, problem, state)
        n = state.data.num_examples
        timer = StepTimer(warmup=WARMUP_STEPS, min_steps=1, min_seconds=seconds)
        for batch_size in batch_sizes:
            comm: list[float] = []  # the copy seconds of each timed step

            def step(i: int, size: int = batch_size, comm: list[float] = comm) -> None:
                _, seconds = worker.step(0, i * size % (n - size + 1), size)
                device_ops.synchronize(worker.device)  # the step's time includes the device's
                if i >= timer.warmup:  # the calls the timer times
                    comm.append(seconds)

            times = timer.times(step, spec)
            elapsed = sum(times)
            results.put((batch_size, len(times) * batch_size / elapsed, 1000 * elapsed / len(times),
                         1000 * sum(comm) / len(times)))
        results.put(None)
    except BaseException as exc:  # the parent turns it into an error line
        results.put(f"{type(exc).__name__}: {exc}")


def _step_along(spec: WorkerSpec, cfg: RunConfig, problem: Problem, state: SharedState) -> None:
    """Another worker of the mix: its training loop, at its own batch size, until stopped (the
    cursor has no epoch budget)."""
    _worker(spec, cfg, problem, state).run()


def _allreduce(spec: WorkerSpec, specs: list[WorkerSpec], cfg: RunConfig, numel: int,
               results) -> None:
    """One rank: the median seconds of an all-reduce of ``numel`` floats (rank 0 reports)."""
    torch.set_num_threads(spec.threads)
    group = Group(cfg.dist, spec.rank, specs)
    try:
        buffer = group.buffer(numel)
        times = []
        for i in range(ALLREDUCE_WARMUP + ALLREDUCE_TIMED):
            started = time.perf_counter()
            group.all_reduce_(buffer)
            if i >= ALLREDUCE_WARMUP:
                times.append(time.perf_counter() - started)
        if spec.rank == 0:
            results.put(statistics.median(times))
    finally:
        group.leave()


def _measure_allreduce(cfg: RunConfig, specs: list[WorkerSpec], numel: int) -> float:
    """Seconds of one all-reduce of the model among the mix's workers, as the ranks of local
    SGD or sync exchange it."""
    cfg = with_free_port(cfg)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_allreduce, args=(s, specs, cfg, numel, results), daemon=True)
             for s in specs]
    for proc in procs:
        proc.start()
    try:
        return float(results.get(timeout=cfg.dist.timeout_s))
    finally:
        for proc in procs:
            proc.join(timeout=cfg.dist.timeout_s)


def calibrate(cfg: RunConfig, seconds: float = 0.5) -> list[dict]:
    """Examples/s, ms/step and the part of it spent copying the model to or from the master
    (comm ms/step: a replica's copies; 0 for a worker that steps in place) per group and batch
    size (batch sizes up to the training set), measured with the rest of the mix stepping; and
    the mix's all-reduce of the model (ms, in every row; empty for a one-worker mix)."""
    run_data = load_run_data(cfg, progress=cfg.progress)
    problem, data = run_data.problem, run_data.train
    batch_sizes = [b for b in BATCH_SIZES if b <= data.num_examples]
    rows = []
    ctx = mp.get_context("spawn")
    specs = expand(cfg.devices)
    measured = {spec.group: spec for spec in reversed(specs)}  # each group's first worker
    for spec in sorted(measured.values(), key=lambda s: s.rank):
        master = SharedMaster.initial(cfg.model, problem, cfg.seed)
        state = SharedState.create(data, master, None, len(specs), ctx)
        results = ctx.Queue()
        proc = ctx.Process(target=_measure, args=(spec, cfg, problem, state, batch_sizes, seconds,
                                                  results), daemon=True)
        others = [ctx.Process(target=_step_along, args=(s, cfg, problem, state), daemon=True)
                  for s in specs if s is not spec]
        for p in [*others, proc]:
            p.start()
        try:
            while (item := results.get()) is not None:
                if isinstance(item, str):
                    raise RuntimeError(f"calibrating group '{spec.group}' failed: {item}")
                batch_size, per_s, ms, comm_ms = item
                rows.append({"group": spec.group, "device": spec.device, "kind": spec.label,
                             "threads": spec.threads, "batch_size": batch_size,
                             "examples_per_s": per_s, "ms_per_step": ms,
                             "comm_ms_per_step": comm_ms, "slowdown": spec.slowdown})
        finally:
            state.signals.stop.set()
            for p in [*others, proc]:
                p.join(timeout=60)
                if p.is_alive():
                    p.terminate()
    allreduce_ms = None
    if len(specs) > 1:
        allreduce_ms = 1000 * _measure_allreduce(cfg, specs, master.params.numel()
                                                 + master.buffers.numel())
    return [{**row, "allreduce_ms": allreduce_ms} for row in rows]


def save(rows: list[dict], cfg: RunConfig) -> Path:
    import pandas as pd

    folder = Path(cfg.results_dir) / "calibration"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{cfg.model.name}_{cfg.dataset.name}_"
                     f"{cfg.devices.name}.csv")
    pd.DataFrame(rows).to_csv(path, index=False)
    return path
