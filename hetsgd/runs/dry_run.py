"""`hetsgd run --dry-run ARGS`: every job that `hetsgd run ARGS` would start (each job of a sweep
with ``-m``), composed and checked as far as it goes without training, so that a sweep's last job
does not fail on its device mix after the first ones trained for hours.

The checks are the ones a run makes before its first step: the sweep's folder (checked, not
claimed) or a single run's, and tuning (:mod:`hetsgd.runs.sweep_dir`), composition, the run a
``resume=`` continues (:mod:`hetsgd.runs.resume`: its checkpoint read, nothing written), the
schemas' ranges, the device mix (CUDA GPUs present), the algorithm's plan for that mix, and the
dataset: a known source, its task, a ``dataset.path`` that exists. Nothing is downloaded,
loaded, trained or written; data that is not cached yet is said, not fetched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser

from hetsgd import algorithms
from hetsgd.config import ConfigError, RunConfig, compose_run, to_run_config
from hetsgd.config.compose import hydra_arguments, sweep_jobs
from hetsgd.config.hydra_private import draws_jobs
from hetsgd.config.keys import composition_error
from hetsgd.data.cache import existing_file
from hetsgd.data.embedded import Digits
from hetsgd.data.folder import Folder
from hetsgd.data.libsvm import LibsvmFile
from hetsgd.data.registry import _check_task, get_source
from hetsgd.data.synthetic import Synthetic
from hetsgd.data.tables import Files
from hetsgd.engines.factory import check_optimizer_for
from hetsgd.errors import UserError
from hetsgd.runs.resume import resume
from hetsgd.runs.sweep_dir import check_run_dir, settle_sweep_dir
from hetsgd.tuning.spec import NODE
from hetsgd.workers import expand

#: The sources that read the file or folder that ``dataset.path`` names, and those that read none.
NEEDS_PATH = (LibsvmFile, Files, Folder)
NO_PATH = (Digits, Synthetic)


@dataclass(frozen=True)
class Job:
    """A job of the dry run: its overrides, and why it would fail (None: it would start)."""

    number: int
    overrides: tuple[str, ...]
    failure: str | None
    note: str | None = None  # what it would do first that takes time (a download)


def dry_run(args: Sequence[str]) -> list[Job]:
    """Each job of `hetsgd run ARGS`, checked; a refusal of ARGS themselves (an unknown flag, a
    sweep folder in use) is a :class:`UserError`."""
    _, parsed = hydra_arguments(args)
    if parsed.config_dir is not None:
        raise UserError("hetsgd run --dry-run composes from hetsgd's own configs: "
                        "--config-dir is not supported with it")
    sweep_dir, tuning, _ = settle_sweep_dir(parsed.overrides, parsed.multirun, claim=False)
    if sweep_dir is None:
        check_run_dir(parsed.overrides)
    overrides = parsed.overrides
    if tuning is not None:  # the comparison's jobs: each method on each seed (hetsgd/tuning/)
        overrides = [*overrides, f"{NODE}=null", f"+method={','.join(tuning.method_names)}"]
    if not (parsed.multirun or sweep_dir):
        return [_checked(0, overrides)]
    try:
        drawn = _drawn(overrides)
        jobs = sweep_jobs(overrides) if drawn is None else []
    except Exception as exc:  # noqa: BLE001 - Hydra's parse of a sweep: its message
        raise UserError(composition_error(exc, parsed.overrides)) from exc
    if drawn is not None:  # a sampler's sweep: one job, its sampled keys at their defaults
        job = _checked(0, drawn[0])
        return [replace(job, note="; ".join(n for n in (drawn[1], job.note) if n))]
    return [_checked(number, job) for number, job in enumerate(jobs)]


def _drawn(overrides: Sequence[str]) -> tuple[list[str], str] | None:
    """A sweep whose sweeper is not Hydra's basic one (Optuna's) draws its jobs as it runs, so
    none can be listed: its overrides but the swept ones, and what the dry run says of them;
    None for the basic sweeper, whose jobs are expanded."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    fixed = [o.input_line for o in parsed if not o.is_sweep_override() and o.input_line]
    sweeper = compose_run(fixed, hydra_config=True).hydra.sweeper
    if not draws_jobs(sweeper):
        return None
    swept = [o.key_or_group for o in parsed if o.is_sweep_override()]
    swept += [str(key) for key in sweeper.get("params") or {}]
    trials = sweeper.get("n_trials")
    count = f"{trials} " if isinstance(trials, int) else ""
    return fixed, (f"{str(sweeper.get('_target_')).rpartition('.')[2]} draws its {count}jobs "
                   f"as it runs: one checked, the keys it samples ({', '.join(swept)}) left at "
                   "the config's values")


def _checked(number: int, overrides: Sequence[str]) -> Job:
    """One job, composed and checked: :class:`Job` with the first failure, if any."""
    try:
        cfg = to_run_config(compose_run(overrides))
        if cfg.resume is not None:  # the run it continues, checked as the run would check it
            resumption = resume(Path(cfg.resume), overrides)
            resumption.release()
            cfg = to_run_config(resumption.cfg)
        note = check_job(cfg)
    except (UserError, ConfigError) as exc:
        return Job(number, tuple(overrides), str(exc))
    except Exception as exc:  # noqa: BLE001 - composition errors, a plugin's own, said in one line
        return Job(number, tuple(overrides), composition_error(exc, overrides))
    return Job(number, tuple(overrides), None, note)


def check_job(cfg: RunConfig) -> str | None:
    """What a run of ``cfg`` checks before it trains, in its order (:mod:`hetsgd.runs.runner`):
    the mix's workers, the algorithm's plan for them, its optimizers, the dataset; a failure
    raises. Returns
    what the run would do first that takes time (download a dataset), if anything."""
    specs = expand(cfg.devices)
    algorithm, cfg = algorithms.choose(cfg)
    plan = algorithm.plan(cfg, specs)
    check_optimizer_for(plan.cfg, algorithm.hooks(plan), len(plan.workers))
    source = get_source(cfg.dataset.name)
    _check_task(cfg.dataset.task, source.task, source.name)
    if isinstance(source, NEEDS_PATH) and not cfg.dataset.path:
        raise UserError(f"dataset={source.name} needs dataset.path (the file or folder it reads)")
    if isinstance(source, NO_PATH):
        source.no_path(cfg.dataset)
    for path in (cfg.dataset.path, getattr(cfg.dataset, "test_path", None)):
        if path:
            found, folder = existing_file(path), isinstance(source, Folder)
            if isinstance(source, NEEDS_PATH) and found.is_dir() != folder:
                raise UserError(f"{found} is {'not ' if folder else ''}a folder: "
                                f"dataset={source.name} reads {'one' if folder else 'a file'}")
    if not source.cached():
        return f"{source.name} is not in the data cache: the run downloads it first"
    return None
