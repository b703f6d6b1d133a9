"""Where each worker's time went: computing, copying the master in, merging back, waiting; and
whether the same work took as long in every run.

An accelerator's overhead (its replica's copies and merge, the host's waits) shows here without a
profiler: one row per worker of each comparison row, from every completed run's ``workers.csv``
(its ``compute_s``, ``copy_s``, ``merge_s`` and ``wait_s``), as milliseconds per update and as
shares of the worker's time, averaged over the row's runs. Runs written before the split existed
(no ``copy_s`` column) are left out of it.

The range of a worker's compute time per update over its row's runs says how steadily the
machine ran the same work, measured where the work happens: seeds change the data's order and
the initial model, not the work of an update at one batch size. Where it spreads beyond
:data:`STEP_SPREAD` the report says so, since the row's times then vary for something other
than the method. Over eight quiet runs of ``make run`` on a 2-core AMD EPYC VM (2026-12-06)
the ranges read up to 1.16x for the emulated stand-in alone, 1.30x for Hogbatch's stand-in and
1.49x for its CPU worker, and 1.23-2.81x for Hogwild's two CPU workers: its update took
2.6-7.8 ms, both workers of a run alike, no seed always slow or fast, while their CPU share
stayed 0.86-0.90 (in one run checked seed by seed, 4.1 ms an update in one seed and 7.0-7.8 in
the others at a share of 0.885-0.889, with no other process's share, steal or pressure moving):
the contention measures do not see this. One Hogwild worker alone read 2.20-2.51 ms over six runs, two read
2.43-7.08 ms, on the CPU 0.89-0.94 of that time: they computed slower, they did not wait. The
VM's cores themselves change speed: a one-thread loop of 512-wide matmuls took 0.23 ms an
iteration in 7 of 13 runs of 3 s alone and 0.33-0.47 ms in the others, and two at once on its
two cores ran at about half speed (0.41-0.52 ms) in all 8 trials, both in 5 and one in 3. That
is how a core reads whose hardware-thread sibling on the host is busy (the VM's other core, or
another tenant's), which the guest, told one thread per core, cannot see.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pandas as pd

from hetsgd.config.checks import finite_or_none
from hetsgd.errors import UserError
from hetsgd.outputs.comparison import plain, row_label
from hetsgd.outputs.index import load_csv
from hetsgd.outputs.safe_text import shown

SPLIT = ("compute_s", "copy_s", "merge_s", "wait_s")
#: A worker whose update, at one batch size, took more than this many times longer in one of its
#: row's runs than in another is named under the table: the project's choice, just above what the
#: workers other than Hogwild's read over eight quiet runs (module docstring), not calibrated
#: across machines.
STEP_SPREAD = 1.5

log = logging.getLogger(__name__)


def worker_split(runs: pd.DataFrame, keys: tuple[str, ...]) -> pd.DataFrame:
    """Per (``keys``..., worker): the mean over completed ``runs`` (rows of the index with those
    keys) of each part's milliseconds per update and its share of the worker's time, in %; the
    lowest and highest compute ms per update over the runs (``compute_low``, ``compute_high``),
    how many ``runs`` and the worker's ``batch`` where it was one size in every run (else NaN).
    A run whose files cannot be read, or a worker whose numbers are not finite, is left out."""
    rows = [row for _, run in runs[runs["status"] == "completed"].iterrows()
            for row in _run_rows(run, keys)]
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows)
    grouped = frame.groupby([*keys, "worker", "group", "label"], sort=False, dropna=False)
    split = grouped[[c for c in frame.columns if c.endswith(("_ms", "_pct"))]].mean()
    batches = grouped["batch"]
    return split.assign(
        emulated=grouped["emulated"].any(), simulated=grouped["simulated"].any(),  # its label
        compute_low=grouped["compute_ms"].min(), compute_high=grouped["compute_ms"].max(),
        runs=grouped.size(),
        batch=batches.first().where(batches.count().eq(grouped.size())
                                    & batches.nunique().eq(1))).reset_index()


def _run_rows(run: pd.Series, keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """One run's workers as rows of the split: none where its workers.csv or batches.csv cannot
    be read (a warning), or its workers.csv predates the split; a worker whose numbers are not finite, or
    that landed no update or spent no time (no split to show: read as 0 ms it would halve its
    row's mean and its compute range's low end), is left out."""
    try:
        workers = load_csv(run["run_dir"], "workers")
        if workers is None:  # every completed run writes one, a row per worker
            raise UserError(f"{run['run_dir']}/workers.csv is missing or has no rows")
        if not {*SPLIT, "updates"} <= set(workers.columns):
            return []
        changes = load_csv(run["run_dir"], "batches")
    except UserError as err:  # one unreadable file costs only its own run
        log.warning("left out of the time split: %s", shown(err))
        return []
    columns = (*SPLIT, "updates")
    rows = []
    for _, worker in workers.iterrows():
        known = [n for n in (finite_or_none(worker[c]) for c in columns) if n is not None]
        if len(known) < len(columns):
            continue
        *seconds, updates = known
        total = sum(seconds)
        if updates < 1 or total <= 0:
            continue
        row = {key: run[key] for key in keys}
        row.update(worker=plain(worker["worker"]), group=str(worker["group"]),
                   label=plain(worker.get("label")), batch=_one_batch(worker, changes),
                   emulated=bool(run.get("emulated")), simulated=bool(run.get("simulated")))
        for part, value in zip(SPLIT, seconds, strict=True):
            row[f"{part[:-2]}_ms"] = 1000 * value / updates
            row[f"{part[:-2]}_pct"] = 100 * value / total
        rows.append(row)
    return rows


def _one_batch(worker: pd.Series, changes: pd.DataFrame | None) -> float:
    """The worker's batch size where it kept one through the run: the same first and last, and
    no other in the run's batches.csv (an adaptive worker's sizes can leave and come back); NaN
    where it changed, or the files do not say."""
    first, last = (finite_or_none(worker.get(end)) for end in ("first_batch", "last_batch"))
    if first is None or first != last:
        return math.nan
    if changes is not None and (changes.loc[changes["worker"] == worker["worker"], "batch_size"]
                                .dropna() != first).any():
        return math.nan
    return first


def unsteady(split: pd.DataFrame) -> pd.DataFrame:
    """The workers of :func:`worker_split` that kept one batch size and whose compute ms per
    update spread more than :data:`STEP_SPREAD` over their row's runs."""
    if split.empty:
        return split
    return split[split["batch"].notna() & (split["compute_low"] > 0)
                 & (split["compute_high"] > STEP_SPREAD * split["compute_low"])]


def split_markdown(runs: pd.DataFrame, keys: tuple[str, ...]) -> str:
    """The split as a markdown table ('' when no run has it): ms per update, % in brackets, the
    compute ms's range over the runs; then the workers whose same work ran at different speeds."""
    frame = worker_split(runs, keys)
    if frame.empty:
        return ""
    header = [*keys, "worker", *(f"{part[:-2]} ms (%)" for part in SPLIT),
              "compute ms: runs' range"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in frame.iterrows():
        cells = [shown(str(row[key] or "")) for key in keys]
        cells.append(_worker(row))
        cells += [f"{row[f'{part[:-2]}_ms']:.3f} ({row[f'{part[:-2]}_pct']:.0f}%)"
                  for part in SPLIT]
        cells.append(f"{row['compute_low']:.3f}-{row['compute_high']:.3f}" if row["runs"] > 1
                     else "—")
        lines.append("| " + " | ".join(cells) + " |")
    text = ("Each worker's time per update: computing, copying the master in, merging its "
            "result back, waiting for work (mean over the completed runs), and the range of its "
            "compute time per update over the runs.\n\n" + "\n".join(lines))
    named = [f"{shown(row_label(row))} worker {_worker(row)}: {row['compute_low']:.2f}-"
             f"{row['compute_high']:.2f} ms ({row['compute_high'] / row['compute_low']:.1f}x)"
             for _, row in unsteady(frame).iterrows()]
    if named:
        text += ("\n\nThe same work ran at different speeds: at one batch size, an update took "
                 f"more than {STEP_SPREAD:g}x longer in one run than in another for "
                 f"{'; '.join(named)}. Something other than the method changed between these "
                 "runs (how fast the machine's cores ran), so their times vary for it as well as "
                 "for the method.")
    return text


def _worker(row: pd.Series) -> str:
    return shown(f"{row['worker']} {row['group']} ({row['label']})")
