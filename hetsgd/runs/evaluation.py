"""A run's snapshots evaluated into its results: convergence.csv, then the summary's numbers
(times and epochs to the target losses, whether it learnt, utilization). A run that ended and a
crashed run being recovered (:mod:`hetsgd.runs.recover`) both end here."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import pandas as pd
from rich.progress import track

from hetsgd.config import RunConfig
from hetsgd.engines.snapshots import Snapshot
from hetsgd.engines.training import Training
from hetsgd.observe.evaluate import Evaluator
from hetsgd.observe.monitor import summarize
from hetsgd.observe.progress import stderr_console
from hetsgd.outputs.metrics import (
    reaches,
    snapshot_spacing,
    target_losses,
    time_to_losses,
    timed_loss,
)
from hetsgd.outputs.run_directory import RunDirectory
from hetsgd.outputs.summary import (
    Losses,
    RunSummary,
    TargetLosses,
    by_group,
    learnt_between,
    progress_columns,
    shares,
)
from hetsgd.runs.setup import RunData

log = logging.getLogger("hetsgd")


def _convergence(snapshots: list[Snapshot], metrics: list, workers: list[dict[str, Any]],
                 num_examples: int) -> pd.DataFrame:
    groups = [w["group"] for w in workers]
    rows = []
    for snap, m in zip(snapshots, metrics):
        progress = progress_columns(snap, groups, num_examples)
        logged = {name: progress.pop(name) for name in snap.logged}  # empty before its first
        rows.append({"time_s": snap.time_s, **progress, "train_loss": m.train_loss,
                     "test_loss": m.test_loss, "test_acc": m.test_acc, **logged})
    return pd.DataFrame(rows)


def _losses(snapshot: pd.Series) -> Losses:
    return Losses(float(snapshot["train_loss"]), float(snapshot["test_loss"]),
                  float(snapshot["test_acc"]))


def _best(convergence: pd.DataFrame) -> float:
    """The lowest training loss of the run's snapshots (NaN where none is finite)."""
    return float(convergence["train_loss"].min())


def _results(summary: RunSummary, training: Training, convergence: pd.DataFrame,
             workers: list[dict[str, Any]], num_examples: int,
             stated_targets: list[float]) -> RunSummary:
    updates = {g: int(n) for g, n in by_group([w["group"] for w in workers],
                                              [int(w["updates"]) for w in workers]).items()}
    examples = int(sum(w["examples"] for w in workers))
    first, last = convergence.iloc[0], convergence.iloc[-1]
    column = timed_loss(convergence)
    targets = TargetLosses(*target_losses(stated_targets, float(first[column]), column), column)
    loss = convergence[column]
    in_time = reaches(convergence["time_s"], loss, targets.losses)
    return replace(
        summary,
        time_s=training.time_s,
        epochs=examples / num_examples,
        examples=examples,
        updates=sum(updates.values()),
        updates_by_group=updates,
        update_share=shares(updates),
        examples_per_s=examples / training.time_s if training.time_s > 0 else None,
        initial=_losses(first),
        final=_losses(last),
        learnt=learnt_between(float(first["train_loss"]), float(last["train_loss"]),
                              _best(convergence)),
        target_losses=targets,
        time_to_loss={key: reach.time for key, reach in in_time.items()},
        epochs_to_loss=time_to_losses(convergence["epoch"], loss, targets.losses),
        unstable_losses=[key for key, reach in in_time.items() if reach.unstable],
        snapshot_spacing_s=snapshot_spacing(convergence["time_s"]),
        method_log=(training.snapshots[-1].logged or None) if training.snapshots else None,
        utilization=summarize(training.utilization, summary.cores_sampled or 0,
                              start_s=training.resumed_s))


def evaluate(out: RunDirectory, cfg: RunConfig, data: RunData, training: Training,
             workers: list[dict[str, Any]], summary: RunSummary) -> RunSummary:
    """Evaluate the snapshots into convergence.csv; return ``summary`` with the results.

    ``workers`` are the rows of workers.csv, which say each worker's group. A run that ended
    and a crashed run being recovered both end here; each then writes its summary and only then
    removes the raw snapshots, so that a crash in between leaves them for recovery."""
    evaluator = Evaluator(cfg, data.problem, data.train, data.test)
    metrics = [evaluator(s.params, s.buffers) for s in track(
        training.snapshots, description="evaluating snapshots", disable=not cfg.progress,
        console=stderr_console(), transient=True)]
    convergence = _convergence(training.snapshots, metrics, workers, data.train.num_examples)
    out.write_table("convergence", convergence)
    summary = _results(summary, training, convergence, workers, data.train.num_examples,
                       cfg.eval.target_losses)
    if summary.learnt is False and summary.initial is not None and summary.final is not None:
        warning = (f"the run has not learnt: its training loss went from "
                   f"{summary.initial.train_loss:.4g} to {summary.final.train_loss:.4g}, its "
                   f"best {_best(convergence):.4g} (look at optim.lr and the budget)")
        log.warning("%s", warning)
        summary = replace(summary, warnings=[*(summary.warnings or []), warning])
    return summary
