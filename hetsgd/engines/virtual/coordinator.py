"""The virtual-clock engine: a run's workers as events in virtual time, all in one process.

As federated-learning simulators do (FedScale's system traces, Flower's simulation mode), the
real model updates run, and a virtual clock driven by each device's speed profile decides when
they happen. The workers are the shared-memory engine's own (:class:`Worker`, with the
algorithm's links, steps and controller), so no algorithm exists twice: only the scheduling
differs.

A step of a worker on a chunk, starting at virtual time ``t``:

- at ``t`` it claims the chunk, copies the master in (a replica), and computes its update from
  the model as it is at ``t`` (:meth:`Worker.begin`);
- it lands at ``t + copies + compute`` (:meth:`Worker.end`): the update applied to the model as
  it is then, a replica merged back. The worker starts its next step at once.

``compute`` is the group's :class:`~.profiles.DeviceProfile` time for the step's batch size,
``copies`` the link's copies per step times the profile's copy time, both times the group's
``slowdown`` (the real engine's emulated worker sleeps (slowdown - 1) x its whole step) and the
step's jitter factor (:class:`~.step_times.StepTimes`). So staleness, update interleaving,
shares and idle time follow from the devices' relative speeds, as on real hardware; a step's
staleness is counted exactly, as the updates that landed between its start and its landing.
Events run in (time, rank) order. After each landing the budget and the snapshot spacing are
checked, at the landing's time; every ``TICK_S`` of virtual time the periodic duties (the
controller, progress, utilization samples) run before the events that follow, as the real
coordinator's loop runs them. Nothing reads a wall clock, so the same seed
and config give the same results, bit for bit.

The events run in a thread of their own (:mod:`.watch`): a step (a link's call, the model's)
that does not return within ``workers.stall_s`` fails the run naming the worker and the call,
as a worker process that makes no progress does; a Ctrl-C stops the run at the next event.
"""

from __future__ import annotations

import heapq
import math
import threading
from dataclasses import dataclass

from hetsgd.config import RunConfig
from hetsgd.engines.base import TICK_S, EngineBase
from hetsgd.engines.common.links import LinkFactory
from hetsgd.engines.common.memory import SharedData, SharedMaster
from hetsgd.engines.common.worker import Worker
from hetsgd.engines.counters import CounterRow
from hetsgd.engines.snapshots import Snapshots
from hetsgd.engines.training import Controller, Journal, MonitorFactory, OnTick, Training
from hetsgd.engines.virtual.busy import BusyTime
from hetsgd.engines.virtual.mix import simulated_math
from hetsgd.engines.virtual.profiles import DeviceProfile
from hetsgd.engines.virtual.step_times import step_times
from hetsgd.engines.virtual.watch import FIRST_STEP_ALLOWANCE, Progress, simulated
from hetsgd.errors import Diverged
from hetsgd.model.problem import Problem
from hetsgd.model.step import Pending
from hetsgd.workers import WorkerSpec


@dataclass
class InFlight:
    """A step between its virtual start and its landing."""

    pending: Pending
    size: int
    compute_s: float
    copy_s: float
    epoch: float
    landed_before: int  # updates landed when it started: its staleness is those since


class VirtualCoordinator(EngineBase):
    """Runs the planned workers on the virtual clock; returns what the real coordinator does."""

    def __init__(self, cfg: RunConfig, specs: list[WorkerSpec], problem: Problem,
                 data: SharedData, master: SharedMaster, on_tick: OnTick | None,
                 link_factory: LinkFactory, controller: Controller | None,
                 profiles: list[DeviceProfile], journal: Journal | None = None) -> None:
        super().__init__(cfg, specs, problem, data, master, on_tick, controller, journal,
                         threading)
        self.link_factory = link_factory
        self.times = step_times(cfg, specs, profiles)
        self.workers: list[Worker] = []
        self.rows: list[CounterRow] = []
        self.in_flight: dict[int, InFlight] = {}
        self.events: list[tuple[float, int]] = []  # (landing time, rank)
        self.landed = 0  # updates landed so far, every worker's
        self.stale: list[tuple[int, int]] = [(0, 0)] * len(specs)  # each worker's sum and max
        self.busy = BusyTime(specs)
        self.progress = Progress(cfg.workers.stall_s, "workers.stall_s")
        self.interrupted: str | None = None  # a stop's cause: the events stop at the next one

    def run(self, monitor_factory: MonitorFactory) -> Training:
        """Train on the virtual clock. ``monitor_factory`` is not used: utilization is each
        device's virtual busy share (:mod:`.busy`)."""
        with simulated_math(self.cfg, self.specs):  # the simulation's thread inherits its mode
            training = simulated(self._simulate, self.progress, self._interrupt)
        return self._finish(training)

    def _interrupt(self, cause: str) -> None:
        self.interrupted = cause
        self.state.signals.stop.set()

    def _calling(self, rank: int, call: str) -> None:
        """Worker ``rank`` is in ``call`` (its first step allowed more, as a process's is)."""
        spec = self.specs[rank]
        first = self.rows[rank]["updates"] == 0
        self.progress.beat(f"worker {rank} ({spec.group})'s {call}",
                           FIRST_STEP_ALLOWANCE if first else 1.0)

    # -- steps -------------------------------------------------------------------------------

    def _start(self, rank: int, time_s: float) -> None:
        """Worker ``rank`` begins its next step at ``time_s``, if the cursor has a chunk."""
        claim = self.state.cursor.claim(self.rows[rank].batch_size)
        if claim is None:
            return
        epoch, start, size = claim
        worker = self.workers[rank]
        self._calling(rank, "link's before_step or the step's computation")
        pending, _ = worker.begin(epoch, start, size)
        self.progress.beat(None)
        compute, copies = self.times[rank].step(size, worker.link.COPIES_PER_STEP)
        computing = time_s + copies / 2  # half the copies come before the batch
        self.busy.compute(rank, computing, computing + compute)
        self.in_flight[rank] = InFlight(pending, size, compute, copies,
                                        epoch + start / self.state.data.num_examples,
                                        self.landed)
        heapq.heappush(self.events, (time_s + copies + compute, rank))

    def _land(self, rank: int) -> int:
        """Worker ``rank``'s step in flight lands; returns its examples."""
        step = self.in_flight.pop(rank)
        self._calling(rank, "link's after_step or publish")
        self.workers[rank].end(step.pending)
        self.workers[rank].link.publish()  # the merge lands at the step's virtual end
        self.progress.beat(None)
        row = self.rows[rank]
        row.step(step.size, step.compute_s, 0.0, step.copy_s, step.copy_s / 2)  # half in
        stale, (total, largest) = self.landed - step.landed_before, self.stale[rank]
        self.stale[rank] = total + stale, max(largest, stale)
        row.staleness(*self.stale[rank])
        self.landed += 1
        Worker.read_loss(step.pending.loss, row, step.epoch)
        return step.size

    # -- the coordinator's duties ------------------------------------------------------------

    def _tick(self, time_s: float, utilization: list[dict]) -> None:
        """The coordinator's periodic duties (the controller samples update rates at each)."""
        if self.busy.due(time_s, self.cfg.monitor.interval_s):
            self._record_utilization(self.busy.sample(time_s), utilization)
        self._duties(time_s)

    def _snapshot(self, time_s: float, snapshots: Snapshots) -> None:
        for rank, worker in enumerate(self.workers):  # a resident replica copies itself in
            self._calling(rank, "link's publish")
            worker.link.publish()
        self.progress.beat(None)
        self._take_snapshot(time_s, snapshots)

    # -- the run -----------------------------------------------------------------------------

    def _simulate(self) -> Training:
        training = Training()
        snapshots = self._new_snapshots()
        utilization: list[dict] = []
        stop = self.state.signals.stop
        self.workers = [Worker(spec, self.cfg, self.problem, self.state, self.link_factory)
                        for spec in self.specs]
        self.rows = [CounterRow(self.state.counters.table[s.rank], s.batch_size)
                     for s in self.specs]
        budget = math.inf if self.cfg.budget.seconds is None else self.cfg.budget.seconds
        examples, n = 0, self.state.data.num_examples
        now, ticks = 0.0, 0
        try:
            self._take_snapshot(0.0, snapshots)
            for spec in self.specs:
                self._start(spec.rank, 0.0)
            while self.events and not self.interrupted:
                landing, rank = heapq.heappop(self.events)
                while (tick := ticks * TICK_S) <= landing:
                    self._tick(tick, utilization)
                    ticks += 1
                now = landing
                examples += self._land(rank)
                if now >= budget:
                    stop.set()
                if snapshots.due(now, examples / n) and not stop.is_set():  # the last: below
                    self._snapshot(now, snapshots)
                if not stop.is_set():
                    self._start(rank, now)
        except Diverged as exc:
            training.status, training.error = "diverged", str(exc)
        if self.interrupted is not None:  # a stop signal (:meth:`_interrupt`): keep what ran
            training.status, training.error = "interrupted", self.interrupted
        stop.set()
        training.time_s = now
        self._snapshot(now, snapshots)
        if self.busy.due(now, self.cfg.monitor.interval_s, closing=True):
            self._record_utilization(self.busy.sample(now), utilization)
        training.snapshots = snapshots.items
        training.utilization = utilization
        return training
