"""The coordinator: spawn worker processes around one master model, watch them, snapshot it.

Every algorithm runs through it; they differ in the worker entry point (``target``): the
asynchronous family's workers update the master directly, while replicas that train on their own
(a GPU, distributed ranks) publish into it when a snapshot is due. The coordinator process never
initializes CUDA. It starts the workers (spawned, so each sets its
thread count and makes its own CUDA context), waits until every worker has built its model and
staged its data, then starts the clock and the workers together. While they train it copies the
master every ``eval.every_s`` seconds, ends training at the time budget, and notices a worker that
failed or died. Evaluation of the snapshots happens after training (see ``evaluate``).
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
from typing import Protocol

import torch.multiprocessing as mp

from hetsgd.config import RunConfig
from hetsgd.devices import WorkerSpec
from hetsgd.engines.shared_memory.counters import WorkerCounters
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
# After a worker failed, the others get dist.timeout_s (their collectives' own limit) plus this
# long to notice and report before the coordinator ends them.
FAILURE_GRACE_S = 10.0
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


@dataclass
class Training:
    """What a training phase leaves behind for evaluation and the results files."""

    status: str = "completed"  # completed | failed | interrupted | diverged
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


def guarded(target: Callable, *args) -> None:
    """A worker process's entry: it leaves Ctrl-C to its coordinator (which stops it through
    ``stop`` and keeps what was measured) and, on Linux, dies with the coordinator however that
    dies (the parent-death signal), so no worker outlives its run."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the coordinator died before the line above
            os._exit(1)
    target(*args)


class Coordinator:
    def __init__(self, cfg: RunConfig, specs: list[WorkerSpec], problem: Problem,
                 data: SharedData, master: SharedMaster,
                 on_tick: OnTick | None = None,
                 target: Callable = worker_process, controller: Controller | None = None) -> None:
        self.cfg, self.specs, self.problem, self.target = cfg, specs, problem, target
        self.controller = controller
        ctx = mp.get_context("spawn")
        self.ctx = ctx
        self.state = SharedState.create(data, master, cfg.budget.epochs, len(specs), ctx)
        self.reports = ctx.Queue()
        self.on_tick = on_tick
        # Accelerator workers keep replicas of their own: the master holds their latest steps
        # only once they answered a publish request (see Signals).
        self.publishers = [spec.rank for spec in specs if spec.accel]

    # -- snapshots ---------------------------------------------------------------------------

    def _publish(self, running: Callable[[], list[int]]) -> None:
        """Ask the publishers to bring the master up to date, and wait for the running ones."""
        signals = self.state.signals
        signals.publish_request += 1
        deadline = time.perf_counter() + PUBLISH_TIMEOUT_S
        while not signals.answered(running()) and time.perf_counter() < deadline:
            time.sleep(PUBLISH_POLL_S)

    def _snapshot(self, t0: float) -> Snapshot:
        counters = self.state.counters
        params, buffers = self.state.master.snapshot()
        return Snapshot(time.perf_counter() - t0, float(counters.column("examples").sum()),
                        counters.column("updates").tolist(), params, buffers)

    # -- the run -----------------------------------------------------------------------------

    def run(self, monitor_factory) -> Training:
        training = Training()
        procs = [self.ctx.Process(target=guarded, daemon=True, name=f"hetsgd-worker-{s.rank}",
                                  args=(self.target, s, self.cfg, self.problem, self.state,
                                        self.reports))
                 for s in self.specs]
        for p in procs:
            p.start()
        monitor = monitor_factory(lambda: [p.pid for p in procs if p.pid is not None])
        finished: dict[int, tuple[str, str]] = {}
        evaluation = self.cfg.eval
        snapshots = Snapshots(evaluation.every_s, evaluation.every_epochs,
                              evaluation.max_snapshots, evaluation.max_snapshot_mb * 2**20,
                              self.state.master.nbytes)
        examples = self.state.counters.column("examples")
        n = self.state.data.num_examples
        t0: float | None = None
        try:
            self._await_ready(procs, finished)
            monitor.start()
            t0 = time.perf_counter()
            monitor.set_time_origin(t0)
            snapshots.add(self._snapshot(t0), 0.0)
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
                    snapshots.add(self._snapshot(t0), epoch)
                if self.controller is not None:
                    self.controller.tick(now - t0, self.state.counters)
                if self.on_tick is not None:
                    self.on_tick(now - t0, self.state.counters)
            training.time_s = time.perf_counter() - t0
            snapshots.add(self._snapshot(t0), float(examples.sum()) / n)
            training.snapshots = snapshots.items
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM turned into one: keep what was measured
            training.status, training.error = "interrupted", "interrupted by the user"
            self.state.signals.stop.set()
            if t0 is not None:
                training.time_s = time.perf_counter() - t0
                snapshots.add(self._snapshot(t0), float(examples.sum()) / n)
                training.snapshots = snapshots.items
        finally:
            self.state.signals.stop.set()
            self.state.signals.go.set()
            for p in procs:
                p.join(timeout=30)
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
