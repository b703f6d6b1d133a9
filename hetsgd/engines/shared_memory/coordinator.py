"""The coordinator: spawn worker processes around one master model, watch them, snapshot it.

Every algorithm runs through it; they differ in the worker entry point (``target``): the
asynchronous family's workers update the master directly, while replicas that train on their own
(a GPU, distributed ranks) publish into it when a snapshot is due. The coordinator process never
initializes CUDA. It starts the workers (spawned, so each sets its
thread count and makes its own CUDA context), waits until every worker has built its model and
staged its data, then starts the clock and the workers together. While they train it copies the
master every ``eval.every_s`` seconds, hands each copy to its :class:`Journal` (the run directory,
so that a killed coordinator loses at most one snapshot interval), ends training at the time
budget, and notices a worker that failed or died. Evaluation of the snapshots happens after
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
from typing import Protocol

import torch.multiprocessing as mp

from hetsgd.config import RunConfig
from hetsgd.devices import WorkerSpec
from hetsgd.engines.checkpoint import Checkpoint, WorkerState
from hetsgd.engines.shared_memory.counters import COUNTERS, WorkerCounters
from hetsgd.engines.shared_memory.memory import SharedData, SharedMaster
from hetsgd.engines.shared_memory.snapshots import Snapshot, Snapshots
from hetsgd.engines.shared_memory.state import SharedState
from hetsgd.engines.shared_memory.worker import worker_process
from hetsgd.model.problem import Problem

OnTick = Callable[[float, WorkerCounters], None]  # (training seconds, counters), every tick

STARTUP_TIMEOUT_S = 600.0
PUBLISH_TIMEOUT_S = 60.0
PUBLISH_POLL_S = 0.0005  # how often a publish request is checked for its answer
TICK_S = 0.01  # how often the coordinator looks at the workers
EXIT_TIMEOUT_S = 30.0  # how long a worker has to exit once training ended
# After a worker failed, the others get dist.timeout_s (their collectives' own limit) plus this
# long to notice and report before the coordinator ends them.
FAILURE_GRACE_S = 10.0
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


@dataclass
class Training:
    """What a training phase leaves behind for evaluation and the results files."""

    status: str = "completed"  # completed | failed | interrupted | diverged | crashed
    error: str | None = None
    time_s: float = 0.0
    snapshots: list[Snapshot] = field(default_factory=list)
    counters: list[dict[str, float]] = field(default_factory=list)
    utilization: list[dict[str, float]] = field(default_factory=list)
    batches: list[dict[str, float]] = field(default_factory=list)  # batch-size changes, if any
    extra: dict = field(default_factory=dict)  # algorithm-specific summary entries


class Controller(Protocol):
    """Steers workers while they train (Adaptive Hogbatch's batch sizes), from the coordinator."""

    log: list[dict[str, float]]

    def tick(self, elapsed: float, counters: WorkerCounters) -> None: ...

    def summary(self) -> dict: ...


class Journal(Protocol):
    """Keeps what the coordinator measures on disk as it is measured (the runner's
    ``RunJournal``), so that a run whose coordinator is killed can still be evaluated."""

    def snapshot(self, snapshot: Snapshot, counters: list[dict[str, float]]) -> None:
        """A snapshot just taken, with every worker's counters at that moment."""

    def drop(self, snapshot: Snapshot) -> None:
        """A snapshot that :class:`Snapshots` thinned out."""

    def checkpoint(self, checkpoint: Checkpoint) -> None:
        """A checkpoint just assembled, to replace the previous one."""


def guarded(target: Callable, *args) -> None:
    """A worker process's entry: it leaves Ctrl-C to its coordinator (which stops it through
    ``stop`` and keeps what was measured) and, on Linux, dies with the coordinator however that
    dies (the parent-death signal), so no worker outlives its run. The worker was started with
    SIGINT blocked (see :meth:`Coordinator._start`); a Ctrl-C that came while it was importing
    is pending, and ignoring SIGINT before unblocking it discards that one too."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the coordinator died before the line above
            os._exit(1)
    target(*args)


class Coordinator:
    def __init__(self, cfg: RunConfig, specs: list[WorkerSpec], problem: Problem,
                 data: SharedData, master: SharedMaster,
                 on_tick: OnTick | None = None,
                 target: Callable = worker_process, controller: Controller | None = None,
                 resume: Checkpoint | None = None) -> None:
        self.cfg, self.specs, self.problem, self.target = cfg, specs, problem, target
        self.controller = controller
        ctx = mp.get_context("spawn")
        self.ctx = ctx
        self.state = SharedState.create(data, master, cfg.budget.epochs, len(specs), ctx)
        self.state.checkpointing = cfg.checkpoint.every_s is not None
        self.resume = resume
        self._parts: dict[int, dict[int, WorkerState]] = {}  # by position, then rank
        self.reports = ctx.Queue()
        self.on_tick = on_tick
        # Accelerator workers keep replicas of their own: the master holds their latest steps
        # only once they answered a publish request (see Signals).
        self.publishers = [spec.rank for spec in specs if spec.accel]
        self.journal: Journal | None = None  # where snapshots and counters go as they are taken

    # -- snapshots ---------------------------------------------------------------------------

    def _publish(self, running: Callable[[], list[int]]) -> None:
        """Ask the publishers to bring the master up to date, and wait for the running ones."""
        signals = self.state.signals
        signals.publish_request += 1
        deadline = time.perf_counter() + PUBLISH_TIMEOUT_S
        while not signals.answered(running()) and time.perf_counter() < deadline:
            time.sleep(PUBLISH_POLL_S)

    def _take_snapshot(self, time_s: float, snapshots: Snapshots) -> None:
        """Copy the master, as it is at ``time_s`` of training, into ``snapshots``; the journal
        gets the copy with every worker's counters, and drops the copies that ``snapshots``
        thinned out."""
        counters = self.state.counters
        params, buffers = self.state.master.snapshot()
        examples = float(counters.column("examples").sum())
        snapshot = Snapshot(time_s, examples,
                            counters.column("updates").tolist(), params, buffers)
        dropped = snapshots.add(snapshot, examples / self.state.data.num_examples)
        if self.journal is not None:
            self.journal.snapshot(snapshot, [counters.row(rank)
                                             for rank in range(len(counters.table))])
            for old in dropped:
                self.journal.drop(old)

    def _new_snapshots(self) -> Snapshots:
        evaluation = self.cfg.eval
        return Snapshots(evaluation.every_s, evaluation.every_epochs, evaluation.max_snapshots,
                         evaluation.max_snapshot_mb * 2**20, self.state.master.nbytes)

    # -- checkpoints -------------------------------------------------------------------------

    def _receive_part(self, rank: int, data: bytes) -> None:
        part = WorkerState.from_bytes(data)
        self._parts.setdefault(part.position, {})[rank] = part

    def _write_checkpoints(self, t0: float, snapshots: Snapshots) -> None:
        """Assemble every position that all workers have sent their part of, for the journal."""
        world = len(self.state.counters.table)
        for position in [p for p, parts in self._parts.items() if len(parts) == world]:
            parts = self._parts.pop(position)
            checkpoint = Checkpoint.assemble([parts[rank] for rank in range(world)], t0,
                                             snapshots.items,
                                             (snapshots.every_s, snapshots.every_epochs))
            if self.journal is not None:
                self.journal.checkpoint(checkpoint)

    def _resume_snapshots(self, t0: float, snapshots: Snapshots) -> None:
        """The snapshots the checkpoint kept come first, at the spacing they had reached."""
        assert self.resume is not None
        counters = [dict(zip(COUNTERS, row.tolist())) for row in self.resume.counters]
        for snapshot in self.resume.snapshots:
            snapshots.add(snapshot, snapshot.examples / self.state.data.num_examples)
            if self.journal is not None:
                self.journal.snapshot(snapshot, counters)
        snapshots.every_s, snapshots.every_epochs = self.resume.snapshot_spacing

    def _start(self, procs: list) -> None:
        """Start the workers with SIGINT blocked, which they inherit through fork and exec: a
        Ctrl-C while they import stays pending until :func:`guarded` ignores it, instead of
        ending each in a traceback. The coordinator gets its own Ctrl-C once it unblocks."""
        # Started inside the block, the resource tracker would unblock SIGINT after its own start.
        resource_tracker.ensure_running()
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for p in procs:
                p.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    # -- the run -----------------------------------------------------------------------------

    def run(self, monitor_factory) -> Training:
        training = Training()
        if self.resume is not None:  # before the workers start: they take their parts along
            self.state.restore(self.resume)
        procs = [self.ctx.Process(target=guarded, daemon=True, name=f"hetsgd-worker-{s.rank}",
                                  args=(self.target, s, self.cfg, self.problem, self.state,
                                        self.reports))
                 for s in self.specs]
        monitor = monitor_factory(lambda: [p.pid for p in procs if p.pid is not None])
        finished: dict[int, tuple[str, str]] = {}
        snapshots = self._new_snapshots()
        examples = self.state.counters.column("examples")
        n = self.state.data.num_examples
        t0: float | None = None
        every_s = self.cfg.checkpoint.every_s
        try:
            self._start(procs)
            self._await_ready(procs, finished)
            monitor.start()
            t0 = time.perf_counter() - (self.resume.time_s if self.resume is not None else 0.0)
            monitor.set_time_origin(t0)
            if self.resume is not None:
                self._resume_snapshots(t0, snapshots)
            self._take_snapshot(time.perf_counter() - t0, snapshots)
            last_request = time.perf_counter()
            self.state.signals.go.set()
            first_failure: float | None = None
            while len(finished) < len(procs):
                self._collect(procs, finished, timeout=TICK_S)
                now = time.perf_counter()
                if first_failure is None and any(k != "done" for k, _ in finished.values()):
                    first_failure = now
                grace = self.cfg.dist.timeout_s + FAILURE_GRACE_S
                if first_failure is not None and now - first_failure > grace:
                    break  # a worker still alive this long after a failure is hung: end it below
                budget = self.cfg.budget.seconds
                if budget is not None and now - t0 >= budget:
                    self.state.signals.stop.set()
                epoch = float(examples.sum()) / n
                if snapshots.due(now - t0, epoch) and len(finished) < len(procs):
                    if self.publishers:
                        self._publish(lambda: [r for r in self.publishers if r not in finished])
                    self._take_snapshot(time.perf_counter() - t0, snapshots)
                if every_s is not None and now - last_request >= every_s:
                    self.state.signals.request_checkpoint()
                    last_request = now
                self._write_checkpoints(t0, snapshots)
                if self.controller is not None:
                    self.controller.tick(now - t0, self.state.counters)
                if self.on_tick is not None:
                    self.on_tick(now - t0, self.state.counters)
            training.time_s = time.perf_counter() - t0
            self._take_snapshot(time.perf_counter() - t0, snapshots)
            training.snapshots = snapshots.items
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM turned into one: keep what was measured
            training.status, training.error = "interrupted", "interrupted by the user"
            self.state.signals.stop.set()
            if t0 is not None:
                training.time_s = time.perf_counter() - t0
                self._take_snapshot(time.perf_counter() - t0, snapshots)
                training.snapshots = snapshots.items
        finally:
            self.state.signals.stop.set()
            self.state.signals.go.set()
            if self.state.checkpointing and t0 is not None:
                self._await_final_parts(procs, finished)
                self._write_checkpoints(t0, snapshots)
            for p in (p for p in procs if p.pid is not None):  # those started
                p.join(timeout=EXIT_TIMEOUT_S)
                if p.is_alive():
                    p.terminate()
            training.utilization = monitor.stop()
        for status, message in finished.values():
            if status != "done" and training.status == "completed":
                training.status, training.error = status, message
        training.counters = [self.state.counters.row(s.rank) for s in self.specs]
        if self.controller is not None:
            training.batches, training.extra = self.controller.log, self.controller.summary()
        return training

    def _await_final_parts(self, procs: list, finished: dict[int, tuple[str, str]]) -> None:
        """Read reports until every worker has ended (each sends its final part first, and
        cannot exit before it is read), within the time a worker is given to exit."""
        deadline = time.perf_counter() + EXIT_TIMEOUT_S
        while len(finished) < len(procs) and time.perf_counter() < deadline:
            self._collect(procs, finished, timeout=TICK_S)

    def _await_ready(self, procs: list, finished: dict[int, tuple[str, str]]) -> None:
        ready: set[int] = set()
        deadline = time.perf_counter() + STARTUP_TIMEOUT_S
        while len(ready) + len(finished) < len(procs):
            if time.perf_counter() > deadline:
                raise RuntimeError("workers did not start within "
                                   f"{STARTUP_TIMEOUT_S:.0f} s")
            ready |= self._collect(procs, finished, timeout=0.1)
        if finished:  # a worker failed during setup: nobody trains
            self.state.signals.stop.set()

    def _collect(self, procs: list, finished: dict[int, tuple[str, str]],
                 timeout: float) -> set[int]:
        """Read worker reports; a worker that died without one counts as failed."""
        ready: set[int] = set()
        try:
            while True:
                kind, rank, message = self.reports.get(timeout=timeout)
                timeout = 0.0
                if kind == "ready":
                    ready.add(rank)
                elif kind == "checkpoint":
                    self._receive_part(rank, message)
                else:
                    finished[rank] = (kind, message)
                    if kind != "done":
                        self.state.signals.stop.set()
        except queue.Empty:
            pass
        for spec, p in zip(self.specs, procs):
            if spec.rank not in finished and p.exitcode is not None and p.exitcode != 0:
                finished[spec.rank] = ("failed", f"worker {spec.rank} ({spec.group}) exited "
                                                 f"with code {p.exitcode}")
                self.state.signals.stop.set()
        return ready
