"""hetsgd from Python: run, sweep and load runs as typed values, e.g. in a notebook.

``run`` and ``sweep`` take the command's own way in (:func:`hetsgd.invocation.invoke`: the same
composition, checks, run directory, figures, trackers and exit status), so a run started here is
the run the shell would start; worker processes are started as there, and never run the calling
script again, so a script needs no ``if __name__ == "__main__":`` guard. Called from the main
thread, a run takes SIGTERM and SIGHUP for its duration, as the command does; from another
thread (only the main one may set signal handlers) it leaves them to the program. ``load`` reads
any run directory back, wherever it was started.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from hetsgd.bounded import stop_verb
from hetsgd.errors import UserError
from hetsgd.invocation import Invocation, invoke
from hetsgd.outputs.index import is_run_dir, load_csv
from hetsgd.outputs.summary import RunSummary
from hetsgd.outputs.sweep import job_dirs


@dataclass(frozen=True)
class RunResult:
    """One run directory read back: its summary and its tables (None where the run did not
    write one, e.g. a run that failed before training)."""

    run_dir: Path
    summary: RunSummary
    convergence: pd.DataFrame | None  # one row per snapshot (convergence.csv)
    utilization: pd.DataFrame | None  # one row per sample (utilization.csv)
    workers: pd.DataFrame | None  # one row per worker (workers.csv)
    # the exit status `hetsgd run` gives this run (0 completed, 1 failed, 3 diverged, 130
    # interrupted); None for a run read back with :func:`load`
    exit_code: int | None = None

    @property
    def status(self) -> str:
        return self.summary.status


@dataclass(frozen=True)
class SweepResult:
    """A multirun: its folder (report.md, the comparison figures), its jobs in order, and the
    exit status of the whole sweep (the gravest of its jobs')."""

    sweep_dir: Path
    runs: list[RunResult]
    exit_code: int


def load(run_dir: str | Path) -> RunResult:
    """Read the run directory ``run_dir``: a missing or unreadable summary reads as a crashed or
    failed run that says why, as in `hetsgd report`. A folder that is no run's (a sweep's, the
    results') is refused, as `hetsgd recover` refuses it, not read as a crashed run."""
    path = Path(run_dir)
    if not path.is_dir():
        raise UserError(f"no such run directory: {path}")
    if not is_run_dir(path):
        raise UserError(f"{path} is not a run directory (one holds summary.json, config.yaml or "
                        ".hydra/; a sweep's runs are the folders in it)")
    return RunResult(path, RunSummary.read(path), load_csv(path, "convergence"),
                     load_csv(path, "utilization"), load_csv(path, "workers"))


def _invoke(arguments: list[str]) -> Invocation:
    """`hetsgd run ARGUMENTS` in this process. A refusal before any run directory exists (a bad
    override, a refused resume, a sweep none of whose jobs could be composed) is raised as the
    one-line error the command prints. A run or sweep stopped by Ctrl-C (or SIGTERM) raises
    KeyboardInterrupt once its folders say so, as a stop does in any Python code: a notebook's
    loop of runs stops too, instead of going on to the next one."""
    invocation = invoke(arguments)
    if invocation.code > 128:  # 128 + the number of the signal that stopped it (SIGHUP: 129)
        where = invocation.started_sweep or (invocation.runs[-1] if invocation.runs else None)
        raise KeyboardInterrupt(f"hetsgd run {' '.join(arguments)} was "
                                f"{stop_verb(invocation.stopped())}"
                                + (f"; what it wrote is in {where}" if where else ""))
    if not invocation.runs and (invocation.started_sweep is None or invocation.errors):
        raise UserError(invocation.errors[-1] if invocation.errors else
                        f"hetsgd run {' '.join(arguments)} started no run "
                        f"(exit status {invocation.code})")
    return invocation


def run(*overrides: str) -> RunResult:
    """Train once with the Hydra ``overrides`` of `hetsgd run` (``"algo=hogbatch"``,
    ``"devices=emulated"``, ...); the run's directory, read back, with its exit status."""
    invocation = _invoke(list(overrides))
    result = load(invocation.runs[-1])
    return RunResult(result.run_dir, result.summary, result.convergence, result.utilization,
                     result.workers, invocation.code)


def sweep(*overrides: str) -> SweepResult:
    """`hetsgd run -m OVERRIDES`: one job per combination of the swept values
    (``"+method=hogwild,hogbatch"``, ``"seed=0,1,2"``), each read back."""
    invocation = _invoke(["-m", *overrides])
    sweep_dir = invocation.started_sweep
    if sweep_dir is None:
        raise UserError(f"hetsgd run -m {' '.join(overrides)} started no sweep "
                        f"(exit status {invocation.code})")
    return SweepResult(sweep_dir, [load(job) for job in job_dirs(sweep_dir)], invocation.code)
