"""Section e: time to a common training loss for each algorithm, as a ratio to sync."""

from __future__ import annotations

from hetsgd.outputs.metrics import normalized_loss, sustained
from scripts.bench.jobs import Job, Jobs
from scripts.bench.section import Section, fmt, ratio

ALGORITHMS = (("sync", "single_cpu"), ("hogwild", "cpu"), ("hogbatch", "emulated"),
              ("adaptive", "emulated"))
# Time-to-target runs: on w8a the normalized loss reaches 0.9 in about 0.1 s, so a short budget
# with a snapshot every 20 ms (each costs an evaluation after training) resolves it.
TARGET_BUDGET_S = 2.0
TARGET_SNAPSHOTS = 100


def _time_to(job: Job, l0: float, best: float, target: float) -> float | None:
    """Time after which the run stays at `target`, every run normalized by the same initial and
    best loss."""
    frame = job.convergence
    return sustained(frame["time_s"], normalized_loss(frame["train_loss"], l0, best), target).time


def bench_time_to_target(jobs: Jobs, seconds: float) -> Section:
    seconds = min(seconds, TARGET_BUDGET_S)
    section = Section(
        "time to a normalized loss, each algorithm on its default mix",
        f"Same data, model (mlp) and time budget ({seconds:g} s), a snapshot every "
        f"{seconds / TARGET_SNAPSHOTS * 1000:.0f} ms. "
        "'L0/10': the summary's time to a tenth of the initial test loss (the same initial "
        "model, so the same absolute loss, in every run); '0.9'/'0.99' common: every run "
        "normalized by the best loss of all four, so a run that stalls early does not look "
        "fast. Times are sustained: the run stays there to its end. Speedup: sync's time / "
        "this time; ex/s: examples/s; final loss: training loss at the end.",
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
            row += [fmt(value, ".2f", " s"), fmt(ratio(times["sync"][kind], value), ".2f", "x")]
        section.rows.append(row + [f"{summary['final']['train_loss']:.4f}",
                                   f"{runs[algo].others:.0%}"])
        section.data[algo] = {"devices": devices, "examples_per_s": summary["examples_per_s"],
                              "seconds_to": times[algo],
                              "speedup": {kind: ratio(times["sync"][kind], value)
                                          for kind, value in times[algo].items()},
                              "final": summary["final"], "update_share": summary["update_share"],
                              "others_cpu_share": runs[algo].others}
    return section
