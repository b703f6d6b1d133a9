"""One run of a composed config: what Hydra calls for `hetsgd run` and for each job of a sweep,
whichever entry started it (:mod:`hetsgd.invocation`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.conf import HydraConf
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from hetsgd.bounded import stop_cause
from hetsgd.config import ConfigError, to_run_config
from hetsgd.engines.processes import warm_up
from hetsgd.engines.ranks.torchrun import torchrun
from hetsgd.errors import out_of_memory

if TYPE_CHECKING:  # the summary's readers load pandas: `hetsgd --help` does without
    from hetsgd.outputs.summary import RunSummary


def train(cfg: DictConfig, started_at: float | None = None) -> RunSummary:
    """Train ``cfg`` (composed by Hydra, which made its run directory) and return its summary,
    also when it failed or was refused: the run directory says so and why. Then its figures (a
    single run's: a sweep draws its comparison at its end) and its trackers' logs. ``started_at``
    is when the run began on the wall clock (default: now). A refused resume of a run directory
    in place raises :class:`~hetsgd.errors.UserError`, with nothing written over it."""
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    trained_with = [cfg]  # a resume trains with its checkpoint's config, trackers included
    try:
        _redact_hydra_files(hydra_cfg)
        summary = _run(cfg, run_dir, hydra_cfg, started_at, trained_with.append)
    except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM before the run wrote its summary
        _interrupted_before_start(run_dir, cfg, stop_cause(stop))
        raise
    _log_to_trackers(run_dir, trained_with[-1].logger)
    return replace(summary, run_dir=str(run_dir))


def _run(cfg: DictConfig, run_dir: Path, hydra_cfg: HydraConf, started_at: float | None,
         trained_with: Callable[[Any], None]) -> RunSummary:
    """:func:`train`'s run: refused, failed to load, or run (``trained_with`` is told its
    config); then a single run's figures."""
    refusal = _refusal(cfg)
    if refusal is None and not cfg.devices.simulated:  # its imports overlap this process's own
        warm_up(cfg.workers.start)
    # the run directory's writers (they load pandas), before the training stack: a run that
    # cannot load torch (say beyond `ulimit -v`) still writes why
    from hetsgd.runs.refused import refuse

    if refusal is not None and cfg.resume is None and torchrun() is None:
        # a value the checks refuse: its failed run directory, without the training stack (a
        # resume's config is the checkpoint's; torchrun's other ranks wait for rank 0's word)
        return refuse(run_dir, cfg, cfg, refusal)
    try:
        from hetsgd.runs import runner  # the training stack loads only when a run starts
    except Exception as exc:  # noqa: BLE001 - e.g. torch's libraries not mapped: said, in the run
        return refuse(run_dir, cfg, cfg, out_of_memory(exc) or
                      f"loading the training stack raised {type(exc).__name__}: {exc}")
    summary = runner.run(cfg, run_dir, cfg, hydra_cfg.overrides.task, started_at, trained_with)
    if hydra_cfg.mode != RunMode.MULTIRUN:
        from hetsgd.outputs.drawing import draw_figures  # loaded by the run

        draw_figures(run_dir)
    return summary


def _interrupted_before_start(run_dir: Path, cfg: DictConfig, cause: str) -> None:
    """A run stopped before it wrote its summary (starting its workers' server, loading torch)
    says so, as every other stopped run does, instead of reading as crashed. Nothing is
    written where a summary is (the run's own, or the one a resume in place continues), and a
    write that fails (the stop landed inside the very import it needs) leaves the stop as it
    is."""
    if cfg.resume is not None or torchrun() is not None:
        return
    with suppress(Exception):
        from hetsgd.outputs.run_directory import SUMMARY
        from hetsgd.runs.refused import refuse

        if not (run_dir / SUMMARY).exists():
            refuse(run_dir, cfg, cfg, f"{cause} as the run started",
                   status="interrupted")


def _redact_hydra_files(hydra_cfg: HydraConf) -> None:
    """Hydra wrote the job's config and overrides (and a sweep's) before this job began: the
    secrets of URIs in them (a tracker's password) are redacted there, as in what the run
    writes and logs itself; the run keeps the real values."""
    from hetsgd.outputs.run_directory import redact_files

    files = []
    if hydra_cfg.output_subdir is not None:
        files += [Path(hydra_cfg.runtime.output_dir) / hydra_cfg.output_subdir / name
                  for name in ("config.yaml", "hydra.yaml", "overrides.yaml")]
    if hydra_cfg.mode == RunMode.MULTIRUN:
        files.append(Path(hydra_cfg.sweep.dir) / "multirun.yaml")
    redact_files(files)


def _refusal(cfg: DictConfig) -> str | None:
    """What the schema's checks refuse in ``cfg``, if anything: such a run needs no workers, so
    no forkserver is started (and no torch imported there) only for the run to fail."""
    try:
        to_run_config(cfg)
    except ConfigError as exc:
        return str(exc)
    return None


def _log_to_trackers(run_dir: Path, loggers: Any) -> None:
    """The trackers `logger=...` chose (none by default) log the files just written, figures
    included; like drawing them, failing never fails the run."""
    if loggers.tensorboard is None and loggers.mlflow is None:
        return
    from hetsgd.outputs.trackers import track  # tensorboard and mlflow load only here

    track(run_dir, loggers)

