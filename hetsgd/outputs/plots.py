"""Figures in the papers' style, drawn from the files of run directories alone (no rerun).

Per run, see :mod:`hetsgd.outputs.run_figures`. Per comparison (same dataset and model, see
:mod:`hetsgd.outputs.report`): the same curves with one line per algorithm and device mix, the
mean over seeds with a min-max band, on the comparison's normalized scale; a seed that ended
earlier than another holds its last value (:func:`_band`).
"""

from __future__ import annotations

import itertools
import logging
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from hetsgd.errors import UserError
from hetsgd.outputs.comparison import (
    Comparison,
    aggregate,
    comparisons,
    flagged,
    mix_label,
    row_label,
)
from hetsgd.outputs.figure_formats import check_formats
from hetsgd.outputs.figure_style import (
    ALGO_COLORS,
    BAND,
    GRID_POINTS,
    LINESTYLES,
    MARKERS,
    SIZE,
    SPARE_COLORS,
    legend,
    loss_axes,
    new_figure,
    normalized_axes,
    save,
    share_bars,
    styled,
    time_label,
)
from hetsgd.outputs.index import find_sweeps, index_dirs, index_runs, is_run_dir
from hetsgd.outputs.metrics import loss_name
from hetsgd.outputs.run_figures import plot_run
from hetsgd.outputs.safe_text import shown

log = logging.getLogger(__name__)
#: Every how many grid points a line with a marker shows it.
MARK_EVERY = GRID_POINTS // 10


def _band(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
    """Mean, min and max over curves on a common grid to the last curve's end; a curve that
    ends earlier holds its last value from there, so every seed counts everywhere and the mean
    never jumps where one ends."""
    end = max(x[-1] for x, _ in curves)
    grid = np.linspace(0.0, end, GRID_POINTS)
    ys = np.vstack([np.interp(grid, x, y) for x, y in curves])  # holds the ends' values
    return grid, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)


def _styles(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Colour by algorithm, line style by device mix (and variant), the same in every figure of
    a comparison; a marker where a row's colour and line style are another row's already (a
    fifth mix of one algorithm), so that no two rows look alike (up to 60 rows of one colour)."""
    spare = itertools.cycle(SPARE_COLORS)
    colors = {a: ALGO_COLORS.get(a) or next(spare) for a in sorted(set(table["algo"]))}
    mixes = sorted(set(zip(table["devices"], table["variant"], strict=True)))
    taken: Counter[tuple[str, str]] = Counter()
    styles = []
    for _, row in table.iterrows():
        look = (colors[row["algo"]],
                LINESTYLES[mixes.index((row["devices"], row["variant"])) % len(LINESTYLES)])
        styles.append({"color": look[0], "linestyle": look[1],
                       "marker": MARKERS[taken[look] % len(MARKERS)], "markevery": MARK_EVERY,
                       "markersize": 4})
        taken[look] += 1
    return styles


def _row_curves(comp: Comparison, row: pd.Series, axis: str,
                column: str) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """The row's completed runs' (axis, column) curves, NaN snapshots left out, and how many
    of those runs were flagged as contended (drawn all the same: on a busy machine every run
    may be, and an empty figure shows nothing)."""
    runs = comp.runs
    mine = runs[(runs["algo"] == row["algo"]) & (runs["devices"] == row["devices"])
                & (runs["variant"] == row["variant"])]
    curves, contended = [], 0
    for _, run in mine.iterrows():
        curve = comp.curves.get(run["run_dir"])
        if curve is not None and column in curve:
            part = curve[[axis, column]].dropna()
            if len(part):
                curves.append((part[axis].to_numpy(float), part[column].to_numpy(float)))
                contended += flagged(run)
    return curves, contended


def _comparison_curves(comp: Comparison, table: pd.DataFrame, axis: str, column: str,
                       ax: Axes) -> bool:
    drawn = False
    for (_, row), style in zip(table.iterrows(), _styles(table), strict=True):
        curves, contended = _row_curves(comp, row, axis, column)
        if not curves:
            continue
        grid, mean, low, high = _band(curves)
        marked = f", {contended} flagged" if contended else ""
        ax.plot(grid, mean, linewidth=1.6, label=f"{row_label(row)}  (n={len(curves)}{marked})",
                **style)
        if len(curves) > 1:
            ax.fill_between(grid, low, high, color=style["color"], alpha=0.15, linewidth=0)
        drawn = True
    return drawn


def _tick_label(row: pd.Series) -> str:
    """Algorithm, device mix and each override of the variant on lines of their own."""
    return "\n".join([row["algo"], mix_label(row),
                      *row["variant"].split()])


def _comparison_title(comp: Comparison, table: pd.DataFrame, what: str) -> str:
    mixes = sorted({mix_label(r) for _, r in table.iterrows()})
    return f"{comp.title}: {what}\ndevices: {', '.join(mixes)}; {BAND}"


def _comparison_figures(comp: Comparison) -> list[tuple[str, Figure]]:
    table = aggregate(comp)
    table = table[table["n"] > 0].reset_index(drop=True)
    if table.empty:
        return []
    figures = []
    best = "—" if comp.l_best is None else f"{comp.l_best:.4g}"
    simulated = table["simulated"].tolist()
    for axis, xlabel, name in loss_axes(simulated):
        fig, ax = new_figure()
        if _comparison_curves(comp, table, axis, "normalized", ax):
            normalized_axes(ax, xlabel, _comparison_title(
                comp, table, f"normalized {loss_name(comp.loss)} vs {xlabel.split(' [')[0]} "
                            f"(L_best = {best})"))
            figures.append((name, fig))
    fig, ax = new_figure()
    if _comparison_curves(comp, table, "time_s", "test_acc", ax):
        ax.set_xlim(left=0)
        xlabel = time_label(simulated)
        ax.set(xlabel=xlabel, ylabel="test accuracy",
               title=_comparison_title(comp, table, f"test accuracy vs {xlabel.split(' [')[0]}"))
        legend(ax)
        figures.append(("accuracy_vs_time", fig))
    if comp.groups:
        fig, ax = new_figure(max(SIZE[0], 1.5 * len(table) + 1.0))
        shares = [[f"share_{g}_mean", f"share_{g}_std"] for g in comp.groups]
        share_bars(ax, [_tick_label(row) for _, row in table.iterrows()],
                    comp.groups, table[[m for m, _ in shares]].to_numpy(float),
                    table[[s for _, s in shares]].to_numpy(float))
        ax.set_title(_comparison_title(comp, table, "update share per worker group")
                     .replace(BAND, "mean over seeds, error bar = std"))
        figures.append(("update_shares", fig))
    return figures


def _suffixes(comps: list[Comparison]) -> list[str]:
    """File-name suffix per comparison: the dataset, plus the model when the dataset has more
    than one, plus the clock (virtual, real) when both clocks have runs of it."""
    names = [c.dataset for c in comps]
    for part in ("model", "clock"):
        names = [name if names.count(name) == 1 else f"{name}_{getattr(c, part)}"
                 for name, c in zip(names, comps, strict=True)]
    return [re.sub(r"[^\w.+-]", "_", name) for name in names]


@styled
def plot_comparison(runs: pd.DataFrame | Iterable[Path], out_dir: Path,
                    formats: Sequence[str] = ("png",)) -> list[Path]:
    """Comparison figures (``loss_vs_time_<dataset>`` ...) for the runs given as an index
    (:func:`hetsgd.outputs.index.index_runs`) or as run directories, into ``out_dir``."""
    formats = check_formats(formats)
    index = runs if isinstance(runs, pd.DataFrame) else index_dirs(runs)
    comps = comparisons(index)
    return [path for comp, suffix in zip(comps, _suffixes(comps), strict=True)
            for name, fig in _comparison_figures(comp)
            for path in save(fig, Path(out_dir), f"{name}_{suffix}", formats)]


def plot_all(path: Path, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Redraw everything under ``path``: each run's figures, then comparison figures into
    ``figures/`` of each sweep and of ``path`` itself (unless it is a single run). A run whose
    files cannot be read is skipped with a warning naming the file; the others are drawn."""
    path, formats = Path(path), check_formats(formats)
    index = index_runs(path)
    written = []
    for run_dir in index["run_dir"]:
        try:
            written += plot_run(Path(run_dir), formats)
        except (UserError, OSError, ValueError, TypeError, KeyError) as err:
            log.warning("no figures for %s: %s", shown(run_dir), shown(err))
    if is_run_dir(path):
        return written  # a run's unreadable files: comparisons() warns and leaves the run out
    for where in sorted(set(find_sweeps(path)) | {path}):
        inside = index.loc[np.array([Path(d).is_relative_to(where) for d in index["run_dir"]],
                                    dtype=bool)]
        if not inside.empty:
            written += plot_comparison(inside, where / "figures", formats)
    return written
