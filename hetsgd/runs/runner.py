"""One run, top to bottom: config -> device mix -> plan -> data -> engine + monitor -> evaluation
-> files.

Whatever happens, the run directory ends with a ``summary.json`` whose ``status`` says how the
run ended and, if it failed, why. While it trains, what it measures goes to disk as it is
measured (:class:`RunJournal`), so that a run whose process is killed can still be evaluated
(:mod:`hetsgd.runs.recover`).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from rich.progress import track

from hetsgd import algorithms
from hetsgd.bounded import exits_caught, own_interrupt, stops_marked
from hetsgd.config import ConfigError, RunConfig, to_run_config
from hetsgd.config.algorithms import CustomAlgoConfig
from hetsgd.config.plain import plain
from hetsgd.engines import device_ops
from hetsgd.engines.common.memory import SharedMaster
from hetsgd.engines.factory import build_engine
from hetsgd.engines.hooks import DistributedHooks, SharedMemoryHooks
from hetsgd.engines.processes import warm_up
from hetsgd.engines.ranks.handoff import hand_off
from hetsgd.engines.ranks.torchrun import check_distributed, torchrun
from hetsgd.engines.snapshots import Snapshot
from hetsgd.engines.training import Training
from hetsgd.engines.virtual.cost import CostProbe
from hetsgd.engines.virtual.mix import math_threads
from hetsgd.errors import UserError, out_of_memory
from hetsgd.liveness import this_process
from hetsgd.model.custom import check_token_ids
from hetsgd.model.step import resolved_step
from hetsgd.observe.contention import contention, simulator_share, workers_share
from hetsgd.observe.contention import warning as contention_warning
from hetsgd.observe.evaluate import Evaluator
from hetsgd.observe.host import HostLoad, HostWatch
from hetsgd.observe.monitor import UtilizationMonitor, summarize
from hetsgd.observe.progress import TrainingProgress, stderr_console
from hetsgd.outputs.index import CRASHED
from hetsgd.outputs.journal import RunJournal, remove_snapshots, workers_table
from hetsgd.outputs.metrics import (
    reaches,
    snapshot_spacing,
    target_losses,
    time_to_losses,
    timed_loss,
)
from hetsgd.outputs.run_directory import (
    SNAPSHOTS,
    RunDirectory,
    WriteError,
    environment,
)
from hetsgd.outputs.summary import (
    GroupMix,
    Launch,
    Losses,
    Mix,
    RunSummary,
    Simulation,
    Staleness,
    TargetLosses,
    Timing,
    by_group,
    learnt_between,
    shares,
)
from hetsgd.outputs.trackers.live import following
from hetsgd.runs.refused import refuse
from hetsgd.runs.resume import Resumption, resume
from hetsgd.runs.setup import Handoff, RunData, load_run_data
from hetsgd.workers import WorkerSpec, expand

log = logging.getLogger("hetsgd")
LEFT_THREAD_GRACE_S = 1.0  # how long threads the run's code left running get to end


def _convergence(snapshots: list[Snapshot], metrics: list, workers: list[dict[str, Any]],
                 num_examples: int) -> pd.DataFrame:
    groups = [w["group"] for w in workers]
    rows = []
    for snap, m in zip(snapshots, metrics):
        row = {"time_s": snap.time_s, "epoch": snap.examples / num_examples,
               "updates": sum(snap.updates)}
        row.update({f"updates_{group}": n for group, n in by_group(groups, snap.updates).items()})
        row.update(train_loss=m.train_loss, test_loss=m.test_loss, test_acc=m.test_acc)
        rows.append({**row, **snap.logged})  # the method's own, empty before its first
    return pd.DataFrame(rows)


def _worker_groups(specs: list[WorkerSpec]) -> Counter[tuple[str, str]]:
    """For the log: how many workers each group has, by (group, kind: ``cuda (simulated)``)."""
    return Counter((s.group, s.kind if s.label == s.kind else f"{s.kind} ({s.label})")
                   for s in specs)


def _mix(specs: list[WorkerSpec]) -> Mix:
    """The workers the run trained on, by group: what summary.json says about the mix used."""
    groups: dict[str, list[WorkerSpec]] = {}
    for spec in specs:
        groups.setdefault(spec.group, []).append(spec)
    return Mix({name: GroupMix(label=first.label, role="accel" if first.accel else "host",
                               count=len(group), threads=first.threads,
                               batch_size=first.batch_size, devices=[s.device for s in group])
                for name, group in groups.items() for first in group[:1]})


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
        method_log=training.snapshots[-1].logged or None,
        utilization=summarize(training.utilization,
                              cores_given=int(sum(w["threads"] for w in workers))))


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


@dataclass
class _Attempt:
    """How far a run got: what :func:`run` writes as its summary wherever the pipeline stops."""

    out: RunDirectory
    summary: RunSummary
    trained: tuple[float | None, float] | None = None  # training's start and end, wall clock
    handed_off: bool = False  # torchrun's other ranks have their plan (or the error)
    evaluated: bool = False  # convergence.csv holds the snapshots: they may go

    def note(self, **fields: Any) -> None:
        """What the run has learnt about itself, into the summary it will end with."""
        self.summary = replace(self.summary, **fields)


def _train(attempt: _Attempt, cfg: RunConfig | DictConfig, resolved_config: Any,
           resumption: Resumption | None) -> None:
    """The run's pipeline, top to bottom: config -> mix -> plan -> data -> engine + monitor ->
    evaluation. Each step's outcome goes into ``attempt`` as soon as it is known, so that the
    summary of a run stopped anywhere (an error, Ctrl-C, a full disk) says what it got to."""
    out, running = attempt.out, this_process()  # the process tells a live run from a crashed one
    out.write_config(resolved_config)
    out.write_summary(replace(attempt.summary, coordinator=running).to_dict())  # until run() ends
    if resumption is not None:  # once it is claimed: a second resume of it is refused
        resumption.start_in(out.path)
    if isinstance(cfg, DictConfig):
        cfg = to_run_config(cfg)
    specs = expand(cfg.devices)
    attempt.note(environment=environment(), emulated=any(spec.emulated for spec in specs),
                 simulated=cfg.devices.simulated,  # times are virtual (engines/virtual)
                 precision=device_ops.precision(  # a simulated worker computes on the CPU
                     cfg.devices.tf32 and not cfg.devices.simulated,
                     [torch.device(spec.device) for spec in specs]))
    algorithm, cfg = algorithms.choose(cfg)  # a custom algorithm's typed settings, its name
    attempt.note(algo=cfg.algo.name)
    plan = algorithm.plan(cfg, specs)
    if (planned := _as_planned(resolved_config, cfg, plan.cfg)) is not None:
        out.write_config(planned)  # the values it trains with, as a rerun or resume reads them
    cfg, specs = plan.cfg, plan.workers
    attempt.note(plan=plan.settled, mix=_mix(specs), launch=Launch.of(torchrun(), len(specs)))
    hooks = algorithm.hooks(plan)
    if torchrun() is not None:  # global rank 0: the other ranks take this plan
        check_distributed(cfg.algo.name, isinstance(hooks, DistributedHooks))
        hand_off(Handoff(plan=algorithms.handed_off(plan, algorithm)).to_plain())
        attempt.handed_off = True
    if not cfg.devices.simulated:  # its imports overlap the data's loading
        warm_up(cfg.workers.start)
    data = load_run_data(cfg, progress=cfg.progress, workers=specs)
    log.info("%s on %s, %d worker(s): %s", cfg.algo.name, data.summary_line(), len(specs),
             ", ".join(f"{group}: {count} x {kind}"
                       for (group, kind), count in _worker_groups(specs).items()))
    master = SharedMaster.initial(cfg.model, data.problem, cfg.seed)
    model = data.problem.build_model(cfg.model, cfg.seed)
    check_token_ids(model, [part.x.dense for part in (data.train, data.test)])
    attempt.note(
        dataset_source=data.source, synthetic=data.synthetic, scaling=data.scaling,
        features=data.features,
        classes=None if data.class_names is None else list(data.class_names),  # sorted, numbered
        # which step the workers take: fused only where it computes the model's own forward
        plan={**plan.settled, "step": resolved_step(model, cfg.optim.step)})
    out.write_summary(replace(attempt.summary, coordinator=running).to_dict())  # for recovery
    with (TrainingProgress(cfg, specs, data.train.num_examples) as progress,
          following(out.path, cfg.logger, [s.group for s in specs],
                    data.train.num_examples) as live,
          RunJournal(out, specs, on_snapshot=live) as journal):
        # a simulated run times its first steps, to say what the whole run will cost
        cost = (CostProbe(cfg.budget, data.train.num_examples, progress.update)
                if cfg.devices.simulated else None)
        engine = build_engine(plan, hooks, data.problem, data.train, master,
                              progress.update if cost is None else cost.tick, journal,
                              resumption.checkpoint if resumption is not None else None)
        with HostWatch() as host:
            training = engine.run(lambda pids: UtilizationMonitor(
                cfg.monitor.interval_s, pids, devices=[s.device for s in specs],
                on_sample=journal.utilization))
    if cost is not None:
        attempt.note(simulation=Simulation.from_dict(cost.measured(training.time_s)))
    attempt.trained = (journal.training_started_at, time.time())
    # warnings: e.g. a coordinator that was not scheduled for a while; staleness where several
    # workers update the master asynchronously (the shared-memory hooks)
    asynchronous_engine = isinstance(hooks, SharedMemoryHooks)
    asynchronous = asynchronous_engine and len(specs) > 1
    error, _, trace = (training.error or "").partition("\n")  # a worker's traceback follows
    if trace:
        _keep_traceback(out.path, trace)
    attempt.note(status=training.status, error=error or None,
                 warnings=training.warnings or None,
                 staleness=(Staleness.of([s.group for s in specs], training.counters)
                            if asynchronous else None))
    for warning in training.warnings:
        log.warning("%s", warning)
    workers = workers_table(specs, training.counters)
    out.write_table("workers", workers)
    _note_contention(attempt, cfg, specs, workers, host.load, asynchronous_engine)
    if training.batches:
        out.write_table("batches", training.batches)
    if not training.snapshots and training.status != "interrupted":
        raise RuntimeError(error or "training ended before the first snapshot")
    if training.snapshots:  # else it stopped before the clock started: nothing measured
        attempt.summary = replace(evaluate(out, cfg, data, training, workers, attempt.summary),
                                  extra=training.extra)  # the algorithm's own entries
        attempt.evaluated = True


def _as_planned(recorded: Any, before: RunConfig, planned: RunConfig) -> Any:
    """The recorded config with what the plan changed, None where it changed nothing to
    record: a built-in algorithm's settled values stay in summary.json's ``plan``; a custom
    algorithm's settings go in as the keys of ``algo`` they are given as."""
    changed = {f.name: plain(getattr(planned, f.name)) for f in fields(RunConfig)
               if f.name != "algo" and getattr(planned, f.name) != getattr(before, f.name)}
    custom = isinstance(recorded.algo, DictConfig) and OmegaConf.select(recorded, "algo._target_")
    if custom and planned.algo != before.algo:
        algo = planned.algo
        values = algo.settings if isinstance(algo, CustomAlgoConfig) else plain(algo)
        changed["algo"] = {key: value for key, value in values.items() if key != "name"}
    return OmegaConf.merge(recorded, changed) if changed else None


def _note_contention(attempt: _Attempt, cfg: RunConfig, specs: list[WorkerSpec],
                     workers: list[dict[str, Any]], load: HostLoad, copies_are_work: bool
                     ) -> None:
    """Whether the workers got the CPU they asked for (the simulator, in a simulated run), and
    how busy the host was: summary.json's ``contention``, and a warning when flagged (which
    the command prints last, below the run's table)."""
    if cfg.devices.simulated:
        share, by_group = simulator_share(load, math_threads(specs)), None
    else:
        share, by_group = workers_share(workers, copies_are_work)
    entry = contention(share, by_group, load, cfg.monitor.contention_threshold,
                       "simulator" if cfg.devices.simulated else "workers")
    warning = contention_warning(entry)
    attempt.note(contention=entry,
                 warnings=[*(attempt.summary.warnings or []), *([warning] if warning else [])]
                 or None)


def _keep_traceback(run_dir: Path, trace: str) -> None:
    """The summary says why a run failed; where it failed goes to error.log, if it can."""
    with suppress(OSError, MemoryError):
        (run_dir / "error.log").write_text(trace)


def run(cfg: RunConfig | DictConfig, run_dir: Path, resolved_config: Any,
        overrides: Sequence[str] = (), started_at: float | None = None) -> RunSummary:
    """Run one experiment into `run_dir` and return its summary (also on failure): the
    pipeline (:func:`_train`) inside what turns each way it can end into a status. A composed
    config (`hetsgd run`'s) is checked in the pipeline, so an out-of-range value ends like any
    failure.

    With ``resume=RUN_DIR`` the run continues that run's checkpoint (:mod:`.resume`) in
    `run_dir`, which may be RUN_DIR itself, with ``overrides`` (the command's) on top of the
    checkpoint's: a resume that cannot be is then a :class:`UserError` raised before anything
    is written over it. A full disk (a :class:`WriteError`) ends the run ``crashed``, as a
    killed run does, so that ``hetsgd recover`` takes what it left once there is room.
    ``started_at`` is when the run began on the wall clock, for ``timing`` (default: now; the
    command passes its process's start for its first run)."""
    started_at = time.time() if started_at is None else started_at  # for summary.json's timing
    if torchrun() is not None and (cfg.resume is not None or cfg.checkpoint.every_s is not None):
        error = ("checkpoints are not supported under torchrun (the other nodes' ranks can neither "
                 "send their parts nor read them): set checkpoint.every_s=null, without resume")
        # the other ranks wait for a plan: they fail with this
        hand_off(Handoff(error=error).to_plain())
        return refuse(run_dir, cfg, resolved_config, error)
    resumption = None
    if cfg.resume is not None:
        try:
            resumption = resume(Path(cfg.resume), overrides)
        except UserError as exc:
            if Path(cfg.resume).resolve() == run_dir.resolve():
                raise
            return refuse(run_dir, cfg, resolved_config, str(exc))
        cfg = resolved_config = resumption.cfg
    attempt = _Attempt(RunDirectory(run_dir), replace(
        RunSummary.starting(cfg),
        resumed_from=resumption.summary() if resumption is not None else None))
    threads = set(threading.enumerate())  # those the run leaves behind are the user's code's
    try:
        with stops_marked(), exits_caught():  # the user's code's os._exit is its SystemExit
            _train(attempt, cfg, resolved_config, resumption)
    except (SystemExit, KeyboardInterrupt) as exc:  # Ctrl-C during setup or evaluation: the
        if own_interrupt(exc):  # files written so far stay; else the code's own end
            attempt.note(status="failed", error=_ended_by_code(cfg, exc))
        else:
            attempt.note(status="interrupted", error="interrupted by the user")
    except (UserError, ConfigError) as exc:
        attempt.note(status="failed", error=str(exc))
    except WriteError as exc:  # what is on disk stays: snapshots, counters, utilization
        left = (f": once there is room, `hetsgd recover {run_dir}` evaluates the snapshots it "
                "left" if (run_dir / SNAPSHOTS).is_dir() else "")
        attempt.note(status=CRASHED, error=f"{exc}{left}")
    except Exception as exc:  # a failed run must still say why, in its directory
        attempt.note(status="failed", error=out_of_memory(exc) or f"{type(exc).__name__}: {exc}")
        _keep_traceback(run_dir, traceback.format_exc())
    finally:
        _left_running(attempt, cfg, threads)
        _end(attempt, cfg, started_at)
    return attempt.summary


def _user_code(cfg: RunConfig | DictConfig) -> str:
    """The targets of the user's code a run calls, for a line about what that code did."""
    targets = [f"{part}._target_={target}" for part in ("algo", "model")
               if isinstance(target := getattr(getattr(cfg, part), "_target_", None), str)]
    return ", ".join(targets) or "the run's code"


def _ended_by_code(cfg: RunConfig | DictConfig, exc: BaseException) -> str:
    """Why a run that its own code ended (``sys.exit``, a ``KeyboardInterrupt`` no Ctrl-C
    raised) failed, where no bound around the call named it."""
    said = f": {exc}" if str(exc) else ""
    return f"{_user_code(cfg)}: raised {type(exc).__name__}{said} during the run"


def _left_running(attempt: _Attempt, cfg: RunConfig | DictConfig,
                  before: set[threading.Thread]) -> None:
    """A thread the run's code started and left running that is not a daemon would keep the
    process alive after the run: the run fails naming it (the thread cannot be stopped)."""
    left = [t for t in threading.enumerate() if t not in before and t.is_alive() and not t.daemon]
    for thread in left:
        thread.join(LEFT_THREAD_GRACE_S / len(left))
    names = [repr(t.name) for t in left if t.is_alive()]
    if names and attempt.summary.status in ("completed", "diverged"):
        attempt.note(status="failed", error=(
            f"{_user_code(cfg)}: left {len(names)} non-daemon thread(s) running after the run "
            f"({', '.join(names)}), which would keep the process alive: end them with the run, "
            "or make them daemons"))


def _end(attempt: _Attempt, cfg: RunConfig | DictConfig, started_at: float) -> None:
    """The summary written last, however the run ended; the snapshots removed once evaluated
    and written down; torchrun's other ranks told, if the plan never reached them."""
    if attempt.trained is not None and attempt.trained[0] is not None:
        attempt.note(timing=Timing(attempt.trained[0] - started_at, time.time() - attempt.trained[1]))
    try:
        attempt.out.write_summary(attempt.summary.to_dict())
    except WriteError as exc:  # summary.json still names this process: it reads as crashed
        if attempt.summary.status != CRASHED:  # else a full disk: the first file it refused says
            log.error("%s", exc)
            attempt.note(status=CRASHED, error=str(exc))
        attempt.evaluated = False  # its snapshots stay, for recovery
    if attempt.evaluated and not cfg.eval.keep_snapshots:
        remove_snapshots(attempt.out.path)
    if torchrun() is not None and not attempt.handed_off:  # the other ranks would wait for a plan
        hand_off(Handoff(error=attempt.summary.error).to_plain())
