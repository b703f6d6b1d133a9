"""The `hetsgd` command line: run (through Hydra), data, machine, report, plot."""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any, NoReturn, TextIO

import hydra
import typer
from hydra.core.hydra_config import HydraConfig
from hydra.errors import MissingConfigException
from hydra.types import RunMode
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table
from rich.text import Text

from hetsgd.config import CONF_DIR, ConfigError, RunConfig, compose_run, register_configs, to_run_config
from hetsgd.config.compose import with_first_group_choices
from hetsgd.engines.distributed.torchrun import follower, torchrun
from hetsgd.engines.processes import warm_up
from hetsgd.errors import UserError, out_of_memory
from hetsgd.machine import machine_facts, process_started_at
from hetsgd.outputs.safe_text import guard_logging

app = typer.Typer(
    help="Train one model on the CPUs and GPUs of a server together, and measure it.\n\n"
         "Start with `hetsgd run` (the defaults: sync SGD on the embedded digits set), "
         "`hetsgd run --help` for overrides, `hetsgd data list` and `hetsgd machine`.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)
data_app = typer.Typer(help="Datasets and the data cache ($HETSGD_DATA or ~/.cache/hetsgd).",
                       no_args_is_help=True)
app.add_typer(data_app, name="data")
# Markup off: what is printed holds paths, overrides and exception text, where `[/x]` is no tag.
console = Console(markup=False)
err = Console(stderr=True, markup=False, highlight=False)
# How `hetsgd run` exits: 0 when every run completed, else the code of the gravest outcome.
EXIT_CODES = {"completed": 0, "diverged": 3, "failed": 1, "interrupted": 130}
# SIGTERM (a scheduler, `kill`) and SIGHUP (the terminal went away) stop a run as Ctrl-C does;
# the exit code is 128 + the signal's number, as a shell reports a command the signal ended
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
run_statuses: list[str] = []  # how each run this process trained ended
runs_started: list[Path] = []  # the run directory of each run this command started
errors_printed: list[str] = []  # the error lines this command printed (for hetsgd.api)
command_started_at: float | None = None  # the console command's process start (see main)
terminated: list[int] = []  # the stop signals that arrived
# A launcher such as submitit runs sweep jobs in processes that unpickle `train_job` and compose
# their own config, so the schemas and resolvers are registered wherever this module loads.
register_configs()


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, taken like Ctrl-C: stop the workers, keep what was measured, write
    everything."""


def _terminate(signum: int, frame: object) -> None:
    terminated.append(signum)
    raise Terminated()


def _take_stop_signals() -> dict[signal.Signals, Any]:
    """Route the stop signals to :func:`_terminate`, except one the user chose to ignore
    (`nohup` ignores SIGHUP); returns the handlers to put back. Multiprocessing's resource
    tracker, which the run's workers share, starts first with SIGHUP blocked, which it keeps (it
    unblocks only what it ignores itself): a hangup, which reaches the whole process group,
    then stops the run through its coordinator rather than killing the tracker.

    Only the main thread may set handlers: a run started from another thread (``hetsgd.run`` in
    a thread of the caller's) leaves the signals to the program that owns that thread."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    for signum, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(signum, _terminate)
    return previous


def _exit_code(statuses: list[str]) -> int:
    """The gravest outcome's code. A status that is none of EXIT_CODES' (a sweep job that left no
    final summary reads `crashed`) counts as failed."""
    if "interrupted" in statuses:
        return 128 + terminated[0] if terminated else EXIT_CODES["interrupted"]
    if any(status not in ("completed", "diverged") for status in statuses):
        return EXIT_CODES["failed"]
    return EXIT_CODES["diverged"] if "diverged" in statuses else EXIT_CODES["completed"]


def _one_line(message: str) -> str:
    return " ".join(line.strip() for line in str(message).splitlines() if line.strip())


def _composition_error(exc: Exception) -> str:
    """What a bad override did, with its cause, or that memory ran out. Hydra raises some errors
    without a message (an assertion deep in its defaults list, e.g. for `algo=${x}`): those
    still get a line that says what failed."""
    if (memory := out_of_memory(exc)) is not None:  # not the overrides' fault
        return memory
    message = str(exc) or f"the overrides cannot be composed into a config ({type(exc).__name__})"
    return message + (f": {exc.__cause__}" if exc.__cause__ is not None else "")


def _print_error(message: str) -> None:
    from hetsgd.outputs.safe_text import redacted, shown  # a message may quote a run folder

    line = shown(redacted(_one_line(message)))
    errors_printed.append(line)
    err.print(Text.assemble(("hetsgd: error:", "red"), " ", line), soft_wrap=True)


def _fail(message: str, code: int = 1) -> None:
    _print_error(message)
    raise typer.Exit(code)


# -- run ---------------------------------------------------------------------------------------


def _summary_table(summary: dict[str, Any]) -> Table:
    from hetsgd.outputs.report import mix_label  # loaded by the run already
    from hetsgd.outputs.safe_text import shown  # a recovered summary is someone's data

    table = Table(title=shown(f"{summary['algo']} on {summary['dataset']} ({mix_label(summary)})"),
                  show_header=False)
    final, initial = summary.get("final") or {}, summary.get("initial") or {}
    rows = [("status", summary["status"]), ("error", summary.get("error")),
            ("training time", f"{summary.get('time_s', 0):.2f} s"),
            ("epochs", f"{summary.get('epochs', 0):.2f}"),
            ("updates", str(summary.get("updates_by_group"))),
            # asynchronous runs: other workers' updates landed during a step, mean / most
            ("staleness", None if not (stale := summary.get("staleness"))
             else f"{stale['mean']:.2f} / {stale['max']} (mean / max)"),
            ("train loss", f"{initial.get('train_loss', float('nan')):.4f} -> "
                           f"{final.get('train_loss', float('nan')):.4f}"),
            ("test loss / acc", f"{final.get('test_loss', float('nan')):.4f} / "
                                f"{final.get('test_acc', float('nan')):.4f}"),
            (f"time to train loss {' / '.join(summary.get('time_to_loss') or {})}", " / ".join(
                "—" if v is None else f"{v:.2f} s"
                for v in (summary.get("time_to_loss") or {}).values())),
            ("results", summary.get("run_dir"))]
    for key, value in rows:
        if value is not None:
            table.add_row(shown(key), shown(value))
    return table


def train_job(cfg: DictConfig) -> None:
    """Hydra's task function: one run, or one job of a sweep. A launcher such as submitit pickles
    it to run it in another process, so it is a plain module function (pickled by name) and keeps
    nothing the command needs after the sweep: that comes from the run folders."""
    _redact_hydra_files()
    refusal = _refusal(cfg)
    # the forkserver's imports overlap this process's own, just below
    if refusal is None and not cfg.devices.simulated:
        warm_up(cfg.workers.start)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    # the command's first run pays for the process's start; later jobs of a sweep start now
    started_at = command_started_at if not runs_started else None
    runs_started.append(run_dir)
    # the run directory's writers (they load pandas), before the training stack: a run that
    # cannot load torch (say beyond `ulimit -v`) still writes why
    from hetsgd.runs.refused import refuse

    if refusal is not None and cfg.resume is None and torchrun() is None:
        # a value the checks refuse: its failed run directory, without the training stack (a
        # resume's config is the checkpoint's; torchrun's other ranks wait for rank 0's word)
        summary = refuse(run_dir, cfg, cfg, refusal)
    else:
        try:
            from hetsgd.runs import runner  # the training stack loads only when a run starts
        except Exception as exc:  # noqa: BLE001 - e.g. torch's libraries not mapped: said, in the run
            summary = refuse(run_dir, cfg, cfg, out_of_memory(exc) or
                             f"loading the training stack raised {type(exc).__name__}: {exc}")
        else:
            try:
                summary = runner.run(cfg, run_dir, cfg, HydraConfig.get().overrides.task,
                                     started_at)
            except UserError as exc:  # a refused resume of RUN_DIR in place: nothing written
                run_statuses.append("failed")
                _print_error(str(exc))
                return
            if HydraConfig.get().mode != RunMode.MULTIRUN:  # a sweep draws them at its end
                _draw_figures(run_dir)
    run_statuses.append(summary["status"])
    _log_to_trackers(run_dir, cfg)
    if summary["status"] == "failed":
        _print_error(f"{summary['error']} (details in {run_dir})")
        return
    try:
        console.print(_summary_table(summary))
    except Exception as exc:  # noqa: BLE001 - the run's files are written: only the table is lost
        logging.getLogger("hetsgd").warning("could not print the summary of %s: %s", run_dir,
                                            out_of_memory(exc) or exc)
    if summary["status"] == "interrupted":
        raise KeyboardInterrupt  # a sweep stops here; its summary covers the jobs that ran


def _redact_hydra_files() -> None:
    """Hydra wrote the job's config and overrides (and a sweep's) before this job began: the
    secrets of URIs in them (a tracker's password) are redacted there, as in what the run
    writes and logs itself; the run keeps the real values."""
    from hetsgd.outputs.run_directory import redact_files

    hydra_cfg = HydraConfig.get()
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


_hydra_run = hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")(train_job)


def _draw_figures(run_dir: Path) -> None:
    """Figures are a view of the files just written; failing to draw never fails the run."""
    try:
        from hetsgd.outputs.run_figures import plot_run  # matplotlib loads only here

        plot_run(run_dir)
    except Exception as exc:  # noqa: BLE001 - the results are on disk; say why figures are missing
        logging.getLogger("hetsgd").warning("could not draw the figures of %s: %s", run_dir,
                                            out_of_memory(exc) or exc)


def _log_to_trackers(run_dir: Path, cfg: DictConfig) -> None:
    """The trackers `logger=...` chose (none by default) log the files just written, figures
    included; like drawing them, failing never fails the run."""
    if cfg.logger.tensorboard is None and cfg.logger.mlflow is None:
        return
    from hetsgd.outputs.trackers import track  # tensorboard and mlflow load only here

    track(run_dir, cfg.logger)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(ctx: typer.Context) -> None:
    """Train once, or sweep with -m. Arguments are Hydra overrides, e.g.

    hetsgd run algo=sync dataset=w8a model=mlp_paper budget.epochs=5

    hetsgd run -m seed=0,1,2    (a sweep, one job after another)

    hetsgd run -m hydra/launcher=submitit_slurm seed=0,1,2    (a sweep on a Slurm cluster)

    hetsgd run --cfg job    (print the composed config and exit)

    Config groups: algo, dataset (dataset.path=FILE for libsvm), model, devices.

    Common keys: budget.epochs, budget.seconds, optim.lr, eval.every_s, seed.

    Results go to results/runs/ (or $HETSGD_RESULTS); sweeps to results/sweeps/.
    """
    if follower():  # a torchrun rank other than 0 trains its rank; rank 0 writes the run directory
        from hetsgd.runs.follow import follow

        try:
            code = follow()
        except (UserError, ConfigError) as exc:
            _fail(str(exc))
        raise typer.Exit(code)
    os.environ["HYDRA_FULL_ERROR"] = "1"  # errors reach us whole; we print them as one line
    # for hetsgd.run too (put back after): Hydra logs a sweep's overrides, secrets included
    record_factory = guard_logging()
    _forget_earlier_runs()
    argv, sys.argv = sys.argv, ["hetsgd run", *with_first_group_choices(ctx.args),
                                *_continue_in_place(ctx.args)]
    stop_handlers = _take_stop_signals()
    interrupted, statuses = False, []  # statuses: read once, on an interrupt
    handlers = list(logging.root.handlers)
    try:
        _refuse_used_sweep_dir(ctx.args)
        _hydra_run()
    except KeyboardInterrupt:
        interrupted, statuses = True, _statuses()
        sweep_dir = started_sweep()
        if sweep_dir is not None:
            err.print(f"hetsgd: sweep interrupted after {len(statuses)} job(s); the others did "
                      f"not run ({_close_sweep(sweep_dir)})", soft_wrap=True)
    except (UserError, ConfigError) as exc:
        _fail(str(exc))
    except MissingConfigException as exc:  # e.g. algo=nope (an OSError too, for Hydra)
        options = ", ".join(exc.options or [])
        _fail(f"no config '{exc.missing_cfg_file}'" + (f": choose one of {options}" if options else ""))
    except OSError as exc:  # a write of Hydra's own (a job's .hydra/ files) failed: a full disk
        _fail(_stopped_by(exc))
    except Exception as exc:  # Hydra's and OmegaConf's composition errors: bad overrides
        if os.environ.get("HETSGD_DEBUG"):
            raise
        _fail(_composition_error(exc))
    finally:
        _detach_log_handlers(keep=handlers)
        logging.setLogRecordFactory(record_factory)
        sys.argv = argv
        for signum, handler in stop_handlers.items():
            signal.signal(signum, handler)
    code = _exit_code([*statuses, "interrupted"] if interrupted else _statuses())
    if code:
        raise typer.Exit(code)


def _continue_in_place(args: list[str]) -> list[str]:
    """`resume=RUN_DIR` continues in RUN_DIR itself, so that one run directory holds the whole
    run; only an existing run directory, so that a mistyped path creates no folder outside the
    results (the runner then reports it in a fresh run directory)."""
    from hetsgd.outputs.index import is_run_dir, override_key

    source = next((a.split("=", 1)[1] for a in args
                   if "=" in a and override_key(a) == "resume"), None)
    if source is None or not is_run_dir(Path(source)):
        return []
    quoted = str(Path(source).resolve()).replace("\\", "\\\\").replace("'", "\\'")
    # Hydra writes nothing there (no .hydra/): a refused resume leaves RUN_DIR as it was, and
    # an accepted one records its overrides itself (hetsgd.runs.resume)
    return [f"hydra.run.dir='{quoted}'", "hydra.output_subdir=null"]


def _refuse_used_sweep_dir(args: list[str]) -> None:
    """A sweep told to write into the folder of an earlier one (``hydra.sweep.dir=DIR``; by
    default each sweep gets a new folder) is refused before any job runs."""
    from hetsgd.outputs.index import override_key
    from hetsgd.outputs.sweep import check_unused

    given = [a for a in args if "=" in a and override_key(a) in ("hydra.sweep.dir", "results_dir")]
    if not {"-m", "--multirun"} & set(args) or not any(
            override_key(a) == "hydra.sweep.dir" for a in given):
        return
    check_unused(Path(str(compose_run(given, hydra_config=True).hydra.sweep.dir)))


def _detach_log_handlers(keep: list[logging.Handler]) -> None:
    """Close the handlers Hydra gave the root logger for this command (its runs' `cli.log`
    files), so that nothing logged later, in the same process, writes to a run directory or
    fails because one was removed."""
    for handler in list(logging.root.handlers):
        if handler not in keep:
            handler.close()
            logging.root.removeHandler(handler)


def _forget_earlier_runs() -> None:
    """The command may run more than once in one process (tests, notebooks); each time it reports
    the runs it started, and only those."""
    from hetsgd.outputs.sweep import sweeps_started

    for record in (run_statuses, runs_started, errors_printed, terminated, sweeps_started):
        record.clear()


def started_sweep() -> Path | None:
    """The folder of the sweep this command started, once it exists."""
    from hetsgd.outputs.sweep import sweeps_started

    return sweeps_started[-1] if sweeps_started and sweeps_started[-1].is_dir() else None


def _statuses() -> list[str]:
    """How the runs of this command ended: a sweep's as its job folders say (its launcher may have
    run them in other processes), a single run's as it returned."""
    from hetsgd.outputs.sweep import job_statuses

    sweep_dir = started_sweep()
    return job_statuses(sweep_dir) if sweep_dir else run_statuses


def _close_sweep(sweep_dir: Path) -> str:
    """Write the summary and report of the jobs of ``sweep_dir`` that ran, once the sweep
    stopped early; where they are, or why they could not be written (a full disk)."""
    from hetsgd.outputs.sweep import finalize_sweep

    try:
        finalize_sweep(sweep_dir)
    except OSError as exc:
        return f"no summary or report of them either: {exc}"
    return f"summary and report of those that ran in {sweep_dir}"


def _stopped_by(exc: OSError) -> str:
    """A write of Hydra's own failed (a full disk): a job's ``.hydra/`` files, written before
    the job starts, in the newest job folder of a sweep, whose summary and report of the jobs
    that ran are still written."""
    from hetsgd.outputs.run_directory import WriteError
    from hetsgd.outputs.sweep import newest_job_folder

    sweep_dir = started_sweep()
    if sweep_dir is None:
        return f"{exc} (writing the run's .hydra/ files)" if exc.filename is None else str(exc)
    job = newest_job_folder(sweep_dir)
    if exc.filename is None and job is not None:
        exc = WriteError.of(job, exc)
    return f"{exc}; the sweep stopped there ({_close_sweep(sweep_dir)})"


# -- report and plot ---------------------------------------------------------------------------


@app.command()
def report(path: Path = typer.Argument(Path("results"), help="A run, a sweep, or all of results/."),
           baseline: str = typer.Option(None, help='The speedup baseline, e.g. "algo=sync devices=gpu"; '
                                                   "default: the sync run of each comparison.")) -> None:
    """Tables per comparison: time and epochs to normalized loss 0.9/0.95/0.99, final losses and
    accuracy, update shares, utilization, speedup. Writes report.md and report.csv beside the runs."""
    from hetsgd.outputs.report import write_report

    if not path.exists():
        _fail(f"no such run, sweep or results folder: {path}")
    try:
        console.print(write_report(path, baseline), highlight=False)
    except UserError as exc:
        _fail(str(exc))


@app.command()
def plot(path: Path = typer.Argument(Path("results"), help="A run, a sweep, or all of results/."),
         format: str = typer.Option("png", "--format", help="Comma-separated: png, svg, pdf.")) -> None:
    """Redraw the figures of every run and comparison under PATH from their CSV files."""
    from hetsgd.outputs.figure_formats import check_formats
    from hetsgd.outputs.plots import plot_all

    if not path.exists():
        _fail(f"no such run, sweep or results folder: {path}")
    try:
        written = plot_all(path, check_formats(format.split(",")))
    except UserError as exc:
        _fail(str(exc))
    console.print(f"{len(written)} figure file(s) written under {path}")


@app.command()
def recover(run_dir: Path = typer.Argument(..., help="A run directory left by a crashed run."),
            model_target: list[str] = typer.Option(
                [], "--model-target", metavar="PKG.FACTORY",
                help="Call this model factory, which the run's config names (a custom model; "
                     "repeat it for each _target_ the config names): a run folder's own "
                     "targets are never called otherwise.")) -> None:
    """Evaluate the snapshots a crashed run left into convergence.csv, summary.json and figures."""
    from hetsgd.runs.recover import recover as recover_run

    try:
        summary = recover_run(run_dir, model_target)
    except (UserError, ConfigError) as exc:
        _fail(str(exc))
    _draw_figures(run_dir)
    console.print(_summary_table(summary))


# -- data ----------------------------------------------------------------------------------------


@data_app.command("list")
def data_list() -> None:
    """List the datasets hetsgd knows, and whether each is in the cache."""
    from hetsgd import data as datasets  # the data stack loads only for data commands
    table = Table("name", "task", "cached", "description")
    for info in datasets.list_sources():
        table.add_row(info.name, str(info.task), "yes" if info.cached else "no", info.description)
    console.print(table)
    console.print(f"cache: {datasets.data_home()}")


@data_app.command("info")
def data_info(name: str) -> None:
    """Show where a dataset comes from, its size, and where its files go in the cache."""
    from hetsgd import data as datasets
    try:
        info = datasets.source_info(name)
    except UserError as exc:
        _fail(str(exc))
    for key, value in vars(info).items():
        console.print(Text.assemble((key, "bold"), f": {value}"), highlight=False)


@data_app.command("fetch")
def data_fetch(name: str) -> None:
    """Download a dataset into the cache (checksums verified)."""
    from hetsgd import data as datasets
    try:
        paths = datasets.fetch(name)
    except UserError as exc:
        _fail(str(exc))
    for path in paths:
        console.print(str(path))


# -- machine -------------------------------------------------------------------------------------


def _compose(overrides: list[str]) -> RunConfig:
    """A run's config from overrides, as `hetsgd run` would compose it (for commands that are not
    runs themselves); bad overrides end in one error line."""
    try:
        return to_run_config(compose_run(overrides))
    except Exception as exc:  # composition and validation errors: bad overrides
        _fail(_composition_error(exc))
        raise  # unreachable: _fail exits


def _print_calibration(overrides: list[str], seconds: float) -> None:
    from hetsgd.engines.virtual.profiles import exchange_cost
    from hetsgd.runs.calibrate import calibrate, save

    cfg = _compose(overrides)
    try:
        rows = calibrate(cfg, seconds)
    except (UserError, RuntimeError) as exc:
        _fail(str(exc))
    table = Table("group", "device", "kind", "threads", "batch", "examples/s", "ms/step",
                  "comm ms/step",
                  title=f"{cfg.model.name} on {cfg.dataset.name}, devices={cfg.devices.name}")
    for row in rows:
        table.add_row(row["group"], row["device"], row["kind"], str(row["threads"]),
                      str(row["batch_size"]), f"{row['examples_per_s']:,.0f}",
                      f"{row['ms_per_step']:.3f}", f"{row['comm_ms_per_step']:.3f}")
    console.print(table)
    exchange = exchange_cost(rows[0])
    if exchange is not None:
        points = ", ".join(f"{1000 * cost:.3f} ms at a wait of {1000 * wait:.3f} ms"
                           for wait, cost in zip(exchange.waits_s, exchange.seconds))
        console.print(f"the mix's exchange of the model, a round beyond its slowest step: "
                      f"{points} (the earliest rank's)", soft_wrap=True)
    path = save(rows, cfg)
    console.print(f"saved: {path}\nreplay it on the virtual clock, on any machine: hetsgd run "
                  f"devices={cfg.devices.name} devices.simulated=true devices.calibration={path}",
                  soft_wrap=True)


_MACHINE_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.command(context_settings=_MACHINE_SETTINGS)
def machine(ctx: typer.Context,
            as_json: bool = typer.Option(False, "--json", help="Print JSON."),
            calibrate: bool = typer.Option(False, "--calibrate", help=(
                "Measure examples/s and ms/step of each group of the mix over batch sizes 1..1024 "
                "for the configured model and dataset, and the part of a step spent copying the "
                "model to or from the master (comm ms/step); extra arguments are run overrides, e.g. "
                "`hetsgd machine --calibrate model=mlp_paper dataset=w8a devices=auto`.")),
            seconds: float = typer.Option(0.5, help="Measuring time per batch size.")) -> None:
    """List this machine's CPU, cores and the CUDA GPUs torch can use; --calibrate measures them."""
    if ctx.info_name == "devices":
        err.print("hetsgd: `hetsgd devices` is now `hetsgd machine` (`devices` names the device "
                  "mix); the old name goes in the next release", soft_wrap=True)
    if calibrate:
        _print_calibration(ctx.args, seconds)
        return
    info = machine_facts()
    if as_json:
        console.print_json(json.dumps(info))
        return
    console.print(f"CPU: {info['cpu_model']} ({info['cores']} usable cores)")
    console.print(f"torch {info['torch']}, CUDA build: {info['torch_cuda'] or 'no'}")
    if not info["gpus"]:
        console.print("GPUs: none usable (devices=emulated stands in for a CPU+GPU mix)")
    for i, gpu in enumerate(info["gpus"]):
        console.print(f"GPU {i}: {gpu['name']}, {gpu['memory_mb']:.0f} MB, driver {gpu['driver']}")
    from hetsgd.engines.virtual.profiles import device_names

    console.print(f"simulated devices (devices.groups.<group>.profile=...): "
                  f"{', '.join(device_names())}", soft_wrap=True)


# the command's name before 0.2: still accepted, with a one-line notice, for one release
app.command("devices", hidden=True, context_settings=_MACHINE_SETTINGS)(machine)


class _LastingStream:
    """sys.stdout or sys.stderr, outlasting its reader. Once a write fails (a pipe whose reader
    left, as in `hetsgd run | head`; a terminal gone; a full disk), the descriptor is pointed at
    /dev/null (Python's "Note on SIGPIPE"), so that the run, rich, Hydra's and Python's logging,
    worker processes started later and the interpreter's last flush all write into nothing
    instead of raising in the middle of a run or a sweep; the exit code stays the outcome's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            _to_devnull(self._stream.fileno())
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            _to_devnull(self._stream.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _to_devnull(fd: int) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    if devnull != fd:
        os.dup2(devnull, fd)
        os.close(devnull)


def _lasting_output() -> None:
    """Wrap stdout and stderr in :class:`_LastingStream`. A descriptor closed from the start
    (`2>&-`) gets /dev/null first: otherwise the next file opened takes its number, and what the
    run and its workers print would land in that file."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = getattr(sys, name)
        try:
            os.fstat(fd)
        except OSError:
            _to_devnull(fd)
            stream = None
        setattr(sys, name, _LastingStream(stream or open(fd, "w", closefd=False)))


def main() -> None:
    """The console command: its runs' cost begins with this process (its interpreter and
    imports), which ``hetsgd.run`` from Python does not pay per run."""
    global command_started_at
    command_started_at = process_started_at()
    _lasting_output()
    guard_logging()  # warnings quote run folders' names
    try:
        app()
    except SystemExit as exc:
        _end(exc.code)
    _end(0)


def _end(code: int | str | None) -> NoReturn:
    """End the console command without the interpreter's teardown: with torch loaded, freeing
    its modules and libraries one by one takes about a second after the command's last line
    (0.7-0.9 s on the development VMs). What teardown does that matters runs first: the other
    threads finish, the exit handlers run (logging's flush, multiprocessing's cleanup), the
    standard streams are flushed."""
    if isinstance(code, str):  # SystemExit("message"): Python prints it and exits 1
        print(code, file=sys.stderr)
        code = 1
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream
            stream.flush()
    os._exit(code or 0)
