"""A sweep's folder, settled before its first job: where Hydra puts it, refused where an earlier
sweep is there or another holds it, and the tuning the sweep asks for, checked; and a single
run's folder, refused where an earlier run is there. For `hetsgd run` (:mod:`hetsgd.invocation`,
which then claims a sweep's folder) and its dry run (:mod:`hetsgd.runs.dry_run`, which claims
nothing)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.types import RunMode
from omegaconf import DictConfig

from hetsgd.config import compose_run
from hetsgd.config.compose import quoted
from hetsgd.config.hydra_private import draws_jobs
from hetsgd.errors import UserError
from hetsgd.outputs.safe_text import shown
from hetsgd.outputs.terminal import err

if TYPE_CHECKING:
    from hetsgd.tuning import Tuning

# The launcher that runs a sweep's jobs all at once on this machine (hydra/launcher=submitit_local:
# submitit's local executor has no limit on how many run together)
CONCURRENT_LAUNCHER = "hydra_submitit_launcher.submitit_launcher.LocalLauncher"
# The overrides that may set hydra.mode: MULTIRUN without -m (the experiments do)
MODE_SETTERS = frozenset({"experiment", "hydra.mode"})


class SweepFolder(NamedTuple):
    """Where a sweep writes (None: a single run), the tuning it asks for, and the outermost
    folder its claim created (to remove again if no job starts)."""

    folder: Path | None = None
    tuning: Tuning | None = None
    made: Path | None = None


def settle_sweep_dir(overrides: list[str], multirun: bool, config_dir: str | None = None,
                     claim: bool = True) -> SweepFolder:
    """The folder the sweep of ``overrides`` writes into, as Hydra resolves it (from everything
    but the swept values), refused if an earlier sweep is there (:func:`check_unused`) or
    another claimed it (:func:`claim_folder`), and the tuning it asks for, checked; claimed for
    this sweep unless not ``claim`` (a dry run, which writes nothing). None for a single run
    (neither ``-m`` nor an experiment's ``hydra.mode: MULTIRUN``) and where the overrides do
    not compose, which Hydra then reports itself. A launcher that runs the jobs at once is
    warned of here, once: their measured times compete for the cores. A sweep of a
    ``tuning.*`` key is refused (:func:`refuse_swept`)."""
    from hetsgd.tuning.spec import refuse_swept

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # noqa: BLE001 - Hydra's own parser says what is wrong, just after
        return SweepFolder()
    refuse_swept(parsed)
    try:
        # without -m only an experiment (or hydra.mode itself) can make it a sweep: a single
        # run is not composed an extra time
        if not multirun and not any(o.key_or_group in MODE_SETTERS for o in parsed):
            return SweepFolder()
        fixed = [override.input_line for override in parsed
                 if not override.is_sweep_override() and override.input_line is not None]
        if config_dir is not None:  # the user's configs (their +method, their experiment)
            fixed.append(f"hydra.searchpath=[{quoted('file://' + str(Path(config_dir).resolve()))}]")
        config = compose_run(fixed, hydra_config=True)
    except Exception:  # noqa: BLE001 - Hydra's own composition says what is wrong, just after
        return SweepFolder()
    hydra = config.hydra
    if not multirun and hydra.mode != RunMode.MULTIRUN:
        return SweepFolder()
    from hetsgd.outputs.sweep import (
        check_unclaimed,
        check_unused,
        claim_folder,
        record_sampled_sweep,
    )

    sweep_dir = Path(str(hydra.sweep.dir))
    check_unused(sweep_dir)
    if str(hydra.launcher.get("_target_", "")).endswith(CONCURRENT_LAUNCHER):
        err.print("hetsgd: warning: hydra/launcher=submitit_local runs the sweep's jobs at once on "
                  "this machine, so their workers share its cores and their times compete; "
                  "Hydra's default launcher runs them one by one", soft_wrap=True)
    tuning = _check_sweep(config, parsed, fixed)
    if not claim:
        check_unclaimed(sweep_dir)
        return SweepFolder(sweep_dir, tuning)
    made = claim_folder(sweep_dir)  # the last check: a refused sweep leaves no claim behind
    if draws_jobs(hydra.sweeper):
        record_sampled_sweep(sweep_dir, overrides, hydra.sweeper.get("params"))
    return SweepFolder(sweep_dir, tuning, made)


def _check_sweep(config: DictConfig, parsed: list[Override], fixed: list[str]) -> Tuning | None:
    """What a sweep asks for, checked before its folder is claimed: values to sweep
    (``seed=range(0)`` runs nothing), its objective (:func:`check_objective`) and the tuning
    it asks for, returned. A tuned comparison searches its grid whole, which a sampling sweeper
    (Optuna's) would not, and the comparison runs the values it chose, which a command-line
    value of a searched key would replace: both refused, as are its methods' and knobs' faults
    (:func:`check_knobs`)."""
    from hetsgd.tuning import Tuning
    from hetsgd.tuning.objective import check_objective
    from hetsgd.tuning.phases import check_knobs
    from hetsgd.tuning.spec import NODE, refuse_empty, refuse_searched

    refuse_empty(parsed)
    check_objective(config)
    tuning = Tuning.of(config)
    if tuning is None:
        return None
    if draws_jobs(config.hydra.sweeper):
        raise UserError(f"a tuned comparison ({NODE}) searches its grid whole with Hydra's basic "
                        "sweeper, which a sampling one would not: leave hydra/sweeper out")
    refuse_searched(tuning, parsed)
    check_knobs(tuning, fixed)
    return tuning


def check_run_dir(overrides: Sequence[str]) -> None:
    """A run given the folder of an earlier one (``hydra.run.dir=DIR``, a habit of Hydra's
    users) is refused before Hydra writes there: it would overwrite its summary and mix their
    files. Continuing it is ``resume=DIR``; a folder named through an interpolation is not
    resolved here (its default, a new time-stamped folder, never holds one)."""
    from hetsgd.outputs.index import is_run_dir

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except Exception:  # noqa: BLE001 - Hydra's own parser says what is wrong, just after
        return
    given = {o.key_or_group: o.value() for o in parsed}
    folder = given.get("hydra.run.dir")
    if not isinstance(folder, str) or "resume" in given or "${" in folder:
        return
    if is_run_dir(Path(folder).expanduser()):
        raise UserError(f"hydra.run.dir {shown(folder)} holds an earlier run, which this one "
                        f"would overwrite: choose another folder (or leave hydra.run.dir out for "
                        f"a new one), or continue that run with resume={shown(folder)}")
