"""The one way in: the command `hetsgd run ARGS` and Python's ``hetsgd.run(*ARGS)`` both call
:func:`invoke`, which has Hydra compose ARGS (a run, or a sweep with ``-m``) and calls
:func:`hetsgd.train.train` for each run.

Everything one invocation learns (the runs it started, how they ended, the errors it printed, the
stop signals that arrived) lives in its :class:`Invocation`, never in a module, so that several
invocations in one process (a notebook, the tests) never see each other's runs. The arguments go
to Hydra as they are (its own parser), not through ``sys.argv``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.errors import MissingConfigException
from omegaconf import DictConfig

from hetsgd.bounded import Stopped, Terminated, stop_cause, stop_verb
from hetsgd.config import CONF_DIR, ConfigError, register_configs
from hetsgd.config.compose import hydra_arguments, quoted
from hetsgd.config.hydra_private import run_hydra
from hetsgd.config.keys import composition_error, missing_config
from hetsgd.engines.ranks.torchrun import follower
from hetsgd.errors import SearchInterrupted, UserError, out_of_memory
from hetsgd.observe.contention import warning as contention_warning
from hetsgd.outputs.safe_text import guard_logging, shown
from hetsgd.outputs.terminal import console, err, print_error, summary_table
from hetsgd.runs.sweep_dir import check_run_dir, settle_sweep_dir
from hetsgd.train import train

log = logging.getLogger("hetsgd")
# How `hetsgd run` exits: 0 when every run completed, else the code of the gravest outcome.
EXIT_CODES = {"completed": 0, "diverged": 3, "failed": 1, "interrupted": 130}
# SIGTERM (a scheduler, `kill`) and SIGHUP (the terminal went away) stop a run as Ctrl-C does;
# the exit code is 128 + the signal's number, as a shell reports a command the signal ended
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# A launcher such as submitit runs sweep jobs in processes that unpickle the task function
# (:class:`_Job`) and compose their own config, so the schemas and resolvers are registered
# wherever this module loads.
register_configs()


@dataclass
class Invocation:
    """One `hetsgd run` (or ``hetsgd.run``/``hetsgd.sweep``), as it goes and as it ended."""

    # when the first run began: the console command's process start (its interpreter and
    # imports, which Python's hetsgd.run does not pay per run); None: when it starts
    started_at: float | None = None
    runs: list[Path] = field(default_factory=list)  # the run directory of each run started here
    statuses: list[str] = field(default_factory=list)  # how each run trained here ended
    errors: list[str] = field(default_factory=list)  # the error lines printed
    # the stop signals (Ctrl-C's SIGINT, SIGTERM, SIGHUP) as they arrived: the first names the stop
    stop_signals: list[int] = field(default_factory=list)
    sweep_dir: Path | None = None  # a sweep's folder, known before its first job
    sweep_made: Path | None = None  # the outermost folder its claim created (results/sweeps/)
    code: int = 0  # the exit status

    def error(self, message: object) -> None:
        """Print ``message`` as the command's one error line, and keep it."""
        self.errors.append(print_error(message))

    def fail(self, message: object) -> None:
        """The invocation itself failed (no run could start, or the sweep stopped): exit 1."""
        self.error(message)
        self.code = EXIT_CODES["failed"]

    @property
    def started_sweep(self) -> Path | None:
        """The folder of the sweep this invocation started, once it exists."""
        return self.sweep_dir if self.sweep_dir is not None and self.sweep_dir.is_dir() else None

    def ended(self) -> list[str]:
        """How its runs ended: a sweep's as its job folders say (its launcher may have run them in
        other processes), a single run's as it returned."""
        from hetsgd.outputs.sweep import job_statuses

        sweep_dir = self.started_sweep
        return job_statuses(sweep_dir) if sweep_dir else self.statuses

    def stopped(self) -> Stopped:
        """The first stop that arrived, as the exception that ends a sweep and names the stop."""
        first = self.stop_signals[0] if self.stop_signals else signal.SIGINT
        return Stopped() if first == signal.SIGINT else Terminated(first)

    def exit_code(self, statuses: list[str]) -> int:
        """The gravest outcome's code. A status that is none of EXIT_CODES' (a sweep job that left
        no final summary reads `crashed`) counts as failed."""
        if "interrupted" in statuses:
            return 128 + self.stop_signals[0] if self.stop_signals else EXIT_CODES["interrupted"]
        if any(status not in ("completed", "diverged") for status in statuses):
            return EXIT_CODES["failed"]
        return EXIT_CODES["diverged"] if "diverged" in statuses else EXIT_CODES["completed"]


class _Job:
    """Hydra's task function: one run, or one job of a sweep, recorded in its invocation. A
    launcher such as submitit pickles it to run it in another process, where what it records
    stays: the invocation then reads the sweep's job folders."""

    def __init__(self, invocation: Invocation) -> None:
        self.invocation = invocation

    def __call__(self, cfg: DictConfig) -> float:
        """The run's objective (:func:`hetsgd.tuning.objective.run_objective`), which Hydra's
        sweepers (Optuna's) rank by; the metric's worst for a run that did not complete and learn."""
        from hetsgd.tuning.objective import run_objective

        invocation = self.invocation
        # the first run pays for the process's start; later jobs of a sweep start now
        started_at = invocation.started_at if not invocation.runs else None
        invocation.runs.append(Path(HydraConfig.get().runtime.output_dir))
        try:
            summary = train(cfg, started_at)
        except KeyboardInterrupt:  # stopped outside the runner (as the run started, or drawing
            invocation.statuses.append("interrupted")  # its figures): its folder says so, and
            err.print(f"hetsgd: {stop_cause(invocation.stopped())}; what the run wrote is in "
                      f"{shown(invocation.runs[-1])}", soft_wrap=True)  # so does the console
            raise
        except UserError as exc:  # a refused resume of RUN_DIR in place: nothing written, so no
            invocation.runs.pop()  # run of this invocation's (RUN_DIR is another's)
            invocation.statuses.append("failed")
            invocation.error(exc)
            return run_objective(cfg, None)
        invocation.statuses.append(summary.status)
        if summary.status == "failed":
            invocation.error(f"{summary.error} (details in {summary.run_dir})")
            return run_objective(cfg, summary.to_dict())
        if summary.status == "interrupted" and summary.final is None:  # nothing to tabulate:
            err.print(f"hetsgd: {shown(summary.error)}", soft_wrap=True)  # it says why
            raise invocation.stopped()
        try:
            console.print(summary_table(summary.to_dict()))
        except Exception as exc:  # noqa: BLE001 - the run's files are written: only the table is lost
            log.warning("could not print the summary of %s: %s", summary.run_dir,
                        out_of_memory(exc) or exc)
        if (line := contention_warning(summary.contention or {})) is not None:
            log.warning("%s", line)  # the run's last word: its times are not the machine's
        if summary.status == "interrupted":
            raise invocation.stopped()  # a sweep stops here; its summary covers the jobs that ran
        return run_objective(cfg, summary.to_dict())


def invoke(args: Sequence[str], started_at: float | None = None) -> Invocation:
    """`hetsgd run ARGS` in this process: Hydra's own arguments (``-m``, ``--cfg job``,
    ``--config-dir``) and overrides. Every error is printed as one line and recorded; the
    invocation's ``code`` is the exit status the command gives."""
    invocation = Invocation(started_at)
    if follower():  # a torchrun rank other than 0 trains its rank; rank 0 writes the run directory
        from hetsgd.runs.follow import follow

        try:
            invocation.code = follow(args)
        except (UserError, ConfigError) as exc:
            invocation.fail(exc)
        return invocation
    os.environ["HYDRA_FULL_ERROR"] = "1"  # errors reach us whole; we print them as one line
    record_factory = guard_logging()  # put back after: Hydra logs a sweep's overrides, secrets too
    stop_handlers = _take_stop_signals(invocation.stop_signals)
    handlers = list(logging.root.handlers)
    interrupted = False
    try:
        _launch(invocation, [*args, *_continue_in_place(args)])
    except KeyboardInterrupt as stop:
        interrupted = True
        if isinstance(stop, SearchInterrupted):  # a tuned comparison's search: its trials
            err.print(str(stop), soft_wrap=True)
        elif (sweep_dir := invocation.started_sweep) is not None:
            err.print(f"hetsgd: sweep {stop_verb(invocation.stopped())} after "
                      f"{len(invocation.ended())} job(s); the "
                      f"others did not run ({_close_sweep(sweep_dir)})", soft_wrap=True)
    except (UserError, ConfigError) as exc:
        invocation.fail(exc)
    except MissingConfigException as exc:  # e.g. algo=nope (an OSError too, for Hydra)
        invocation.fail(missing_config(exc))
    except OSError as exc:  # a write of Hydra's own (a job's .hydra/ files) failed: a full disk
        invocation.fail(_stopped_by(invocation, exc))
    except Exception as exc:  # Hydra's and OmegaConf's composition errors: bad overrides
        if os.environ.get("HETSGD_DEBUG"):
            raise
        invocation.fail(composition_error(exc, args))
    finally:
        _detach_log_handlers(keep=handlers)
        logging.setLogRecordFactory(record_factory)
        for signum, handler in stop_handlers.items():
            signal.signal(signum, handler)
        if invocation.sweep_dir is not None:
            from hetsgd.outputs.sweep import release_unstarted

            release_unstarted(invocation.sweep_dir, invocation.sweep_made)
    if not invocation.code:
        statuses = invocation.ended()
        invocation.code = invocation.exit_code([*statuses, "interrupted"] if interrupted
                                               else statuses)
    return invocation


def _launch(invocation: Invocation, args: list[str]) -> None:
    """What ``@hydra.main`` does with ``sys.argv``, with ``args``: Hydra's own parser and runner
    (:mod:`hetsgd.config.hydra_private`). A sweep's folder is settled first
    (:func:`~hetsgd.runs.sweep_dir.settle_sweep_dir`), so that the invocation knows it whichever
    launcher runs the jobs."""
    parser, parsed = hydra_arguments(args)
    invocation.sweep_dir, tuning, invocation.sweep_made = settle_sweep_dir(
        parsed.overrides, parsed.multirun, parsed.config_dir)
    if invocation.sweep_dir is not None:
        parsed.overrides.append(f"hydra.sweep.dir={quoted(invocation.sweep_dir)}")
    else:
        check_run_dir(parsed.overrides)
    job = _Job(invocation)

    def sweep(overrides: list[str]) -> None:
        run_hydra(argparse.Namespace(**{**vars(parsed), "overrides": overrides}), parser, job,
                  config_dir=str(CONF_DIR), config_name="config")

    if tuning is None or invocation.sweep_dir is None:
        sweep(parsed.overrides)
    else:  # a search, then the comparison of each method's best setting (hetsgd/tuning/)
        from hetsgd.tuning.phases import tune_then_compare

        tune_then_compare(tuning, parsed.overrides, invocation.sweep_dir, sweep)


def _continue_in_place(args: Sequence[str]) -> list[str]:
    """`resume=RUN_DIR` continues in RUN_DIR itself, so that one run directory holds the whole
    run; only an existing run directory, so that a mistyped path creates no folder outside the
    results (the runner then reports it in a fresh run directory). The path is the override's
    value as Hydra reads it: quoted, as a sweep job's folder (``1_seed=1``) must be."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from hetsgd.outputs.index import is_run_dir, override_key

    given = [a for a in args if "=" in a and override_key(a) == "resume"]
    try:
        source = OverridesParser.create().parse_override(given[-1]).value() if given else None
    except Exception:  # noqa: BLE001 - Hydra's own parse says what is wrong, just after
        return []
    if not isinstance(source, str) or not is_run_dir(Path(source)):
        return []
    # Hydra writes nothing there (no .hydra/): a refused resume leaves RUN_DIR as it was, and
    # an accepted one records its overrides itself (hetsgd.runs.resume)
    return [f"hydra.run.dir={quoted(Path(source).resolve())}", "hydra.output_subdir=null"]


def _take_stop_signals(arrived: list[int]) -> dict[signal.Signals, Any]:
    """Route the stop signals to a handler that records them in ``arrived`` and stops the run as
    Ctrl-C does, except one the user chose to ignore (`nohup` ignores SIGHUP); Python's own
    Ctrl-C is recorded too, so that the first stop names the exit code. Returns the handlers to
    put back. Multiprocessing's resource tracker, which the run's workers share,
    starts first with SIGHUP blocked, which it keeps (it unblocks only what it ignores itself):
    a hangup, which reaches the whole process group, then stops the run through its coordinator
    rather than killing the tracker.

    Only the main thread may set handlers: a run started from another thread (``hetsgd.run`` in
    a thread of the caller's) leaves the signals to the program that owns that thread."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    if threading.current_thread() is not threading.main_thread():
        return {}

    def terminate(signum: int, frame: object) -> None:
        arrived.append(signum)
        raise Terminated(signum)

    def interrupt(signum: int, frame: object) -> None:
        arrived.append(signum)
        raise KeyboardInterrupt

    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, *STOP_SIGNALS)}
    for signum, handler in previous.items():
        if signum != signal.SIGINT and handler is not signal.SIG_IGN:
            signal.signal(signum, terminate)
        elif handler is signal.default_int_handler:  # Python's own Ctrl-C, recorded in order
            signal.signal(signum, interrupt)
    return previous


def _detach_log_handlers(keep: list[logging.Handler]) -> None:
    """Close the handlers Hydra gave the root logger for this invocation (its runs' `cli.log`
    files), so that nothing logged later, in the same process, writes to a run directory or
    fails because one was removed."""
    for handler in list(logging.root.handlers):
        if handler not in keep:
            handler.close()
            logging.root.removeHandler(handler)


def _close_sweep(sweep_dir: Path) -> str:
    """Write the summary and report of the jobs of ``sweep_dir`` that ran, once the sweep
    stopped early; where they are, or why they could not be written (a full disk)."""
    from hetsgd.outputs.sweep import finalize_sweep

    try:
        finalize_sweep(sweep_dir)
    except OSError as exc:
        return f"no summary or report of them either: {exc}"
    return f"summary and report of those that ran in {sweep_dir}"


def _stopped_by(invocation: Invocation, exc: OSError) -> str:
    """A write of Hydra's own failed (a full disk): a job's ``.hydra/`` files, written before
    the job starts, in the newest job folder of a sweep, whose summary and report of the jobs
    that ran are still written."""
    from hetsgd.outputs.run_directory import WriteError
    from hetsgd.outputs.sweep import newest_job_folder

    sweep_dir = invocation.started_sweep
    if sweep_dir is None:
        return f"{exc} (writing the run's .hydra/ files)" if exc.filename is None else str(exc)
    job = newest_job_folder(sweep_dir)
    if exc.filename is None and job is not None:
        exc = WriteError.of(job, exc)
    return f"{exc}; the sweep stopped there ({_close_sweep(sweep_dir)})"
