"""How fast each worker group of a mix runs the configured model, over a range of batch sizes,
as it trains: with the rest of the mix stepping at the same time.

Every worker of the mix is a spawned process, all on one shared master, as in training. For each
group in turn, its first worker sweeps the batch sizes while every other worker steps at its own
batch size, so the measurement carries what the mix costs itself on this machine (cores, memory
bandwidth, the shared model's cache lines); a group measured alone runs faster than it trains.
Each step is the one the group's workers take in training — the replica copy and merge of an
accelerator, and an emulated group's slowdown, included. A mix of several workers also gets its
exchange measured, the way local SGD and sync pay it every round or step: every worker a rank
process, rounds of steps and the gloo (or NCCL) exchange of the model. The rounds take longer
than the slowest rank's steps by more than the all-reduce alone (ranks that waited wake late,
the collective's threads take cores from the steps), the more the longer the earliest rank
waited, and that whole excess, at three such waits, is what a simulated round pays. The
coordinator stays CUDA-free.
"""

from __future__ import annotations

import math
import os
import queue
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from hetsgd.algorithms.hogbatch import hogbatch_link
from hetsgd.config import RunConfig
from hetsgd.config.labels import dataset_label, model_label
from hetsgd.engines import device_ops
from hetsgd.engines.common.coordinator import FIRST_STEP_FACTOR, KILL_TIMEOUT_S, guarded
from hetsgd.engines.common.memory import SharedData, SharedMaster
from hetsgd.engines.common.state import SharedState
from hetsgd.engines.common.worker import Worker
from hetsgd.engines.processes import context
from hetsgd.engines.ranks.group import Group, with_free_port
from hetsgd.engines.ranks.rank import Rank
from hetsgd.engines.step_timing import StepTimer
from hetsgd.engines.virtual.profiles import EXCHANGE_COLUMNS, measured_profiles
from hetsgd.model.problem import Problem
from hetsgd.model.step import resolved_step
from hetsgd.outputs.run_directory import write_csv
from hetsgd.runs.setup import load_run_data
from hetsgd.workers import WorkerSpec, expand

BATCH_SIZES = (1, 4, 16, 64, 256, 1024)
WARMUP_STEPS = 3
EXCHANGE_WARMUP = 5  # rounds
EXCHANGE_SECONDS = 2  # each round pattern is timed for this many times a batch size's seconds
LONG_WAIT_S = 0.004  # how long the earliest rank waits in the long rounds, about
MAX_LONG_STEPS, MIN_ROUNDS = 64, 20


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
                _, copy, merge = worker.step(0, i * size % (n - size + 1), size)
                device_ops.synchronize(worker.device)  # the step's time includes the device's
                if i >= timer.warmup:  # the calls the timer times
                    comm.append(copy + merge)

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


@dataclass(frozen=True)
class RoundPattern:
    """Rounds in which rank r takes ``steps[r]`` steps at its batch size, then the exchange;
    ``rounds`` of them are timed, after ``EXCHANGE_WARMUP``."""

    steps: tuple[int, ...]
    rounds: int


def _rounds(spec: WorkerSpec, specs: list[WorkerSpec], cfg: RunConfig, problem: Problem,
            state: SharedState, patterns: list[RoundPattern], results) -> None:
    """One rank: each pattern's rounds of training steps (the emulated slowdown included) and
    the exchange of the model that local SGD and sync make, as a rank of theirs does both.
    Rank 0 reports the wall seconds per round of each pattern."""
    torch.set_num_threads(spec.threads)
    group: Group | None = None
    try:
        group = Group(cfg.dist, spec.rank, specs)
        rank = Rank(spec, specs, cfg, problem, state, group, linked=False,
                    step_choice=cfg.optim.step)
        batches, n = rank.batches(), rank.num_examples
        size = min(spec.batch_size, n)
        step = 0
        seconds_per_round = []
        for pattern in patterns:
            started = time.perf_counter()
            for round_ in range(EXCHANGE_WARMUP + pattern.rounds):
                if round_ == EXCHANGE_WARMUP:
                    started = time.perf_counter()
                for _ in range(pattern.steps[spec.rank]):
                    step_started = time.perf_counter()
                    x, y = batches.get(0, step * size % (n - size + 1), size)
                    mean, _ = rank.train_step(x, y, 0.0, size)
                    device_ops.synchronize(rank.device)
                    spec.emulate(time.perf_counter() - step_started)
                    step += 1
                rank.average(1 / len(specs), float(mean))
            seconds_per_round.append((time.perf_counter() - started) / pattern.rounds)
        if spec.rank == 0:
            results.put(seconds_per_round)
    except BaseException as exc:  # the parent turns it into an error line
        results.put(f"{type(exc).__name__}: {exc}")
    finally:
        if group is not None:
            group.leave()


def _seconds_per_round(cfg: RunConfig, specs: list[WorkerSpec], problem: Problem,
                       data: SharedData, patterns: list[RoundPattern]) -> list[float]:
    """Wall seconds of a round of each pattern on the mix, every worker a rank process as in
    training."""
    cfg = with_free_port(cfg)
    ctx = context(cfg.workers.start)
    master = SharedMaster.initial(cfg.model, problem, cfg.seed)
    state = SharedState.create(data, master, None, len(specs), ctx)
    results = ctx.Queue()
    procs = [ctx.Process(target=guarded, args=(_rounds, dict(os.environ), s, specs, cfg, problem,
                                               state, patterns, results), daemon=True)
             for s in specs]
    for proc in procs:
        proc.start()
    try:
        item = results.get(timeout=cfg.dist.timeout_s + 60)
    except queue.Empty:
        item = f"no rank reported within dist.timeout_s={cfg.dist.timeout_s:g} s + 60 s"
    finally:
        _end(procs, cfg.dist.timeout_s)
    if isinstance(item, str):
        raise RuntimeError(f"measuring the mix's exchange failed: {item}")
    return [float(seconds) for seconds in item]


def _measure_exchange(rows: list[dict], cfg: RunConfig, specs: list[WorkerSpec],
                      problem: Problem, data: SharedData, seconds: float) -> dict[str, str]:
    """What a round's exchange adds to its slowest rank's steps, at three waits of the earliest
    rank (space-separated, by wait): rounds in which every rank steps for about as long as the
    slowest rank's one step (unbalanced local SGD's rounds), rounds of one step each (sync's,
    the wait is the mix's difference in speed), and rounds of as many steps each as make the
    earliest rank wait about ``LONG_WAIT_S`` (balanced local SGD's). The excess is the measured
    round less the slowest rank's steps as the rows' profiles give them (never below 0: a round
    measured faster than that is noise); it holds the all-reduce and whatever the ranks pay
    around it on this machine (a rank that waited wakes late, the collective's threads take
    cores)."""
    profiles = measured_profiles(rows, "the calibration")
    step_s = [profiles[s.group].compute_s(min(s.batch_size, data.num_examples)) * s.slowdown
              for s in specs]
    slowest, spread = max(step_s), max(step_s) - min(step_s)
    long_steps = max(2, min(MAX_LONG_STEPS, math.ceil(LONG_WAIT_S / max(spread, 1e-9))))
    steps = [tuple(max(1, round(slowest / t)) for t in step_s), (1,) * len(specs),
             (long_steps,) * len(specs)]
    busy = [[k * t for k, t in zip(pattern, step_s)] for pattern in steps]
    patterns = [RoundPattern(k, max(MIN_ROUNDS, math.ceil(seconds / (max(b) + LONG_WAIT_S))))
                for k, b in zip(steps, busy)]
    rounds_s = _seconds_per_round(cfg, specs, problem, data, patterns)
    points = sorted((max(b) - min(b), max(0.0, r - max(b))) for b, r in zip(busy, rounds_s))
    return {"exchange_wait_ms": " ".join(f"{1000 * wait:.6g}" for wait, _ in points),
            "exchange_ms": " ".join(f"{1000 * excess:.6g}" for _, excess in points)}


def _next(results: Any, wait_s: float) -> Any:
    """The measuring worker's next report; its silence for ``wait_s`` reads as a failure
    report, since a stopped or hung worker sends nothing."""
    try:
        return results.get(timeout=wait_s)
    except queue.Empty:
        return f"no measurement within {wait_s:g} s (a worker stopped or hung)"


def _end(procs: list, wait_s: float) -> None:
    """Every process gone within about ``wait_s`` plus a bounded kill: SIGKILL, as a stopped
    one never handles SIGTERM, and every join bounded, so that multiprocessing's exit handler
    (which joins children without a timeout) finds none left."""
    deadline = time.perf_counter() + wait_s
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.perf_counter()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=KILL_TIMEOUT_S)


def calibrate(cfg: RunConfig, seconds: float = 0.5) -> list[dict]:
    """Examples/s, ms/step and the part of it spent copying the model to or from the master
    (comm ms/step: a replica's copies; 0 for a worker that steps in place) per group and batch
    size (batch sizes up to the training set), measured with the rest of the mix stepping; and
    the mix's exchange of the model (ms a round adds to the slowest step, at three waits of the
    earliest rank; in every row, empty for a one-worker mix)."""
    run_data = load_run_data(cfg, progress=cfg.progress)
    problem, data = run_data.problem, run_data.train
    batch_sizes = [b for b in BATCH_SIZES if b <= data.num_examples]
    rows = []
    ctx = context(cfg.workers.start)
    specs = expand(cfg.devices)
    measured = {spec.group: spec for spec in reversed(specs)}  # each group's first worker
    # the step it times, which a run on it must take (engines/virtual/mix.py)
    step = resolved_step(problem.build_model(cfg.model, cfg.seed), cfg.optim.step, cfg.optim)
    for spec in sorted(measured.values(), key=lambda s: s.rank):
        master = SharedMaster.initial(cfg.model, problem, cfg.seed)
        state = SharedState.create(data, master, None, len(specs), ctx)
        results = ctx.Queue()
        environment = dict(os.environ)
        proc = ctx.Process(target=guarded, args=(_measure, environment, spec, cfg, problem, state,
                                                 batch_sizes, seconds, results), daemon=True)
        others = [ctx.Process(target=guarded, args=(_step_along, environment, s, cfg, problem,
                                                    state), daemon=True)
                  for s in specs if s is not spec]
        for p in [*others, proc]:
            p.start()
        # a start or a first step, then one batch size's steps: measured for ``seconds``
        wait_s = FIRST_STEP_FACTOR * cfg.workers.stall_s + seconds
        try:
            while (item := _next(results, wait_s)) is not None:
                if isinstance(item, str):
                    raise RuntimeError(f"calibrating group '{spec.group}' failed: {item}")
                batch_size, per_s, ms, comm_ms = item
                rows.append({"group": spec.group, "device": spec.device, "label": spec.label,
                             "threads": spec.threads, "batch_size": batch_size,
                             "examples_per_s": per_s, "ms_per_step": ms,
                             "comm_ms_per_step": comm_ms, "slowdown": spec.slowdown,
                             "step": step})
        finally:
            state.signals.stop.set()
            _end([*others, proc], cfg.workers.stall_s)
    exchange: dict[str, Any] = dict.fromkeys(EXCHANGE_COLUMNS)
    if len(specs) > 1:
        exchange = _measure_exchange(rows, cfg, specs, problem, data, EXCHANGE_SECONDS * seconds)
    return [{**row, **exchange} for row in rows]


def save(rows: list[dict], cfg: RunConfig) -> Path:
    import pandas as pd

    folder = Path(cfg.results_dir) / "calibration"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{model_label(cfg.model)}_"
                     f"{dataset_label(cfg.dataset)}_{cfg.devices.name}.csv")
    write_csv(path, pd.DataFrame(rows))
    return path
