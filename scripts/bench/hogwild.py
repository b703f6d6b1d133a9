"""Section c: Hogwild over 1 and 2 worker processes, beside lone workers that share nothing or
only the model."""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import Any

import torch

from hetsgd.config import RunConfig, to_run_config
from hetsgd.engines.common.memory import SharedMaster
from scripts.bench import inprocess
from scripts.bench.jobs import FAST_EVAL, Jobs, compose_config
from scripts.bench.section import Section, ratio

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
    problem, shared = inprocess.training_data(data)
    worker = inprocess.worker(_scaling_config(data, epochs), problem, shared, master)
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
        master = SharedMaster.initial(cfg.model, inprocess.training_data(data)[0], cfg.seed)
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
                                 f"{ratio(eps, speeds[1]):.2f}x",
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
                                 f"{ratio(eps, speeds[1]):.2f}x", "", "", ""])
            lone.setdefault(label, []).append(ratio(eps, speeds[1]))
        rounds.append(ratio(speeds[2], speeds[1]))
    met = min(r or 0.0 for r in rounds) >= SCALING_GOAL
    section.notes.append(f"2 workers over 1: {', '.join(f'{r:.2f}x' for r in rounds if r)}; goal "
                         f">= {SCALING_GOAL:g}x in every round: {'met' if met else 'NOT met'}. "
                         + "; ".join(f"{label} over 1 worker: "
                                     f"{', '.join(f'{r:.2f}x' for r in ratios if r)}"
                                     for label, ratios in lone.items()) + ".")
    section.data.update(ratio_2_over_1=rounds, lone_2_over_1=lone, goal=SCALING_GOAL, met=met)
    return section
