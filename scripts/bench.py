"""`make bench`: hetsgd's speed as ratios measured side by side in one run.

Absolute times on a shared or CPU-only machine say little, so every measurement pairs two
configurations run back to back on the same machine and reports their ratio; the absolute numbers
go to ``bench.json`` too, labelled with the machine. Nothing here is a threshold: the bench reports.

a. hetsgd's worker step vs a plain ``torch.optim.SGD`` loop (in-process, one thread, mlp_paper and
   mlp at batch 1/16/256/4096; goals 1.5/1.2/1.0/1.0x the plain loop's examples/s)
b. the loop around the step: claiming, counting, the stop flag (goal: under 5 µs a step)
c. Hogwild over 1 and 2 worker processes (examples/s; goal: 2 workers >= 1.8x one), beside
   2 lone workers with a model each and on one shared model (what sharing the weights costs)
d. memory: the data and the master exist once, however many workers (USS per process; goal:
   the coordinator's rise while loading and evaluating <= 1.5x the training data)
e. time to a common training loss for each algorithm, as a ratio to sync
f. the utilization sampler's overhead (monitor.interval_s 0.5 vs 0.05)
g. the virtual-clock engine's own cost: one worker's examples per real second simulated vs real
   (mlp_paper and mlp at batch 1 and 16; goal: simulated >= 0.9x real), and the costly case, 48
   simulated one-example Hogwild workers: real seconds per virtual second and per 1,000 updates

A ratio below its goal says so, with (for the step) the profile that explains it. ``--quick``
(``make bench-quick``) runs a-d and g with 2 s training runs.

Runs use w8a when the file is at hand (``$HETSGD_W8A``, see scripts/w8a_path.py, or the data cache),
else a synthetic set of w8a's shape. ``--seconds`` (or ``$HETSGD_BENCH_SECONDS``) sets the budget of
each training run; results go to ``$HETSGD_RESULTS/bench/<time>/`` (default ``results/``).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pandas as pd
import psutil
import torch
from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from w8a_path import W8A, cache_name  # scripts/: $HETSGD_W8A and its default

from hetsgd.config import RunConfig, compose_run, to_run_config
from hetsgd.data import source_info
from hetsgd.devices import expand
from hetsgd.engines.shared_memory.batches import EPOCH_SEED_STRIDE
from hetsgd.engines.shared_memory.cursor import EpochCursor
from hetsgd.engines.shared_memory.memory import SharedData, SharedMaster
from hetsgd.engines.shared_memory.state import SharedState
from hetsgd.engines.shared_memory.worker import Worker
from hetsgd.model.architectures import build_model
from hetsgd.model.losses import loss_fn
from hetsgd.model.problem import Problem
from hetsgd.outputs.metrics import crossing, normalized_loss
from hetsgd.outputs.run_directory import environment
from hetsgd.runs import runner
from hetsgd.runs.setup import load_run_data

# w8a's shape (49,749 + 14,951 examples, 300 features), dense, when the real file is absent
W8A_LIKE = ("dataset=synthetic", "dataset.n_samples=64700", "dataset.n_features=300")
STEP_REPEATS = 3
MEMORY_SET = ("dataset=synthetic", "dataset.n_samples=300000", "dataset.n_features=400")
MEMORY_NEEDS_BYTES = 4 * 2**30  # the memory run needs about 2 GiB; keep a margin
# the coordinator's peak while loading and evaluating, above its USS before the run: at most this
# many times the training data (its shared copy, the test part, and a few blocks in flight)
MEMORY_GOAL = 1.5
ALGORITHMS = (("sync", "single_cpu"), ("hogwild", "cpu"), ("hogbatch", "emulated"),
              ("adaptive", "emulated"))
FAST_EVAL = ("eval.every_s=1000", "eval.every_epochs=null")  # speed runs: first and last snapshot
# Time-to-target runs: on w8a the normalized loss reaches 0.9 in about 0.1 s, so a short budget
# with a snapshot every 20 ms (each costs an evaluation after training) resolves it.
TARGET_BUDGET_S = 2.0
TARGET_SNAPSHOTS = 100
MiB = 2**20

console = Console(width=None if sys.stdout.isatty() else 132)


# -- sections: one measurement each, rendered to the terminal, markdown and JSON ---------------


@dataclass
class Section:
    title: str
    explanation: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)  # absolute numbers, for bench.json
    error: str | None = None
    load: str = ""  # how busy the rest of the machine was meanwhile
    notes: list[str] = field(default_factory=list)  # e.g. the profile behind a missed goal
    key: str = ""  # its letter in BENCHES, set when it is measured

    def table(self) -> Table:
        # escaped: an override such as devices.only=[cpu] is not rich markup
        table = Table(*self.columns, title=f"{self.key}. {self.title}",
                      caption=escape("\n".join([f"{self.explanation} {self.load}", *self.notes])),
                      title_justify="left",
                      caption_justify="left")
        for row in self.rows:
            table.add_row(*row)
        if self.error:
            table.add_row(f"[red]failed: {self.error}[/red]", *[""] * (len(self.columns) - 1))
        return table

    def markdown(self) -> str:
        lines = [f"## {self.key}. {self.title}", "", f"{self.explanation} {self.load}", "",
                 "| " + " | ".join(self.columns) + " |",
                 "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        lines += [""] + [f"- {note}" for note in self.notes] if self.notes else []
        if self.error:
            lines += ["", f"**failed:** {self.error}"]
        return "\n".join(lines) + "\n"


def _ratio(value: float | None, baseline: float | None) -> float | None:
    return value / baseline if value is not None and baseline else None


def _fmt(value: float | None, spec: str = ".3g", unit: str = "") -> str:
    return "—" if value is None else f"{value:{spec}}{unit}"


# -- how busy the rest of the machine was --------------------------------------------------------


class OtherLoad:
    """CPU time that processes outside this bench used meanwhile, as a share of all cores.

    Ratios need a quiet machine; this says whether it was. Ours is this process and the children
    it reaped (the workers); the rest of the system's busy time is someone else's, and steal is
    the hypervisor's (a noisy neighbour on a VM)."""

    def __enter__(self) -> OtherLoad:
        self.start = self._read()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float, float]:
        cpu, mine = psutil.cpu_times(), os.times()
        busy = sum(getattr(cpu, name, 0.0) for name in ("user", "nice", "system", "irq",
                                                         "softirq"))
        ours = mine.user + mine.system + mine.children_user + mine.children_system
        return time.perf_counter(), busy, ours, getattr(cpu, "steal", 0.0)

    def shares(self) -> tuple[float, float]:
        """(others' share, steal share) of the cores' time over the block."""
        (t0, busy0, ours0, steal0), (t1, busy1, ours1, steal1) = self.start, self.end
        capacity = max((t1 - t0) * psutil.cpu_count(), 1e-9)
        return max(0.0, (busy1 - busy0) - (ours1 - ours0)) / capacity, (steal1 - steal0) / capacity


# -- running hetsgd jobs in-process, as `hetsgd run` does ---------------------------------------


def compose_config(*overrides: str) -> DictConfig:
    return compose_run(["progress=false", *overrides])


@dataclass
class Job:
    summary: dict[str, Any]
    workers: pd.DataFrame
    convergence: pd.DataFrame
    others: float  # share of the CPUs that other processes used during the run


class Jobs:
    """Runs jobs through ``hetsgd.runs.runner.run`` into a temporary folder; a failed run raises."""

    def __init__(self, folder: Path, data: tuple[str, ...]) -> None:
        self.folder, self.data, self.count = folder, data, 0

    def run(self, *overrides: str) -> Job:
        cfg = compose_config(*self.data, *overrides)
        self.count += 1
        run_dir = self.folder / f"run{self.count:02d}"
        with OtherLoad() as load:
            summary = runner.run(to_run_config(cfg), run_dir, cfg)
        if summary["status"] != "completed":
            raise RuntimeError(f"{' '.join(overrides)}: {summary['status']}: {summary['error']}")
        return Job(summary, pd.read_csv(run_dir / "workers.csv"),
                   pd.read_csv(run_dir / "convergence.csv"), load.shares()[0])


def choose_data(tmp: Path) -> tuple[tuple[str, ...], str]:
    """w8a from ``$HETSGD_W8A`` (through a temporary data cache) or the cache, else w8a-like."""
    if W8A.exists():
        home = tmp / "data"
        home.mkdir()
        (home / cache_name()).symlink_to(W8A.resolve())
        os.environ["HETSGD_DATA"] = str(home)
        return ("dataset=w8a",), f"w8a ({W8A})"
    if source_info("w8a").cached:
        return ("dataset=w8a",), "w8a (data cache)"
    return W8A_LIKE, "synthetic, w8a's shape (dense; the w8a file is not here)"


# -- a. the worker step vs a plain PyTorch loop ---------------------------------------------------

STEP_MODELS = ("mlp_paper", "mlp")
# hetsgd / plain examples/s on one thread: the goals by batch size
STEP_GOALS = {1: 1.5, 16: 1.2, 256: 1.0, 4096: 1.0}
STEP_PROFILE_OPS = 6  # operators shown in the profile of a ratio below its goal


def _step_config(data: tuple[str, ...], model: str, batch: int, steps: int,
                 num_examples: int) -> RunConfig:
    """One single-threaded CPU worker on the bench's data, for ``steps`` steps of ``batch``."""
    return to_run_config(compose_config(
        "algo=sync", "devices=single_cpu", *data, f"model={model}", "optim.lr=0.01",
        "devices.groups.cpu.threads=1", f"devices.groups.cpu.batch_size={batch}",
        f"budget.epochs={steps * batch / num_examples}"))


def _training_data(data: tuple[str, ...]) -> tuple[Problem, SharedData]:
    """The bench's training set in shared memory, as a run loads it."""
    run_data = load_run_data(to_run_config(compose_config(*data)), progress=False)
    return run_data.problem, run_data.train


def _worker(cfg: RunConfig, problem: Problem, data: SharedData,
            master: SharedMaster | None = None) -> Worker:
    """The one worker of ``cfg``'s mix, in this process, with a cursor of its own over ``data``
    (``cfg.budget.epochs`` of it), on ``master`` (by default a fresh initial model)."""
    master = master or SharedMaster.initial(cfg.model, problem, cfg.seed)
    state = SharedState.create(data, master, cfg.budget.epochs, 1, mp.get_context("spawn"))
    spec, = expand(cfg.devices)
    return Worker(spec, cfg, problem, state)


def _hetsgd_loop(cfg: RunConfig, problem: Problem, data: SharedData,
                 around: AbstractContextManager = nullcontext()) -> tuple[float, int, torch.Tensor]:
    """Time ``Worker.run`` in-process over a fresh master and cursor (inside ``around``, e.g.
    a profiler): (seconds, steps, params)."""
    worker = _worker(cfg, problem, data)
    with around:
        start = time.perf_counter()
        worker.run()
        seconds = time.perf_counter() - start
    state = worker.state
    return seconds, int(state.counters.row(0)["updates"]), state.master.params.clone()


def _plain_loop(cfg: RunConfig, problem: Problem, data: SharedData
                ) -> tuple[float, int, torch.Tensor]:
    """The same model, data order and batches through a textbook torch.optim.SGD loop."""
    cursor = EpochCursor(data.num_examples, cfg.budget.epochs, threading.Lock())
    orders: dict[int, torch.Tensor] = {}
    batches = []
    while (claim := cursor.claim(cfg.devices.groups["cpu"].batch_size)) is not None:
        epoch, begin, size = claim
        if epoch not in orders:  # the worker's seeded permutation of each epoch
            generator = torch.Generator().manual_seed(cfg.seed * EPOCH_SEED_STRIDE + epoch)
            orders[epoch] = torch.randperm(data.num_examples, generator=generator)
        batches.append(orders[epoch][begin:begin + size])
    model = build_model(cfg.model, problem.num_features, problem.num_outputs, None, cfg.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr)
    criterion = loss_fn(problem.task)
    start = time.perf_counter()
    for idx in batches:
        optimizer.zero_grad()
        loss = criterion(model(data.x.rows(idx)), data.y.index_select(0, idx))
        loss.backward()
        optimizer.step()
        loss.item()
    seconds = time.perf_counter() - start
    return seconds, len(batches), torch.cat([p.detach().flatten() for p in model.parameters()])


def _steps_for(seconds: float, data: tuple[str, ...], model: str, batch: int,
               problem: Problem, shared: SharedData) -> int:
    """Steps that take about ``seconds`` in the plain loop (from a short probe run)."""
    probe = 3
    spent, count, _ = _plain_loop(_step_config(data, model, batch, probe, shared.num_examples),
                                  problem, shared)
    return max(probe, round(seconds / (spent / count)))


def _profile(cfg: RunConfig, problem: Problem, data: SharedData) -> str:
    """Where hetsgd's loop spends its time: the operators with the most self CPU time."""
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    _, steps, _ = _hetsgd_loop(cfg, problem, data, around=profiler)
    events = sorted(profiler.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    return ", ".join(f"{e.key} {e.self_cpu_time_total / steps:.0f} µs/step "
                     f"({e.self_cpu_time_total / total:.0%})" for e in events[:STEP_PROFILE_OPS])


def bench_step(jobs: Jobs, seconds: float) -> Section:
    timing_s = min(seconds, 5.0) / 5
    section = Section(
        "the worker step vs a plain PyTorch loop (CPU, 1 thread, in-process)",
        "Examples/s of hetsgd's Worker.run (claim from the cursor, gather, step on the flat "
        "master, counters; optim.step=auto, the fused MLP step) over a textbook "
        "torch.optim.SGD loop (zero_grad, forward, backward, step, loss.item()) on the same "
        f"model, data and batches, each timing about {timing_s:g} s; best of "
        f"{STEP_REPEATS} interleaved repeats. Ratio > 1: hetsgd is faster. max |Δ|: largest "
        "parameter difference at the end (float32 rounding grows with the number of steps).",
        ["model", "batch", "steps", "plain µs/step", "hetsgd µs/step", "hetsgd / plain",
         "goal", "max |Δ|"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        problem, shared = _training_data(jobs.data)
        for model in STEP_MODELS:
            for batch, goal in STEP_GOALS.items():
                steps = _steps_for(timing_s, jobs.data, model, batch, problem, shared)
                cfg = _step_config(jobs.data, model, batch, steps, shared.num_examples)
                best = {"plain": math.inf, "hetsgd": math.inf}
                for _repeat in range(STEP_REPEATS):
                    ours_s, count, ours = _hetsgd_loop(cfg, problem, shared)
                    plain_s, plain_count, theirs = _plain_loop(cfg, problem, shared)
                    assert count == plain_count, (count, plain_count)
                    best["hetsgd"] = min(best["hetsgd"], ours_s / count)
                    best["plain"] = min(best["plain"], plain_s / count)
                diff = float((ours - theirs).abs().max())
                ratio = best["plain"] / best["hetsgd"]
                met = ratio >= goal
                section.rows.append([model, str(batch), str(count), f"{best['plain'] * 1e6:.0f}",
                                     f"{best['hetsgd'] * 1e6:.0f}", f"{ratio:.2f}x",
                                     f">= {goal:g}" + ("" if met else ", not met"),
                                     f"{diff:.1e}"])
                section.data[f"{model}_batch{batch}"] = {
                    "steps": count, "plain_s_per_step": best["plain"],
                    "hetsgd_s_per_step": best["hetsgd"], "hetsgd_over_plain": ratio,
                    "goal": goal, "max_param_diff": diff}
                if not met:
                    section.notes.append(f"{model} at batch {batch}, {ratio:.2f}x: "
                                         f"{_profile(cfg, problem, shared)}")
    finally:
        torch.set_num_threads(threads)
    return section


# -- b. the loop around the step ---------------------------------------------------------------

LOOP_GOAL_US = 5.0
LOOP_STEPS = 200_000


def bench_loop(jobs: Jobs, _seconds: float) -> Section:
    section = Section(
        "the loop around the step: claim, count, check the stop flag",
        "Worker.run in-process with its step replaced by one that does nothing, on one worker "
        f"at batch 1 for {LOOP_STEPS:,} steps: what every step costs besides its own work "
        "(claiming a chunk from the cursor under its lock, the counters, the stop flag, the "
        "clock, the periodic loss read).",
        ["steps", "µs/step", "goal"])
    problem, shared = _training_data(jobs.data)
    cfg = _step_config(jobs.data, "logreg", 1, LOOP_STEPS, shared.num_examples)
    worker = _worker(cfg, problem, shared)
    loss = torch.zeros(())
    worker.step = lambda epoch, start, size: (loss, 0.0)  # type: ignore[method-assign]
    started = time.perf_counter()
    worker.run()
    seconds = time.perf_counter() - started
    steps = int(worker.state.counters.row(0)["updates"])
    per_step = seconds / steps * 1e6
    section.rows.append([f"{steps:,}", f"{per_step:.2f}", f"< {LOOP_GOAL_US:g}"
                         + ("" if per_step < LOOP_GOAL_US else ", not met")])
    section.data = {"steps": steps, "us_per_step": per_step, "goal_us": LOOP_GOAL_US}
    return section


# -- c. Hogwild scaling over processes -----------------------------------------------------------

SCALING_ROUNDS = 2  # 1 worker, 2 workers, 1, 2, ...: the spread between rounds shows the noise
SCALING_GOAL = 1.8  # 2 workers' examples/s over one worker's
SCALING_RUN = ("algo=hogwild", "devices=cpu", "devices.groups.cpu.threads=1",
               "devices.groups.cpu.batch_size=32", "model=mlp", "model.hidden=[256,256]")


def _scaling_config(data: tuple[str, ...], epochs: float) -> RunConfig:
    return to_run_config(compose_config(*data, *SCALING_RUN, "devices.groups.cpu.count=1",
                                        f"budget.epochs={epochs}"))


def _lone_worker(data: tuple[str, ...], epochs: float, master: SharedMaster | None, start: Any,
                 done: Any) -> None:
    """A Hogwild worker with a cursor and data of its own, in a process of its own, on
    ``master`` (shared with other lone workers) or, if None, a model of its own. Waits at
    ``start``; puts (end time, examples) on ``done``."""
    torch.set_num_threads(1)
    problem, shared = _training_data(data)
    worker = _worker(_scaling_config(data, epochs), problem, shared, master)
    start.wait()
    worker.run()
    done.put((time.monotonic(), int(worker.state.counters.row(0)["examples"])))


def _lone_workers(data: tuple[str, ...], count: int, epochs: float, share_model: bool) -> float:
    """Examples/s of ``count`` lone workers run at once, ``epochs`` each: every example they
    trained over the time from their common start to the last one's end. Copies that share
    nothing show what the machine gives that many processes (cores that share caches, memory
    bandwidth or a physical core); copies that share only the model show what Hogwild's writes
    to the same weights from several cores cost."""
    master = None
    if share_model:
        cfg = _scaling_config(data, epochs)
        master = SharedMaster.initial(cfg.model, _training_data(data)[0], cfg.seed)
    context = mp.get_context("spawn")
    start, done = context.Barrier(count + 1), context.Queue()
    processes = [context.Process(target=_lone_worker, args=(data, epochs, master, start, done))
                 for _ in range(count)]
    for process in processes:
        process.start()
    start.wait()
    began = time.monotonic()
    ends = [done.get(timeout=600) for _ in processes]
    for process in processes:
        process.join()
    return sum(examples for _, examples in ends) / (max(end for end, _ in ends) - began)


def bench_hogwild(jobs: Jobs, seconds: float) -> Section:
    section = Section(
        "Hogwild scaling over worker processes",
        "examples/s of algo=hogwild devices=cpu with 1 and 2 single-threaded workers (mlp "
        f"[256,256], batch 32, same time budget), {SCALING_ROUNDS} interleaved rounds; and of "
        "2 lone workers at once (no coordinator; each its own cursor and data, the epochs one "
        "worker trains in that budget), with a model each (what this machine gives two "
        "processes that share nothing) and on one shared model (what Hogwild's writes to the "
        "same weights from two cores cost). busy / wait: share of the training time each "
        "worker spent in its step / waiting for the cursor's lock. others' CPU: share of the "
        "CPUs other processes used during that run.",
        ["round", "workers", "examples/s", "vs 1 worker", "busy per worker", "wait per worker",
         "others' CPU"])
    rounds: list[float | None] = []
    lone: dict[str, list[float | None]] = {}
    for round_ in range(1, SCALING_ROUNDS + 1):
        speeds = {}
        for count in (1, 2):
            job = jobs.run(*SCALING_RUN, f"devices.groups.cpu.count={count}",
                           "budget.epochs=null", f"budget.seconds={seconds}", *FAST_EVAL)
            eps, time_s = job.summary["examples_per_s"], job.summary["time_s"]
            speeds[count] = eps
            section.rows.append([str(round_), str(count), f"{eps:,.0f}",
                                 f"{_ratio(eps, speeds[1]):.2f}x",
                                 " ".join(f"{b:.0%}" for b in job.workers["busy_s"] / time_s),
                                 " ".join(f"{w:.1%}" for w in job.workers["wait_s"] / time_s),
                                 f"{job.others:.0%}"])
            section.data[f"round{round_}_workers{count}"] = {
                "examples_per_s": eps, "time_s": time_s, "others_cpu_share": job.others,
                "workers": job.workers.to_dict("records")}
        train_size = job.summary["examples"] / job.summary["epochs"]
        for label, share_model in (("2 lone, own models", False), ("2 lone, one model", True)):
            eps = _lone_workers(jobs.data, 2, speeds[1] * seconds / train_size, share_model)
            section.rows.append([str(round_), label, f"{eps:,.0f}",
                                 f"{_ratio(eps, speeds[1]):.2f}x", "", "", ""])
            lone.setdefault(label, []).append(_ratio(eps, speeds[1]))
        rounds.append(_ratio(speeds[2], speeds[1]))
    met = min(r or 0.0 for r in rounds) >= SCALING_GOAL
    section.notes.append(f"2 workers over 1: {', '.join(f'{r:.2f}x' for r in rounds if r)}; goal "
                         f">= {SCALING_GOAL:g}x in every round: {'met' if met else 'NOT met'}. "
                         + "; ".join(f"{label} over 1 worker: "
                                     f"{', '.join(f'{r:.2f}x' for r in ratios if r)}"
                                     for label, ratios in lone.items()) + ".")
    section.data.update(ratio_2_over_1=rounds, lone_2_over_1=lone, goal=SCALING_GOAL, met=met)
    return section


# -- d. memory: data and master once -------------------------------------------------------------


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
            try:  # workers are spawned interpreters; skip multiprocessing's resource tracker
                if any("spawn_main" in part for part in child.cmdline()):
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
    code = ("import psutil, torch, hetsgd.engines.shared_memory.worker; "
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


# -- e. time to a common loss per algorithm -------------------------------------------------------


def _time_to(job: Job, l0: float, best: float, target: float) -> float | None:
    """Time to `target` with every run normalized by the same initial and best loss."""
    frame = job.convergence
    return crossing(frame["time_s"], normalized_loss(frame["train_loss"], l0, best), target)


def bench_time_to_target(jobs: Jobs, seconds: float) -> Section:
    seconds = min(seconds, TARGET_BUDGET_S)
    section = Section(
        "time to a normalized loss, each algorithm on its default mix",
        f"Same data, model (mlp) and time budget ({seconds:g} s), a snapshot every "
        f"{seconds / TARGET_SNAPSHOTS * 1000:.0f} ms. "
        "'L0/10': the summary's time to a tenth of the initial training loss (the same initial "
        "model, so the same absolute loss, in every run); '0.9'/'0.99' common: every run "
        "normalized by the best loss of all four, so a run that stalls early does not look "
        "fast. Speedup: sync's time / this time; ex/s: examples/s; final loss: training loss "
        "at the end.",
        ["algo", "devices", "ex/s", "L0/10", "speedup", "0.9 common", "speedup",
         "0.99 common", "speedup", "final loss", "others' CPU"])
    runs = {algo: jobs.run(f"algo={algo}", f"devices={devices}", "model=mlp",
                           "budget.epochs=null", f"budget.seconds={seconds}",
                           f"eval.every_s={seconds / TARGET_SNAPSHOTS}", "eval.every_epochs=null")
            for algo, devices in ALGORITHMS}
    l0 = runs["sync"].convergence["train_loss"].iloc[0]  # the same initial model in every run
    best = min(job.convergence["train_loss"].min() for job in runs.values())
    times = {algo: {"L0/10": list(job.summary["time_to_loss"].values())[-1],
                    "0.9 common": _time_to(job, l0, best, 0.9),
                    "0.99 common": _time_to(job, l0, best, 0.99)}
             for algo, job in runs.items()}
    for algo, devices in ALGORITHMS:
        summary = runs[algo].summary
        row = [algo, summary["devices"], f"{summary['examples_per_s']:,.0f}"]
        for kind, value in times[algo].items():
            row += [_fmt(value, ".2f", " s"), _fmt(_ratio(times["sync"][kind], value), ".2f", "x")]
        section.rows.append(row + [f"{summary['final']['train_loss']:.4f}",
                                   f"{runs[algo].others:.0%}"])
        section.data[algo] = {"devices": devices, "examples_per_s": summary["examples_per_s"],
                              "seconds_to": times[algo],
                              "speedup": {kind: _ratio(times["sync"][kind], value)
                                          for kind, value in times[algo].items()},
                              "final": summary["final"], "update_share": summary["update_share"],
                              "others_cpu_share": runs[algo].others}
    return section


# -- f. sampler overhead -------------------------------------------------------------------------

SAMPLER_ROUNDS = 2


def bench_sampler(jobs: Jobs, seconds: float) -> Section:
    section = Section(
        "utilization sampler overhead",
        "The same sync job (single_cpu, mlp) with monitor.interval_s 0.5 (default) and 0.05, "
        f"{SAMPLER_ROUNDS} interleaved rounds: examples/s. Ratio < 1: sampling 10x as often "
        "costs training speed.",
        ["round", "monitor.interval_s", "examples/s", "vs 0.5 s", "others' CPU"])
    ratios = []
    for round_ in range(1, SAMPLER_ROUNDS + 1):
        speeds = {}
        for interval in (0.5, 0.05):
            job = jobs.run("algo=sync", "devices=single_cpu", "model=mlp", "budget.epochs=null",
                           f"budget.seconds={seconds}", f"monitor.interval_s={interval}",
                           *FAST_EVAL)
            speeds[interval] = eps = job.summary["examples_per_s"]
            section.rows.append([str(round_), str(interval), f"{eps:,.0f}",
                                 f"{_ratio(eps, speeds[0.5]):.3f}x", f"{job.others:.0%}"])
            section.data[f"round{round_}_interval{interval}"] = {"examples_per_s": eps,
                                                                 "others_cpu_share": job.others}
        ratios.append(_ratio(speeds[0.05], speeds[0.5]))
    section.data["ratio_0.05_over_0.5"] = ratios
    return section


# -- g. the virtual engine's own cost ------------------------------------------------------------

# (model, batch) of the one-worker runs: the paper's net and mlp, at Hogwild's batch sizes
ENGINE_RUNS = (("mlp_paper", 1), ("mlp_paper", 16), ("mlp", 1), ("mlp", 16))
ENGINE_GOAL = 0.9  # simulated examples per real second over the real engine's
ENGINE_REPEATS = 2  # interleaved; the best of each
ENGINE_PROFILE = "xeon_e5_2686v4_core"  # any profile: virtual times do not enter these ratios
# the costly case: Ma & Rusu's 48 one-example Hogwild workers, one event per update
MANY_WORKERS = ("algo=hogwild", "devices=paper_hogbatch_v100", "devices.only=[cpu]",
                "optim.lr=0.01")


@contextmanager
def engine_seconds() -> Iterator[list[float]]:
    """Real seconds each run's engine spends in ``run`` (for the virtual engine: the whole
    simulation, its first and last snapshot included), appended as the runs end."""
    spent: list[float] = []
    build = runner.coordinator

    def timed(*args: Any, **kwargs: Any) -> Any:
        engine = build(*args, **kwargs)
        run = engine.run

        def run_timed(*run_args: Any, **run_kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return run(*run_args, **run_kwargs)
            finally:
                spent.append(time.perf_counter() - started)
        engine.run = run_timed
        return engine

    with patch.object(runner, "coordinator", timed):
        yield spent


def bench_virtual_engine(jobs: Jobs, seconds: float) -> Section:
    timing_s = min(seconds, 5.0) / 2
    section = Section(
        "the virtual engine's own cost over the training math it runs",
        "The same one-worker run (algo=sync devices=single_cpu, 1 thread, w8a, lr 0.01; the "
        f"updates the real engine makes in {timing_s:g} s) on the real engine and simulated "
        f"(devices.simulated=true, profile {ENGINE_PROFILE}): examples of training math per real "
        "second, the real engine's over its own training clock (its worker process started), "
        "the simulated one's over the real seconds its engine ran. Best of "
        f"{ENGINE_REPEATS} interleaved repeats. sim / real < 1: the share the virtual clock's "
        "events, heap and bookkeeping cost. Last rows, the costly case: paper_hogbatch_v100's "
        "48 one-example Hogwild workers alone (devices.only=[cpu]), run for as many updates as "
        "the batch-1 rows and for twice as many; the difference between the two gives real "
        "seconds per virtual second and per 1,000 updates, and that per-update cost over one "
        "simulated worker's (whose model is in another state: see the training losses in the "
        "notes).",
        ["run", "model", "batch", "updates", "examples/s (real s)", "sim / real", "goal",
         "real s / virtual s", "real ms / 1k updates", "vs 1 worker"])
    with engine_seconds() as spent:
        alone = {}  # model -> its simulated batch-1 run, and an update's real seconds there
        for model, batch in ENGINE_RUNS:
            measured = _one_worker(section, jobs, spent, model, batch, timing_s)
            if batch == 1:
                alone[model] = measured
        for model, (job, per_update) in alone.items():
            _many_workers(section, jobs, spent, model, job, per_update)
    return section


def _one_worker(section: Section, jobs: Jobs, spent: list[float], model: str, batch: int,
                timing_s: float) -> tuple[Job, float]:
    """Rows of the one-worker run real and simulated; returns the simulated run and the real
    seconds of one of its updates."""
    run = ("algo=sync", "devices=single_cpu", f"model={model}", "optim.lr=0.01",
           "devices.groups.cpu.threads=1", f"devices.groups.cpu.batch_size={batch}", *FAST_EVAL)
    # the first real run sets the budget of the others: what it trained in timing_s
    budget = ("budget.epochs=null", f"budget.seconds={timing_s}")
    best = {"real": 0.0, "simulated": 0.0}
    for _repeat in range(ENGINE_REPEATS):
        real = jobs.run(*run, *budget)
        best["real"] = max(best["real"], real.summary["examples_per_s"])
        budget = (f"budget.epochs={real.summary['epochs']}",)
        simulated = jobs.run(*run, *budget, "devices.simulated=true",
                             f"devices.groups.cpu.profile={ENGINE_PROFILE}")
        best["simulated"] = max(best["simulated"], simulated.summary["examples"] / spent[-1])
    ratio = best["simulated"] / best["real"]
    updates = simulated.summary["updates"]
    met = ratio >= ENGINE_GOAL
    section.rows += [
        ["real", model, str(batch), f"{updates:,}", f"{best['real']:,.0f}", "", "", "",
         f"{batch / best['real'] * 1e6:.1f}", ""],
        ["simulated", model, str(batch), f"{updates:,}", f"{best['simulated']:,.0f}",
         f"{ratio:.2f}x", f">= {ENGINE_GOAL:g}" + ("" if met else ", not met"),
         f"{spent[-1] / simulated.summary['time_s']:.2f}",
         f"{batch / best['simulated'] * 1e6:.1f}", ""]]
    section.data[f"{model}_batch{batch}"] = {
        "updates": updates, "real_examples_per_s": best["real"],
        "simulated_examples_per_real_s": best["simulated"], "simulated_over_real": ratio,
        "goal": ENGINE_GOAL, "met": met}
    return simulated, batch / best["simulated"]


def _many_workers(section: Section, jobs: Jobs, spent: list[float], model: str, alone: Job,
                  alone_per_update: float) -> None:
    """The row of 48 simulated one-example workers, for as many updates as the lone worker's
    run ``alone`` and for twice as many: their difference is the steady cost per update, without
    what both pay once (building every worker)."""
    runs = [jobs.run(*MANY_WORKERS, f"model={model}",
                     f"budget.epochs={scale * alone.summary['epochs']}", *FAST_EVAL)
            for scale in (1, 2)]
    real_s = spent[-1] - spent[-2]
    updates = runs[1].summary["updates"] - runs[0].summary["updates"]
    virtual_s = runs[1].summary["time_s"] - runs[0].summary["time_s"]
    per_update = real_s / updates
    fixed_s = spent[-2] - runs[0].summary["updates"] * per_update
    section.rows.append(["simulated, 48 workers", model, "1", f"{updates:,}",
                         f"{updates / real_s:,.0f}", "", "", f"{real_s / virtual_s:.1f}",
                         f"{per_update * 1e6:.1f}", f"{per_update / alone_per_update:.2f}x"])
    section.notes.append(
        f"48 workers, {model}: the shorter run took {fixed_s:.2f} s more than its updates at "
        "that cost (building every worker, and first steps slower or faster than later ones); "
        f"training loss at the end {runs[1].summary['final']['train_loss']:.3g}, the lone "
        f"worker's {alone.summary['final']['train_loss']:.3g}")
    section.data[f"{model}_48_workers"] = {
        "updates": updates, "real_s": real_s, "virtual_s": virtual_s,
        "real_s_per_virtual_s": real_s / virtual_s, "real_s_per_1000_updates": 1000 * per_update,
        "over_one_worker_per_update": per_update / alone_per_update,
        "shorter_run_fixed_s": fixed_s}


# -- the whole bench -----------------------------------------------------------------------------

Bench = Callable[[Jobs, float], Section]
BENCHES: dict[str, tuple[Bench, str]] = {
    "a": (bench_step, "worker step vs plain loop"), "b": (bench_loop, "loop overhead"),
    "c": (bench_hogwild, "Hogwild scaling"), "d": (bench_memory, "memory"),
    "e": (bench_time_to_target, "time to target"), "f": (bench_sampler, "sampler overhead"),
    "g": (bench_virtual_engine, "virtual engine overhead")}
QUICK = "abcdg"  # `make bench-quick`: the sections with goals
QUICK_SECONDS = 2.0


def _measure(key: str, bench: Bench, name: str, jobs: Jobs, seconds: float) -> Section:
    """One measurement; a failure is recorded in its section and the bench goes on."""
    console.print(f"[bold]bench:[/bold] {name} ...")
    started = time.perf_counter()
    with OtherLoad() as load:
        try:
            section = bench(jobs, seconds)
        except Exception as exc:  # noqa: BLE001 - report it with the others, do not lose the rest
            section = Section(name, "", ["error"],
                              error=" ".join(f"{type(exc).__name__}: {exc}".split()))
    section.key = key
    others, steal = load.shares()
    section.load = (f"Meanwhile other processes used {others:.0%} of the CPUs"
                    + (f" and the hypervisor stole {steal:.0%}" if steal >= 0.005 else "")
                    + ("; a busy machine makes these ratios unreliable." if others + steal > 0.1
                       else "."))
    section.data.update(bench_seconds=time.perf_counter() - started, others_cpu_share=others,
                        steal_share=steal)
    return section


def write(out: Path, header: dict[str, Any], sections: list[Section]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report = dict(header, sections={s.key: asdict(s) for s in sections})
    (out / "bench.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    machine = header["machine"]
    intro = [f"# hetsgd bench, {header['time']}", "",
             f"Machine: {machine['cpu_model']}, {machine['cores']} usable cores, "
             f"GPUs: {', '.join(machine['gpus']) or 'none'}; torch {machine['torch']}. "
             f"Data: {header['data']}; {header['seconds']} s per training run. "
             "Ratios compare runs made side by side in this one bench; absolute numbers are "
             "in bench.json.", "", ""]
    (out / "bench.md").write_text("\n".join(intro) + "\n".join(s.markdown() for s in sections))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float,
                        default=float(os.environ.get("HETSGD_BENCH_SECONDS", 5)),
                        help="time budget of each training run (default 5, "
                             "or $HETSGD_BENCH_SECONDS)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default $HETSGD_RESULTS/bench/<time>)")
    parser.add_argument("--only", default="".join(BENCHES),
                        help="the sections to run, by key (e.g. --only d; default: all)")
    parser.add_argument("--quick", action="store_true",
                        help=f"sections {QUICK} with 2 s runs (`make bench-quick`)")
    args = parser.parse_args()
    if args.quick:
        args.only, args.seconds = QUICK, QUICK_SECONDS
    if unknown := set(args.only) - set(BENCHES):
        parser.error(f"--only: no section {', '.join(sorted(unknown))}")
    stamp = datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out = args.out or Path(os.environ.get("HETSGD_RESULTS", "results")) / "bench" / stamp
    started = time.perf_counter()
    header: dict[str, Any] = {"time": stamp, "machine": environment(), "seconds": args.seconds}
    sections: list[Section] = []
    with tempfile.TemporaryDirectory(prefix="hetsgd-bench-") as tmp:
        data, header["data"] = choose_data(Path(tmp))
        os.environ["HETSGD_RESULTS"] = str(Path(tmp) / "results")
        jobs = Jobs(Path(tmp) / "runs", data)
        for key, (bench, name) in BENCHES.items():
            if key not in args.only:
                continue
            sections.append(_measure(key, bench, name, jobs, args.seconds))
            console.print(sections[-1].table())
            console.print()
            header["total_s"] = time.perf_counter() - started
            write(out, header, sections)  # after each: a bench cut short keeps what it measured
    machine = header["machine"]
    console.print(f"{machine['cpu_model']}, {machine['cores']} cores; data: {header['data']}; "
                  f"{header['total_s']:.0f} s in all. Written: {out}/bench.json, bench.md")
    return 1 if any(s.error for s in sections) else 0


if __name__ == "__main__":  # workers are spawned: they import this file and must not run it
    sys.exit(main())
