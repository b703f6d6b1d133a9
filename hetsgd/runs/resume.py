"""Resuming a run from its checkpoint: ``hetsgd run resume=RUN_DIR [overrides]``.

The resumed run trains the model, data, algorithm and mix of the checkpointed one: its config is
the checkpoint's, composed as recovery does (:mod:`hetsgd.runs.recover`), with this command's
overrides on top; these may extend or change the budget, evaluation, checkpoints, monitoring,
torch.distributed, the workers' stall window and progress, and nothing else. Its clock,
counters and snapshots continue the checkpoint's: what the run measured after the checkpoint is
left out, so the resumed run's curves continue the old ones as one run's. A custom model's
factory, which the checkpoint names, is called only when this command names it too
(``model=custom model._target_=...``, :mod:`hetsgd.runs.trust`); a run folder holding a
symbolic link is not resumed (its writes would follow it). One run is resumed by one process at
a time: a resumption holds an exclusive lock on the run's folder until :meth:`Resumption.release`
(or its process's end), and a second is refused while it does.
"""

from __future__ import annotations

import fcntl
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from omegaconf import DictConfig

from hetsgd.atomic import remove_abandoned
from hetsgd.config import ConfigError, RunConfig, to_run_config
from hetsgd.config.checks import finite_or_none
from hetsgd.config.compose import changed_keys, rebuild_config, recomposable
from hetsgd.config.schema import EvalConfig
from hetsgd.data.files import reason
from hetsgd.engines.checkpoint import Checkpoint
from hetsgd.errors import UserError
from hetsgd.outputs.checkpoint import latest_checkpoint, read_checkpoint, run_config
from hetsgd.outputs.index import (
    OVERRIDES,
    RUNNING,
    is_run_dir,
    load_csv,
    override_key,
    read_summary,
)
from hetsgd.outputs.journal import counter_columns, restart_snapshots
from hetsgd.outputs.run_directory import check_no_links, write_csv, write_text
from hetsgd.runs.trust import check_recorded_overrides, check_targets, override_targets

# What a resumed run must keep: anything else would train another model than the checkpoint's.
KEPT = ("algo", "dataset", "model", "devices", "optim", "data", "seed")


@dataclass
class Resumption:
    cfg: DictConfig  # the resumed run's config
    overrides: list[str]  # those it is composed from
    checkpoint: Checkpoint
    version: Path  # the checkpoint's folder
    source: Path  # the run directory it continues
    claim: int  # a descriptor of ``source`` holding its exclusive lock while the run resumes

    def release(self) -> None:
        """The run has ended: another process may resume it."""
        if self.claim >= 0:
            os.close(self.claim)
            self.claim = -1

    def summary(self) -> dict:
        """summary.json's ``resumed_from``."""
        return {"run_dir": str(self.source), "time_s": self.checkpoint.time_s,
                "examples": self.checkpoint.examples}

    def start_in(self, run_dir: Path) -> None:
        """Make ``run_dir`` (the checkpointed run's own, or a new one) hold what the resumed
        run continues, as its checkpoint left it: the overrides of its config, the utilization
        samples, snapshots and workers' counters up to the checkpoint. A resume killed before
        it trains leaves a run that recovery evaluates up to the checkpoint; what a killed
        run's writers left half written there is removed."""
        remove_abandoned(run_dir)
        (run_dir / OVERRIDES).parent.mkdir(parents=True, exist_ok=True)
        write_text(run_dir / OVERRIDES, yaml.safe_dump(self.overrides))
        rows = load_csv(self.source, "utilization")
        if rows is not None:
            write_csv(run_dir / "utilization.csv", rows[rows["time_s"] <= self.checkpoint.time_s])
        restart_snapshots(run_dir, self.version, self.checkpoint)
        workers = load_csv(self.source, "workers")
        if workers is not None and len(workers) == len(self.checkpoint.workers):
            simulated = bool(self.cfg.devices.simulated)
            write_csv(run_dir / "workers.csv", pd.DataFrame([
                {**row, **counter_columns(counters, simulated)}
                for row, counters in zip(workers.to_dict("records"),
                                         self.checkpoint.counter_rows())]))


def _rebuilt(source: Path, config: DictConfig, recorded: list[str], now: list[str]
             ) -> tuple[DictConfig, RunConfig]:
    """The checkpointed run's config with this command's ``now`` on top, and as it was
    (:func:`rebuild_config`), refused where ``now`` changes a key in :data:`KEPT`. Compositions
    are compared first (another model's schema cannot take the recorded model's values), then
    the values themselves where they differ: a run composed with a ``--config-dir`` is composed
    again without it (:func:`recomposable`), its own values coming from its recorded config."""
    failure = f"resume={source}: cannot rebuild the config to resume"
    made = recomposable(config, [])  # its groups' choices: a `model=custom` here changes nothing
    now = [override for override in now if override not in made]
    changed = changed_keys(recomposable(config, recorded), now, KEPT, failure)
    try:
        cfg, recorded_cfg = rebuild_config(config, recorded, failure, now)
        if changed:
            resumed = to_run_config(cfg)
            changed = [key for key in changed
                       if getattr(resumed, key) != getattr(recorded_cfg, key)]
    except (ConfigError, UserError):
        if not changed:
            raise
    if changed:
        raise UserError(f"resume={source}: a resumed run trains what its checkpoint did, so "
                        f"{changed[0]} cannot change (only budget, eval, checkpoint, monitor, "
                        "dist, workers and progress can)")
    return cfg, recorded_cfg


def resume(source: Path, overrides: Sequence[str]) -> Resumption:
    """Check that ``source`` can be resumed with this command's ``overrides`` and read its
    checkpoint; a one-line :class:`UserError` says why not. Nothing is written: a refused resume
    leaves ``source`` as it was."""
    if not source.is_dir():
        raise UserError(f"resume={source}: no such directory")
    if not is_run_dir(source):
        raise UserError(f"resume={source} is not a run directory")
    check_no_links(source, f"resume={source}")  # before anything is read through one
    claim = claimed(source, f"resume={source}")
    try:
        return _resumption(source, overrides, claim)
    except BaseException:
        os.close(claim)
        raise


def claimed(source: Path, what: str) -> int:
    """A descriptor of ``source`` holding an exclusive lock on it; a UserError, saying ``what``
    was refused, where another process holds it: two resumes of one run, both told it crashed,
    would both write into it, and a recover (:mod:`hetsgd.runs.recover`) would remove the
    snapshots a resume has just restored."""
    try:
        claim = os.open(source, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:  # a folder this user may not read
        raise UserError(f"{what}: cannot open it: {reason(exc)}") from None
    try:
        fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(claim)
        raise UserError(f"{what}: another process is resuming the run, or recovering it: try "
                        "again once that one has ended") from None
    except OSError:  # a file system without locks (some NFS mounts): docs/faults.md says so
        pass
    return claim


def _resumption(source: Path, overrides: Sequence[str], claim: int) -> Resumption:
    summary = read_summary(source)
    if summary.get("status") == RUNNING:  # read_summary says crashed once its process is gone
        process = summary.get("coordinator") or {}
        raise UserError(f"resume={source}: the run is still going (process {process.get('pid')} "
                        f"on {process.get('host')}): resume it once it has ended")
    version = latest_checkpoint(source)
    if version is None:
        raise UserError(f"resume={source}: the run left no checkpoint (checkpoints are taken "
                        "with checkpoint.every_s=SECONDS)")
    config, recorded = run_config(version)
    check_recorded_overrides(recorded, version)
    # the checkpointed run's overrides never name resume: start_in wrote them without it
    now = [str(o) for o in overrides if override_key(str(o)) != "resume"]
    cfg, recorded_cfg = _rebuilt(source, config, recorded, now)
    check_targets(recorded_cfg, source, override_targets(now),
                  "add model=custom model._target_={}")
    cfg.resume = str(source)
    try:
        resumed = to_run_config(cfg)
        checkpoint = read_checkpoint(version)
    except (ConfigError, UserError) as err:
        raise UserError(f"resume={source}: {err}") from err
    seconds = resumed.budget.seconds
    if seconds is not None and checkpoint.time_s >= seconds:  # it would train one step more
        raise UserError(f"resume={source}: its checkpoint is at {checkpoint.time_s:.3g} s, at "
                        f"budget.seconds={seconds:g} already: raise budget.seconds to train on "
                        "(a run that stopped during its final evaluation: hetsgd recover)")
    if (epochs := _checkpoint_epochs(summary, checkpoint, resumed)) is not None:
        raise UserError(f"resume={source}: its checkpoint is at {epochs:.4g} epochs, at "
                        f"budget.epochs={resumed.budget.epochs:g} already: raise budget.epochs "
                        "to train on (a run that stopped during its final evaluation: hetsgd "
                        "recover)")
    checkpoint = replace(checkpoint, snapshot_spacing=_spacing(checkpoint, recorded_cfg.eval,
                                                               resumed.eval))
    return Resumption(cfg, [*recorded, *now], checkpoint, version, source, claim)


def _checkpoint_epochs(summary: dict[str, Any], checkpoint: Checkpoint,
                       resumed: RunConfig) -> float | None:
    """The checkpoint's epochs where they have reached ``budget.epochs`` (a resume would train
    nothing, and rewrite the run with a last row the same as its previous one), else None. An
    epoch is the training set's examples, which the run's summary gives (examples / epochs);
    a summary that does not say, or local SGD counting the authors' rounds as its epochs
    (``algo.epoch_accounting=authors``), is not judged here."""
    budget = resumed.budget.epochs
    examples, epochs = (finite_or_none(summary.get(key)) for key in ("examples", "epochs"))
    if (budget is None or not examples or not epochs
            or getattr(resumed.algo, "epoch_accounting", "examples") != "examples"):
        return None
    done = checkpoint.examples * epochs / examples
    return done if done >= budget * (1 - 1e-9) else None


def _spacing(checkpoint: Checkpoint, was: EvalConfig, now: EvalConfig) -> tuple[float, float]:
    """The snapshot spacing a resumed run goes on at: the checkpoint's, which is the spacing
    ``was`` gave its run, doubled each time thinning halved its snapshots; where this command
    changes ``eval``, ``now``'s spacing, doubled as often."""
    every_s, _ = checkpoint.snapshot_spacing
    doubled = every_s / was.every_s
    return (now.every_s * doubled,
            math.inf if now.every_epochs is None else now.every_epochs * doubled)
