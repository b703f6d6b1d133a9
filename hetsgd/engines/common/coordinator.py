"""The coordinator: start worker processes around one master model, watch them, snapshot it.

Every algorithm runs through it; they differ in the worker entry point (``target``): the
asynchronous family's workers update the master directly, while replicas that train on their own
(a GPU, distributed ranks) publish into it when a snapshot is due. The coordinator process never
initializes CUDA. It starts the workers (forked from a clean forkserver or spawned,
:mod:`hetsgd.engines.processes`; either way each sets its thread count and makes its own CUDA
context), waits until every worker has built its model and
staged its data, then starts the clock and the workers together. While they train it copies the
master every ``eval.every_s`` seconds, hands each copy to its :class:`Journal` (the run directory,
so that a killed coordinator loses at most one snapshot interval), ends training at the time
budget, and notices a worker that failed, died or hung (:class:`Watch`); whatever happens, every
worker it started is gone when it returns. Evaluation of the snapshots happens after
training (see ``evaluate``). With checkpoints on, it asks the workers for their state every
``checkpoint.every_s`` seconds and assembles the parts they send back, and those they send at
the end, into checkpoints for its journal; a resumed run starts from one, its clock and
snapshots continuing the checkpoint's.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import resource_tracker

from hetsgd.bounded import stop_cause
from hetsgd.config import RunConfig
from hetsgd.engines.base import TICK_S, EngineBase
from hetsgd.engines.checkpoint import Checkpoint, WorkerState
from hetsgd.engines.common.links import UNANSWERED_STEPS
from hetsgd.engines.common.memory import SharedData, SharedMaster
from hetsgd.engines.common.watch import Tick, Watch, cpu_s, ended
from hetsgd.engines.processes import (
    LOST_TO_FORKSERVER,
    context,
    forkserver_exit,
    settle,
    start_deadline,
)
from hetsgd.engines.snapshots import Snapshots
from hetsgd.engines.training import (
    Controller,
    Journal,
    Monitor,
    MonitorFactory,
    OnTick,
    Training,
)
from hetsgd.model.problem import Problem
from hetsgd.workers import WorkerSpec

STARTUP_TIMEOUT_S = 600.0
PUBLISH_TIMEOUT_S = 60.0
PUBLISH_POLL_S = 0.0005  # how often a publish request is checked for its answer
EXIT_TIMEOUT_S = 30.0  # how long a worker has to report and exit once training ended
# A rank that ended, or whose peer did, may still wait in a collective for dist.timeout_s (its
# own limit); it gets this long beyond that to notice and report.
FAILURE_GRACE_S = 5.0
# A worker's first step may take this many times its stall window (a first CUDA step compiles
# and tunes its kernels; a first collective waits for the slowest rank's).
FIRST_STEP_FACTOR = 4.0
KILL_TIMEOUT_S = 5.0  # how long a SIGKILLed worker's exit is waited for
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
LEFT_TO_COORDINATOR = {signal.SIGINT, signal.SIGHUP}  # what a worker ignores (see guarded)


def guarded(target: Callable, environment: dict[str, str], *args) -> None:
    """A worker process's entry: it leaves Ctrl-C and a terminal's hangup (SIGHUP, which reaches
    the whole foreground process group) to its coordinator (which stops it through ``stop`` and
    keeps what was measured) and, on Linux, dies with the coordinator however that dies (the
    parent-death signal), so no worker outlives its run. The worker was started with those
    signals blocked (see :meth:`Coordinator._start`); one that came while it was importing is
    pending, and ignoring them before unblocking discards that one too. Then it settles in: the
    coordinator's ``environment``, and a fork of the forkserver lets go of the forkserver, whose
    end then follows the coordinator's (:func:`hetsgd.engines.processes.settle`)."""
    for signum in LEFT_TO_COORDINATOR:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, LEFT_TO_COORDINATOR)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # its parent (coordinator or forkserver) died before the line above
            os._exit(1)
    settle(environment)
    target(*args)


@dataclass
class _Pass:
    """What the coordinator tracks while its workers train, from their start to their end."""

    procs: list
    snapshots: Snapshots
    watch: Watch
    finished: dict[int, tuple[str, str]] = field(default_factory=dict)  # how each reported its end
    hung: dict[int, str] = field(default_factory=dict)  # the coordinator's verdict on one it ends
    t0: float | None = None  # the clock's origin, once every worker is ready
    stopped: float | None = None  # when the coordinator first saw training end
    died_first: bool = False  # a worker died before the coordinator found any hung
    last_request: float = 0.0  # when it last asked the workers for their state


class Coordinator(EngineBase):
    """The process engine: one process per worker (forked from the forkserver, or spawned:
    ``workers.start``), running ``target``."""

    def __init__(self, cfg: RunConfig, specs: list[WorkerSpec], problem: Problem,
                 data: SharedData, master: SharedMaster,
                 on_tick: OnTick | None, target: Callable, controller: Controller | None = None,
                 resume: Checkpoint | None = None, journal: Journal | None = None) -> None:
        self.ctx = context(cfg.workers.start)
        super().__init__(cfg, specs, problem, data, master, on_tick, controller, journal,
                         self.ctx)
        self.target, self.resume = target, resume
        self.reports = self.ctx.Queue()
        # Accelerator workers keep replicas of their own: the master holds their latest steps
        # only once they answered a publish request (see Signals).
        self.publishers = [spec.rank for spec in specs if spec.accel]
        self.stall_s = cfg.workers.stall_s  # a worker making no progress this long is hung
        self.exit_s = EXIT_TIMEOUT_S  # how long workers have to report once training ended
        self.died = False  # whether a worker ended without its report

    noun = "worker"  # what the messages call one of its processes
    # how a report begins that says its worker was only released by another's end
    released: tuple[str, ...] = ()

    def _name(self, rank: int) -> str:
        return f"{self.noun} {rank} ({next(s.group for s in self.specs if s.rank == rank)})"

    def _progress(self) -> dict[int, float]:
        """Each worker's progress as the coordinator can see it: updates counted, beats."""
        updates, beats = self.state.counters.column("updates"), self.state.signals.beats
        return {s.rank: float(updates[s.rank]) + float(beats[s.rank]) for s in self.specs}

    # -- snapshots ---------------------------------------------------------------------------

    def _publish(self, running: Callable[[], list[int]]) -> dict[int, str]:
        """Ask the publishers to bring the master up to date, and wait for the running ones.
        Returns those whose link broke its contract (it stepped on without answering), and
        those that made no progress for the whole wait: stopped or hung, which the stall watch
        cannot see (a wait the coordinator spends aside restarts every worker's window)."""
        signals = self.state.signals
        signals.publish_request += 1
        updates = self.state.counters.column("updates")
        asked_at = {rank: float(updates[rank]) for rank in running()}
        progress, wait_s = self._progress(), min(PUBLISH_TIMEOUT_S, self.stall_s)
        deadline = time.perf_counter() + wait_s
        while not signals.answered(running()) and time.perf_counter() < deadline:
            stepped = {r: float(updates[r]) - asked_at.get(r, 0.0) for r in running()}
            broken = {r: (f"{self._name(r)} took {s:g} steps after a publish request without "
                          "answering it: its link's after_step() must answer one "
                          "(state.signals.answer(rank); see hetsgd.algorithms.api.Link)")
                      for r, s in stepped.items() if s >= UNANSWERED_STEPS and signals.asked(r)}
            if broken:
                return broken
            time.sleep(PUBLISH_POLL_S)
        now = self._progress()  # a first step may take longer: the watch's own window
        return {r: (f"{self._name(r)} made no progress for {wait_s:g} s and did not answer a "
                    "publish request (stopped, or hung in a device call or a lock): killed")
                for r in running()
                if signals.asked(r) and now[r] == progress[r] and float(updates[r]) > 0}

    def _answering(self, live: _Pass) -> list[int]:
        """The publishers a publish request waits for: those still running. One killed (the
        OOM killer, a driver's crash) never answers, and its death is collected only after the
        wait: it held the snapshot, and the whole run, for the stall window."""
        return [spec.rank for spec, process in zip(self.specs, live.procs)
                if spec.rank in self.publishers and spec.rank not in live.finished
                and process.exitcode is None]

    # -- checkpoints -------------------------------------------------------------------------

    def _start(self, procs: list) -> dict[int, str]:
        """Start the workers with SIGINT and SIGHUP blocked, which they inherit through fork and
        exec: a Ctrl-C or hangup while they import stays pending until :func:`guarded` ignores
        it, instead of ending each in a traceback. The coordinator gets its own once it
        unblocks. A forkserver that does not start them in time is killed
        (:func:`~hetsgd.engines.processes.start_deadline`); returns the worker it did not
        start, with why."""
        # Started inside the block, the resource tracker would unblock SIGINT after its own start.
        resource_tracker.ensure_running()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, LEFT_TO_COORDINATOR)
        try:
            with start_deadline(self.cfg.workers.start,
                                self.cfg.workers.start_timeout_s) as killed:
                for spec, p in zip(self.specs, procs):
                    try:
                        p.start()
                    except (OSError, EOFError):  # the forkserver's socket, closed by its end
                        if not killed:
                            raise
                        return {spec.rank: killed[0]}
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return {}

    # -- the run -----------------------------------------------------------------------------

    def run(self, monitor_factory: MonitorFactory) -> Training:
        """Start the workers, tick until training ends, then end every worker started, whatever
        happened; the run's status from the first failure."""
        training = Training(resumed_s=self.resume.time_s if self.resume is not None else 0.0)
        if self.resume is not None:  # before the workers start: they take their parts along
            self.state.restore(self.resume)
        procs = [self.ctx.Process(target=guarded, daemon=True, name=f"hetsgd-worker-{s.rank}",
                                  args=(self.target, dict(os.environ), s, self.cfg,
                                        self.problem, self.state, self.reports))
                 for s in self.specs]
        monitor = monitor_factory(lambda: [p.pid for p in procs if p.pid is not None])
        live = _Pass(procs, self._new_snapshots(), Watch(
            [s.rank for s in self.specs], self.stall_s, FIRST_STEP_FACTOR * self.stall_s))
        try:
            self._begin(live, monitor)
            self._train(live)
            self._end_clock(live, training)
        except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM turned into one: keep what was
            training.status, training.error = "interrupted", stop_cause(stop)  # measured
            self.state.signals.stop.set()
            self._end_clock(live, training)
        finally:
            self.state.signals.stop.set()
            self.state.signals.go.set()
            # its last sample while the workers are there: ended, they would read as idle
            training.utilization = monitor.stop()
            killed = self._wind_down(procs, live.finished, live.hung,
                                     (live.stopped or time.perf_counter()) + self.exit_s)
            if self.state.checkpointing and live.t0 is not None:
                self._write_checkpoints(live.t0, live.snapshots)
        self._judge(training, live, killed)
        training.warnings = live.watch.warnings(training.time_s, self.cfg.budget.seconds)
        return self._finish(training)

    def _begin(self, live: _Pass, monitor: Monitor) -> None:
        """Start the workers and, once every one is ready, the clock (continuing a resumed
        run's) with the first snapshot; none trains if one could not start."""
        live.hung.update(self._start(live.procs) or self._await_ready(live.procs, live.finished))
        if live.hung:  # nobody trains: those still setting up are ended at once by run()
            live.stopped = time.perf_counter() - self.exit_s
        resumed_s = self.resume.time_s if self.resume is not None else 0.0
        # an origin before the monitor starts too: a sample it takes before the clock's start
        # is set is dated in this run's time (a resumed run's), not from 0
        monitor.set_time_origin(time.perf_counter() - resumed_s)
        monitor.start()
        live.t0 = t0 = time.perf_counter() - resumed_s
        monitor.set_time_origin(t0)
        if self.resume is not None:
            self._resume_snapshots(self.resume, live.snapshots)
        self._take_snapshot(time.perf_counter() - t0, live.snapshots)
        live.last_request = time.perf_counter()
        self.state.signals.go.set()
        live.watch.start(time.perf_counter(), self._progress())

    def _train(self, live: _Pass) -> None:
        """Tick until every worker has ended, one hung, or those still training had their time to
        exit after the stop (the budget, or a hung one); snapshots, checkpoint requests and the
        engine's duties on each tick."""
        assert live.t0 is not None
        t0, signals = live.t0, self.state.signals
        examples = self.state.counters.column("examples")
        every_s = self.cfg.checkpoint.every_s
        while not live.hung and len(live.finished) < len(live.procs):
            tick = Tick()
            self._collect(live.procs, live.finished, timeout=TICK_S)
            now = time.perf_counter()
            # a stall after a worker's death is its consequence (a cursor lock it held)
            live.died_first = self.died
            for rank in live.watch.hung(now, self._progress(), set(live.finished)):
                live.hung[rank] = (f"{self._name(rank)} made no progress for "
                                   f"{live.watch.window(rank):g} s (stopped, or hung in a device "
                                   "call, a lock or a collective): killed")
            budget = self.cfg.budget.seconds
            if live.hung or (budget is not None and now - t0 >= budget):
                signals.stop.set()
            if live.stopped is None and signals.stop.is_set():
                live.stopped = now
            if live.stopped is not None and now - live.stopped > self.exit_s:
                live.watch.ticked(*tick.watched(t0))
                break  # those still training are ended by run()
            epoch = float(examples.sum()) / self.state.data.num_examples
            if live.snapshots.due(now - t0, epoch) and len(live.finished) < len(live.procs):
                with tick.aside:
                    if self.publishers:
                        live.hung.update(self._publish(lambda: self._answering(live)))
                    self._take_snapshot(time.perf_counter() - t0, live.snapshots)
            if every_s is not None and now - live.last_request >= every_s:
                signals.request_checkpoint()
                live.last_request = now
            with tick.aside:
                self._write_checkpoints(t0, live.snapshots)
                self._duties(now - t0)
            live.watch.ticked(*tick.watched(t0))

    def _end_clock(self, live: _Pass, training: Training) -> None:
        """The training time and the last snapshot, where the clock had started."""
        if live.t0 is not None:
            training.time_s = time.perf_counter() - live.t0
            self._take_snapshot(time.perf_counter() - live.t0, live.snapshots)
            training.snapshots = live.snapshots.items

    def _judge(self, training: Training, live: _Pass, killed: dict[int, str]) -> None:
        """The run's status from the first failure: the coordinator's verdict on hung workers
        first (the others' failures are their release from a wait on them), unless a worker
        died before any hung: then the workers' own reports and deaths first; last, those that
        never ended."""
        verdict = [("failed", "; ".join(live.hung.values()))] if live.hung else []
        # a rank whose collective broke was released by another's end: that end first (a
        # death, which _collect records after the reports queued meanwhile, or a rank's error)
        reports = sorted(live.finished.values(),
                         key=lambda report: report[1].startswith(self.released))
        failures = [*reports, *verdict] if live.died_first else [*verdict, *reports]
        failures += [("failed", m) for m in killed.values()]
        for status, message in failures:
            if status != "done" and training.status == "completed":
                training.status, training.error = status, message

    def _wind_down(self, procs: list, finished: dict[int, tuple[str, str]],
                   hung: dict[int, str], deadline: float) -> dict[int, str]:
        """End every worker started, within a bounded time: the hung at once, the others once
        they have exited or at ``deadline``, their reports read meanwhile (a worker cannot
        exit before its queued reports, such as its final checkpoint part, are read). Ends are
        SIGKILLs (a stopped process never handles SIGTERM) and every join is bounded, so that
        multiprocessing's exit handler, which joins children without a timeout, finds none left.
        Returns those that had to be killed without having reported, with why."""
        started = [(s.rank, p) for s, p in zip(self.specs, procs) if p.pid is not None]
        for rank, p in started:
            if rank in hung:
                p.kill()
        while (any(p.is_alive() for rank, p in started if rank not in hung)
               and time.perf_counter() < deadline):
            self._collect(procs, finished, timeout=TICK_S)
        self._collect(procs, finished, timeout=0.0)  # what those that exited sent last
        killed = {}
        for rank, p in started:
            if p.is_alive():
                p.kill()
                if rank not in finished and rank not in hung:
                    killed[rank] = (f"{self._name(rank)} did not end within {self.exit_s:g} s "
                                    "of the end of training: killed")
        for _, p in started:
            p.join(timeout=KILL_TIMEOUT_S)
        return killed

    def _await_ready(self, procs: list, finished: dict[int, tuple[str, str]]) -> dict[int, str]:
        """Wait until every worker has set up or ended. A worker setting up is alive while it
        gets CPU time (importing, building) or beats (:func:`~hetsgd.engines.reports.beating`, through long
        waits); one that does neither for its stall window is hung, as is one not set up within
        ``STARTUP_TIMEOUT_S``, or within ``exit_s`` of another's failure. Returns those hung,
        with why; training then stops before it starts."""

        def alive() -> dict[int, float]:
            progress = self._progress()
            return {s.rank: progress[s.rank] + cpu_s(p.pid) for s, p in zip(self.specs, procs)}

        ready: set[int] = set()
        now = time.perf_counter()
        deadline, failed_at = now + STARTUP_TIMEOUT_S, None
        watch = Watch([s.rank for s in self.specs], self.stall_s, self.stall_s)
        watch.start(now, alive())
        while len(ready) + len(finished) < len(procs):
            ready |= self._collect(procs, finished, timeout=0.1)
            now = time.perf_counter()
            failed_at = failed_at or (now if finished else None)
            hung = {rank: f"made no progress for {watch.window(rank):g} s while setting up"
                    for rank in watch.hung(now, alive(), ready | set(finished))}
            late = [s.rank for s in self.specs if s.rank not in ready and s.rank not in finished]
            if now > deadline:
                hung = dict.fromkeys(late, f"did not set up within {STARTUP_TIMEOUT_S:.0f} s")
            elif failed_at is not None and now - failed_at > self.exit_s:
                hung = dict.fromkeys(late, f"did not set up within {self.exit_s:g} s of "
                                           "another's failure")
            if hung:
                self.state.signals.stop.set()
                return {rank: f"{self._name(rank)} {why}: killed" for rank, why in hung.items()}
        if finished:  # a worker failed during setup: nobody trains
            self.state.signals.stop.set()
        return {}

    def _died(self, rank: int, exitcode: int) -> str:
        """Why a worker ended without its report: its own end, or its forkserver's, whose end
        takes its forks along (their parent-death signal) and hides their exit codes (255)."""
        server = None
        if self.cfg.workers.start == "forkserver":
            server = forkserver_exit(KILL_TIMEOUT_S if exitcode == LOST_TO_FORKSERVER else 0.0)
        if server is not None:
            pid, code = server
            return (f"the forkserver (pid {pid}) that started the workers {ended(code)}, "
                    f"ending {self._name(rank)}")
        return f"{self._name(rank)} {ended(exitcode)}"

    def _collect(self, procs: list, finished: dict[int, tuple[str, str]],
                 timeout: float) -> set[int]:
        """Read worker reports; a worker that ended without one, whatever its exit code, counts
        as failed (a worker's reports reach the queue's pipe before its process ends: those of
        one that exited are read once more first)."""
        ready = self._read(finished, timeout)
        for spec, p in zip(self.specs, procs):
            if spec.rank in finished or p.exitcode is None:
                continue
            ready |= self._read(finished, 0.0)
            if spec.rank not in finished:
                finished[spec.rank] = ("failed", self._died(spec.rank, p.exitcode))
                self.died = True
                self.state.signals.stop.set()
        return ready

    def _read(self, finished: dict[int, tuple[str, str]], timeout: float) -> set[int]:
        """The reports queued, the first waited for up to ``timeout``; returns who set up."""
        ready: set[int] = set()
        try:
            while True:
                topic, rank, message = self.reports.get(timeout=timeout)
                timeout = 0.0
                if topic == "ready":
                    ready.add(rank)
                elif topic == "checkpoint":
                    self._receive_part(rank, WorkerState.from_bytes(message))
                else:
                    finished[rank] = (topic, message)
                    if topic != "done":
                        self.state.signals.stop.set()
        except queue.Empty:
            pass
        return ready
