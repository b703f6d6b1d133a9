"""Sections a and b: hetsgd's worker step against a textbook PyTorch loop, and what the loop
around the step costs."""

from __future__ import annotations

import math
import threading
import time
from contextlib import AbstractContextManager, nullcontext

import torch

from hetsgd.config import RunConfig, to_run_config
from hetsgd.engines.batches import EPOCH_SEED_STRIDE
from hetsgd.engines.common.cursor import EpochCursor
from hetsgd.engines.common.memory import SharedData
from hetsgd.model.architectures import build_model
from hetsgd.model.losses import loss_fn
from hetsgd.model.problem import Problem
from scripts.bench import inprocess
from scripts.bench.jobs import Jobs, compose_config
from scripts.bench.section import Section

STEP_REPEATS = 3
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


def _hetsgd_loop(cfg: RunConfig, problem: Problem, data: SharedData,
                 around: AbstractContextManager = nullcontext()) -> tuple[float, int, torch.Tensor]:
    """Time ``Worker.run`` in-process over a fresh master and cursor (inside ``around``, e.g.
    a profiler): (seconds, steps, params)."""
    worker = inprocess.worker(cfg, problem, data)
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
        problem, shared = inprocess.training_data(jobs.data)
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
    problem, shared = inprocess.training_data(jobs.data)
    cfg = _step_config(jobs.data, "logreg", 1, LOOP_STEPS, shared.num_examples)
    worker = inprocess.worker(cfg, problem, shared)
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
