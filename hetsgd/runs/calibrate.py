"""How fast each worker group of a mix runs the configured model, over a range of batch sizes.

Each group is measured in its own spawned process (one at a time, so groups do not compete for
cores), through the same step the group's workers take in training — the replica copy and merge
of an accelerator, and an emulated group's slowdown, included. The coordinator stays CUDA-free.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import torch
import torch.multiprocessing as mp

from hetsgd.algorithms.hogbatch import hogbatch_link
from hetsgd.config import RunConfig
from hetsgd.devices import WorkerSpec, expand
from hetsgd.engines import device_ops
from hetsgd.engines.shared_memory.memory import SharedMaster
from hetsgd.engines.shared_memory.state import SharedState
from hetsgd.engines.shared_memory.worker import Worker
from hetsgd.engines.step_timing import StepTimer
from hetsgd.model.problem import Problem
from hetsgd.runs.setup import load_run_data

BATCH_SIZES = (1, 4, 16, 64, 256, 1024)
WARMUP_STEPS = 3


def _measure(spec: WorkerSpec, cfg: RunConfig, problem: Problem, state: SharedState,
             batch_sizes: list[int], seconds: float, results) -> None:
    torch.set_num_threads(spec.threads)
    try:
        worker = Worker(spec, cfg, problem, state, partial(hogbatch_link, merge="delta"))
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


def calibrate(cfg: RunConfig, seconds: float = 0.5) -> list[dict]:
    """Examples/s, ms/step and the part of it spent copying the model to or from the master
    (comm ms/step: a replica's copies; 0 for a worker that steps in place) per group and batch
    size (batch sizes up to the training set)."""
    run_data = load_run_data(cfg, progress=cfg.progress)
    problem, data = run_data.problem, run_data.train
    batch_sizes = [b for b in BATCH_SIZES if b <= data.num_examples]
    rows = []
    ctx = mp.get_context("spawn")
    specs = expand(cfg.devices)
    first_of_group: dict[str, WorkerSpec] = {}
    for spec in specs:
        first_of_group.setdefault(spec.group, spec)
    for spec in first_of_group.values():
        state = SharedState.create(data, SharedMaster.initial(cfg.model, problem, cfg.seed), None,
                                   1, ctx)
        results = ctx.Queue()
        proc = ctx.Process(target=_measure, args=(spec, cfg, problem, state, batch_sizes, seconds,
                                                  results), daemon=True)
        proc.start()
        while (item := results.get()) is not None:
            if isinstance(item, str):
                proc.join()
                raise RuntimeError(f"calibrating group '{spec.group}' failed: {item}")
            batch_size, per_s, ms, comm_ms = item
            rows.append({"group": spec.group, "device": spec.device, "kind": spec.label,
                         "threads": spec.threads, "batch_size": batch_size,
                         "examples_per_s": per_s, "ms_per_step": ms, "comm_ms_per_step": comm_ms,
                         "slowdown": spec.slowdown})
        proc.join()
    return rows


def save(rows: list[dict], cfg: RunConfig) -> Path:
    import pandas as pd

    folder = Path(cfg.results_dir) / "calibration"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{cfg.model.name}_{cfg.dataset.name}_"
                     f"{cfg.devices.name}.csv")
    pd.DataFrame(rows).to_csv(path, index=False)
    return path
