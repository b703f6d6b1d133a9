"""A result from a run that crashed: its snapshots, evaluated after the fact.

A run whose process was killed (its summary still says ``running`` and names a process that is
gone, or it has no summary), or that stopped on a full disk (``crashed`` too), left on disk what
it had measured (:mod:`hetsgd.outputs.journal`): the snapshots it had taken, its workers'
counters and its utilization samples; so did a run interrupted before they were evaluated (a
second Ctrl-C during its final evaluation). Recovery evaluates every snapshot that can be read
as the run would have, into ``convergence.csv``, and writes the summary with the results up to
the last one; a damaged snapshot file is named and skipped. The status stays as it was,
``crashed`` or ``interrupted``: the run did not end by itself, and its time budget was not
spent. A custom model's factory, which the folder names, is called only when the user names it
too (:mod:`hetsgd.runs.trust`), and a folder holding a symbolic link is not written into.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from hetsgd.config import RunConfig
from hetsgd.config.compose import rebuild_config
from hetsgd.engines.training import Training
from hetsgd.errors import UserError
from hetsgd.outputs.checkpoint import UnreadableFile, latest_checkpoint, run_config
from hetsgd.outputs.index import (
    CONFIG,
    CRASHED,
    is_run_dir,
    load_csv,
    override_key,
    read_overrides,
)
from hetsgd.outputs.journal import INDEX, read_snapshots, remove_snapshots, warn_skipped
from hetsgd.outputs.run_directory import SNAPSHOTS, RunDirectory, check_no_links
from hetsgd.outputs.summary import RunSummary
from hetsgd.runs.evaluation import evaluate
from hetsgd.runs.setup import load_run_data
from hetsgd.runs.trust import check_recorded_overrides, check_targets

log = logging.getLogger("hetsgd")
# the runs that left snapshots unevaluated: killed, or interrupted during the final evaluation
RECOVERABLE = (CRASHED, "interrupted")


def _rows(frame: pd.DataFrame | None) -> list[dict[str, Any]]:
    """A table's rows, empty cells as None (as the monitor wrote them)."""
    if frame is None:
        return []
    return frame.astype(object).where(frame.notna(), None).to_dict("records")


def _config(run_dir: Path) -> RunConfig:
    """The config the run trained with: its config.yaml, composed from its own overrides. A
    ``.hydra/overrides.yaml`` that names ``resume`` is not the run's (a resumed run records its
    overrides without it): an earlier version let Hydra write it for a resume that was then
    refused. The overrides its checkpoint kept stand in for it."""
    overrides = read_overrides(run_dir)
    version = latest_checkpoint(run_dir)
    if version is not None and any(override_key(o) == "resume" for o in overrides):
        _, overrides = run_config(version)
    check_recorded_overrides(overrides, run_dir)
    _, cfg = rebuild_config(run_dir / CONFIG, overrides, f"cannot rebuild the config of {run_dir}")
    return cfg


def recover(run_dir: Path, model_targets: Sequence[str] = ()) -> dict[str, Any]:
    """Evaluate what the crashed (or interrupted) run in ``run_dir`` left, write its
    convergence.csv and summary, and return the summary. ``model_targets``: the model factories
    the user lets it call (the command's ``--model-target``). A run that is neither ``crashed``
    nor ``interrupted``, or left no snapshot that can be read, is a :class:`UserError` saying
    so, as is a target not named or a link inside."""
    run_dir = Path(run_dir)
    if not is_run_dir(run_dir):
        raise UserError(f"{run_dir} is not a run directory")
    check_no_links(run_dir, f"cannot recover {run_dir}")  # before anything is read through one
    summary = RunSummary.read(run_dir)
    if summary.status not in RECOVERABLE:
        raise UserError(f"{run_dir} did not crash and was not interrupted (status: "
                        f"{summary.status}): nothing to recover")
    if summary.final is not None:  # snapshots kept (eval.keep_snapshots) are no sign of a crash
        raise UserError(f"{run_dir} was evaluated already (it was {summary.status} after its "
                        "evaluation, or recovered): nothing to recover")
    skipped: list[UnreadableFile] = []

    def skip(err: UnreadableFile) -> None:
        warn_skipped(err)
        skipped.append(err)

    workers = load_csv(run_dir, "workers")
    snapshots = [] if workers is None else read_snapshots(run_dir, skip, len(workers))
    if not snapshots or workers is None:
        why = (f"{len(skipped)} snapshot file(s) cannot be read" if skipped else
               f"it was {summary.status} before training started")
        raise UserError(f"{run_dir} left no snapshot to recover: {why}")
    cfg = _config(run_dir)
    check_targets(cfg, run_dir, model_targets, "pass --model-target {}", calls_algorithm=False)
    data = load_run_data(cfg, progress=cfg.progress)
    training = Training(status=summary.status, time_s=snapshots[-1].time_s, snapshots=snapshots,
                        utilization=_rows(load_csv(run_dir, "utilization")))
    out = RunDirectory(run_dir)
    notes = [f"{len(skipped)} unreadable one(s) skipped: "
             f"{', '.join(err.file.name for err in skipped)}"] if skipped else []
    if timed_only := sum(math.isnan(snapshot.examples) for snapshot in snapshots):
        notes.append(f"{timed_only} without their row in {SNAPSHOTS}/{INDEX} (files from an "
                     "earlier version) have their time, but no epochs or updates")
        log.warning("%s: %s", run_dir, notes[-1])
    ended = ("was killed or crashed" if summary.status == CRASHED else
             "was interrupted before its snapshots were evaluated")
    summary = replace(summary, coordinator=None, error="; ".join([
        f"the run {ended} after {training.time_s:.1f} s of training; these results were "
        f"recovered from the {len(snapshots)} snapshot(s) it left", *notes]))
    written = evaluate(out, cfg, data, training, _rows(workers), summary).to_dict()
    out.write_summary(written)
    if not cfg.eval.keep_snapshots:
        remove_snapshots(run_dir)
    return written
