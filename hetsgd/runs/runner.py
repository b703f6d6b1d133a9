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
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from hetsgd import algorithms
from hetsgd.algorithms.base import Plan
from hetsgd.bounded import Hung, exits_caught, own_interrupt, stop_cause, stops_marked
from hetsgd.config import ConfigError, RunConfig, to_run_config
from hetsgd.config.algorithms import CustomAlgoConfig
from hetsgd.config.plain import plain
from hetsgd.engines import device_ops, graphs
from hetsgd.engines.common.memory import SharedMaster
from hetsgd.engines.factory import build_engine
from hetsgd.engines.hooks import Hooks, LinkHooks, RankLoopHooks, step_choice
from hetsgd.engines.processes import warm_up
from hetsgd.engines.ranks.handoff import hand_off
from hetsgd.engines.ranks.torchrun import check_distributed, torchrun
from hetsgd.engines.training import Training
from hetsgd.engines.virtual.cost import CostProbe
from hetsgd.errors import UserError, out_of_memory
from hetsgd.liveness import this_process
from hetsgd.model.custom import check_token_ids
from hetsgd.model.step import resolved_step
from hetsgd.observe.contention import contention, simulator_share, workers_share
from hetsgd.observe.contention import warning as contention_warning
from hetsgd.observe.host import HostLoad, HostWatch
from hetsgd.observe.monitor import UtilizationMonitor
from hetsgd.observe.progress import TrainingProgress
from hetsgd.outputs.index import CRASHED
from hetsgd.outputs.journal import RunJournal, remove_snapshots, workers_table
from hetsgd.outputs.run_directory import (
    SNAPSHOTS,
    RunDirectory,
    WriteError,
    environment,
)
from hetsgd.outputs.summary import (
    GroupMix,
    Launch,
    Mix,
    RunSummary,
    Simulation,
    Staleness,
    Timing,
)
from hetsgd.outputs.trackers.live import following
from hetsgd.runs.evaluation import evaluate
from hetsgd.runs.refused import refuse
from hetsgd.runs.resume import Resumption, resume
from hetsgd.runs.setup import Handoff, RunData, load_run_data
from hetsgd.workers import WorkerSpec, expand

log = logging.getLogger("hetsgd")
LEFT_THREAD_GRACE_S = 1.0  # how long threads the run's code left running get to end


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
    plan, hooks = _planned(attempt, cfg, resolved_config)
    data, master = _loaded(attempt, plan, hooks)
    out.write_summary(replace(attempt.summary, coordinator=running).to_dict())  # for recovery
    training, host = _trained(attempt, plan, hooks, data, master, resumption)
    _recorded(attempt, plan, hooks, data, training, host)


def _planned(attempt: _Attempt, cfg: RunConfig, resolved_config: Any) -> tuple[Plan, Hooks]:
    """The mix, the algorithm's plan for it and its hooks; torchrun's other ranks get the plan."""
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
        attempt.out.write_config(planned)  # the values it trains with, as a rerun or resume reads
    cfg, specs = plan.cfg, plan.workers
    attempt.note(plan=plan.settled, mix=_mix(specs), launch=Launch.of(torchrun(), len(specs)))
    hooks = algorithm.hooks(plan)
    attempt.note(cuda_graphs=graphs.label(
        cfg.devices.cuda_graphs, cfg.devices.simulated, isinstance(hooks, RankLoopHooks),
        [torch.device(spec.device) for spec in specs if spec.accel]))
    if torchrun() is not None:  # global rank 0: the other ranks take this plan
        check_distributed(cfg.algo.name, isinstance(hooks, RankLoopHooks))
        hand_off(Handoff(plan=algorithms.handed_off(plan, algorithm)).to_plain())
        attempt.handed_off = True
    return plan, hooks


def _loaded(attempt: _Attempt, plan: Plan, hooks: Hooks) -> tuple[RunData, SharedMaster]:
    """The run's data and its initial master model, with what the summary says of them."""
    cfg, specs = plan.cfg, plan.workers
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
        plan={**plan.settled, "step": resolved_step(model, step_choice(cfg, hooks), cfg.optim)})
    return data, master


def _trained(attempt: _Attempt, plan: Plan, hooks: Hooks, data: RunData, master: SharedMaster,
             resumption: Resumption | None) -> tuple[Training, HostLoad]:
    """The engine's training, journaled as it goes, and the host's load meanwhile."""
    cfg, specs = plan.cfg, plan.workers
    with (TrainingProgress(cfg, specs, data.train.num_examples) as progress,
          following(attempt.out.path, cfg.logger, [s.group for s in specs],
                    data.train.num_examples) as live,
          RunJournal(attempt.out, specs, on_snapshot=live) as journal):
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
    return training, host.load


def _recorded(attempt: _Attempt, plan: Plan, hooks: Hooks, data: RunData, training: Training,
              host: HostLoad) -> None:
    """What training measured, into the run directory and the summary, then evaluated."""
    out, cfg, specs = attempt.out, plan.cfg, plan.workers
    # warnings: e.g. a coordinator that was not scheduled for a while; staleness where several
    # workers update the master asynchronously (link hooks)
    asynchronous = isinstance(hooks, LinkHooks) and len(specs) > 1
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
    _note_contention(attempt, cfg, workers, host)
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


def _note_contention(attempt: _Attempt, cfg: RunConfig, workers: list[dict[str, Any]],
                     load: HostLoad) -> None:
    """Whether the workers got the CPU they wanted (the simulator, in a simulated run), and
    how busy the host was: summary.json's ``contention``, and a warning when flagged (which
    the command prints last, below the run's table)."""
    if cfg.devices.simulated:
        share, by_group = simulator_share(load), None
    else:
        share, by_group = workers_share(workers)
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
        overrides: Sequence[str] = (), started_at: float | None = None,
        trained_with: Callable[[RunConfig | DictConfig], None] | None = None) -> RunSummary:
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
    command passes its process's start for its first run). ``trained_with`` is told the config
    the run trained with: a resume's is the checkpoint's, with ``overrides`` on top."""
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
    if trained_with is not None:
        trained_with(cfg)
    try:
        return _attempted(cfg, run_dir, resolved_config, resumption, started_at)
    finally:
        if resumption is not None:  # another process may resume the run now
            resumption.release()


def _attempted(cfg: RunConfig | DictConfig, run_dir: Path, resolved_config: Any,
               resumption: Resumption | None, started_at: float) -> RunSummary:
    """:func:`run`'s pipeline, each way it can end turned into the run's status."""
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
            attempt.note(status="interrupted", error=_interrupted(attempt, stop_cause(exc)))
    except Hung as exc:  # the engine named the call that hung; whose code it is, the run knows
        targets = _targets(cfg)
        attempt.note(status="failed", error=f"{', '.join(targets)}: {exc}" if targets else str(exc))
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


def _interrupted(attempt: _Attempt, cause: str) -> str:
    """Why a run a stop signal ended outside its engine's own stop is ``interrupted``. Snapshots
    it took stay on disk, unevaluated (a second Ctrl-C during the final evaluation, the first
    having stopped training; a simulation left behind): ``hetsgd recover`` evaluates them. The
    stop that ended training names it, as it names the exit code: a later one only cut its
    evaluation short."""
    if attempt.summary.status == "interrupted" and attempt.summary.error is not None:
        cause = attempt.summary.error
    run_dir = attempt.out.path
    if not any((run_dir / SNAPSHOTS).glob("*.pt")):
        return cause
    when = "during the final evaluation" if attempt.trained is not None else "while it trained"
    return (f"{cause} {when}; its snapshots are kept: `hetsgd recover {run_dir}` "
            "evaluates them")


def _targets(cfg: RunConfig | DictConfig) -> list[str]:
    """The targets of the user's code a run calls, for a line about what that code did."""
    return [f"{part}._target_={target}" for part in ("algo", "model")
            if isinstance(target := getattr(getattr(cfg, part), "_target_", None), str)]


def _user_code(cfg: RunConfig | DictConfig) -> str:
    return ", ".join(_targets(cfg)) or "the run's code"


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
