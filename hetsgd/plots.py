"""Figures in the papers' style, drawn from the files of run directories alone (no rerun).

Per run (``<run>/figures/``): normalized loss against wall time and against epochs, CPU and GPU
utilization over time with the epoch boundaries, update shares per worker group, the adaptive
batch sizes and test accuracy. Per comparison (same dataset and model, see :mod:`hetsgd.report`):
the same curves with one line per algorithm and device mix, the mean over seeds with a min-max
band, on the comparison's normalized scale. Drawing is idempotent: the same files give the same
bytes (no timestamps in the metadata, fixed SVG ids), so figures can be deleted and redrawn.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from hetsgd.errors import UserError
from hetsgd.report import (
    TARGETS,
    Comparison,
    aggregate,
    comparisons,
    devices_label,
    normalized_loss,
    row_label,
)
from hetsgd.results_index import (
    SUMMARY,
    find_sweeps,
    index_dirs,
    index_runs,
    load_csv,
    read_summary,
)

FORMATS = ("png", "svg", "pdf")
DPI = 100
SIZE = (6.4, 3.6)
#: Metadata that would otherwise carry a timestamp or a version, per format.
METADATA: dict[str, dict[str, Any]] = {
    "png": {"Software": None},
    "svg": {"Date": None, "Creator": None},
    "pdf": {"CreationDate": None, "Creator": None, "Producer": None},
}
STYLE = {
    "font.size": 9, "axes.titlesize": 9.5, "axes.labelsize": 9, "legend.fontsize": 8,
    "xtick.labelsize": 8, "ytick.labelsize": 8, "axes.grid": True, "grid.alpha": 0.3,
    "axes.spines.top": False, "axes.spines.right": False, "svg.hashsalt": "hetsgd",
}
ALGO_COLORS = {"sync": "tab:blue", "hogwild": "tab:orange", "hogbatch": "tab:green",
               "adaptive": "tab:red", "local_sgd": "tab:purple"}
SPARE_COLORS = ("tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray")
GROUP_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
GPU_COLORS = ("tab:red", "tab:orange", "tab:brown", "tab:pink", "tab:olive", "tab:purple",
              "tab:green", "tab:gray")
LINESTYLES = ("-", "--", ":", "-.")
GRID_POINTS = 200
#: (convergence column, axis label, figure name) of the normalized-loss figures.
LOSS_AXES = (("time_s", "wall time [s]", "loss_vs_time"), ("epoch", "epochs", "loss_vs_epoch"))
BAND = "mean over seeds, band = min-max"

P = ParamSpec("P")
R = TypeVar("R")


def _styled(draw: Callable[P, R]) -> Callable[P, R]:
    """Draw and save under one style, without touching the caller's matplotlib settings."""
    @functools.wraps(draw)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with mpl.rc_context(STYLE):
            return draw(*args, **kwargs)
    return wrapper


def check_formats(formats: Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(f.strip().lower().lstrip(".") for f in formats)
    bad = [f for f in chosen if f not in FORMATS]
    if bad or not chosen:
        raise UserError(f"unknown figure format {bad[0] if bad else ''!r}: "
                        f"choose from {', '.join(FORMATS)}")
    return chosen


def _new_figure(width: float = SIZE[0]) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(width, SIZE[1]), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _save(fig: Figure, out_dir: Path, name: str, formats: Sequence[str]) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = out_dir / f"{name}.{fmt}"
        fig.savefig(path, format=fmt, dpi=DPI, bbox_inches="tight", metadata=METADATA[fmt])
        paths.append(path)
    return paths


def _legend(ax: Axes, title: str | None = None) -> None:
    """Outside, right of the axes, so it never covers data."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                  borderaxespad=0.0, title=title, title_fontsize=8)


def _normalized_axes(ax: Axes, xlabel: str, title: str) -> None:
    for i, target in enumerate(TARGETS):
        ax.axhline(target, color="0.55", linewidth=0.6, linestyle=":", zorder=0,
                   label="targets " + " / ".join(map(str, TARGETS)) if i == 0 else None)
    low = min(-0.05, ax.get_ylim()[0])
    ax.set_ylim(max(low, -1.0), 1.05)
    ax.set_xlim(left=0)
    ax.set(xlabel=xlabel, ylabel="normalized loss", title=title)
    _legend(ax)


def _share_bars(ax: Axes, labels: list[str], groups: list[str],
                means: np.ndarray, stds: np.ndarray) -> None:
    """Grouped bars: one cluster per label, one bar per worker group, value on top."""
    width = 0.8 / len(groups)
    x = np.arange(len(labels))
    for j, group in enumerate(groups):
        err = np.where(np.isfinite(stds[:, j]), stds[:, j], 0.0)
        bars = ax.bar(x + (j - (len(groups) - 1) / 2) * width, means[:, j], width,
                      yerr=err if err.any() else None, capsize=2, label=group,
                      color=GROUP_COLORS[j % len(GROUP_COLORS)])
        ax.bar_label(bars, [f"{v:.2f}" if np.isfinite(v) else "" for v in means[:, j]],
                     fontsize=7, padding=1)
    ax.set_xticks(x, labels)
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("share of model updates")
    ax.grid(axis="x", visible=False)
    _legend(ax, "worker group")


# ------------------------------------------------------------------------------------------
# one run
# ------------------------------------------------------------------------------------------


def run_title(summary: dict[str, Any]) -> str:
    """``digits · mlp: hogbatch on cpu+gpu (emulated), seed 0``, plus the status when the run
    did not complete."""
    mix = devices_label(summary.get("devices", "?"), summary.get("emulated"))
    status = summary.get("status")
    return (f"{summary.get('dataset', '?')} · {summary.get('model', '?')}: "
            f"{summary.get('algo', '?')} on {mix}, seed {summary.get('seed', '?')}"
            + ("" if status == "completed" else f" [{status}]"))


def _epoch_times(conv: pd.DataFrame | None) -> np.ndarray:
    """Wall times at which each whole epoch ended, interpolated from the snapshots."""
    if conv is None or conv.empty:
        return np.array([])
    last = conv["epoch"].max()
    ends = np.arange(1, math.floor(last) + 1) if np.isfinite(last) else np.array([])
    return np.interp(ends, conv["epoch"], conv["time_s"])


def _run_loss(conv: pd.DataFrame, axis: str, xlabel: str, title: str) -> Figure:
    fig, ax = _new_figure()
    loss = conv["train_loss"]
    norm = normalized_loss(loss, float(loss.iloc[0]), float(loss.min()))
    ax.plot(conv[axis], norm, marker="o", markersize=2.5, linewidth=1.4, color="tab:blue")
    _normalized_axes(ax, xlabel, f"{title}\nnormalized loss vs {xlabel.split(' [')[0]} "
                                 f"(L_best = this run's best)")
    return fig


def _run_accuracy(conv: pd.DataFrame, title: str) -> Figure:
    fig, ax = _new_figure()
    acc = conv[["time_s", "test_acc"]].dropna()
    ax.plot(acc["time_s"], acc["test_acc"], marker="o", markersize=2.5, color="tab:green")
    ax.set_xlim(left=0)
    ax.set(xlabel="wall time [s]", ylabel="test accuracy",
           title=f"{title}\ntest accuracy vs wall time")
    return fig


def _run_utilization(util: pd.DataFrame, conv: pd.DataFrame | None, title: str) -> Figure:
    fig, ax = _new_figure()
    cores = [c for c in util.columns if re.fullmatch(r"cpu\d+_percent", c)]
    ax.plot(util["time_s"], util["cpu_percent"], label="host CPU", color="tab:blue")
    if "workers_cpu_percent" in util and cores:
        ax.plot(util["time_s"], util["workers_cpu_percent"] / len(cores), color="tab:cyan",
                linestyle="--", label=f"workers' CPU\n(of all {len(cores)} cores)")
    gpus = sorted((c for c in util.columns if re.fullmatch(r"gpu\d+_util", c)),
                  key=lambda c: int(c[3:-5]))
    for i, col in enumerate(gpus):
        ax.plot(util["time_s"], util[col], label=f"GPU {col[3:-5]}",
                color=GPU_COLORS[i % len(GPU_COLORS)])
    for k, t in enumerate(_epoch_times(conv)):
        ax.axvline(t, color="0.4", linestyle=":", linewidth=0.9,
                   label="epoch boundary" if k == 0 else None)
    ax.set_ylim(0, max(105.0, ax.get_ylim()[1]))
    ax.set_xlim(left=0)
    gpu_note = "" if gpus else " (no GPU columns)"
    ax.set(xlabel="wall time [s]", ylabel="utilization [%]",
           title=f"{title}\nCPU and GPU utilization{gpu_note}")
    _legend(ax)
    return fig


def _run_shares(shares: dict[str, float], counts: dict[str, int], title: str) -> Figure:
    """A bar per worker group, labelled with its share and its number of updates."""
    fig, ax = _new_figure()
    groups = list(shares)
    bars = ax.bar(groups, [shares[g] or 0.0 for g in groups], width=0.6,
                  color=[GROUP_COLORS[j % len(GROUP_COLORS)] for j in range(len(groups))])
    ax.bar_label(bars, [f"{shares[g] or 0.0:.2f}" + (f"  ({counts[g]:,} updates)" if g in counts
                                                      else "") for g in groups],
                 fontsize=8, padding=2)
    ax.set_ylim(0, 1.12)
    ax.grid(axis="x", visible=False)
    ax.set(xlabel="worker group", ylabel="share of model updates",
           title=f"{title}\nupdate share per worker group")
    return fig


def _run_batches(batches: pd.DataFrame, end_s: float, title: str) -> Figure:
    """Each worker's batch size as a step line, its last size held until the run's end."""
    fig, ax = _new_figure()
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
    ax.set(xlabel="wall time [s]", ylabel="batch size [examples]",
           title=f"{title}\nadaptive batch size")
    _legend(ax)
    return fig


@_styled
def plot_run(run_dir: Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Draw one run's figures into ``<run_dir>/figures/``; a run without curves (a failed run)
    gets only what its files allow, possibly nothing. Returns the files written."""
    run_dir, formats = Path(run_dir), check_formats(formats)
    summary = read_summary(run_dir)
    title = run_title(summary)
    conv = load_csv(run_dir, "convergence")
    util = load_csv(run_dir, "utilization")
    batches = load_csv(run_dir, "batches")
    figures: list[tuple[str, Figure]] = []
    if conv is not None and conv["train_loss"].notna().any():
        figures += [(name, _run_loss(conv, axis, xlabel, title))
                    for axis, xlabel, name in LOSS_AXES]
        if "test_acc" in conv and conv["test_acc"].notna().any():
            figures.append(("accuracy_vs_time", _run_accuracy(conv, title)))
    if util is not None and not util.empty:
        figures.append(("utilization", _run_utilization(util, conv, title)))
    shares = summary.get("update_share")
    if isinstance(shares, dict) and shares:
        counts = summary.get("updates_by_group")
        figures.append(("update_shares", _run_shares(
            shares, counts if isinstance(counts, dict) else {}, title)))
    if batches is not None and not batches.empty:
        end_s = max(float(summary.get("time_s") or 0.0),
                    float(conv["time_s"].max()) if conv is not None and len(conv) else 0.0)
        figures.append(("batch_sizes", _run_batches(batches, end_s, title)))
    return [path for name, fig in figures for path in _save(fig, run_dir / "figures", name,
                                                            formats)]


# ------------------------------------------------------------------------------------------
# comparisons
# ------------------------------------------------------------------------------------------


def _band(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
    """Mean, min and max over curves on a common grid; a curve counts up to where it ends."""
    end = max(x[-1] for x, _ in curves)
    grid = np.linspace(0.0, end, GRID_POINTS)
    ys = np.vstack([np.where(grid <= x[-1], np.interp(grid, x, y), np.nan) for x, y in curves])
    return grid, np.nanmean(ys, axis=0), np.nanmin(ys, axis=0), np.nanmax(ys, axis=0)


def _styles(comp: Comparison, table: pd.DataFrame) -> list[dict[str, Any]]:
    """Colour by algorithm, line style by device mix (and variant), the same in every figure."""
    spare = iter(SPARE_COLORS * 4)
    colors = {a: ALGO_COLORS.get(a) or next(spare) for a in sorted(set(table["algo"]))}
    mixes = sorted(set(zip(table["devices"], table["variant"], strict=True)))
    return [{"color": colors[row["algo"]], "linestyle":
             LINESTYLES[mixes.index((row["devices"], row["variant"])) % len(LINESTYLES)]}
            for _, row in table.iterrows()]


def _row_curves(comp: Comparison, row: pd.Series, axis: str,
                column: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The row's completed runs' (axis, column) curves, NaN snapshots left out."""
    runs = comp.runs
    mine = runs[(runs["algo"] == row["algo"]) & (runs["devices"] == row["devices"])
                & (runs["variant"] == row["variant"])]
    curves = []
    for run_dir in mine["run_dir"]:
        curve = comp.curves.get(run_dir)
        if curve is not None and column in curve:
            part = curve[[axis, column]].dropna()
            if len(part):
                curves.append((part[axis].to_numpy(float), part[column].to_numpy(float)))
    return curves


def _comparison_curves(comp: Comparison, table: pd.DataFrame, axis: str, column: str,
                       ax: Axes) -> bool:
    drawn = False
    for (_, row), style in zip(table.iterrows(), _styles(comp, table), strict=True):
        curves = _row_curves(comp, row, axis, column)
        if not curves:
            continue
        grid, mean, low, high = _band(curves)
        ax.plot(grid, mean, linewidth=1.6, label=f"{row_label(row)}  (n={len(curves)})",
                **style)
        if len(curves) > 1:
            ax.fill_between(grid, low, high, color=style["color"], alpha=0.15, linewidth=0)
        drawn = True
    return drawn


def _tick_label(row: pd.Series) -> str:
    """Algorithm, device mix and each override of the variant on lines of their own."""
    return "\n".join([row["algo"], devices_label(row["devices"], row["emulated"]),
                      *row["variant"].split()])


def _comparison_title(comp: Comparison, table: pd.DataFrame, what: str) -> str:
    mixes = sorted({devices_label(r["devices"], r["emulated"]) for _, r in table.iterrows()})
    return f"{comp.title}: {what}\ndevices: {', '.join(mixes)}; {BAND}"


def _comparison_figures(comp: Comparison) -> list[tuple[str, Figure]]:
    table = aggregate(comp)
    table = table[table["n"] > 0].reset_index(drop=True)
    if table.empty:
        return []
    figures = []
    best = "—" if comp.l_best is None else f"{comp.l_best:.4g}"
    for axis, xlabel, name in LOSS_AXES:
        fig, ax = _new_figure()
        if _comparison_curves(comp, table, axis, "normalized", ax):
            _normalized_axes(ax, xlabel, _comparison_title(
                comp, table, f"normalized loss vs {xlabel.split(' [')[0]} (L_best = {best})"))
            figures.append((name, fig))
    fig, ax = _new_figure()
    if _comparison_curves(comp, table, "time_s", "test_acc", ax):
        ax.set_xlim(left=0)
        ax.set(xlabel="wall time [s]", ylabel="test accuracy",
               title=_comparison_title(comp, table, "test accuracy vs wall time"))
        _legend(ax)
        figures.append(("accuracy_vs_time", fig))
    if comp.groups:
        fig, ax = _new_figure(max(SIZE[0], 1.5 * len(table) + 1.0))
        shares = [[f"share_{g}_mean", f"share_{g}_std"] for g in comp.groups]
        _share_bars(ax, [_tick_label(row) for _, row in table.iterrows()],
                    comp.groups, table[[m for m, _ in shares]].to_numpy(float),
                    table[[s for _, s in shares]].to_numpy(float))
        ax.set_title(_comparison_title(comp, table, "update share per worker group")
                     .replace("band = min-max", "error bar = std"))
        figures.append(("update_shares", fig))
    return figures


def _suffixes(comps: list[Comparison]) -> list[str]:
    """File-name suffix per comparison: the dataset, plus the model when the dataset has more
    than one."""
    datasets = [c.dataset for c in comps]
    names = [c.dataset if datasets.count(c.dataset) == 1 else f"{c.dataset}_{c.model}"
             for c in comps]
    return [re.sub(r"[^\w.+-]", "_", name) for name in names]


@_styled
def plot_comparison(runs: pd.DataFrame | Iterable[Path], out_dir: Path,
                    formats: Sequence[str] = ("png",)) -> list[Path]:
    """Comparison figures (``loss_vs_time_<dataset>`` ...) for the runs given as an index
    (:func:`hetsgd.results_index.index_runs`) or as run directories, into ``out_dir``."""
    formats = check_formats(formats)
    index = runs if isinstance(runs, pd.DataFrame) else index_dirs(runs)
    comps = comparisons(index)
    return [path for comp, suffix in zip(comps, _suffixes(comps), strict=True)
            for name, fig in _comparison_figures(comp)
            for path in _save(fig, Path(out_dir), f"{name}_{suffix}", formats)]


def plot_all(path: Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Redraw everything under ``path``: each run's figures, then comparison figures into
    ``figures/`` of each sweep and of ``path`` itself (unless it is a single run)."""
    path, formats = Path(path), check_formats(formats)
    index = index_runs(path)
    written = [p for run_dir in index["run_dir"] for p in plot_run(Path(run_dir), formats)]
    if (path / SUMMARY).exists():
        return written
    for where in sorted(set(find_sweeps(path)) | {path}):
        inside = index.loc[np.array([Path(d).is_relative_to(where) for d in index["run_dir"]],
                                    dtype=bool)]
        if not inside.empty:
            written += plot_comparison(inside, where / "figures", formats)
    return written
