"""Comparisons: the runs whose losses and times are on one scale, and their per-run numbers.

A *comparison* is the set of runs with the same data, model and clock: simulated runs' times
are virtual (the virtual clock's), the others' measured, so the two never share a time column
or a best loss; nor do runs on other data (another dataset, or other ``dataset`` values).
Within it, every run's normalized loss is (L0 - L) / (L0 - L_best), L0 the run's own initial
loss and L_best the lowest loss any completed run of the comparison reached, so that
"0.9" means the same loss for every algorithm and device mix. The loss is the test loss where
every completed run of the comparison evaluated one, else the training loss. Time and epochs to
a target are *sustained* (:func:`hetsgd.outputs.metrics.sustained`): after them the run stays at
or beyond the target to its end; a run that reached a target and left it is ``unstable`` there.

A row is one algorithm on one device mix and one variant: the overrides, other than algo,
devices, dataset, model and seed, that not every run of the comparison shares (such as
``optim.lr=0.05``), and the ``optim`` values of the run's ``config.yaml`` that differ from the
schema's defaults (a device mix's own lr, for one). Runs flagged as contended
(``summary.json["contention"]["flagged"]``) are counted but not timed unless kept.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hetsgd.config.optim import OPTIM_SCHEMAS, SGDConfig
from hetsgd.errors import UserError
from hetsgd.outputs.index import (
    UNUSABLE,
    flatten,
    load_csv,
    override_key,
    settings,
)
from hetsgd.outputs.intervals import mean_interval
from hetsgd.outputs.metrics import (
    TARGETS,
    TIMED_LOSSES,
    loss_name,
    normalized_loss,
    snapshot_spacing,
    sustained,
    timed_loss,
)
from hetsgd.outputs.safe_text import shown

log = logging.getLogger(__name__)

ROW_KEYS = ("algo", "devices", "variant")
#: Table order of the papers' algorithms; others follow alphabetically.
ALGO_ORDER = ("sync", "hogwild", "hogbatch", "adaptive", "local_sgd")
#: (column, table header, number format) of the per-run metrics, in table order; the times'
#: headers name the loss they are timed on (``{loss}``).
TIMES: tuple[tuple[str, str, str], ...] = (
    *((f"time_to_{t}", f"t@{t} {{loss}} [s]", ".2f") for t in TARGETS),
    *((f"epochs_to_{t}", f"ep@{t}", ".2f") for t in TARGETS),
)
METRICS: tuple[tuple[str, str, str], ...] = (
    *TIMES,
    ("train_loss", "train loss", ".4f"),
    ("test_loss", "test loss", ".4f"),
    ("test_acc", "test acc", ".3f"),
)
#: Utilization metrics, shown after the update shares: the run's own (cores busy with its worker
#: processes, its GPUs), then the host's CPU, which counts every other process too; then the
#: CPU time its workers got over what they wanted (``contention.workers_cpu_share``) and the
#: median snapshot spacing, the resolution of its times.
UTILIZATION: tuple[tuple[str, str, str], ...] = (
    ("workers_cpu_cores", "workers' CPU [cores]", ".1f"),
    ("gpu_util", "GPU util [%]", ".0f"),
    ("host_cpu", "host CPU [%]", ".0f"),
    ("cpu_share", "workers' CPU share", ".2f"),
    ("spacing", "snapshot spacing [s]", ".3f"),
)
SHARE_PREFIX = "update_share."
CLOCKS = {True: "virtual", False: "real"}


@dataclass
class Comparison:
    """The runs of one dataset, model and clock, with their curves on one normalized scale."""

    dataset: str
    model: str
    clock: str  # virtual (simulated runs) or real
    loss: str  # the convergence.csv column timed: test_loss or train_loss
    runs: pd.DataFrame  # rows of the index, any status
    curves: dict[str, pd.DataFrame]  # run_dir -> convergence.csv plus a `normalized` column
    l_best: float | None
    common: str = ""  # the settings every run shares

    @property
    def title(self) -> str:
        return f"{self.dataset} · {self.model} · {self.clock} time"

    @property
    def groups(self) -> list[str]:
        """Worker groups that some run of the comparison reports an update share for."""
        cols = [c for c in self.runs.columns if c.startswith(SHARE_PREFIX)]
        return [c[len(SHARE_PREFIX):] for c in cols if self.runs[c].notna().any()]


def plain(value: object) -> str:
    """A summary value as text: '' for missing, ``1`` for a seed that pandas made ``1.0``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def mix_label(run: Mapping[str, Any]) -> str:
    """A run's (or a row's) device mix, marked ``(emulated)`` or ``(simulated)`` where its name
    does not say so already."""
    devices = str(run.get("devices") or "?")
    marks = [mark for mark in ("emulated", "simulated") if run.get(mark) and mark not in devices]
    return f"{devices}{''.join(f' ({mark})' for mark in marks)}"


def row_label(row: pd.Series) -> str:
    """``hogbatch · cpu+gpu (emulated)``, plus the variant's overrides if any."""
    label = f"{row['algo']} · {mix_label(row)}"
    return f"{label} [{row['variant']}]" if row["variant"] else label


def row_order(frame: pd.DataFrame) -> pd.DataFrame:
    rank = {algo: i for i, algo in enumerate(ALGO_ORDER)}
    order = frame["algo"].map(lambda a: rank.get(a, len(rank)))
    return (frame.assign(_rank=order).sort_values(["_rank", "algo", "devices", "variant"])
            .drop(columns="_rank").reset_index(drop=True))


def optim_settings(config: dict[str, Any]) -> frozenset[str]:
    """``optim.<key>=<value>`` for each optim value of the run's ``config.yaml`` (``config``, as
    :func:`read_config` reads it) that differs from its optimizer schema's default (``{}``
    without one): what a device mix or an experiment set without an override saying so."""
    optim = config.get("optim")
    if not isinstance(optim, dict):
        return frozenset()
    defaults = dataclasses.asdict(OPTIM_SCHEMAS.get(str(optim.get("name")), SGDConfig)())
    return frozenset(f"optim.{key}={plain(value)}" for key, value in optim.items()
                     if key in defaults and value != defaults[key])


def variants(overrides: pd.Series, configs: pd.Series) -> tuple[pd.Series, str]:
    """Per run (a tuple of overrides each, and its config.yaml), the settings that not every run
    shares plus its non-default optim values (:func:`optim_settings`) that no such override
    names, sorted and space-joined ('' for none), so a sweep-wide ``budget.epochs=3`` does not
    split rows; and the settings every run shares, for the section's text."""
    own = overrides.map(settings)
    common = frozenset.intersection(*own) if len(own) else frozenset()
    split = own.map(lambda mine: mine - common)
    optims = configs.map(optim_settings)
    rows = [" ".join(sorted(mine | {o for o in optim if override_key(o) not in
                                    {override_key(m) for m in mine}}))
            for mine, optim in zip(split, optims, strict=True)]
    return pd.Series(rows, index=overrides.index, dtype=object), " ".join(sorted(common))


def _read_curves(runs: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The completed runs' convergence.csv; an unreadable one, or one missing or without a
    training loss (a completed run evaluated at least its first and last snapshot), marks its
    run ``unusable``, so that it is never timed as a run that did not reach a target."""
    raw = {}
    for i, run_dir in runs.loc[runs["status"] == "completed", "run_dir"].items():
        try:
            frame = load_csv(Path(run_dir), "convergence")
        except UserError as err:  # one unreadable file costs only its own run
            log.warning("left out %s: %s", shown(run_dir), shown(err))
            runs.loc[i, ["status", "error"]] = [UNUSABLE, str(err)]
            continue
        if frame is None or not frame["train_loss"].notna().any():  # a completed run evaluated
            why = f"{Path(run_dir) / 'convergence.csv'} is missing or holds no training loss"
            log.warning("left out %s: %s", shown(run_dir), shown(why))  # its curve: damaged, not
            runs.loc[i, ["status", "error"]] = [UNUSABLE, why]  # slow
            continue
        raw[run_dir] = frame
    return raw


def comparisons(index: pd.DataFrame) -> list[Comparison]:
    """Group the index by data, model and clock, name each run's variant and put every
    completed run's curve on the comparison's normalized scale (the data: see
    :func:`_data_names`). Runs that do not name their dataset and model are left out."""
    known = index[index["dataset"].notna() & index["model"].notna()].copy()
    known["algo"] = known["algo"].fillna("?")
    known["devices"] = known["devices"].fillna("?")
    known["clock"] = known["simulated"].map(lambda s: CLOCKS[bool(s)])
    known["dataset"] = _data_names(known)
    result = []
    for (dataset, model, clock), group in known.groupby(["dataset", "model", "clock"],
                                                        sort=True):
        variant, common = variants(group["overrides"], group["config"])
        runs = group.assign(variant=variant).drop(columns="config")
        # a mix's name does not say whether its accelerator was real (auto, with and without a
        # GPU): where one row's runs differ there, the emulated ones are a row of their own
        emulated = runs["emulated"]  # a bool: the index reads it so
        both = emulated.groupby([runs["algo"], runs["devices"], runs["variant"]]).transform(
            "nunique") > 1
        runs.loc[both & emulated, "variant"] = (runs["variant"] + " emulated").str.strip()
        raw = _read_curves(runs)
        # the loss every run has: the test loss unless some run evaluated none
        loss = max((timed_loss(f) for f in raw.values()), key=TIMED_LOSSES.index,
                   default=TIMED_LOSSES[-1])
        losses = [f[loss][np.isfinite(f[loss])] for f in raw.values()]
        l_best = min((float(s.min()) for s in losses if len(s)), default=None)
        curves = {run_dir: frame.assign(normalized=normalized_loss(
            frame[loss], float(frame[loss].iloc[0]), l_best))
            for run_dir, frame in raw.items()}
        result.append(Comparison(str(dataset), str(model), str(clock), loss, row_order(runs),
                                 curves, l_best, common))
    return result


def _data_names(known: pd.DataFrame) -> list[str]:
    """Each run's data, by name: its dataset's label, and where runs of one label differ in the
    ``dataset`` section of their config.yaml (an override, or an experiment's file, set
    ``dataset.limit``), the values they differ in (``digits [dataset.limit=500]``). A key that
    some of them lack (written before it existed) is no difference."""
    values = [_dataset_values(config) for config in known["config"]]
    names = [str(label) for label in known["dataset"]]
    for label in set(names):
        mine = [i for i, name in enumerate(names) if name == label]
        keys = set.intersection(*(set(values[i]) for i in mine))
        apart = sorted(key for key in keys if len({values[i][key] for i in mine}) > 1)
        for i in mine if apart else []:
            names[i] = f"{label} [{' '.join(f'{key}={values[i][key]}' for key in apart)}]"
    return names


def _dataset_values(config: dict[str, Any]) -> dict[str, str]:
    """``dataset.<key>`` -> its value as text, from the run's config.yaml ({} without one)."""
    section = config.get("dataset")
    flat = flatten(section, "dataset.") if isinstance(section, dict) else {}
    return {key: "null" if value is None else plain(value) for key, value in flat.items()}


def flagged(run: Mapping[str, Any]) -> bool:
    """Whether the run was flagged as contended (its workers got too little of their CPU);
    absent or not a boolean: not flagged."""
    value = run.get("contention.flagged")
    return isinstance(value, bool | np.bool_) and bool(value)


def _timed(curve: pd.DataFrame | None, row: dict[str, Any]) -> None:
    """The run's sustained times and epochs to each target into ``row``, whether it was
    unstable there, and how long it ran (a bound for a target it never reached)."""
    for target in TARGETS:
        for axis, name in (("time_s", "time_to"), ("epoch", "epochs_to")):
            reach = None if curve is None else sustained(curve[axis], curve["normalized"],
                                                         target)
            row[f"{name}_{target}"] = math.nan if reach is None or reach.time is None \
                else reach.time
            if axis == "time_s":
                row[f"unstable_{target}"] = reach is not None and reach.unstable
    row["time_ran"] = math.nan if curve is None else float(curve["time_s"].max())


def run_metrics(comp: Comparison, keep_flagged: bool = False) -> pd.DataFrame:
    """One row per run of the comparison; the metrics are NaN except for completed runs, and
    the times NaN also for flagged runs unless ``keep_flagged`` (``timed`` says which count)."""
    rows = []
    for _, run in comp.runs.iterrows():
        row = {key: run[key] for key in (*ROW_KEYS, "emulated", "simulated", "status")}
        row["learnt"] = run.get("learnt")  # None for a run written before it was judged
        row["flagged"] = flagged(run)
        row["timed"] = run["status"] == "completed" and (keep_flagged or not row["flagged"])
        if run["status"] == "completed":
            curve = comp.curves.get(run["run_dir"])
            _timed(curve if row["timed"] else None, row)
            row["spacing"] = None if curve is None else snapshot_spacing(curve["time_s"])
            for key in ("train_loss", "test_loss", "test_acc"):
                row[key] = run.get(f"final.{key}")
            row["workers_cpu_cores"] = run.get("utilization.workers_cpu_cores_mean")
            row["gpu_util"] = run.get("utilization.gpu_util_mean")
            row["host_cpu"] = run.get("utilization.host_cpu_percent_mean")
            row["cpu_share"] = run.get("contention.workers_cpu_share")
            for group in comp.groups:
                row[f"share_{group}"] = run.get(f"{SHARE_PREFIX}{group}")
        rows.append(row)
    frame = pd.DataFrame(rows)
    for col in [*metric_columns(comp), "time_ran"]:
        frame[col] = pd.to_numeric(frame[col], errors="coerce") if col in frame else math.nan
    return frame


def metric_columns(comp: Comparison) -> list[str]:
    return [col for col, _, _ in METRICS + UTILIZATION] + [f"share_{g}" for g in comp.groups]


def status_text(runs: pd.DataFrame) -> str:
    """``2/3 completed (1 not learnt, 1 unstable, 1 flagged), 1 diverged``: completed runs whose
    loss did not go down and stay down, that reached normalized loss 0.9 and left it, and that
    were flagged as contended, are counted as such."""
    statuses = runs["status"]
    counts = Counter(statuses)
    done = counts.pop("completed", 0)
    completed = statuses == "completed"
    marks = {"not learnt": completed & runs["learnt"].eq(False),
             f"unstable at {TARGETS[0]}": completed & runs.get(
                 f"unstable_{TARGETS[0]}", pd.Series(False, index=runs.index)).eq(True),
             "flagged": completed & runs.get("flagged", pd.Series(False, index=runs.index))}
    noted = [f"{int(mask.sum())} {name}" for name, mask in marks.items() if mask.any()]
    text = f"{done}/{len(statuses)} completed" + (f" ({', '.join(noted)})" if noted else "")
    return ", ".join([text, *(f"{n} {status}" for status, n in sorted(counts.items()))])


def aggregate(comp: Comparison, metrics: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (algo, devices, variant): ``n`` completed runs, ``timed`` of them timed,
    ``runs`` in all, a status text, and ``<metric>_mean``, ``<metric>_std`` (NaN for one run)
    and ``<metric>_n`` (how many runs have the metric: fewer than ``n`` when some seeds never
    reached a target); the times also ``<metric>_low`` / ``_high``, the Student-t interval of
    the mean, cut at 0 (:func:`~hetsgd.outputs.intervals.mean_interval`; NaN below two runs)."""
    metrics = run_metrics(comp) if metrics is None else metrics
    rows = []
    for keys, runs in metrics.groupby(list(ROW_KEYS), sort=False):
        row = dict(zip(ROW_KEYS, keys, strict=True))
        row.update(emulated=bool(runs["emulated"].any()), simulated=bool(runs["simulated"].any()),
                   n=int((runs["status"] == "completed").sum()), timed=int(runs["timed"].sum()),
                   runs=len(runs), status=status_text(runs), loss=loss_name(comp.loss))
        for col in metric_columns(comp):
            values = runs[col].dropna()
            row.update({f"{col}_mean": values.mean() if len(values) else math.nan,
                        f"{col}_std": values.std() if len(values) > 1 else math.nan,
                        f"{col}_n": len(values)})
        for col, _, _ in TIMES:
            low, high = (mean_interval(runs[col].dropna().tolist(), at_least=0.0)
                         or (math.nan, math.nan))
            row.update({f"{col}_low": low, f"{col}_high": high})
        rows.append(row)
    return row_order(pd.DataFrame(rows))
