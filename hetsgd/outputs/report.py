"""Comparison tables from run directories, built from their files alone.

A *comparison* is the set of runs with the same dataset and model: their losses are on one scale.
Within it, every run's normalized loss is computed as (L0 - L) / (L0 - L_best), L0 the run's own
initial training loss and L_best the lowest training loss reached by any completed run of the
comparison, so that "0.9" means the same loss for every algorithm and device mix. (A run's own
summary holds only absolute losses and the times to reach them.) Time and epochs to a target are
interpolated linearly between the two snapshots around the first crossing.

A row of a table is one algorithm on one device mix and one variant: the overrides, other than
algo, devices, dataset, model and seed, that not every run of the comparison shares (such as
``optim.lr=0.05``). Its numbers are mean ± standard deviation over its completed runs (seeds).
Runs that did not complete are counted in the status column and listed with their errors, not
averaged; so are completed runs whose ``convergence.csv`` cannot be read (``unusable``), and run
directories that were killed before writing their summary (``crashed``): one bad run costs only its
own row.

Every string a run folder gave (its name, its summary's algo or error) is shown with its control
characters escaped (:func:`~hetsgd.outputs.safe_text.shown`), on the terminal and in the files.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hetsgd.errors import UserError
from hetsgd.outputs.index import UNUSABLE, index_runs, load_csv, settings
from hetsgd.outputs.metrics import TARGETS, crossing, normalized_loss
from hetsgd.outputs.run_directory import write_csv, write_text
from hetsgd.outputs.safe_text import shown
from hetsgd.outputs.search_cost import edge_mark, search_cost

log = logging.getLogger(__name__)

ROW_KEYS = ("algo", "devices", "variant")
IDENTITY = ("algo", "devices", "dataset", "model", "seed")
#: Table order of the papers' algorithms; others follow alphabetically.
ALGO_ORDER = ("sync", "hogwild", "hogbatch", "adaptive", "local_sgd")
DASH = "—"

#: (column, table header, number format) of the per-run metrics, in table order.
METRICS: tuple[tuple[str, str, str], ...] = (
    *((f"time_to_{t}", f"t@{t} [s]", ".2f") for t in TARGETS),
    *((f"epochs_to_{t}", f"ep@{t}", ".2f") for t in TARGETS),
    ("train_loss", "train loss", ".4f"),
    ("test_loss", "test loss", ".4f"),
    ("test_acc", "test acc", ".3f"),
)
#: Utilization metrics, shown after the update shares: the run's own (cores busy with its worker
#: processes, its GPUs), then the host's CPU, which counts every other process too.
UTILIZATION: tuple[tuple[str, str, str], ...] = (
    ("workers_cpu_cores", "workers' CPU [cores]", ".1f"),
    ("gpu_util", "GPU util [%]", ".0f"),
    ("host_cpu", "host CPU [%]", ".0f"),
)
SHARE_PREFIX = "update_share."
#: A tuned sweep (hetsgd/tuning/): its search's trials, one row per trial (the method, each knob
#: as ``set.<knob>``, the seed, the objective as ``objective.<metric>``, the training loss and
#: whether the setting was ``chosen``), in ``tuning.csv`` beside its evaluation jobs, whose
#: trials ran under ``tuning/``; each evaluation job names its method as ``+tuned=<method>``.
TUNING_CSV = "tuning.csv"
TRIALS_DIR = "tuning"
TUNED_GROUP = "tuned"
KNOB_PREFIX = "set."
OBJECTIVE_PREFIX = "objective."
MAXIMIZED = frozenset({"test_acc"})  # the objectives (METRICS) where higher wins


@dataclass
class Comparison:
    """The runs of one dataset and model, with their curves on one normalized scale."""

    dataset: str
    model: str
    runs: pd.DataFrame  # rows of the index, any status
    curves: dict[str, pd.DataFrame]  # run_dir -> convergence.csv plus a `normalized` column
    l_best: float | None

    @property
    def title(self) -> str:
        return f"{self.dataset} · {self.model}"

    @property
    def groups(self) -> list[str]:
        """Worker groups that some run of the comparison reports an update share for."""
        cols = [c for c in self.runs.columns if c.startswith(SHARE_PREFIX)]
        return [c[len(SHARE_PREFIX):] for c in cols if self.runs[c].notna().any()]


def _plain(value: object) -> str:
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


def _row_order(frame: pd.DataFrame) -> pd.DataFrame:
    rank = {algo: i for i, algo in enumerate(ALGO_ORDER)}
    order = frame["algo"].map(lambda a: rank.get(a, len(rank)))
    return (frame.assign(_rank=order).sort_values(["_rank", "algo", "devices", "variant"])
            .drop(columns="_rank").reset_index(drop=True))


def variants(overrides: pd.Series) -> pd.Series:
    """Per run (a tuple of overrides each), the settings that not every run shares, sorted and
    space-joined ('' for none), so a sweep-wide ``budget.epochs=3`` does not split rows."""
    own = overrides.map(settings)
    common = frozenset.intersection(*own) if len(own) else frozenset()
    return own.map(lambda mine: " ".join(sorted(mine - common)))


def comparisons(index: pd.DataFrame) -> list[Comparison]:
    """Group the index by dataset and model, name each run's variant and put every completed
    run's curve on the comparison's normalized scale. Runs that do not name their dataset and
    model are left out."""
    known = index[index["dataset"].notna() & index["model"].notna()].copy()
    known["algo"] = known["algo"].fillna("?")
    known["devices"] = known["devices"].fillna("?")
    result = []
    for (dataset, model), group in known.groupby(["dataset", "model"], sort=True):
        runs = group.assign(variant=variants(group["overrides"]))
        raw = {}
        for i, run_dir in runs.loc[runs["status"] == "completed", "run_dir"].items():
            try:
                frame = load_csv(Path(run_dir), "convergence")
            except UserError as err:  # one unreadable file costs only its own run
                log.warning("left out %s: %s", run_dir, err)
                runs.loc[i, ["status", "error"]] = [UNUSABLE, str(err)]
                continue
            if frame is not None and frame["train_loss"].notna().any():
                raw[run_dir] = frame
        losses = [f["train_loss"][np.isfinite(f["train_loss"])] for f in raw.values()]
        l_best = min((float(s.min()) for s in losses if len(s)), default=None)
        curves = {run_dir: frame.assign(normalized=normalized_loss(
            frame["train_loss"], float(frame["train_loss"].iloc[0]), l_best))
            for run_dir, frame in raw.items()}
        result.append(Comparison(str(dataset), str(model), _row_order(runs), curves, l_best))
    return result


def run_metrics(comp: Comparison) -> pd.DataFrame:
    """One row per run of the comparison; the metrics are NaN except for completed runs."""
    rows = []
    for _, run in comp.runs.iterrows():
        row = {key: run[key] for key in (*ROW_KEYS, "emulated", "simulated", "status")}
        row["learnt"] = run.get("learnt")  # None for a run written before it was judged
        if run["status"] == "completed":
            curve = comp.curves.get(run["run_dir"])
            for target in TARGETS:
                for axis, name in (("time_s", "time_to"), ("epoch", "epochs_to")):
                    hit = None if curve is None else crossing(
                        curve[axis], curve["normalized"], target)
                    row[f"{name}_{target}"] = math.nan if hit is None else hit
            for key in ("train_loss", "test_loss", "test_acc"):
                row[key] = run.get(f"final.{key}")
            row["workers_cpu_cores"] = run.get("utilization.workers_cpu_cores_mean")
            row["gpu_util"] = run.get("utilization.gpu_util_mean")
            row["host_cpu"] = run.get("utilization.host_cpu_percent_mean")
            for group in comp.groups:
                row[f"share_{group}"] = run.get(f"{SHARE_PREFIX}{group}")
        rows.append(row)
    frame = pd.DataFrame(rows)
    for col in _metric_columns(comp):
        frame[col] = pd.to_numeric(frame[col], errors="coerce") if col in frame else math.nan
    return frame


def _metric_columns(comp: Comparison) -> list[str]:
    return [col for col, _, _ in METRICS + UTILIZATION] + [f"share_{g}" for g in comp.groups]


def _status_text(statuses: pd.Series, learnt: pd.Series) -> str:
    """``2/3 completed (1 not learnt), 1 diverged``: a completed run whose training loss did not
    go down is counted as such."""
    counts = Counter(statuses)
    done = counts.pop("completed", 0)
    text = f"{done}/{len(statuses)} completed"
    unlearnt = int(((statuses == "completed") & learnt.eq(False)).sum())
    if unlearnt:
        text += f" ({unlearnt} not learnt)"
    return ", ".join([text, *(f"{n} {status}" for status, n in sorted(counts.items()))])


def aggregate(comp: Comparison) -> pd.DataFrame:
    """One row per (algo, devices, variant): ``n`` completed runs, ``runs`` in all, a status
    text, and ``<metric>_mean``, ``<metric>_std`` (NaN for one run) and ``<metric>_n`` (how many
    runs have the metric: fewer than ``n`` when some seeds never reached a target)."""
    metrics = run_metrics(comp)
    rows = []
    for keys, runs in metrics.groupby(list(ROW_KEYS), sort=False):
        row = dict(zip(ROW_KEYS, keys, strict=True))
        row.update(emulated=bool(runs["emulated"].any()), simulated=bool(runs["simulated"].any()),
                   n=int((runs["status"] == "completed").sum()), runs=len(runs),
                   status=_status_text(runs["status"], runs["learnt"]))
        for col in _metric_columns(comp):
            values = runs[col].dropna()
            row.update({f"{col}_mean": values.mean() if len(values) else math.nan,
                        f"{col}_std": values.std() if len(values) > 1 else math.nan,
                        f"{col}_n": len(values)})
        rows.append(row)
    return _row_order(pd.DataFrame(rows))


def parse_selector(text: str) -> dict[str, str]:
    """``"algo=sync devices=gpu"`` -> ``{"algo": "sync", "devices": "gpu"}``."""
    pairs = [token.split("=", 1) for token in text.split()]
    if not pairs or any(len(pair) != 2 or not pair[0] for pair in pairs):
        raise UserError(f"a baseline is key=value pairs such as 'algo=sync devices=gpu', "
                        f"not {text!r}")
    return dict(pairs)  # type: ignore[arg-type]


def _baseline_row(comp: Comparison, table: pd.DataFrame, selector: str | None) -> int | None:
    """Index into ``table`` of the baseline row. Default: the comparison's sync row (preferring
    plain over variants and the mix named gpu over others, as in the papers)."""
    usable = table[table["n"] > 0]
    if selector is None:
        sync = usable[usable["algo"] == "sync"]
        if sync.empty:
            return None
        prefer = sorted(sync.index, key=lambda i: (sync.at[i, "variant"] != "",
                                                   sync.at[i, "devices"] != "gpu", i))
        return int(prefer[0])
    wanted = parse_selector(selector)
    unknown = [key for key in wanted if key not in comp.runs.columns]
    if unknown:
        raise UserError(f"baseline key {unknown[0]!r} is not a summary.json key "
                        "(use e.g. algo, devices, seed)")
    match = comp.runs[comp.runs["status"] == "completed"]
    for key, value in wanted.items():
        match = match[match[key].map(_plain) == value]
    matched = set(match[list(ROW_KEYS)].itertuples(index=False, name=None))
    hits = [i for i, row in usable.iterrows() if tuple(row[list(ROW_KEYS)]) in matched]
    return int(hits[0]) if hits else None


def _time_ran(comp: Comparison, row: pd.Series) -> float | None:
    """Mean over the row's completed runs of the last time its curve shows: how long each ran
    without reaching a target it never reached. None when no run of the row has a curve."""
    runs = comp.runs[comp.runs["status"] == "completed"]
    for key in ROW_KEYS:
        runs = runs[runs[key] == row[key]]
    ends = [float(curve["time_s"].max()) for curve in map(comp.curves.get, runs["run_dir"])
            if curve is not None]
    return float(np.mean(ends)) if ends else None


def add_speedup(comp: Comparison, table: pd.DataFrame, selector: str | None) -> str:
    """Add ``speedup`` (baseline t@0.9 / row t@0.9), ``speedup_bound`` and ``baseline`` columns
    to ``table`` and return the sentence that names the baseline. A baseline that never reached
    0.9 ran for as long as it ran without getting there, so its time to 0.9 is longer still:
    that time over the row's t@0.9 is a lower bound of the speedup (``speedup_bound``), which
    answers whether the row is faster on a machine where the baseline falls short."""
    target = TARGETS[0]
    first = f"time_to_{target}_mean"
    table["baseline"] = False
    table["speedup"] = math.nan
    table["speedup_bound"] = False
    base = _baseline_row(comp, table, selector)
    how = f"matching '{selector}'" if selector else "default: the comparison's sync run"
    if base is None:
        return f"No baseline ({how}) in this comparison: no speedups."
    table.loc[base, "baseline"] = True
    name = row_label(table.loc[base])
    base_time = table.at[base, first]
    if np.isfinite(base_time):
        table["speedup"] = base_time / table[first]
        return f"Speedup = baseline t@{target} / row t@{target}; baseline: {name} ({how})."
    ran = _time_ran(comp, table.loc[base])
    if ran is None:
        return f"Baseline {name} ({how}) never reached {target}: no speedups."
    table["speedup"] = ran / table[first]
    table["speedup_bound"] = True
    return (f"Baseline {name} ({how}) never reached {target} in the {ran:.2f} s it ran (mean over "
            f"its runs), so its t@{target} is longer: speedup ≥ {ran:.2f} s / row t@{target}, "
            f"a lower bound.")


def _speedup_cell(row: pd.Series) -> str:
    """The ratio, or ``≥ 1.70x`` where it is a lower bound (see :func:`add_speedup`)."""
    text = _number(row["speedup"], ".2f")
    return f"≥ {text}x" if row["speedup_bound"] and text != DASH else text


def _number(value: float, fmt: str) -> str:
    return format(value, fmt) if np.isfinite(value) else DASH


def _cell(row: pd.Series, col: str, fmt: str) -> str:
    """``mean ± std`` over the runs that have the metric; ``(k/n)`` when only some have it."""
    mean, std, count = row[f"{col}_mean"], row[f"{col}_std"], row[f"{col}_n"]
    if not np.isfinite(mean):
        return DASH
    text = _number(mean, fmt) + (f" ± {_number(std, fmt)}" if np.isfinite(std) else "")
    return text + (f" ({count}/{row['n']})" if count < row["n"] else "")


def _shares(row: pd.Series, groups: list[str]) -> str:
    parts = []
    for group in groups:
        mean, std = row[f"share_{group}_mean"], row[f"share_{group}_std"]
        if np.isfinite(mean):
            spread = f"±{std:.2f}" if np.isfinite(std) else ""
            parts.append(f"{group} {mean:.2f}{spread}")
    return " / ".join(parts) or DASH


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(shown(c).replace("|", "\\|") for c in cells) + " |"
    return "\n".join([line(headers), line(["---"] * len(headers)), *map(line, rows)])


def objective_column(trials: pd.DataFrame) -> str:
    """The one ``objective.<metric>`` column of a tuned sweep's trials."""
    found = [c for c in trials.columns if c.startswith(OBJECTIVE_PREFIX)]
    if len(found) != 1:
        raise UserError(f"{TUNING_CSV} has {len(found)} {OBJECTIVE_PREFIX}<metric> columns, not one")
    return found[0]


def setting_means(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per method and setting of a tuned sweep's trials, in trial order: the objective's
    and the training loss's means over the trial seeds (NaN where a seed has none: a setting
    that some seed never brought to the target ranks behind one that every seed did)."""
    knobs = [c for c in trials.columns if c.startswith(KNOB_PREFIX)]
    values = [objective_column(trials), "train_loss"]
    numbers = trials.assign(**{c: pd.to_numeric(trials[c], errors="coerce") for c in values})
    return (numbers.groupby(["method", *knobs], sort=False, dropna=False)[values]
            .agg(lambda column: column.mean(skipna=False)).reset_index())


def add_tuning(table: pd.DataFrame, trials: pd.DataFrame) -> list[str]:
    """Add to ``table`` (a tuned sweep's comparison) each row's chosen knob values
    (``chosen <knob>``, marked ``(high edge)`` on an edge: :mod:`hetsgd.outputs.search_cost`) and its
    search's spread (``search <objective>``: the best .. worst
    setting mean, with how many settings have one where not all do); return those columns."""
    objective = objective_column(trials)
    knobs = [c for c in trials.columns if c.startswith(KNOB_PREFIX)]
    means = setting_means(trials)
    maximized = objective[len(OBJECTIVE_PREFIX):] in MAXIMIZED
    search = f"search {objective[len(OBJECTIVE_PREFIX):]}"
    columns = [f"chosen {knob[len(KNOB_PREFIX):]}" for knob in knobs] + [search]
    for column in columns:
        table[column] = DASH
    for i, row in table.iterrows():
        method = next((o.split("=", 1)[1] for o in str(row["variant"]).split()
                       if o.startswith(f"+{TUNED_GROUP}=")), None)
        chosen = trials[(trials["method"] == method) & trials["chosen"].astype(bool)]
        for knob, column in zip(knobs, columns):
            if not chosen.empty:
                table.at[i, column] = (_plain(chosen[knob].iloc[0]) +
                                       edge_mark(chosen, knob[len(KNOB_PREFIX):]))
        spread = means.loc[means["method"] == method, objective]
        reached = spread.dropna().sort_values(ascending=not maximized)
        if len(spread):
            table.at[i, search] = ((f"{reached.iloc[0]:.3g} .. {reached.iloc[-1]:.3g}"
                                    if len(reached) else DASH) +
                                   (f" ({len(reached)}/{len(spread)})"
                                    if len(reached) < len(spread) else ""))
    return columns


def comparison_markdown(comp: Comparison, table: pd.DataFrame, baseline_text: str,
                        tuned: Sequence[str] = ()) -> str:
    """The comparison's section; ``tuned``: a tuned sweep's columns (:func:`add_tuning`), after
    the setting."""
    with_variant = bool((table["variant"] != "").any())
    headers = ["algo", "devices", *(["setting"] if with_variant else []), *tuned, "n", "status",
               *(header for _, header, _ in METRICS), "update share",
               *(header for _, header, _ in UTILIZATION), "speedup"]
    rows = []
    for _, row in table.iterrows():
        rows.append([row["algo"], mix_label(row),
                     *([row["variant"] or DASH] if with_variant else []),
                     *(row[column] for column in tuned), str(row["n"]),
                     row["status"], *(_cell(row, col, fmt) for col, _, fmt in METRICS),
                     _shares(row, comp.groups),
                     *(_cell(row, col, fmt) for col, _, fmt in UTILIZATION),
                     _speedup_cell(row)])
    best = DASH if comp.l_best is None else f"{comp.l_best:.4g}"
    return "\n\n".join([
        f"## {shown(comp.title)}",
        (f"Normalized loss = (L0 - L) / (L0 - L_best), L0 each run's initial training loss and "
         f"L_best = {best}, the lowest training loss reached by any completed run of this "
         f"comparison (same dataset and model). Times are training wall time (virtual time for "
         f"simulated runs), interpolated between snapshots; mean ± std over the n completed "
         f"runs (seeds). {shown(baseline_text)}"),
        markdown_table(headers, rows)])


def _failed_markdown(index: pd.DataFrame, root: Path) -> str:
    failed = index[index["status"] != "completed"]
    if failed.empty:
        return ""
    lines = ["## Failed runs", ""]
    for _, run in failed.iterrows():
        where = Path(run["run_dir"]).resolve()
        rel = where.relative_to(root) if where.is_relative_to(root) else where
        what = ", ".join(f"{key} {_plain(run[key])}" for key in IDENTITY if _plain(run[key]))
        error = " ".join((_plain(run["error"]) or "no error recorded").split())
        lines.append(shown(f"- `{rel}` ({what}): **{run['status']}**: {error}"))
    return "\n".join(lines)


def _tuning_trials(root: Path) -> pd.DataFrame | None:
    """The trials of the tuned sweep at ``root`` (None for any other folder); an unreadable
    ``tuning.csv`` is a :class:`UserError` naming it."""
    file = root / TUNING_CSV
    if not file.is_file():
        return None
    try:
        trials = pd.read_csv(file, dtype={"method": str})
    except (OSError, ValueError) as err:
        raise UserError(f"unreadable {file}: {err}") from err
    missing = [c for c in ("method", "chosen", "train_loss") if c not in trials.columns]
    if missing:
        raise UserError(f"unreadable {file}: no {missing[0]} column")
    return trials


def build_report(index: pd.DataFrame, root: Path,
                 baseline: str | None = None) -> tuple[str, pd.DataFrame]:
    """The markdown report and its numbers (one row per comparison row) for the runs of
    ``index``; ``root`` is where failed runs' paths are shown relative to. A completed run whose
    ``convergence.csv`` cannot be read is reported as ``unusable``, with the file named."""
    root = Path(root).resolve()
    sections = [f"# hetsgd report: {shown(root.name or root)}"]
    tables = []
    trials = _tuning_trials(root)
    comps = comparisons(index)
    for comp in comps:
        table = aggregate(comp)
        text = add_speedup(comp, table, baseline)
        tuned = add_tuning(table, trials) if trials is not None else []
        sections.append(comparison_markdown(comp, table, text, tuned))
        if trials is not None:
            sections.append(search_cost(trials))
        tables.append(table.assign(dataset=comp.dataset, model=comp.model, l_best=comp.l_best))
    # the comparisons' runs carry the statuses found while reading their curves (unusable)
    unnamed = index[index["dataset"].isna() | index["model"].isna()]
    sections.append(_failed_markdown(pd.concat([unnamed, *(c.runs for c in comps)]), root))
    numbers = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    if not numbers.empty:
        first = ["dataset", "model", "l_best", "algo", "devices", "emulated", "simulated",
                 "variant", "n",
                 "runs", "status", "baseline", "speedup", "speedup_bound"]
        numbers = numbers[first + [c for c in numbers.columns if c not in first]]
    return "\n\n".join(s for s in sections if s) + "\n", numbers


def write_report(path: Path, baseline: str | None = None, index: pd.DataFrame | None = None) -> str:
    """Report on every run under ``path`` (a run, a sweep or all of ``results/``): write
    ``report.md`` and ``report.csv`` into ``path`` (each replaced atomically) and return the
    markdown. Runs that failed, crashed or left unreadable files are listed, never fatal.
    ``index``: those runs, when the caller has read them already (a sweep's jobs); when it is
    missing or empty, the runs are found under ``path``."""
    path = Path(path)
    if index is None or index.empty:
        # a tuned sweep compares its evaluation jobs alone
        index = index_runs(path, path / TRIALS_DIR if (path / TUNING_CSV).is_file() else None)
    markdown, numbers = build_report(index, path, baseline)
    write_text(path / "report.md", markdown)
    write_csv(path / "report.csv", numbers.map(lambda v: shown(v) if isinstance(v, str) else v))
    return markdown
