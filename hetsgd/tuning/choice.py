"""A search's trials as a table, and each method's best setting chosen from it.

The trials are one comparison (same dataset and model), so a time to a normalized loss is
measured against the best training loss of every trial of every method; each setting's
objective is its mean over the trial seeds, and a setting that some seed never brought to the
target ranks behind every one that all did (:func:`hetsgd.outputs.report.setting_means`).
Ties go to the lower mean training loss, then to the setting listed first, so that the same
trials always give the same choice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from hetsgd.errors import UserError
from hetsgd.outputs.index import index_dirs, override_key
from hetsgd.outputs.report import (
    KNOB_PREFIX,
    OBJECTIVE_PREFIX,
    comparisons,
    objective_column,
    run_metrics,
    setting_means,
)
from hetsgd.outputs.sweep import job_dirs

METHOD = "method"


def trial_table(trials_dir: Path, knobs: Sequence[str], objective: str) -> pd.DataFrame:
    """One row per trial run under ``trials_dir``: its method, its value of each knob, its seed
    and status, the ``objective`` (NaN unless completed and reached), its final training loss
    and its run directory."""
    rows = []
    for comp in comparisons(index_dirs(job_dirs(trials_dir))):
        metrics = run_metrics(comp)
        for (_, run), (_, measured) in zip(comp.runs.iterrows(), metrics.iterrows()):
            given = {override_key(o): o.split("=", 1)[1] for o in run["overrides"] if "=" in o}
            rows.append({"method": given.get(METHOD),
                         **{f"{KNOB_PREFIX}{knob}": given.get(override_key(knob)) for knob in knobs},
                         "seed": run["seed"], "status": run["status"],
                         f"{OBJECTIVE_PREFIX}{objective}": measured.get(objective, math.nan),
                         "train_loss": measured.get("train_loss", math.nan),
                         "run_dir": run["run_dir"]})
    columns = [METHOD, *(f"{KNOB_PREFIX}{k}" for k in knobs), "seed", "status",
               f"{OBJECTIVE_PREFIX}{objective}", "train_loss", "run_dir"]
    return pd.DataFrame(rows, columns=columns)


def choose(trials: pd.DataFrame, maximized: bool) -> dict[str, dict[str, str]]:
    """Each method's best setting (knob -> value as given) among ``trials``, and the trials
    marked ``chosen``. A method none of whose settings completed on every trial seed is a
    :class:`UserError`."""
    knobs = [c for c in trials.columns if c.startswith(KNOB_PREFIX)]
    objective = objective_column(trials)
    means = setting_means(trials)
    sign = -1.0 if maximized else 1.0
    chosen: dict[str, dict[str, str]] = {}
    trials["chosen"] = False
    for method, settings in means.groupby(METHOD, sort=False):
        order = sorted(range(len(settings)), key=lambda i: _rank(settings.iloc[i], objective, sign))
        best = settings.iloc[order[0]]
        if math.isnan(best["train_loss"]):
            raise UserError(f"no setting of +method={method} completed on every trial seed, so "
                            "none can be chosen (each trial's status is in tuning.csv)")
        chosen[str(method)] = {knob[len(KNOB_PREFIX):]: str(best[knob]) for knob in knobs}
        mine = trials[METHOD] == method
        for knob in knobs:
            mine &= trials[knob].astype(str) == str(best[knob])
        trials.loc[mine, "chosen"] = True
    return chosen


def _rank(setting: pd.Series, objective: str, sign: float) -> tuple[bool, float, bool, float]:
    """Sort key of a setting: reached first, then the better objective, then the lower loss."""
    value, loss = float(setting[objective]), float(setting["train_loss"])
    return (math.isnan(value), sign * value if not math.isnan(value) else 0.0,
            math.isnan(loss), loss if not math.isnan(loss) else 0.0)
