"""The virtual clock for the torch.distributed family (sync on several workers, local SGD): the
algorithm's own rank loops, as threads of one process meeting in a :class:`~.group.Meeting`.

The coordinator's duties run at the meetings, while every rank waits: a snapshot of the master
when one is due (rank 0 writes the master after each exchange, so at a meeting the master holds
the model of the previous one, and the snapshot carries that one's time), utilization samples,
progress, and checkpoints: a request every ``checkpoint.every_s`` virtual seconds, which the
ranks agree on at their next exchange and answer after it, and the checkpoint of every position
whose parts have all come (their times are virtual, and so is a resumed run's clock). A rank
that fails releases the others from the barrier; the run then fails with the first rank's
error, as a real run does. The ranks' threads are watched (:mod:`.watch`): once training has
started, ranks that neither step nor meet for ``dist.timeout_s`` (one hung in the algorithm's
code, the others waiting for it at an exchange) fail the run naming the hung ones, as a real
collective's timeout does; a Ctrl-C stops them at their next exchange.
"""

from __future__ import annotations

import threading
import time
from functools import partial

from hetsgd.config import RunConfig
from hetsgd.engines.base import EngineBase
from hetsgd.engines.checkpoint import Checkpoint, WorkerState
from hetsgd.engines.common.memory import SharedData, SharedMaster
from hetsgd.engines.hooks import SetupSummary
from hetsgd.engines.ranks.group import RankLost
from hetsgd.engines.ranks.loop import RankLoop
from hetsgd.engines.training import Journal, MonitorFactory, OnTick, Training
from hetsgd.engines.virtual.busy import BusyTime
from hetsgd.engines.virtual.group import Meeting, VirtualClock, VirtualGroup
from hetsgd.engines.virtual.mix import simulated_math
from hetsgd.engines.virtual.profiles import DeviceProfile
from hetsgd.engines.virtual.step_times import step_times
from hetsgd.engines.virtual.watch import wait
from hetsgd.errors import Diverged
from hetsgd.model.problem import Problem
from hetsgd.workers import WorkerSpec


class VirtualRanks(EngineBase):
    """Runs a distributed algorithm's ranks on virtual clocks; returns what the real coordinator
    of ranks does."""

    def __init__(self, cfg: RunConfig, world: list[WorkerSpec], problem: Problem,
                 data: SharedData, master: SharedMaster, on_tick: OnTick | None,
                 loop_type: type[RankLoop], setup_summary: SetupSummary,
                 profiles: list[DeviceProfile], journal: Journal | None = None,
                 resume: Checkpoint | None = None) -> None:
        super().__init__(cfg, world, problem, data, master, on_tick, None, journal, threading)
        self.loop_type, self.setup_summary = loop_type, setup_summary
        self.busy = BusyTime(world)
        clocks = [VirtualClock(s.rank, times, cfg.budget.seconds, self.busy)
                  for s, times in zip(world, step_times(cfg, world, profiles))]
        self.meeting = Meeting(clocks, master.nbytes, self._on_meeting, cfg.seed)
        self.loops: list[RankLoop | None] = [None] * len(world)
        self.errors: dict[int, BaseException] = {}
        self.snapshots = self._new_snapshots()
        self.utilization: list[dict] = []
        self.resume = resume
        # the time of the model the master holds, and of the last checkpoint request
        self.previous_meeting = resume.time_s if resume is not None else 0.0
        self.last_request = self.previous_meeting
        self.parts_lock = threading.Lock()
        self.seen: tuple[float, ...] = ()  # the meetings and clocks when last seen to move
        self.seen_at = time.monotonic()

    # -- at every meeting --------------------------------------------------------------------

    def _on_meeting(self, time_s: float) -> None:
        examples = float(self.state.counters.column("examples").sum())
        if self.snapshots.due(self.previous_meeting, examples / self.state.data.num_examples):
            self._snapshot(self.previous_meeting)
        if self.busy.due(time_s, self.cfg.monitor.interval_s):
            self._record_utilization(self.busy.sample(time_s), self.utilization)
        self._checkpoint_duties(time_s)
        self._duties(time_s)
        self.previous_meeting = time_s

    def _checkpoint_duties(self, time_s: float) -> None:
        """The checkpoints whose parts have all come, then a request when one is due."""
        every_s = self.cfg.checkpoint.every_s
        if every_s is None:
            return
        with self.parts_lock:
            self._write_checkpoints(0.0, self.snapshots)
        if time_s - self.last_request >= every_s:
            self.state.signals.request_checkpoint()
            self.last_request = time_s

    def _on_part(self, rank: int, part: WorkerState) -> None:
        """A rank's part of a checkpoint, from its thread: a copy, as a process's would be."""
        with self.parts_lock:
            self._receive_part(rank, WorkerState.from_bytes(part.to_bytes()))

    def _snapshot(self, time_s: float) -> None:
        first = self.loops[0]
        if first is not None and first.rank.link is not None:  # rank 0's resident replica
            first.rank.link.publish()
        self._take_snapshot(time_s, self.snapshots)

    # -- the run -----------------------------------------------------------------------------

    def _rank(self, spec: WorkerSpec, setup: dict) -> None:
        """A rank's thread: the loop, then its final counters, computed in its turns (one rank
        at a time); any failure releases the others."""
        try:
            self.meeting.turns.take(spec.rank)
            loop = self.loop_type(spec, self.specs, self.cfg, self.problem, self.state,
                                  VirtualGroup(spec.rank, self.meeting))
            self.loops[spec.rank] = loop
            if spec.rank == 0:
                setup.update(loop.setup())
            self.meeting.start(spec.rank)
            loop.run(partial(self._on_part, spec.rank))
            loop.rank.finish()
            self.meeting.turns.hand_on(spec.rank)
        except BaseException as exc:  # noqa: BLE001 - reported by run()
            self.errors[spec.rank] = exc
            self.meeting.abort()

    def run(self, monitor_factory: MonitorFactory) -> Training:
        """Train on the virtual clocks. ``monitor_factory`` is not used: utilization is each
        device's virtual busy share."""
        training = Training(resumed_s=self.resume.time_s if self.resume is not None else 0.0)
        setup: dict[str, list[float]] = {}
        if self.resume is not None:  # before the ranks start: they take their parts along
            self.state.restore(self.resume)
            self._resume_snapshots(self.resume, self.snapshots)
            self.busy.last_time = self.resume.time_s  # utilization from here on
        kept = self.snapshots.items
        if not (kept and kept[-1].time_s == self.previous_meeting):  # a checkpoint's own last
            self._take_snapshot(self.previous_meeting, self.snapshots)
        ranks = [threading.Thread(target=self._rank, args=(spec, setup), daemon=True,
                                  name=f"hetsgd-rank-{spec.rank}") for spec in self.specs]
        with simulated_math(self.cfg, self.specs):  # the rank threads inherit its float mode
            for thread in ranks:
                thread.start()
            ended = False
            try:
                ended = wait(ranks, self._late, lambda cause: self._stop(training, cause))
            finally:  # ranks left behind, hung or waiting for one: released from the barriers
                if not ended:  # (daemon threads, they end with the process)
                    self.meeting.abort()
        self._raise_failure(training)
        training.time_s = max(clock.time for clock in self.meeting.clocks)
        self._write_checkpoints(0.0, self.snapshots)  # the final one, which every rank sent
        self._snapshot(training.time_s)
        if self.busy.due(training.time_s, self.cfg.monitor.interval_s, closing=True):
            self._record_utilization(self.busy.sample(training.time_s), self.utilization)
        training.snapshots, training.utilization = self.snapshots.items, self.utilization
        self._finish(training)
        if setup:
            training.extra = self.setup_summary(self.specs, setup)
        return training

    def _stop(self, training: Training, cause: str) -> None:
        """A stop signal: the ranks stop at their next exchange, keeping what ran."""
        training.status, training.error = "interrupted", cause
        self.state.signals.stop.set()

    def _late(self) -> str | None:
        """Once training has started, the ranks hung (not waiting at an exchange) when none
        has stepped or met for ``dist.timeout_s``; None while they move."""
        meeting, now = self.meeting, time.monotonic()
        seen = (meeting.meetings, *(clock.time for clock in meeting.clocks))
        if seen != self.seen or not meeting.started:
            self.seen, self.seen_at = seen, now
            return None
        limit = self.cfg.dist.timeout_s
        if now - self.seen_at <= limit:
            return None
        hung = [f"rank {spec.rank} ({spec.group})" for spec in self.specs
                if spec.rank not in meeting.waiting]
        return (f"{', '.join(hung)} made no progress for dist.timeout_s={limit:g} s on the "
                "virtual clock (no step, no exchange; the other ranks waited for it at one): "
                "raise dist.timeout_s if it is only slow")

    def _raise_failure(self, training: Training) -> None:
        """Divergence ends the run as diverged; any other failure is raised, the first rank's
        own error rather than the others' release from the barrier."""
        if not self.errors or (training.status == "interrupted" and all(
                isinstance(e, RankLost) for e in self.errors.values())):  # released after a stop
            return
        first = next((e for e in self.errors.values() if not isinstance(e, RankLost)),
                     next(iter(self.errors.values())))
        if not isinstance(first, Diverged):
            raise first
        training.status, training.error = "diverged", str(first)
