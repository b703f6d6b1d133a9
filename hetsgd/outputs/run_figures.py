"""One run's figures (``<run>/figures/``), from its files alone: training and test loss against
wall time and against epochs, CPU and GPU utilization over time with the epoch boundaries (every
k-th where more would hide the curves), update shares per worker group, the adaptive batch sizes
and test accuracy."""

from __future__ import annotations

import itertools
import logging
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from hetsgd.errors import UserError
from hetsgd.outputs.comparison import flagged
from hetsgd.outputs.figure_formats import check_formats
from hetsgd.outputs.figure_style import (
    GPU_COLORS,
    GROUP_COLORS,
    legend,
    loss_axes,
    new_figure,
    save,
    styled,
    time_label,
)
from hetsgd.outputs.index import flatten, load_csv
from hetsgd.outputs.report import mix_label
from hetsgd.outputs.safe_text import shown
from hetsgd.outputs.summary import RunSummary

log = logging.getLogger(__name__)


def run_title(summary: RunSummary) -> str:
    """``digits · mlp: hogbatch on cpu+gpu (emulated), seed 0``, plus the status when the run
    did not complete, and ``flagged as contended`` when its workers got too little of their CPU
    (the report does not time such a run; its figures are drawn, and say so)."""
    def known(value: object) -> object:
        return "?" if value is None else value

    run = summary.to_dict()
    marks = [] if summary.status == "completed" else [str(summary.status)]
    if flagged(flatten(run)):
        marks.append("flagged as contended")
    return (f"{known(summary.dataset)} · {known(summary.model)}: "
            f"{known(summary.algo)} on {mix_label(run)}, seed {known(summary.seed)}"
            + (f" [{', '.join(marks)}]" if marks else ""))


#: The most epoch boundaries a utilization figure draws: past it, every k-th epoch's.
MOST_EPOCH_LINES = 20


def epoch_step(epochs: int) -> int:
    """Every how many epochs a boundary is drawn for ``epochs`` whole epochs: the first of
    1, 2, 5, 10, 20, 50, ... that leaves at most ``MOST_EPOCH_LINES`` lines."""
    steps = (m * 10**e for e in itertools.count() for m in (1, 2, 5))
    return next(step for step in steps if epochs // step <= MOST_EPOCH_LINES)


def _epoch_times(conv: pd.DataFrame | None) -> tuple[np.ndarray, int]:
    """Wall times at which every k-th whole epoch ended, interpolated from the snapshots, and
    k (:func:`epoch_step`)."""
    if conv is None or conv.empty or not np.isfinite(last := conv["epoch"].max()):
        return np.array([]), 1
    step = epoch_step(math.floor(last))
    ends = np.arange(step, math.floor(last) + 1, step)
    return np.interp(ends, conv["epoch"], conv["time_s"]), step


def _run_loss(conv: pd.DataFrame, axis: str, xlabel: str, title: str,
              targets: list[float]) -> Figure:
    """Training and test loss as measured (a run alone has no common scale to normalize to),
    with the summary's target losses."""
    fig, ax = new_figure()
    for column, color in (("train_loss", "tab:blue"), ("test_loss", "tab:orange")):
        if column in conv and conv[column].notna().any():
            ax.plot(conv[axis], conv[column], marker="o", markersize=2.5, linewidth=1.4,
                    color=color, label=column.replace("_", " "))
    for i, target in enumerate(targets):
        ax.axhline(target, color="0.55", linewidth=0.6, linestyle=":", zorder=0,
                   label="target losses" if i == 0 else None)
    ax.set_yscale("log")
    ax.set_xlim(left=0)
    ax.set(xlabel=xlabel, ylabel="loss", title=f"{title}\nloss vs {xlabel.split(' [')[0]}")
    legend(ax)
    return fig


def _run_accuracy(conv: pd.DataFrame, title: str, xlabel: str) -> Figure:
    fig, ax = new_figure()
    acc = conv[["time_s", "test_acc"]].dropna()
    ax.plot(acc["time_s"], acc["test_acc"], marker="o", markersize=2.5, color="tab:green")
    ax.set_xlim(left=0)
    ax.set(xlabel=xlabel, ylabel="test accuracy",
           title=f"{title}\ntest accuracy vs {xlabel.split(' [')[0]}")
    return fig


def _run_utilization(util: pd.DataFrame, conv: pd.DataFrame | None, title: str,
                     cores_given: int | None, simulated: bool = False) -> Figure:
    """The workers' CPU as a percentage of the cores the mix gave them (of all the host's cores
    when the summary does not say), the run's GPUs (``gpuN`` is ``cuda:N``; in a simulated run
    the N-th accelerator worker), and, dashed, the host's CPU, which counts every other process
    too (a simulated run has none: its utilization is each device's virtual busy share)."""
    fig, ax = new_figure()
    cores = [c for c in util.columns if re.fullmatch(r"cpu\d+_percent", c)]
    if "workers_cpu_percent" in util and (cores_given or cores):
        given = cores_given or len(cores)
        of = f"of the {given} cores given" if cores_given else f"of all {given} host cores"
        ax.plot(util["time_s"], util["workers_cpu_percent"] / given, color="tab:blue",
                label=f"workers' CPU\n({of})")
    if "host_cpu_percent" in util:
        ax.plot(util["time_s"], util["host_cpu_percent"], color="0.3", linestyle="--",
                label="host CPU\n(all processes)")
    gpus = sorted((c for c in util.columns if re.fullmatch(r"gpu\d+_util", c)),
                  key=lambda c: int(c[3:-5]))
    for i, col in enumerate(gpus):
        name = f"accelerator {col[3:-5]} (simulated)" if simulated else f"GPU cuda:{col[3:-5]}"
        ax.plot(util["time_s"], util[col], label=name,
                color=GPU_COLORS[i % len(GPU_COLORS)])
    ends, step = _epoch_times(conv)
    for k, t in enumerate(ends):
        ax.axvline(t, color="0.4", linestyle=":", linewidth=0.9,
                   label=None if k else "epoch boundary" if step == 1 else f"every {step} epochs")
    ax.set_ylim(0, max(105.0, ax.get_ylim()[1]))
    ax.set_xlim(left=0)
    note = " (virtual busy share)" if simulated else "" if gpus else " (no GPU columns)"
    ax.set(xlabel=time_label([simulated]), ylabel="utilization [%]",
           title=f"{title}\nCPU and GPU utilization{note}")
    legend(ax)
    return fig


def _run_shares(shares: Mapping[str, float | None], counts: Mapping[str, int],
                title: str) -> Figure:
    """A bar per worker group, labelled with its share and its number of updates. The groups'
    names are escaped as ticks are set: tick labels are rebuilt when the figure is drawn, after
    :func:`save` escaped its text."""
    fig, ax = new_figure()
    groups = list(shares)
    bars = ax.bar(range(len(groups)), [shares[g] or 0.0 for g in groups], width=0.6,
                  color=[GROUP_COLORS[j % len(GROUP_COLORS)] for j in range(len(groups))])
    ax.set_xticks(range(len(groups)), [shown(g) for g in groups])
    ax.bar_label(bars, [f"{shares[g] or 0.0:.2f}" + (f"  ({counts[g]:,} updates)" if g in counts
                                                      else "") for g in groups],
                 fontsize=8, padding=2)
    ax.set_ylim(0, 1.12)
    ax.grid(axis="x", visible=False)
    ax.set(xlabel="worker group", ylabel="share of model updates",
           title=f"{title}\nupdate share per worker group")
    return fig


def _run_batches(batches: pd.DataFrame, end_s: float, title: str, xlabel: str) -> Figure:
    """Each worker's batch size as a step line, its last size held until the run's end."""
    fig, ax = new_figure()
    for i, (worker, rows) in enumerate(batches.groupby("worker", sort=True)):
        rows = rows.sort_values("time_s")
        group = rows["group"].iloc[0] if "group" in rows else "?"
        times = [*rows["time_s"], max(end_s, rows["time_s"].iloc[-1])]
        sizes = [*rows["batch_size"], rows["batch_size"].iloc[-1]]
        ax.step(times, sizes, where="post", label=f"worker {worker} ({group})",
                color=GROUP_COLORS[i % len(GROUP_COLORS)])
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.set_xlim(left=0)
    ax.set(xlabel=xlabel, ylabel="batch size [examples]",
           title=f"{title}\nadaptive batch size")
    legend(ax)
    return fig


def _readable(run_dir: Path, name: str) -> pd.DataFrame | None:
    """``<name>.csv`` of the run, or None with a warning naming it where it cannot be read: an
    unreadable file costs only the figures drawn from it."""
    try:
        return load_csv(run_dir, name)
    except UserError as err:
        log.warning("no figures from %s.csv of %s: %s", name, shown(run_dir), shown(err))
        return None


@styled
def plot_run(run_dir: Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Draw one run's figures into ``<run_dir>/figures/``; a run without curves (a failed run)
    gets only what its files allow, possibly nothing. Returns the files written."""
    run_dir, formats = Path(run_dir), check_formats(formats)
    summary = RunSummary.read(run_dir)
    title = run_title(summary)
    simulated = bool(summary.simulated)
    xlabel = time_label([simulated])
    conv, util, batches = (_readable(run_dir, name)
                           for name in ("convergence", "utilization", "batches"))
    figures: list[tuple[str, Figure]] = []
    if conv is not None and conv["train_loss"].notna().any():
        targets = (summary.target_losses.losses or []) if summary.target_losses else []
        figures += [(name, _run_loss(conv, axis, xlabel, title, targets))
                    for axis, xlabel, name in loss_axes([simulated])]
        if "test_acc" in conv and conv["test_acc"].notna().any():
            figures.append(("accuracy_vs_time", _run_accuracy(conv, title, xlabel)))
    if util is not None and not util.empty:
        figures.append(("utilization", _run_utilization(util, conv, title,
                                                        summary.cores_sampled, simulated)))
    if summary.update_share:
        figures.append(("update_shares", _run_shares(
            summary.update_share, summary.updates_by_group or {}, title)))
    if batches is not None and not batches.empty:
        end_s = max(float(summary.time_s or 0.0),
                    float(conv["time_s"].max()) if conv is not None and len(conv) else 0.0)
        figures.append(("batch_sizes", _run_batches(batches, end_s, title, xlabel)))
    return [path for name, fig in figures for path in save(fig, run_dir / "figures", name,
                                                            formats)]
