"""Comparison tables from run directories, built from their files alone.

The runs are grouped into comparisons (:mod:`hetsgd.outputs.comparison`: one dataset, model and
clock each, never virtual and real time together), one section each. A row of a table is one
algorithm on one device mix and one setting; its times to normalized loss 0.9 / 0.95 / 0.99
(sustained, on the test loss where the runs evaluate one) are means over its timed runs with
their Student-t interval and ``n``, its other numbers mean ± standard deviation over its completed
runs (seeds), and its speedup is over the comparison's baseline (:mod:`hetsgd.outputs.speedup`).
Runs that did not complete are counted in the status column and listed with their errors, not
averaged; so are completed runs whose ``convergence.csv`` cannot be read (``unusable``), and run
directories that were killed before writing their summary (``crashed``): one bad run costs only its
own row.

Every string a run folder gave (its name, its summary's algo or error) is shown with its control
characters escaped (:func:`~hetsgd.outputs.safe_text.shown`), on the terminal and in the files.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from hetsgd.errors import UserError
from hetsgd.outputs.cells import bracket, cell
from hetsgd.outputs.comparison import (
    METRICS,
    ROW_KEYS,
    TIMES,
    UTILIZATION,
    Comparison,
    aggregate,
    comparisons,
    mix_label,
    run_metrics,
)
from hetsgd.outputs.comparison import plain as _plain
from hetsgd.outputs.index import TRIALS_DIR, index_runs
from hetsgd.outputs.intervals import CONFIDENCE, METHOD
from hetsgd.outputs.metrics import loss_name
from hetsgd.outputs.run_directory import write_csv, write_text
from hetsgd.outputs.safe_text import shown
from hetsgd.outputs.search_cost import edge_mark, search_cost
from hetsgd.outputs.speedup import add_speedup, baseline_row, ranking
from hetsgd.outputs.time_split import split_markdown

IDENTITY = ("algo", "devices", "dataset", "model", "seed")
DASH = "—"
#: A tuned sweep (hetsgd/tuning/): its search's trials, one row per trial (the method, each knob
#: as ``set.<knob>``, the seed, the objective as ``objective.<metric>``, the training loss and
#: whether the setting was ``chosen``), in ``tuning.csv`` beside its evaluation jobs, whose
#: trials ran under ``tuning/``; each evaluation job names its method as ``+tuned=<method>``.
TUNING_CSV = "tuning.csv"
TUNED_GROUP = "tuned"
KNOB_PREFIX = "set."
OBJECTIVE_PREFIX = "objective."
MAXIMIZED = frozenset({"test_acc"})  # the objectives (METRICS) where higher wins


def _speedup_cell(row: pd.Series) -> str:
    """``2.00 [1.80, 2.20]``, ``≥`` where it is a lower bound (see :mod:`~hetsgd.outputs.speedup`),
    ``baseline`` on the baseline's row."""
    if row["baseline"]:
        return "baseline"
    text = _number(row["speedup"], ".2f")
    if text == DASH:
        return text
    spread = bracket(row["speedup_low"], row["speedup_high"], ".2f")
    return ("≥ " if row["speedup_bound"] else "") + text + (f" {spread}" if spread else "")


def _number(value: float, fmt: str) -> str:
    return format(value, fmt) if np.isfinite(value) else DASH


def _cell(row: pd.Series, col: str, fmt: str) -> str:
    """``mean ± std`` over the runs that have the metric; ``(k/n)`` when only some have it."""
    mean, std, count = row[f"{col}_mean"], row[f"{col}_std"], row[f"{col}_n"]
    if not np.isfinite(mean):
        return DASH
    text = _number(mean, fmt) + (f" ± {_number(std, fmt)}" if np.isfinite(std) else "")
    return text + (f" ({count}/{row['n']})" if count < row["n"] else "")


def _time_cell(row: pd.Series, col: str, fmt: str) -> str:
    """``mean [low, high] n=k`` over the timed runs that stayed at the target, ``n=k/m`` when
    only k of the row's m timed runs did; no interval for one run."""
    mean = row[f"{col}_mean"]
    if not np.isfinite(mean):
        return DASH
    return cell(mean, (row[f"{col}_low"], row[f"{col}_high"]), row[f"{col}_n"], fmt,
                row["timed"])


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
    methods = trials["method"].dropna().unique()
    only = methods[0] if len(methods) == 1 else None  # one method: +tuned is not swept
    for i, row in table.iterrows():
        method = next((o.split("=", 1)[1] for o in str(row["variant"]).split()
                       if o.startswith(f"+{TUNED_GROUP}=")), only)
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
                        ranked: str, tuned: Sequence[str] = ()) -> str:
    """The comparison's section; ``ranked``: the line under its table (:func:`ranking`);
    ``tuned``: a tuned sweep's columns (:func:`add_tuning`), after the setting."""
    with_variant = bool((table["variant"] != "").any())
    times = {col for col, _, _ in TIMES}
    # the workers' CPU share comes from runs that record their contention
    utilization = [m for m in UTILIZATION if m[0] != "cpu_share"
                   or table[f"{m[0]}_mean"].notna().any()]
    loss = loss_name(comp.loss)
    headers = ["algo", "devices", *(["setting"] if with_variant else []), *tuned, "n", "status",
               *(header.format(loss=loss) for _, header, _ in METRICS), "update share",
               *(header for _, header, _ in utilization), "speedup", "vs baseline"]
    rows = []
    for _, row in table.iterrows():
        rows.append([row["algo"], mix_label(row),
                     *([row["variant"] or DASH] if with_variant else []),
                     *(row[column] for column in tuned), str(row["n"]), row["status"],
                     *((_time_cell if col in times else _cell)(row, col, fmt)
                       for col, _, fmt in METRICS),
                     _shares(row, comp.groups),
                     *(_cell(row, col, fmt) for col, _, fmt in utilization),
                     _speedup_cell(row), row["verdict"] or DASH])
    best = DASH if comp.l_best is None else f"{comp.l_best:.4g}"
    unit = "virtual seconds (the virtual clock's)" if comp.clock == "virtual" else \
        "measured training wall seconds"
    common = f" Settings every run shares: {shown(comp.common)}." if comp.common else ""
    return "\n\n".join(s for s in [
        f"## {shown(comp.title)}",
        (f"Normalized loss = (L0 - L) / (L0 - L_best) on the {loss}, L0 each run's initial "
         f"{loss} and L_best = {best}, the lowest {loss} reached by any completed run of this "
         f"comparison (same dataset, model and clock). Times are {unit}. t@x is the time after "
         f"which a run stays at or beyond normalized loss x to its end (raw snapshots, "
         f"interpolated between the two around the last crossing; about one snapshot spacing "
         f"of resolution); a run that reached x and left it is unstable and not credited. "
         f"Times: mean [{CONFIDENCE:.0%} {METHOD} interval of the mean, cut at 0] over the n "
         f"timed runs (seeds) that stayed there (n=1: no interval); other numbers: mean ± std "
         f"over the completed runs. Runs flagged as contended are not timed unless kept "
         f"(--keep-flagged).{common} {shown(baseline_text)}"),
        markdown_table(headers, rows), shown(ranked)] if s)


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


def build_report(index: pd.DataFrame, root: Path, baseline: str | None = None,
                 keep_flagged: bool = False, trials: pd.DataFrame | None = None,
                 title: str | None = None) -> tuple[str, pd.DataFrame]:
    """The markdown report and its numbers (one row per comparison row) for the runs of
    ``index``; ``root`` is where failed runs' paths are shown relative to, ``trials`` a tuned
    sweep's (:func:`_tuning_trials`). A completed run whose ``convergence.csv`` cannot be read
    is reported as ``unusable``, with the file named."""
    root = Path(root).resolve()
    sections = [f"# hetsgd report: {shown(title or root.name or root)}"]
    tables = []
    comps = comparisons(index)
    matched = False  # whether the baseline asked for names a row of some comparison
    for comp in comps:
        metrics = run_metrics(comp, keep_flagged)
        table = aggregate(comp, metrics)
        matched = matched or baseline_row(comp, table, baseline) is not None
        text = add_speedup(comp, table, metrics, baseline)
        tuned = add_tuning(table, trials) if trials is not None else []
        sections.append(comparison_markdown(comp, table, text, ranking(table, metrics), tuned))
        sections.append(split_markdown(comp.runs, ROW_KEYS))
        if trials is not None:
            sections.append(search_cost(trials))
        tables.append(table.assign(dataset=comp.dataset, model=comp.model, clock=comp.clock,
                                   l_best=comp.l_best))
    if baseline is not None and comps and not matched:  # a typo, not a report without speedups
        raise UserError(f"baseline '{baseline}' matches no completed run of any comparison")
    # the comparisons' runs carry the statuses found while reading their curves (unusable)
    unnamed = index[index["dataset"].isna() | index["model"].isna()]
    sections.append(_failed_markdown(pd.concat([unnamed, *(c.runs for c in comps)]), root))
    numbers = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    if not numbers.empty:
        first = ["dataset", "model", "clock", "loss", "l_best", "algo", "devices", "emulated",
                 "simulated", "variant", "n", "timed", "runs", "status", "baseline", "speedup",
                 "speedup_low", "speedup_high", "speedup_bound", "verdict"]
        numbers = numbers[first + [c for c in numbers.columns if c not in first]]
    return "\n\n".join(s for s in sections if s) + "\n", numbers


def _index(path: Path) -> pd.DataFrame:
    """The runs under ``path``; a tuned sweep's evaluation jobs alone, not its trials."""
    return index_runs(path, path / TRIALS_DIR if (path / TUNING_CSV).is_file() else None)


def _each_once(index: pd.DataFrame) -> pd.DataFrame:
    """Each run once, however many of the paths hold it (``results/`` and a sweep under it):
    counted twice, its seed would narrow every interval it is in."""
    if index.empty:
        return index
    folders = index["run_dir"].map(lambda d: Path(d).resolve())
    return index[~folders.duplicated()].reset_index(drop=True)


def write_report(paths: Path | Sequence[Path], baseline: str | None = None,
                 index: pd.DataFrame | None = None, keep_flagged: bool = False) -> str:
    """Report on every run under ``paths`` (runs, sweeps, all of ``results/``; several are
    reported together, each comparison still apart): write ``report.md`` and ``report.csv``
    into the path, or the folder holding them all when there are several (each file replaced
    atomically), and return the markdown. Runs that failed, crashed or left unreadable files
    are listed, never fatal. ``index``: the runs, when the caller has read them already (a
    sweep's jobs); when it is missing or empty, the runs are found under ``paths``.
    ``keep_flagged``: time runs flagged as contended too."""
    paths = [Path(paths)] if isinstance(paths, str | os.PathLike) else [Path(p) for p in paths]
    if not paths:
        raise UserError("no path to report on")
    tuned = [found for found in map(_tuning_trials, paths) if found is not None]
    if len(tuned) > 1:
        raise UserError("several tuned sweeps: report one tuned sweep at a time")
    if index is None or index.empty:
        index = _each_once(pd.concat([_index(path) for path in paths], ignore_index=True))
    out = paths[0] if len(paths) == 1 else Path(os.path.commonpath(
        [p.resolve() for p in paths]))
    title = None if len(paths) == 1 else ", ".join(str(p) for p in paths)
    markdown, numbers = build_report(index, out, baseline, keep_flagged,
                                     tuned[0] if tuned else None, title)
    write_text(out / "report.md", markdown)
    write_csv(out / "report.csv", numbers.map(lambda v: shown(v) if isinstance(v, str) else v)
              .rename(columns=lambda c: shown(str(c))))  # group names and knobs are the folders
    return markdown
