"""Speedups over a comparison's baseline, with their intervals, and which rows they tell apart.

A row's speedup is the baseline's mean time to normalized loss 0.9 over the row's, both over
their *timed* runs (completed, and not flagged as contended unless kept). A row is credited only
where every one of its timed runs reached 0.9 and stayed (a seed that collapsed, or never got
there, leaves the row without a speedup; its t@0.9 cell says how many did). A baseline run
that never stayed at 0.9 counts with the time it ran, which its time to 0.9 exceeds: the
speedup is then a lower bound (``≥``). Intervals: :mod:`hetsgd.outputs.intervals`. Where a
speedup's interval holds 1, the row is "not distinguishable" from the baseline.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from hetsgd.errors import UserError
from hetsgd.outputs.comparison import ROW_KEYS, Comparison, plain, row_label
from hetsgd.outputs.intervals import Interval, excludes_one, ratio_interval
from hetsgd.outputs.metrics import TARGETS

TARGET = TARGETS[0]
TIME = f"time_to_{TARGET}"
NOT_DISTINGUISHABLE = "not distinguishable"
NO_INTERVAL = "n=1: no interval"


def parse_selector(text: str) -> dict[str, str]:
    """``"algo=sync devices=gpu"`` -> ``{"algo": "sync", "devices": "gpu"}``."""
    pairs = [token.split("=", 1) for token in text.split()]
    if not pairs or any(len(pair) != 2 or not pair[0] for pair in pairs):
        raise UserError(f"a baseline is key=value pairs such as 'algo=sync devices=gpu', "
                        f"not {text!r}")
    return dict(pairs)  # type: ignore[arg-type]


def baseline_row(comp: Comparison, usable: pd.DataFrame, selector: str | None) -> int | None:
    """Index of the baseline row among the rows ``usable`` (of :func:`aggregate`'s table).
    Default: the comparison's sync row (preferring plain over variants and the mix named gpu
    over others, as in the papers)."""
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
        raise UserError(f"baseline key {unknown[0]!r} is not a summary.json key (use e.g. algo, "
                        "devices, seed, or a row's setting: 'variant=+method=sync')")
    match = comp.runs[comp.runs["status"] == "completed"]
    for key, value in wanted.items():
        match = match[match[key].map(plain) == value]
    matched = set(match[list(ROW_KEYS)].itertuples(index=False, name=None))
    hits = [i for i, row in usable.iterrows() if tuple(row[list(ROW_KEYS)]) in matched]
    return int(hits[0]) if hits else None


def _runs_of(metrics: pd.DataFrame, row: pd.Series) -> pd.DataFrame:
    """The runs of ``row`` among ``metrics``."""
    for key in ROW_KEYS:
        metrics = metrics[metrics[key] == row[key]]
    return metrics


def _timed_runs(metrics: pd.DataFrame, row: pd.Series) -> pd.DataFrame:
    return _runs_of(metrics[metrics["timed"]], row)


def _verdict(speedup: Interval | None, bound: bool) -> str:
    """Faster, slower or not distinguishable, by the speedup's interval; a baseline bounded from
    below can only show a row faster."""
    if speedup is None:
        return NO_INTERVAL
    if not excludes_one(speedup):
        return NOT_DISTINGUISHABLE
    return "faster" if speedup[0] > 1 else ("slower" if not bound else NOT_DISTINGUISHABLE)


def add_speedup(comp: Comparison, table: pd.DataFrame, metrics: pd.DataFrame,
                selector: str | None) -> str:
    """Add ``baseline``, ``speedup`` with ``speedup_low`` / ``speedup_high`` (its interval),
    ``speedup_bound`` and ``verdict`` columns to ``table`` (rows of :func:`aggregate`, whose
    runs are ``metrics``) and return the sentence that names the baseline."""
    table["baseline"] = False
    table[["speedup", "speedup_low", "speedup_high"]] = math.nan
    table["speedup_bound"] = False
    table["verdict"] = ""
    base = baseline_row(comp, table[table["timed"] > 0], selector)
    how = f"matching '{selector}'" if selector else "default: the comparison's sync run"
    if base is None:
        untimed = baseline_row(comp, table, selector)
        if untimed is None:
            return f"No baseline ({how}) in this comparison: no speedups."
        flagged = int(_runs_of(metrics, table.loc[untimed])["flagged"].sum())
        why = f" ({flagged} flagged as contended: --keep-flagged times them)" if flagged else ""
        return (f"Baseline {row_label(table.loc[untimed])} ({how}) has no timed run{why}: "
                "no speedups.")
    table.loc[base, "baseline"] = True
    name = row_label(table.loc[base])
    runs = _timed_runs(metrics, table.loc[base])
    bound = bool(runs[TIME].isna().any())
    base_times = runs[TIME].fillna(runs["time_ran"]).dropna().tolist()
    if not base_times:
        return f"Baseline {name} ({how}) has no curve: no speedups."
    for i, row in table.iterrows():
        times = _timed_runs(metrics, row)[TIME]
        if i == base or times.empty or times.isna().any():
            continue
        spread = ratio_interval(base_times, times.tolist())
        table.loc[i, ["speedup", "speedup_low", "speedup_high"]] = [
            float(np.mean(base_times) / times.mean()), *(spread or (math.nan, math.nan))]
        table.at[i, "speedup_bound"] = bound
        table.at[i, "verdict"] = _verdict(spread, bound)
    text = (f"Speedup = baseline t@{TARGET} / row t@{TARGET} (means over timed runs) "
            f"[interval], for rows all of whose timed runs stayed at {TARGET}; baseline: "
            f"{name} ({how}).")
    if bound:
        text += (f" Some of its runs never stayed at {TARGET}: they count with the time they ran "
                 f"({np.mean(base_times):.2f} s mean with the others), so speedups are lower "
                 "bounds (≥).")
    return text


def _left_out(row: pd.Series) -> str | None:
    """Why a row cannot be ranked on its own times (None where it can): no timed run, or a
    timed run that never stayed at the target (its mean would leave out its slowest seed)."""
    if row["timed"] == 0:
        return "no timed run"
    missed = int(row["timed"] - row[f"{TIME}_n"])
    return f"{missed} of {int(row['timed'])} timed runs never stayed at {TARGET}" if missed \
        else None


def ranking(table: pd.DataFrame, metrics: pd.DataFrame) -> str:
    """The row fastest to normalized loss 0.9 (lowest mean over its timed runs, all of which
    got there), the rows whose ratio of mean times to it has an interval that holds 1 (not
    distinguishable from it), and every row left out of the ranking, with why."""
    if table.empty:
        return ""
    why = pd.Series([_left_out(row) for _, row in table.iterrows()], index=table.index,
                    dtype=object)
    whole = table[why.isna()]
    if whole.empty:
        return f"No row ranked: {_reasons(table, why)}."
    best = whole[f"{TIME}_mean"].idxmin()
    text = f"Fastest to {TARGET}: {row_label(whole.loc[best])}"
    if whole.at[best, "timed"] < 2:
        text += f" ({NO_INTERVAL}, so no row is ranked against it)."
    else:
        ours = _timed_runs(metrics, whole.loc[best])[TIME].tolist()
        alike, apart = [], 0
        for i, row in whole.drop(index=best).iterrows():
            spread = ratio_interval(_timed_runs(metrics, row)[TIME].tolist(), ours)
            if spread is None:  # one run, or a mean time of 0: no ratio to tell apart
                why[i] = NO_INTERVAL if row["timed"] < 2 else "no interval of its ratio"
            elif excludes_one(spread):
                apart += 1
            else:
                alike.append(row_label(row))
        text += (f"; {NOT_DISTINGUISHABLE} from it (the interval of the ratio of the mean "
                 f"times holds 1): {', '.join(alike)}." if alike else
                 "; every other row with an interval is told apart from it." if apart else
                 "; no other row has an interval to compare with it.")
    return text + (f" Not ranked: {_reasons(table, why)}." if why.notna().any() else "")


def _reasons(table: pd.DataFrame, why: pd.Series) -> str:
    """``row (why); row (why)`` for the rows left out, in the table's order."""
    return "; ".join(f"{row_label(table.loc[i])} ({reason})" for i, reason in why.dropna().items())
