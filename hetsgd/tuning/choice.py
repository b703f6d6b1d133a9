"""A search's trials as a table, and each method's best setting chosen from it.

Each method's objective comes from its own trials alone: a time to a normalized loss is
measured against the best loss of that method's trials of every round (the loss the report
times: the test loss where each trial has one), so a value added to another method's grid
moves neither its objective nor its choice. Each setting's objective is its mean
over the trial seeds, and a setting that some seed never brought to the target ranks behind
every one that all did (:func:`hetsgd.outputs.report.setting_means`). A setting any of whose
trials diverged, failed or did not learn (its final training loss no lower than its first) is
never chosen. Ties go to the lower mean training loss, then to the setting listed first, so
that the same trials always give the same choice.

Every trial is timed, those whose workers got too little of the CPU (``contention.flagged``)
too, and ``tuning.csv`` says which were (``flagged``). The report leaves such runs out of its
times, as not representative of the machine; a search cannot leave a trial out of its ranking,
where a missing time reads as a target never reached, and on a busy machine, where most trials
are flagged, it would choose by training loss alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from hetsgd.errors import UserError
from hetsgd.outputs.index import index_dirs, override_key, override_values
from hetsgd.outputs.report import (
    KNOB_PREFIX,
    OBJECTIVE_PREFIX,
    Comparison,
    comparisons,
    objective_column,
    run_metrics,
    setting_means,
)
from hetsgd.outputs.sweep import job_dirs

METHOD = "method"


def trial_table(rounds: Sequence[tuple[int, Path]], knobs: Sequence[str],
                objective: str) -> pd.DataFrame:
    """One row per trial run under the folders of ``rounds`` (the search's round number, its
    sweep folder), in round order: its method, its value of each knob, its seed, status and
    whether it learnt, whether its CPU share was flagged, the ``objective`` (NaN unless
    completed and reached), its final training loss, its wall seconds (setup, training in
    real seconds and final evaluation) and its run directory. A method's objectives are
    measured over its trials of every round together: an extension's trials are normalized by
    the method's best loss, not by their own."""
    indexes = []
    for number, folder in rounds:
        index = index_dirs(job_dirs(folder)) if folder.is_dir() else pd.DataFrame()
        if not index.empty:
            indexes.append(index.assign(round=number))
    rows = []
    if indexes:
        index = pd.concat(indexes, ignore_index=True)
        given = index["overrides"].map(override_values)
        for method in dict.fromkeys(given.map(lambda g: g.get(METHOD))):
            mine = index[given.map(lambda g, m=method: g.get(METHOD) == m)]
            for comp in comparisons(mine):  # this method's trials alone
                rows += _rows(comp, knobs, objective)
    columns = [METHOD, *(f"{KNOB_PREFIX}{k}" for k in knobs), "seed", "status", "learnt",
               "flagged", f"{OBJECTIVE_PREFIX}{objective}", "train_loss", "wall_s", "round", "run_dir"]
    return pd.DataFrame(rows, columns=columns).sort_values("round", kind="stable",
                                                           ignore_index=True)


def _rows(comp: Comparison, knobs: Sequence[str], objective: str) -> list[dict[str, object]]:
    metrics = run_metrics(comp, keep_flagged=True)
    rows = []
    for (_, run), (_, measured) in zip(comp.runs.iterrows(), metrics.iterrows()):
        given = override_values(run["overrides"])
        rows.append({METHOD: given.get(METHOD),
                     **{f"{KNOB_PREFIX}{knob}": given.get(override_key(knob)) for knob in knobs},
                     "seed": run["seed"], "status": run["status"], "learnt": run.get("learnt"),
                     "flagged": bool(measured["flagged"]),
                     f"{OBJECTIVE_PREFIX}{objective}": measured.get(objective, math.nan),
                     "train_loss": measured.get("train_loss", math.nan),
                     "wall_s": _wall_s(run), "round": int(run["round"]),
                     "run_dir": run["run_dir"]})
    return rows


def _wall_s(run: pd.Series) -> float:
    """What a trial cost in real seconds: its setup, its training (a simulated run's real
    seconds, not its virtual ones) and its final evaluation; NaN where its summary lacks them."""
    training = run.get("simulation.real_s") if run.get("simulated") else run.get("time_s")
    parts = [training, run.get("timing.before_training_s"), run.get("timing.after_training_s")]
    numbers = pd.to_numeric(pd.Series(parts, dtype=object), errors="coerce")
    return float(numbers.sum()) if numbers.notna().any() else math.nan


def usable(trials: pd.DataFrame) -> pd.Series:
    """Per trial, whether it completed and learnt: a setting with any other trial is never
    chosen (an lr of 1e30 whose loss went up, or that diverged)."""
    learnt = trials["learnt"] if "learnt" in trials.columns else pd.Series(True, trials.index)
    return (trials["status"] == "completed") & learnt.map(lambda v: str(v) == "True")


def choose(trials: pd.DataFrame, maximized: bool,
           methods: Sequence[str] = ()) -> dict[str, dict[str, str]]:
    """Each method's best setting (knob -> value as given) among ``trials``, and the trials
    marked ``chosen``. A method (of the trials, or of ``methods``, which must each get a
    choice) none of whose settings completed and learnt on every trial seed, or that has no
    trial, is a :class:`UserError`."""
    knobs = [c for c in trials.columns if c.startswith(KNOB_PREFIX)]
    objective = objective_column(trials)
    ok = usable(trials)
    means = setting_means(trials.assign(train_loss=trials["train_loss"].where(ok)))
    sign = -1.0 if maximized else 1.0
    chosen: dict[str, dict[str, str]] = {}
    trials["chosen"] = False
    tried = {str(method): settings for method, settings in means.groupby(METHOD, sort=False)}
    for method in dict.fromkeys([*methods, *tried]):
        settings = tried.get(method, means[:0])
        order = sorted(range(len(settings)), key=lambda i: _rank(settings.iloc[i], objective, sign))
        if not order or math.isnan(settings.iloc[order[0]]["train_loss"]):
            raise UserError(f"no setting of +method={method} completed and learnt on every trial "
                            "seed (each diverged, failed or ended no lower than it began), so "
                            "none can be chosen: each trial's status is in tuning.csv")
        best = settings.iloc[order[0]]
        chosen[method] = {knob[len(KNOB_PREFIX):]: str(best[knob]) for knob in knobs}
        mine = trials[METHOD] == method
        for knob in knobs:
            mine &= trials[knob].astype(str) == str(best[knob])
        trials.loc[mine, "chosen"] = True
    return chosen


def _rank(setting: pd.Series, objective: str, sign: float) -> tuple[bool, bool, float, float]:
    """Sort key of a setting: usable first (a NaN training loss: some trial did not complete
    and learn), then reached, then the better objective, then the lower loss."""
    value, loss = float(setting[objective]), float(setting["train_loss"])
    return (math.isnan(loss), math.isnan(value), sign * value if not math.isnan(value) else 0.0,
            loss if not math.isnan(loss) else 0.0)
