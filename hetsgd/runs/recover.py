"""A result from a run that crashed: its snapshots, evaluated after the fact.

A run whose process was killed (its summary still says ``running`` and names a process that is
gone, or it has no summary), or that stopped on a full disk (``crashed`` too), left on disk what
it had measured (:mod:`hetsgd.outputs.journal`): the snapshots it had taken, its workers'
counters and its utilization samples; so did a run interrupted before they were evaluated (a
second Ctrl-C during its final evaluation). Recovery evaluates every snapshot that can be read
as the run would have, into ``convergence.csv``, and writes the summary with the results up to
the last one: its time and counts (updates, examples) are that snapshot's own, as the curve's
last row, since workers.csv, replaced after each snapshot, may be one behind; a damaged
snapshot file is named and skipped, and a missing or garbled workers.csv costs only each
worker's group, which the summary's mix also says. The status stays as it was, ``crashed`` or
``interrupted``: the run did not end by itself, and its time budget was not spent. An unreadable
summary says neither: refused, in one line. A custom model's factory, which the folder names,
is called only when the user names it too (:mod:`hetsgd.runs.trust`), and a folder holding a
symbolic link is not written into. The summary names the folder it was written in, absolute
(a copied or moved run's old summary names another), and what the killed run's writes left
half-written there is removed.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from hetsgd.atomic import remove_abandoned
from hetsgd.config import RunConfig
from hetsgd.config.compose import rebuild_config
from hetsgd.engines.snapshots import Snapshot
from hetsgd.engines.training import Training
from hetsgd.errors import UserError
from hetsgd.outputs.checkpoint import CHECKPOINT, UnreadableFile, latest_checkpoint, run_config
from hetsgd.outputs.index import (
    CONFIG,
    CRASHED,
    is_run_dir,
    load_csv,
    override_key,
    read_overrides,
    summary_values,
)
from hetsgd.outputs.journal import INDEX, read_snapshots, remove_snapshots, warn_skipped
from hetsgd.outputs.run_directory import SNAPSHOTS, SUMMARY, RunDirectory, check_no_links
from hetsgd.outputs.summary import RunSummary, by_group, shares
from hetsgd.runs.evaluation import evaluate
from hetsgd.runs.resume import claimed
from hetsgd.runs.setup import load_run_data
from hetsgd.runs.trust import check_recorded_overrides, check_targets

log = logging.getLogger("hetsgd")
# the runs that left snapshots unevaluated: killed, or interrupted during the final evaluation
RECOVERABLE = (CRASHED, "interrupted")
WORKERS = "workers"
COUNTS = ("updates", "examples")  # the columns of workers.csv that the summary counts


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


def _summary(run_dir: Path) -> RunSummary:
    """The summary of the run to recover, which must say that it crashed or was interrupted
    and holds no final results. An unreadable one says nothing of the kind (it reads as a
    failed run elsewhere, which this run never said it was): refused, naming the file and the
    way on, since a run folder without a summary recovers as a run killed before writing one."""
    values, unreadable = summary_values(run_dir)
    if unreadable is not None:
        kept = len(list((run_dir / SNAPSHOTS).glob("*.pt")))
        then = (f"move it aside to recover the {kept} snapshot file(s) left, as those of a run "
                "that wrote no summary" if kept else "it left no snapshot to recover either")
        raise UserError(f"cannot recover {run_dir}: its {SUMMARY} is unreadable ({unreadable}), "
                        f"so nothing says that the run crashed; {then}")
    summary = RunSummary.from_dict(values)
    if summary.status not in RECOVERABLE:
        raise UserError(f"{run_dir} did not crash and was not interrupted (status: "
                        f"{summary.status}): nothing to recover")
    if summary.final is not None:  # snapshots kept (eval.keep_snapshots) are no sign of a crash
        raise UserError(f"{run_dir} was evaluated already (it was {summary.status} after its "
                        "evaluation, or recovered): nothing to recover")
    return summary


def _workers_csv(run_dir: Path) -> tuple[pd.DataFrame | None, str | None]:
    """workers.csv where it names each worker's group and counts, else None and why not: a
    garbled or missing one costs only the groups, which the summary's mix also says."""
    file = run_dir / f"{WORKERS}.csv"
    try:
        workers = load_csv(run_dir, WORKERS)
    except UserError as err:
        return None, str(err)
    if workers is None:
        return None, f"{file} {'holds no worker' if file.exists() else 'is missing'}"
    if missing := [c for c in COUNTS if c not in workers.columns or workers[c].isna().any()
                   or not pd.api.types.is_numeric_dtype(workers[c])]:
        return None, f"{file} has no numbers in the column(s) {', '.join(missing)}"
    return workers, None


def _mix_groups(summary: RunSummary) -> list[str]:
    """Each worker's group as the summary's mix says, ranked in group order as the runner's
    plans rank them (``[]`` where it says none, or no number of workers)."""
    try:
        return [name for name, group in (summary.mix.groups.items() if summary.mix else ())
                for _ in range(int(group.count))]
    except (TypeError, ValueError):
        return []


def _groups(run_dir: Path, summary: RunSummary, workers: pd.DataFrame | None, why: str | None,
            count: int) -> tuple[list[str], str | None]:
    """Each worker's group, from workers.csv (``why``: why it cannot say, None where it can),
    else from the summary's mix where it has the ``count`` workers the snapshots count; and why
    workers.csv was not used (None where it was). A :class:`UserError` where neither says."""
    if workers is not None:
        return [str(group) for group in workers["group"]], None
    if len(named := _mix_groups(summary)) == count:
        return named, why
    raise UserError(f"cannot recover {run_dir}: {why}, and its {SUMMARY} names no mix of the "
                    f"{count} worker(s) its snapshots count, to say each one's group")


def _counted(summary: RunSummary, last: Snapshot, groups: list[str], num_examples: int
             ) -> RunSummary:
    """``summary`` with the counts of ``last``, the snapshot whose time it takes and where the
    curve ends: workers.csv is replaced after each snapshot's file is written, so a coordinator
    killed in between left it a snapshot behind, and summary and curve would disagree."""
    updates = {group: int(n) for group, n in by_group(groups, last.updates).items()}
    examples = int(last.examples)
    return replace(summary, epochs=examples / num_examples, examples=examples,
                   updates=sum(updates.values()), updates_by_group=updates,
                   update_share=shares(updates),
                   examples_per_s=examples / last.time_s if last.time_s > 0 else None)


def _snapshots(run_dir: Path, summary: RunSummary, workers: int | None,
               skipped: list[UnreadableFile]) -> list[Snapshot]:
    """Every snapshot file that can be read, those that cannot named in ``skipped``; a
    :class:`UserError` where none can."""

    def skip(err: UnreadableFile) -> None:
        warn_skipped(err)
        skipped.append(err)

    snapshots = read_snapshots(run_dir, skip, workers)
    if not snapshots:
        why = (f"{len(skipped)} snapshot file(s) cannot be read" if skipped else
               f"it was {summary.status} before training started")
        raise UserError(f"{run_dir} left no snapshot to recover: {why}")
    return snapshots


def recover(run_dir: Path, model_targets: Sequence[str] = ()) -> dict[str, Any]:
    """Evaluate what the crashed (or interrupted) run in ``run_dir`` left, write its
    convergence.csv and summary, and return the summary. ``model_targets``: the model factories
    the user lets it call (the command's ``--model-target``). A run that is neither ``crashed``
    nor ``interrupted``, or left no snapshot that can be read, is a :class:`UserError` saying
    so, as is a target not named or a link inside. The summary names the folder as `hetsgd run`
    does, absolute: where it was written, which a copied or moved run's old summary is not."""
    run_dir = Path(run_dir)
    if not is_run_dir(run_dir):
        raise UserError(f"{run_dir} is not a run directory")
    check_no_links(run_dir, f"cannot recover {run_dir}")  # before anything is read through one
    claim = claimed(run_dir, f"cannot recover {run_dir}")  # not while a resume restores it
    try:
        return _recovered(run_dir, model_targets)
    finally:
        os.close(claim)


def _recovered(run_dir: Path, model_targets: Sequence[str]) -> dict[str, Any]:
    summary = _summary(run_dir)
    workers, why = _workers_csv(run_dir)
    skipped: list[UnreadableFile] = []
    snapshots = _snapshots(run_dir, summary, len(workers) if workers is not None
                           else len(_mix_groups(summary)) or None, skipped)
    last = snapshots[-1]
    groups, unused = _groups(run_dir, summary, workers, why, len(last.updates))
    counted = not math.isnan(last.examples) and not any(math.isnan(u) for u in last.updates)
    if unused is not None and not counted:
        raise UserError(f"cannot recover {run_dir}: {unused}, and its last snapshot, at "
                        f"{last.time_s:.3g} s, counts no updates (a file from an earlier version)")
    cfg = _config(run_dir)
    check_targets(cfg, run_dir, model_targets, "pass --model-target {}", calls_algorithm=False)
    data = load_run_data(cfg, progress=cfg.progress)
    training = Training(status=summary.status, time_s=last.time_s, snapshots=snapshots,
                        utilization=_rows(load_csv(run_dir, "utilization")))
    out = RunDirectory(Path(os.path.abspath(run_dir)))  # as `hetsgd run` (Hydra) names its own
    for folder in (out.path, out.path / SNAPSHOTS, out.path / CHECKPOINT):  # what the killed
        remove_abandoned(folder)  # run's writes left behind (a checkpoint version half written)
    rows = _rows(workers) if unused is None else [  # the counts: the last snapshot's (_counted)
        {"group": group, "updates": updates, "examples": 0}
        for group, updates in zip(groups, last.updates)]
    written = evaluate(out, cfg, data, training, rows, replace(
        summary, coordinator=None, run_dir=str(out.path),
        error=_error(run_dir, summary, training, skipped, unused)))
    if counted:
        written = _counted(written, last, groups, data.train.num_examples)
    out.write_summary(written.to_dict())
    if not cfg.eval.keep_snapshots:
        remove_snapshots(run_dir)
    return written.to_dict()


def _error(run_dir: Path, summary: RunSummary, training: Training,
           skipped: list[UnreadableFile], unused: str | None) -> str:
    """The recovered summary's error: how the run ended, what was recovered and what was not."""
    snapshots = training.snapshots
    notes = [f"{len(skipped)} unreadable one(s) skipped: "
             f"{', '.join(err.file.name for err in skipped)}"] if skipped else []
    if timed_only := sum(math.isnan(snapshot.examples) for snapshot in snapshots):
        notes.append(f"{timed_only} without their row in {SNAPSHOTS}/{INDEX} (files from an "
                     "earlier version) have their time, but no epochs or updates")
        log.warning("%s: %s", run_dir, notes[-1])
    if unused is not None:
        notes.append(f"{unused}; each worker's group was taken from the mix in {SUMMARY}, "
                     "the counts from the last snapshot")
        log.warning("%s: %s", run_dir, notes[-1])
    ended = ("was killed or crashed" if summary.status == CRASHED else
             "was interrupted before its snapshots were evaluated")
    return "; ".join([f"the run {ended} after {training.time_s:.1f} s of training; these results "
                      f"were recovered from the {len(snapshots)} snapshot(s) it left", *notes])
