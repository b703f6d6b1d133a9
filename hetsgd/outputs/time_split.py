"""Where each worker's time went: computing, copying the master in, merging back, waiting.

An accelerator's overhead (its replica's copies and merge, the host's waits) shows here without a
profiler: one row per worker of each comparison row, from every completed run's ``workers.csv``
(its ``compute_s``, ``copy_s``, ``merge_s`` and ``wait_s``), as milliseconds per update and as
shares of the worker's time, averaged over the row's runs. Runs written before the split existed
(no ``copy_s`` column) are left out of it.
"""

from __future__ import annotations

import pandas as pd

from hetsgd.outputs.index import load_csv
from hetsgd.outputs.safe_text import shown

SPLIT = ("compute_s", "copy_s", "merge_s", "wait_s")


def worker_split(runs: pd.DataFrame, keys: tuple[str, ...]) -> pd.DataFrame:
    """Per (``keys``..., worker): the mean over completed ``runs`` (rows of the index with those
    keys) of each part's milliseconds per update and its share of the worker's time, in %."""
    rows = []
    for _, run in runs[runs["status"] == "completed"].iterrows():
        workers = load_csv(run["run_dir"], "workers")
        if workers is None or not set(SPLIT) <= set(workers.columns):
            continue
        for _, worker in workers.iterrows():
            total = sum(float(worker[part]) for part in SPLIT)
            updates = max(int(worker["updates"]), 1)
            row = {key: run[key] for key in keys}
            row.update(worker=int(worker["worker"]), group=str(worker["group"]),
                       label=str(worker["label"]))
            for part in SPLIT:
                row[f"{part[:-2]}_ms"] = 1000 * float(worker[part]) / updates
                row[f"{part[:-2]}_pct"] = 100 * float(worker[part]) / total if total else 0.0
            rows.append(row)
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows)
    by = [*keys, "worker", "group", "label"]
    return frame.groupby(by, sort=False, dropna=False).mean().reset_index()


def split_markdown(runs: pd.DataFrame, keys: tuple[str, ...]) -> str:
    """The split as a markdown table ('' when no run has it): ms per update, and % in brackets."""
    frame = worker_split(runs, keys)
    if frame.empty:
        return ""
    header = [*keys, "worker", *(f"{part[:-2]} ms (%)" for part in SPLIT)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for _, row in frame.iterrows():
        cells = [shown(str(row[key] or "")) for key in keys]
        cells.append(shown(f"{row['worker']} {row['group']} ({row['label']})"))
        cells += [f"{row[f'{part[:-2]}_ms']:.3f} ({row[f'{part[:-2]}_pct']:.0f}%)"
                  for part in SPLIT]
        lines.append("| " + " | ".join(cells) + " |")
    return ("Each worker's time per update: computing, copying the master in, merging its "
            "result back, waiting for work (mean over the completed runs).\n\n"
            + "\n".join(lines))
