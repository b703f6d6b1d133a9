"""Section h: the cost around a run, as `hetsgd run` pays it, against `import torch`.

Each case is the command itself, started as a user starts it, with a 1 s training budget; beside
each run, `python -c "import torch"` is timed on the same machine, so the ratios hold on any
CPU. From the run's summary (``timing``): the seconds before its training clock started (the
interpreter, composing, the data, the workers' start) and after training ended (evaluation,
writing); the command's wall time gives the rest to its exit (figures, interpreter teardown).
A sweep job is the second job of a two-job sweep: it shares the sweep's process, data and
forkserver with the first, as every later job does; its time "to exit" holds the sweep's end
(its report and comparison figures) too.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.bench.jobs import Jobs
from scripts.bench.section import Section, fmt

ONE_SECOND = ("budget.seconds=1", "budget.epochs=null", "progress=false", "dataset=digits")
CASES: dict[str, tuple[str, ...]] = {
    "one worker (sync)": ("algo=sync",),
    "two-worker Hogwild": ("algo=hogwild", "devices=cpu", "devices.groups.cpu.count=2"),
    "local SGD, emulated mix": ("algo=local_sgd", "devices=emulated"),
}
SWEEP_JOB = "sweep job (the second of two)"
REPEATS = 3  # medians of this many, interleaved with as many `import torch`


def _import_torch() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - started


def _command(results: Path, *args: str) -> tuple[float, list[dict]]:
    """`hetsgd run ARGS` in a results folder of its own: its wall seconds, and the summaries of
    the runs it wrote, in the order they ran."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hetsgd", "run", *args, f"results_dir={results}"],
                          capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"hetsgd run {' '.join(args)} exited {done.returncode}: "
                           f"{done.stderr.strip().splitlines()[-1:]}")
    paths = sorted(results.rglob("summary.json"), key=lambda p: p.stat().st_mtime)
    return wall, [json.loads(p.read_text()) for p in paths]


def _costs(case: str, folder: Path) -> dict[str, float]:
    """One run of ``case``: seconds before training, after it to the summary, to the exit."""
    if case == SWEEP_JOB:
        wall, summaries = _command(folder, "-m", "algo=sync", "seed=0,1", *ONE_SECOND)
        first, job = summaries
        # the second job's own span: from its start (the first's summary written) to the exit
        wall -= first["timing"]["before_training_s"] + first["time_s"] + first["timing"][
            "after_training_s"]
    else:
        wall, (job,) = _command(folder, *CASES[case], *ONE_SECOND)
    before, after = job["timing"]["before_training_s"], job["timing"]["after_training_s"]
    return {"before_s": before, "after_s": after, "exit_s": wall - before - job["time_s"] - after,
            "around_s": wall - job["time_s"]}


def bench_overhead(jobs: Jobs, seconds: float) -> Section:
    """``seconds`` is not used: the issue's measure is a 1 s run."""
    rows, data = [], {}
    with tempfile.TemporaryDirectory(prefix="hetsgd-overhead-") as tmp:
        for case in [*CASES, SWEEP_JOB]:
            torch_s, costs = [], []
            for i in range(REPEATS):
                torch_s.append(_import_torch())
                costs.append(_costs(case, Path(tmp) / f"{len(data)}_{i}"))
            base = statistics.median(torch_s)
            median = {k: statistics.median(c[k] for c in costs) for k in costs[0]}
            data[case] = {"import_torch_s": base, **median}
            rows.append([case, fmt(base, ".2f"), fmt(median["before_s"], ".2f"),
                         fmt(median["after_s"], ".2f"), fmt(median["exit_s"], ".2f"),
                         fmt(median["around_s"], ".2f"), fmt(median["around_s"] / base, ".2f", "x"),
                         fmt(median["before_s"] / base, ".2f", "x")])
    return Section(
        "the cost around a run",
        f"`hetsgd run ... budget.seconds=1` on digits, {REPEATS} runs each, medians, beside "
        f"{REPEATS} `python -c \"import torch\"`: seconds before the training clock started, "
        "after it ended to the summary, from there to the exit; the cost around the run "
        "(wall less training time) and its ratio to `import torch` (goal: at most 1.5x), and "
        "the time to the first update as a ratio.",
        ["case", "import torch [s]", "before [s]", "after [s]", "to exit [s]", "around [s]",
         "around / torch", "first update / torch"], rows, data)
