"""The end of a Hydra multirun: the sweep's ``summary.csv``, report and figures, table printed.

Hydra calls :meth:`SweepReport.on_multirun_end` once the sweeper has run every job, in the process
that started the sweep, whichever launcher ran the jobs (with submitit they run in other processes
or on other machines, so all it knows of them is their folders). It is registered in the primary
config::

    hydra:
      callbacks:
        report:
          _target_: hetsgd.outputs.sweep.SweepReport

Hydra skips this callback when a job's task function raises, so jobs must record their failure in
``summary.json`` and return. A job folder without ``summary.json``, or whose summary still says
``running`` (a job that was killed or died before it ended), is still listed in ``summary.csv``
and the report as crashed. Every file is replaced atomically.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from hetsgd.atomic import writing_path
from hetsgd.data.files import reason
from hetsgd.errors import UserError
from hetsgd.liveness import is_alive, this_process
from hetsgd.outputs.figure_formats import check_formats
from hetsgd.outputs.index import (
    CLAIM,
    MULTIRUN,
    SEARCH_CLAIM,
    TRIALS_DIR,
    index_dirs,
    is_run_dir,
    read_summary,
)
from hetsgd.outputs.run_directory import write_csv, write_text
from hetsgd.outputs.safe_text import shown
from hetsgd.readback import read_bounded

log = logging.getLogger(__name__)

#: summary.csv columns, in order; times to the run's target losses (``time_to_loss.<loss>``) and
#: update shares (``update_share.<group>``) follow.
SUMMARY_COLUMNS = (
    "job", "overrides", "status", "error", "algo", "dataset", "model", "devices", "emulated",
    "simulated", "seed", "time_s", "epochs", "updates", "examples_per_s", "final.train_loss",
    "final.test_loss", "final.test_acc", "target_losses.reference",
    "utilization.workers_cpu_cores_mean", "utilization.workers_cpu_share_mean",
    "utilization.host_cpu_percent_mean", "utilization.gpu_util_mean", "run_dir",
)


def _job_number(job_dir: Path) -> int | None:
    """Hydra names job folders after the job number (``3`` or ``3_+method=gpu,seed=1``)."""
    match = re.match(r"\d+", job_dir.name)
    return int(match.group()) if match else None


def job_dirs(sweep_dir: Path) -> list[Path]:
    """The sweep's job folders (run directories: see :func:`hetsgd.outputs.index.is_run_dir`),
    in job order."""
    found = [d for d in Path(sweep_dir).iterdir() if d.is_dir() and is_run_dir(d)]
    return sorted(found, key=lambda d: (_job_number(d) is None, _job_number(d) or 0, d.name))


def newest_job_folder(sweep_dir: Path) -> Path | None:
    """The folder of the sweep's latest job, a run directory or not yet one (Hydra makes it
    before it writes its ``.hydra/`` files into it)."""
    numbered = [(number, d) for d in Path(sweep_dir).iterdir()
                if d.is_dir() and (number := _job_number(d)) is not None]
    return max(numbered)[1] if numbered else None


def job_statuses(sweep_dir: Path) -> list[str]:
    """How each job ended, in job order, as its folder says (``crashed`` without a final summary)."""
    return [read_summary(d)["status"] for d in job_dirs(sweep_dir)]


def check_unused(sweep_dir: Path) -> None:
    """A sweep started in the folder of an earlier one would overwrite its jobs' folders (job
    numbers start at 0 again) and its summary: refused before any job runs."""
    if (sweep_dir / MULTIRUN).is_file() or (sweep_dir.is_dir() and job_dirs(sweep_dir)):
        raise UserError(f"hydra.sweep.dir {sweep_dir} already holds a sweep, whose jobs this one "
                        "would overwrite: choose another hydra.sweep.dir (or leave it out for a "
                        "new folder under results/sweeps/), or move that sweep away first")


def claim_folder(folder: Path, what: str = "hydra.sweep.dir") -> Path | None:
    """Claim ``folder`` for this process's sweep before its first job: create it if need be and
    create its claim file exclusively (a hard link of the whole file, which fails where the
    name exists: one process alone can make it), so that of two sweeps started together into
    one folder the second is refused in one line rather than both running and one's results
    being lost. The claim names this process, so
    the refusal can say whose it is; a folder whose claimant is gone stays claimed (its jobs may
    be there) until it is moved away. ``what`` names the folder's setting in the refusal.
    Returns the outermost folder this created (None: ``folder`` was there), which
    :func:`release_unstarted` removes again where the sweep never started."""
    made = next((p for p in reversed([folder, *folder.parents]) if not p.exists()), None)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file of that name, a read-only or missing parent
        raise UserError(f"{what} {shown(folder)}: cannot create it: {reason(exc)}") from None
    claim = folder / CLAIM
    written = writing_path(claim)  # whole before it is linked: a rival reads the claimant
    try:
        written.write_text(json.dumps(this_process()))
        os.link(written, claim)  # the exclusive create: it fails where the claim exists
    except FileExistsError:
        raise _claimed(folder, what) from None
    except OSError as exc:  # a full disk, a file system without hard links
        raise UserError(f"{what} {shown(folder)}: cannot claim it: {reason(exc)}") from None
    finally:
        written.unlink(missing_ok=True)
    return made


def record_sampled_sweep(folder: Path, overrides: Sequence[str], params: Any) -> None:
    """What Hydra's basic sweeper writes into a sweep's folder and a sampling one (Optuna's)
    does not: ``multirun.yaml``, with the sweep's overrides and its sweeper's ``params``, which
    names the folder a sweep (never reused) and its jobs' folders by the keys the sweep varies
    (:mod:`hetsgd.config.swept`: ``0_optim.lr=0.0123``, not ``0_``)."""
    record = {"hydra": {"overrides": {"task": [str(o) for o in overrides]},
                        "sweeper": {"params": {str(k): str(v) for k, v in (params or {}).items()}}}}
    write_text(folder / MULTIRUN, yaml.safe_dump(record, sort_keys=False))


def release_unstarted(folder: Path, made: Path | None) -> None:
    """A sweep that ended before its first job (a job's overrides did not compose, ``--cfg``):
    its claim and Hydra's ``multirun.yaml`` removed, and the folder if that was all it held (a
    tuned comparison's search folder too, where it holds only its own claim and
    ``multirun.yaml``), so that no empty sweep is left to list, nor a claim that refuses the
    folder to the next; and the folders :func:`claim_folder` ``made`` above it
    (``results/sweeps/``), where empty."""
    try:
        if (folder / TRIALS_DIR).is_dir():
            _remove_if_only(folder / TRIALS_DIR, (SEARCH_CLAIM, MULTIRUN))
        _remove_if_only(folder, (CLAIM, MULTIRUN))
        if made is not None and made != folder:
            for parent in folder.parents:
                parent.rmdir()  # OSError where it holds more: left, with those above it
                if parent == made:
                    break
    except OSError:  # gone already, or not ours to tidy: left as it is
        pass


def _remove_if_only(folder: Path, markers: tuple[str, ...]) -> None:
    """``folder``, where it holds none but ``markers`` (an OSError where it holds more)."""
    if {entry.name for entry in folder.iterdir()} <= set(markers):
        for name in markers:
            (folder / name).unlink(missing_ok=True)
        folder.rmdir()


def check_unclaimed(folder: Path, what: str = "hydra.sweep.dir") -> None:
    """The refusal :func:`claim_folder` would give ``folder`` where another sweep claimed it,
    without claiming it or creating anything (a dry run writes nothing)."""
    if (folder / CLAIM).exists():
        raise _claimed(folder, what)


def _claimed(folder: Path, what: str) -> UserError:
    """The refusal of a folder that another sweep claimed."""
    return UserError(f"{what} {shown(folder)} is claimed by another sweep "
                     f"({_claimant(folder / CLAIM)}): choose another folder (or leave it out for "
                     "a new one under results/), or move that one away first")


def _claimant(claim: Path) -> str:
    """Who holds a claim, for the refusal: the process, and whether it still runs."""
    try:
        process = json.loads(read_bounded(claim))
        alive = "running" if is_alive(process) else "ended"
        return f"process {int(process['pid'])} on {shown(str(process['host']))}, {alive}"
    except (OSError, ValueError, TypeError, KeyError):
        return f"its {CLAIM} cannot be read"


def sweep_summary(jobs: pd.DataFrame) -> pd.DataFrame:
    """One row per job of ``jobs`` (:func:`index_dirs` of :func:`job_dirs`): number,
    overrides, status, error and the run's own key metrics (the comparison-wide numbers are in
    report.csv)."""
    if jobs.empty:
        return pd.DataFrame(columns=list(SUMMARY_COLUMNS))
    index = jobs.copy()
    index["job"] = [_job_number(Path(d)) for d in index["run_dir"]]
    index["overrides"] = index["overrides"].map(" ".join)
    for col in ("job", "seed", "updates"):  # whole numbers that gaps would turn into floats
        if col in index.columns:
            index[col] = pd.to_numeric(index[col], errors="coerce").round().astype("Int64")
    extra = [c for prefix in ("time_to_loss.", "update_share.") for c in index.columns
             if c.startswith(prefix)]
    return index[[c for c in SUMMARY_COLUMNS if c in index.columns] + extra]


def finalize_sweep(sweep_dir: Path, baseline: str | None = None,
                   formats: Sequence[str] = ("png",)) -> str:
    """Write the sweep's summary.csv, report.md, report.csv and comparison figures (a job's own
    figures are left to ``hetsgd plot``, off the sweep's critical path); return the report's
    markdown. A failed, crashed or unreadable job is listed, never fatal."""
    # the report's and the figures' stack (matplotlib) loads here, at the sweep's end, not with
    # this module: Hydra imports it for every run that lists the callback, single ones too
    from hetsgd.outputs.plots import plot_comparison
    from hetsgd.outputs.report import write_report

    sweep_dir = Path(sweep_dir)
    jobs = index_dirs(job_dirs(sweep_dir))  # each job read once: an unreadable one warns once
    write_csv(sweep_dir / "summary.csv", sweep_summary(jobs))
    try:
        markdown = write_report(sweep_dir, baseline, jobs)
    except UserError as err:  # no job folder at all, or a bad --baseline
        markdown = f"# hetsgd report: {sweep_dir.name}\n\n{err}\n"
        write_text(sweep_dir / "report.md", markdown)
    try:
        if not jobs.empty:
            plot_comparison(jobs, sweep_dir / "figures", formats)
    except (UserError, OSError) as err:  # OSError: a full disk, say; the tables are written
        log.warning("no figures for the sweep in %s: %s", sweep_dir, err)
    return markdown


class SweepReport(Callback):
    """Hydra callback that runs :func:`finalize_sweep` on the sweep folder and prints the
    table, and keeps no job's configs in memory once it has ended. It logs its own errors
    instead of raising, so it never turns a finished sweep into a failed command."""

    def __init__(self, baseline: str | None = None,
                 formats: str | Sequence[str] = ("png",)) -> None:
        self.baseline = baseline
        listed = formats.split(",") if isinstance(formats, str) else [str(f) for f in formats]
        self.formats = check_formats(listed)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        """Let go of the job's configs, its own and Hydra's (about 0.2 MB): Hydra's launcher
        keeps every job's return until the sweep ends, and a long sweep's memory would grow by
        them job by job. What the sweep reads later is in the job's folder."""
        job_return.cfg = job_return.hydra_cfg = None

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not sweep_dir.is_dir():
            log.warning("no sweep folder %s: no job ran, nothing to report", sweep_dir)
            return
        try:
            markdown = finalize_sweep(sweep_dir, self.baseline, self.formats)
        except OSError as err:  # a full disk: the jobs' folders are as they ended
            log.error("could not write the summary and report of the sweep in %s: %s",
                      sweep_dir, err)
            return
        except Exception:  # a report error must not hide the finished jobs' results
            log.exception("could not write the report of the sweep in %s", sweep_dir)
            return
        print(markdown)
        print(f"Sweep summary: {sweep_dir / 'summary.csv'}; report and comparison figures in "
              f"{sweep_dir}; each job's own figures: hetsgd plot {sweep_dir}")
