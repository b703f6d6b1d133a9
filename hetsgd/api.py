"""hetsgd from Python: run, sweep and load runs as typed values, e.g. in a notebook.

``run`` and ``sweep`` go through the command line's own ``hetsgd run`` in this process (the same
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

from hetsgd import cli
from hetsgd.errors import UserError
from hetsgd.outputs.index import load_csv
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
    failed run that says why, as in `hetsgd report`."""
    path = Path(run_dir)
    if not path.is_dir():
        raise UserError(f"no such run directory: {path}")
    return RunResult(path, RunSummary.read(path), load_csv(path, "convergence"),
                     load_csv(path, "utilization"), load_csv(path, "workers"))


def _invoke(arguments: list[str]) -> int:
    """``hetsgd ARGUMENTS`` in this process; its exit status. A refusal before any run directory
    exists (a bad override, say) is raised as the one-line error the command prints."""
    code = cli.app(arguments, standalone_mode=False) or 0
    if code and not cli.runs_started:
        raise UserError(cli.errors_printed[-1] if cli.errors_printed
                        else f"hetsgd {' '.join(arguments)} exited with status {code}")
    return int(code)


def run(*overrides: str) -> RunResult:
    """Train once with the Hydra ``overrides`` of `hetsgd run` (``"algo=hogbatch"``,
    ``"devices=emulated"``, ...); the run's directory, read back, with its exit status."""
    code = _invoke(["run", *overrides])
    result = load(cli.runs_started[-1])
    return RunResult(result.run_dir, result.summary, result.convergence, result.utilization,
                     result.workers, code)


def sweep(*overrides: str) -> SweepResult:
    """`hetsgd run -m OVERRIDES`: one job per combination of the swept values
    (``"+method=hogwild,hogbatch"``, ``"seed=0,1,2"``), each read back."""
    code = _invoke(["run", "-m", *overrides])
    sweep_dir = cli.started_sweep()
    if sweep_dir is None:
        raise UserError(f"hetsgd run -m {' '.join(overrides)} started no sweep (exit status {code})")
    return SweepResult(sweep_dir, [load(job) for job in job_dirs(sweep_dir)], code)
