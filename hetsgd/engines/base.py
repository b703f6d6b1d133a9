"""What every engine does alike, however its workers run (processes, threads or events on a
virtual clock): it holds the run's shared state, copies the master into snapshots for its
journal, runs the duties of each tick and closes what training leaves behind. Nothing here
starts a process: the process engines (``Coordinator``, ``DistributedCoordinator``) add that,
so the virtual ones run in this process without any of it."""

from __future__ import annotations

from typing import Any

from hetsgd.config import RunConfig
from hetsgd.engines.checkpoint import Checkpoint, WorkerState
from hetsgd.engines.common.memory import SharedData, SharedMaster
from hetsgd.engines.common.state import SharedState
from hetsgd.engines.method_log import bind
from hetsgd.engines.snapshots import Snapshot, Snapshots
from hetsgd.engines.training import Controller, Journal, OnTick, Training
from hetsgd.model.problem import Problem
from hetsgd.workers import WorkerSpec

TICK_S = 0.01  # how often an engine runs its periodic duties, on the clock it keeps


class EngineBase:
    """The state, snapshots, tick duties and results every engine shares.

    ``ctx`` makes the locks and events the workers share: a multiprocessing context for worker
    processes, the ``threading`` module for workers that run in this process."""

    def __init__(self, cfg: RunConfig, specs: list[WorkerSpec], problem: Problem,
                 data: SharedData, master: SharedMaster, on_tick: OnTick | None,
                 controller: Controller | None, journal: Journal | None, ctx: Any) -> None:
        self.cfg, self.specs, self.problem = cfg, specs, problem
        self.on_tick, self.controller = on_tick, controller
        self.journal = journal  # where snapshots and counters go as they are taken
        self.state = SharedState.create(data, master, cfg.budget.epochs, len(specs), ctx)
        self.state.checkpointing = cfg.checkpoint.every_s is not None
        self._parts: dict[int, dict[int, WorkerState]] = {}  # by position, then rank
        bind(self.state.log)  # a controller's log() in this process

    def _new_snapshots(self) -> Snapshots:
        evaluation = self.cfg.eval
        return Snapshots(evaluation.every_s, evaluation.every_epochs, evaluation.max_snapshots,
                         evaluation.max_snapshot_mb * 2**20, self.state.master.nbytes)

    def _take_snapshot(self, time_s: float, snapshots: Snapshots) -> None:
        """Copy the master, as it is at ``time_s`` of training, into ``snapshots``; the journal
        gets the copy with every worker's counters, and drops the copies that ``snapshots``
        thinned out."""
        counters = self.state.counters
        params, buffers = self.state.master.snapshot()
        examples = float(counters.column("examples").sum())
        snapshot = Snapshot(time_s, examples, counters.column("updates").tolist(), params,
                            buffers, self.state.log.latest())
        dropped = snapshots.add(snapshot, examples / self.state.data.num_examples)
        if self.journal is not None:
            self.journal.snapshot(snapshot, [counters.row(rank)
                                             for rank in range(len(counters.table))])
            for old in dropped:
                self.journal.drop(old)

    # -- checkpoints -------------------------------------------------------------------------

    def _receive_part(self, rank: int, part: WorkerState) -> None:
        self._parts.setdefault(part.position, {})[rank] = part

    def _write_checkpoints(self, t0: float, snapshots: Snapshots) -> None:
        """Assemble every position that all workers have sent their part of, for the journal
        (``t0``: when training started, on the clock the parts' times are read on)."""
        world = len(self.state.counters.table)
        for position in [p for p, parts in self._parts.items() if len(parts) == world]:
            parts = self._parts.pop(position)
            checkpoint = Checkpoint.assemble([parts[rank] for rank in range(world)], t0,
                                             snapshots.items,
                                             (snapshots.every_s, snapshots.every_epochs))
            if self.journal is not None:
                self.journal.checkpoint(checkpoint)

    def _resume_snapshots(self, resume: Checkpoint, snapshots: Snapshots) -> None:
        """The snapshots the checkpoint kept come first, at the spacing they had reached: the
        next one is due a thinned spacing after the last, as in a run that went on."""
        last = resume.snapshots[-1].examples if resume.snapshots else 0.0
        dropped = snapshots.restore(resume.snapshots, resume.snapshot_spacing,
                                    last / self.state.data.num_examples)
        if self.journal is not None:
            counters = resume.counter_rows()
            for snapshot in resume.snapshots:
                self.journal.snapshot(snapshot, counters)
            for old in dropped:
                self.journal.drop(old)

    def _duties(self, elapsed: float) -> None:
        """Each tick's duties, at ``elapsed`` seconds of training: the controller, then the
        runner's callback (progress)."""
        if self.controller is not None:
            self.controller.tick(elapsed, self.state.counters)
        if self.on_tick is not None:
            self.on_tick(elapsed, self.state.counters)

    def _record_utilization(self, row: dict, rows: list[dict]) -> None:
        """A utilization sample the engine took itself (a virtual device's busy share), kept in
        ``rows`` and in the journal."""
        rows.append(row)
        if self.journal is not None:
            self.journal.utilization(row)

    def _finish(self, training: Training) -> Training:
        """Every worker's final counters and the controller's log into ``training``."""
        training.counters = [self.state.counters.row(s.rank) for s in self.specs]
        if self.controller is not None:
            training.batches, training.extra = self.controller.log, self.controller.summary()
        return training
