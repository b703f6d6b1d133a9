"""Section g: the virtual-clock engine's own cost over the training math it runs."""

from __future__ import annotations

import time
from dataclasses import dataclass

from hetsgd import algorithms
from hetsgd.config import to_run_config
from hetsgd.engines.common.memory import SharedMaster
from hetsgd.engines.factory import build_engine
from hetsgd.observe.evaluate import Evaluator
from hetsgd.runs.setup import load_run_data
from hetsgd.workers import expand
from scripts.bench.jobs import FAST_EVAL, Jobs, compose_config
from scripts.bench.section import Section

# (model, batch) of the one-worker runs: the paper's net and mlp, at Hogwild's batch sizes
ENGINE_RUNS = (("mlp_paper", 1), ("mlp_paper", 16), ("mlp", 1), ("mlp", 16))
ENGINE_GOAL = 0.9  # simulated examples per real second over the real engine's
ENGINE_REPEATS = 2  # interleaved; the best of each
ENGINE_PROFILE = "xeon_e5_2686v4_core"  # any profile: virtual times do not enter these ratios
# the costly case: Ma & Rusu's 48 one-example Hogwild workers, one event per update
MANY_WORKERS = ("algo=hogwild", "devices=paper_hogbatch_v100", "devices.only=[cpu]",
                "optim.lr=0.01")


@dataclass
class Simulated:
    """A simulated run's training, its engine timed from outside."""

    real_s: float  # real seconds in the engine's run: the whole simulation, first and last snapshot
    time_s: float  # virtual seconds trained
    examples: int
    updates: int
    epochs: float
    train_loss: float  # at the end, as the run's evaluation would give it


def simulate(jobs: Jobs, *overrides: str) -> Simulated:
    """A simulated run made as the runner makes it, up to its engine, whose ``run`` alone is
    timed: the real cost of the virtual clock and of the training math it runs, without loading
    the data or evaluating (the runner times neither for us)."""
    cfg = to_run_config(compose_config(*jobs.data, *overrides))
    algorithm = algorithms.get(cfg.algo.name)
    plan = algorithm.plan(cfg, expand(cfg.devices))
    data = load_run_data(plan.cfg, progress=False, workers=plan.workers)
    master = SharedMaster.initial(plan.cfg.model, data.problem, plan.cfg.seed)
    engine = build_engine(plan, algorithm.hooks(plan), data.problem, data.train, master, None)
    started = time.perf_counter()
    training = engine.run(None)  # the virtual clock samples no process: its utilization is virtual
    real_s = time.perf_counter() - started
    if training.status != "completed":
        raise RuntimeError(f"{' '.join(overrides)}: {training.status}: {training.error}")
    last = training.snapshots[-1]
    final = Evaluator(plan.cfg, data.problem, data.train, data.test)(last.params, last.buffers)
    examples = int(sum(row["examples"] for row in training.counters))
    return Simulated(real_s, training.time_s, examples,
                     int(sum(row["updates"] for row in training.counters)),
                     examples / data.train.num_examples, final.train_loss)


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
    alone = {}  # model -> its simulated batch-1 run, and an update's real seconds there
    for model, batch in ENGINE_RUNS:
        measured = _one_worker(section, jobs, model, batch, timing_s)
        if batch == 1:
            alone[model] = measured
    for model, (run, per_update) in alone.items():
        _many_workers(section, jobs, model, run, per_update)
    return section


def _one_worker(section: Section, jobs: Jobs, model: str, batch: int,
                timing_s: float) -> tuple[Simulated, float]:
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
        simulated = simulate(jobs, *run, *budget, "devices.simulated=true",
                             f"devices.groups.cpu.profile={ENGINE_PROFILE}")
        best["simulated"] = max(best["simulated"], simulated.examples / simulated.real_s)
    ratio = best["simulated"] / best["real"]
    met = ratio >= ENGINE_GOAL
    section.rows += [
        ["real", model, str(batch), f"{simulated.updates:,}", f"{best['real']:,.0f}", "", "", "",
         f"{batch / best['real'] * 1e6:.1f}", ""],
        ["simulated", model, str(batch), f"{simulated.updates:,}", f"{best['simulated']:,.0f}",
         f"{ratio:.2f}x", f">= {ENGINE_GOAL:g}" + ("" if met else ", not met"),
         f"{simulated.real_s / simulated.time_s:.2f}",
         f"{batch / best['simulated'] * 1e6:.1f}", ""]]
    section.data[f"{model}_batch{batch}"] = {
        "updates": simulated.updates, "real_examples_per_s": best["real"],
        "simulated_examples_per_real_s": best["simulated"], "simulated_over_real": ratio,
        "goal": ENGINE_GOAL, "met": met}
    return simulated, batch / best["simulated"]


def _many_workers(section: Section, jobs: Jobs, model: str, alone: Simulated,
                  alone_per_update: float) -> None:
    """The row of 48 simulated one-example workers, for as many updates as the lone worker's
    run ``alone`` and for twice as many: their difference is the steady cost per update, without
    what both pay once (building every worker)."""
    short, long = (simulate(jobs, *MANY_WORKERS, f"model={model}",
                            f"budget.epochs={scale * alone.epochs}", *FAST_EVAL)
                   for scale in (1, 2))
    real_s = long.real_s - short.real_s
    updates = long.updates - short.updates
    virtual_s = long.time_s - short.time_s
    per_update = real_s / updates
    fixed_s = short.real_s - short.updates * per_update
    section.rows.append(["simulated, 48 workers", model, "1", f"{updates:,}",
                         f"{updates / real_s:,.0f}", "", "", f"{real_s / virtual_s:.1f}",
                         f"{per_update * 1e6:.1f}", f"{per_update / alone_per_update:.2f}x"])
    section.notes.append(
        f"48 workers, {model}: the shorter run took {fixed_s:.2f} s more than its updates at "
        "that cost (building every worker, and first steps slower or faster than later ones); "
        f"training loss at the end {long.train_loss:.3g}, the lone worker's "
        f"{alone.train_loss:.3g}")
    section.data[f"{model}_48_workers"] = {
        "updates": updates, "real_s": real_s, "virtual_s": virtual_s,
        "real_s_per_virtual_s": real_s / virtual_s, "real_s_per_1000_updates": 1000 * per_update,
        "over_one_worker_per_update": per_update / alone_per_update,
        "shorter_run_fixed_s": fixed_s}
