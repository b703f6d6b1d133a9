"""The search at a glance: each method's objective (mean over its trial seeds) against each
knob, its choice ringed, written as ``tuning.png`` beside ``tuning.csv``, so a reader sees
whether the choice sits in a valley or on the edge of what was tried."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hetsgd.outputs.figure_style import (
    ALGO_COLORS,
    SPARE_COLORS,
    legend,
    new_figure,
    save,
    styled,
)
from hetsgd.outputs.report import KNOB_PREFIX, OBJECTIVE_PREFIX, objective_column, setting_means
from hetsgd.tuning.choice import METHOD, usable

FIGURE = "tuning"  # tuning.png, in the sweep folder


@styled
def plot_search(trials: pd.DataFrame, out_dir: Path) -> list[Path]:
    """One figure per knob (``tuning.png``, ``tuning_<knob>.png`` after the first): the
    objective of each usable setting (every trial completed and learnt), by method; nothing
    when no setting has one."""
    knobs = [c for c in trials.columns if c.startswith(KNOB_PREFIX)]
    objective = objective_column(trials)
    ok = usable(trials) if "status" in trials.columns else pd.Series(True, trials.index)
    means = setting_means(trials[ok])
    chosen_rows = trials[trials["chosen"].astype(bool)] if "chosen" in trials.columns else trials[:0]
    paths: list[Path] = []
    for i, knob in enumerate(knobs):
        points = means.assign(x=pd.to_numeric(means[knob], errors="coerce")).dropna(
            subset=["x", objective])
        if points.empty:
            continue
        fig, ax = new_figure()
        for j, (method, mine) in enumerate(points.groupby(METHOD, sort=False)):
            color = ALGO_COLORS.get(str(method), SPARE_COLORS[j % len(SPARE_COLORS)])
            mine = mine.sort_values("x")
            ax.plot(mine["x"], mine[objective], "o-", color=color, label=str(method))
            pick = chosen_rows[chosen_rows[METHOD] == method]
            if not pick.empty:
                at = mine[mine[knob].astype(str) == str(pick[knob].iloc[0])]
                ax.plot(at["x"], at[objective], "o", ms=12, mfc="none", color=color)
        if (points["x"] > 0).all():
            ax.set_xscale("log")
        ax.set_xlabel(knob[len(KNOB_PREFIX):])
        ax.set_ylabel(f"{objective[len(OBJECTIVE_PREFIX):]} (mean over trial seeds)")
        ax.set_title("search: each method's objective, its choice ringed")
        legend(ax, "method")
        name = FIGURE if i == 0 else f"{FIGURE}_{knob[len(KNOB_PREFIX):]}"
        paths += save(fig, out_dir, name, ["png"])
    return paths

