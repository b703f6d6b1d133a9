"""Section f: what the utilization sampler costs training."""

from __future__ import annotations

from scripts.bench.jobs import FAST_EVAL, Jobs
from scripts.bench.section import Section, ratio

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
                                 f"{ratio(eps, speeds[0.5]):.3f}x", f"{job.others:.0%}"])
            section.data[f"round{round_}_interval{interval}"] = {"examples_per_s": eps,
                                                                 "others_cpu_share": job.others}
        ratios.append(ratio(speeds[0.05], speeds[0.5]))
    section.data["ratio_0.05_over_0.5"] = ratios
    return section
