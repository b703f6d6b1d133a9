"""Adaptive Hogbatch's batch-size threshold against Ma & Rusu: per threshold and simulated paper
machine, the CPU's share of the model updates and the GPU's busy share, as a markdown table on
stdout and one figure (docs/results/adaptive_threshold.md).

    python scripts/adaptive_threshold.py [OVERRIDES...]   # the experiment's jobs, replayed
    python scripts/adaptive_threshold.py --sweep SWEEP_DIR  # a finished sweep of the experiment:
        # hetsgd run -m +experiment=adaptive_threshold hydra.sweep.dir=SWEEP_DIR
        # (a folder under it that is not a completed job is named on stderr: status 1)

A replay runs each job of the experiment on the virtual engine with the roofline
profiles of the job's own model (the paper's net) while a logistic regression does the math. A
simulated run's schedule (when each step starts and lands, so its update counts and busy time)
follows from the profiles, the batch sizes and the controller, which reads update counts only,
never the model's numbers: the replay's counts are the full run's, without the hours a run of the
paper's net costs here (``tests/test_adaptive_threshold.py`` checks the equality on a small net).

Shares are read over the second half of the budget, after the controller has settled (the first
half starts at the GPU's batch of 1024 and the hosts' of 1); whole-run values beside them.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from hetsgd import algorithms
from hetsgd.config import AdaptiveConfig, RunConfig, compose_run, to_run_config
from hetsgd.config.checks import finite_or_none
from hetsgd.config.compose import sweep_jobs
from hetsgd.engines.common.memory import SharedMaster
from hetsgd.engines.hooks import LinkHooks
from hetsgd.engines.virtual.coordinator import VirtualCoordinator
from hetsgd.engines.virtual.mix import profiles_for
from hetsgd.errors import UserError
from hetsgd.outputs.figure_style import DPI, SIZE, save, styled
from hetsgd.outputs.index import TEXT_COLUMNS, config_number, find_runs, load_csv, read_summary
from hetsgd.outputs.report import markdown_table
from hetsgd.outputs.terminal import error_line, run_script
from hetsgd.runs.setup import load_run_data
from hetsgd.workers import expand

EXPERIMENT = "+experiment=adaptive_threshold"
MACHINES = {"paper_hogbatch_v100": ("V100", "tab:blue"), "paper_hogbatch_k80": ("K80", "tab:red")}
# Ma & Rusu, read off their figures (docs/papers.md): Adaptive's CPU update share per machine,
# and the GPU's utilization for covtype on the K80 server under CPU+GPU Hogbatch and Adaptive
PAPER_CPU_SHARE = {"paper_hogbatch_v100": (0.52, 0.60), "paper_hogbatch_k80": (0.71, 0.81)}
PAPER_GPU_BUSY = {"Hogbatch": (82.0, 97.0), "Adaptive": (45.0, 53.0)}
STAND_IN = "model=logreg"  # the math of a replay


@dataclass
class Point:
    """One job's numbers: ``updates`` (virtual time, GPU updates, CPU updates) at each snapshot,
    ``gpu_busy`` (virtual time, percent) at each utilization sample."""

    machine: str
    threshold: int | None  # None: not Adaptive (Hogbatch)
    budget_s: float
    updates: list[tuple[float, float, float]]
    gpu_busy: list[tuple[float, float]]
    final_batches: tuple[int, int]  # the GPU's and a host worker's batch size at the end

    def cpu_share(self, start: float = 0.0) -> float:
        """CPU updates over all updates between the first snapshot at or after ``start`` and the
        last within the budget (the run's end for ``start`` 0); NaN where fewer than two
        snapshots, or no update, fall there."""
        inside = [u for u in self.updates if start <= u[0] <= self.budget_s] if start else self.updates
        if len(inside) < 2:
            return math.nan
        (_, g0, c0), (_, g1, c1) = inside[0], inside[-1]
        updates = c1 - c0 + g1 - g0
        return (c1 - c0) / updates if updates else math.nan

    def busy(self, start: float = 0.0) -> float:
        """The GPU's mean busy percent over the samples after ``start`` (NaN where none is; a
        sample that is not a number is none)."""
        samples = [b for t, b in self.gpu_busy
                   if start < t <= (self.budget_s if start else np.inf) and math.isfinite(b)]
        return statistics.fmean(samples) if samples else math.nan


def jobs() -> list[list[str]]:
    """Each job's overrides, as `hetsgd run -m +experiment=adaptive_threshold` makes them."""
    return sweep_jobs([EXPERIMENT])


def replay(job: list[str]) -> Point:
    """The job's schedule on the virtual engine: its model's profiles, the stand-in's math."""
    cfg = to_run_config(compose_run(["progress=false", *job]))
    cheap = to_run_config(compose_run(["progress=false", *job, STAND_IN]))
    data = load_run_data(cheap, progress=False)
    algo = algorithms.get(cheap.algo.name)
    plan = algo.plan(cheap, expand(cheap.devices))
    hooks = algo.hooks(plan)
    assert isinstance(hooks, LinkHooks)
    engine = VirtualCoordinator(plan.cfg, plan.workers, data.problem, data.train,
                                SharedMaster.initial(cheap.model, data.problem, cheap.seed), None,
                                hooks.link, hooks.controller,
                                profiles_for(cfg, plan.workers, data.problem, cfg.optim.step))
    training = engine.run(None)  # type: ignore[arg-type]  # the virtual engine takes no monitor
    accel = {s.rank for s in plan.workers if s.accel}
    updates = [(s.time_s, sum(u for r, u in enumerate(s.updates) if r in accel),
                sum(u for r, u in enumerate(s.updates) if r not in accel)) for s in training.snapshots]
    last = {s.rank: s.batch_size for s in plan.workers}  # then every resize, in order
    last.update({int(r["worker"]): int(r["batch_size"]) for r in training.batches})
    gpu, host = min(accel), next(s.rank for s in plan.workers if not s.accel)
    return Point(plan.cfg.devices.name, plan.settled.get("min_accel_batch"), _budget(cfg), updates,
                 [(r["time_s"], r["gpu0_util"]) for r in training.utilization],
                 (last[gpu], last[host]))


def _budget(cfg: RunConfig) -> float:
    assert cfg.budget.seconds is not None, "the experiment's budget is in virtual seconds"
    return cfg.budget.seconds


#: The columns a finished job's numbers come from, by file.
COLUMNS = {"convergence": ("time_s", "updates_accel", "updates_cpu"),
           "utilization": ("time_s", "gpu0_util"), "workers": ("group", "last_batch")}


def read_run(run_dir: Path) -> Point:
    """A finished job's numbers from its run directory. A run folder is data: one that is not a
    completed Adaptive job on a paper machine, or lacks a number the table needs, is a
    :class:`UserError` naming it and why."""
    summary = read_summary(run_dir)
    if summary.get("status") != "completed":
        raise _refused(run_dir, f"{summary.get('status')}: {summary.get('error')}")
    if summary.get("algo") != "adaptive" or summary.get("devices") not in MACHINES:
        raise _refused(run_dir, f"algo={summary.get('algo')} devices={summary.get('devices')} "
                                f"is not a job of {EXPERIMENT}")
    plan = summary.get("plan")
    threshold = plan.get("min_accel_batch") if isinstance(plan, dict) else None
    if not isinstance(threshold, int):
        raise _refused(run_dir, "its summary.json has no plan.min_accel_batch")
    budget = config_number(run_dir, "budget", "seconds")
    if budget is None or budget <= 0:
        raise _refused(run_dir, "its config.yaml has no positive budget.seconds")
    frames = {}
    for name, columns in COLUMNS.items():
        frame = load_csv(run_dir, name)
        lacking = list(columns) if frame is None else [c for c in columns if c not in frame]
        if lacking:
            raise _refused(run_dir, f"its {name}.csv lacks {', '.join(lacking)}")
        numbers = [c for c in columns if c not in TEXT_COLUMNS]  # a folder may hold text there
        frames[name] = frame.assign(**{c: pd.to_numeric(frame[c], errors="coerce") for c in numbers})
    convergence, utilization = frames["convergence"], frames["utilization"]
    first = frames["workers"].drop_duplicates("group")  # each group's first worker, as replay()
    last = dict(zip(first["group"], first["last_batch"]))
    accel, cpu = (finite_or_none(last.get(group)) for group in ("accel", "cpu"))
    if accel is None or cpu is None:
        raise _refused(run_dir, "its workers.csv has no last batch of the accel or the cpu group")
    return Point(summary["devices"], threshold, budget,
                 list(zip(convergence["time_s"], convergence["updates_accel"], convergence["updates_cpu"])),
                 list(zip(utilization["time_s"], utilization["gpu0_util"])), (int(accel), int(cpu)))


def _refused(run_dir: Path, why: str) -> UserError:
    return UserError(f"{run_dir}: {why}")


def run_folders(sweep: Path) -> list[Path]:
    """The run folders under ``sweep``; a :class:`UserError` where there is none."""
    found = find_runs(sweep)
    if not found:
        raise UserError(f"no run folder under {sweep}")
    return found


def table(points: list[Point]) -> str:
    rows = []
    for p in points:
        half = p.budget_s / 2
        low, high = PAPER_CPU_SHARE[p.machine]
        rows.append([MACHINES[p.machine][0], str(p.threshold), f"{p.cpu_share(half):.3f}",
                     f"{low:.2f}–{high:.2f}", f"{p.busy(half):.0f}", f"{p.cpu_share():.3f}",
                     f"{p.busy():.0f}", f"{p.final_batches[0]} / {p.final_batches[1]}"])
    return markdown_table(["machine", "threshold (min_accel_batch)", "CPU update share, 2nd half",
                           "paper (Adaptive)", "GPU busy [%], 2nd half", "CPU update share, run",
                           "GPU busy [%], run", "final batch GPU / host"], rows)


def paper_setting() -> AdaptiveConfig:
    """Adaptive's bounds for the paper's machines, as ``+experiment=adaptive_paper`` sets them."""
    algo = to_run_config(compose_run(["algo=adaptive", "+experiment=adaptive_paper"])).algo
    assert isinstance(algo, AdaptiveConfig)
    return algo


def _axes(ax: Axes, thresholds: list[int], ylabel: str, title: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(thresholds, [str(t) for t in thresholds], rotation=45)
    ax.axvline(paper_setting().min_accel_batch, color="0.3", linewidth=0.8, linestyle="--",
               label="+experiment=adaptive_paper")
    ax.set(xlabel="threshold: min_accel_batch", ylabel=ylabel, title=title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2, frameon=False)


@styled
def figure(points: list[Point], out_dir: Path, note: str) -> list[Path]:
    fig = Figure(figsize=(2 * SIZE[0], SIZE[1] + 1.2), dpi=DPI)
    FigureCanvasAgg(fig)
    shares, busy = fig.subplots(1, 2)
    thresholds = sorted({p.threshold for p in points if p.threshold is not None})
    for machine, (label, color) in MACHINES.items():
        mine = sorted((p for p in points if p.machine == machine), key=lambda p: p.threshold or 0)
        x = [p.threshold for p in mine]
        shares.plot(x, [p.cpu_share(p.budget_s / 2) for p in mine], "o-", color=color,
                    label=f"{label}, simulated")
        shares.axhspan(*PAPER_CPU_SHARE[machine], color=color, alpha=0.15,
                       label=f"{label}, paper (Adaptive)")
        busy.plot(x, [p.busy(p.budget_s / 2) for p in mine], "o-", color=color,
                  label=f"{label}, simulated")
    for (method, band), shade in zip(PAPER_GPU_BUSY.items(), ("0.55", "0.2")):
        busy.axhspan(*band, color=shade, alpha=0.2, label=f"K80 paper, {method} (covtype)")
    shares.set_ylim(0, 1.02)
    busy.set_ylim(0, 100)
    _axes(shares, thresholds, "CPU share of model updates", "CPU update share")
    _axes(busy, thresholds, "GPU busy [%]", "GPU utilization")
    fig.suptitle(f"Adaptive Hogbatch's threshold, {note}", fontsize=9.5)
    return save(fig, out_dir, "adaptive_threshold", ["png"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", type=Path, help="a finished sweep's folder (else: a replay)")
    parser.add_argument("--figures", type=Path, default=Path("docs/figures"))
    parser.add_argument("overrides", nargs="*", help="a replay's overrides of every job")
    args = parser.parse_args()
    left_out = []
    if args.sweep is None:
        points = [replay([*job, *args.overrides]) for job in jobs()]
    else:
        points = []
        for run in run_folders(args.sweep):
            try:
                points.append(read_run(run))
            except UserError as err:  # one run that cannot be read costs only its own point
                left_out.append(str(err))
        if not points:
            raise UserError(f"no completed job of {EXPERIMENT} under {args.sweep}: "
                            f"{len(left_out)} run(s), the first {left_out[0]}")
    for line in left_out:
        print(f"adaptive_threshold: left out {error_line(line)}", file=sys.stderr)
    points.sort(key=lambda p: (list(MACHINES).index(p.machine), p.threshold or 0))
    print(table(points))
    budget = points[0].budget_s
    note = (f"mlp_paper on digits, simulated; shares over {budget / 2:g}-{budget:g} virtual s"
            + ("" if args.sweep else " (schedule replay)"))
    for path in figure(points, args.figures, note):
        print(f"figure: {path}")
    return 1 if left_out else 0


if __name__ == "__main__":
    run_script("adaptive_threshold", main)
