"""A result from a run that crashed: its snapshots, evaluated after the fact.

A run whose process was killed (its summary still says ``running`` and names a process that is
gone, or it has no summary) left on disk what it had measured (:mod:`hetsgd.outputs.journal`):
the snapshots it had taken, its workers' counters and its utilization samples. Recovery
evaluates those snapshots as the run would have, into ``convergence.csv``, and writes the summary
with the results up to the last snapshot. The status stays ``crashed``: the run did not end by
itself, and its time budget was not spent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from hetsgd.config.compose import rebuild_config
from hetsgd.engines.shared_memory.coordinator import Training
from hetsgd.errors import UserError
from hetsgd.outputs.index import (
    CONFIG,
    CRASHED,
    is_run_dir,
    load_csv,
    read_overrides,
    read_summary,
)
from hetsgd.outputs.journal import read_snapshots, remove_snapshots
from hetsgd.outputs.run_directory import RunDirectory
from hetsgd.runs.runner import evaluate
from hetsgd.runs.setup import load_run_data


def _rows(frame: pd.DataFrame | None) -> list[dict[str, Any]]:
    """A table's rows, empty cells as None (as the monitor wrote them)."""
    if frame is None:
        return []
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def recover(run_dir: Path) -> dict[str, Any]:
    """Evaluate what the crashed run in ``run_dir`` left, write its convergence.csv and summary,
    and return the summary. A run that is not ``crashed``, or left no snapshot, is a
    :class:`UserError` saying so."""
    run_dir = Path(run_dir)
    if not is_run_dir(run_dir):
        raise UserError(f"{run_dir} is not a run directory")
    summary = read_summary(run_dir)
    if summary["status"] != CRASHED:
        raise UserError(f"{run_dir} did not crash (status: {summary['status']}): nothing to "
                        "recover")
    snapshots, workers = read_snapshots(run_dir), load_csv(run_dir, "workers")
    if not snapshots or workers is None:
        raise UserError(f"{run_dir} left no snapshot to recover: it crashed before training "
                        "started, or was recovered already")
    _, cfg = rebuild_config(run_dir / CONFIG, read_overrides(run_dir),
                            f"cannot rebuild the config of {run_dir}")
    data = load_run_data(cfg, progress=cfg.progress)
    training = Training(status=CRASHED, time_s=snapshots[-1].time_s, snapshots=snapshots,
                        utilization=_rows(load_csv(run_dir, "utilization")))
    out = RunDirectory(run_dir)
    summary.pop("coordinator", None)
    summary.update(error=(
        f"the run was killed or crashed after {training.time_s:.1f} s of training; these "
        f"results were recovered from the {len(snapshots)} snapshot(s) it left"))
    summary.update(evaluate(out, cfg, data, training, _rows(workers)))
    out.write_summary(summary)
    if not cfg.eval.keep_snapshots:
        remove_snapshots(run_dir)
    return summary
