"""Ranks of a torch.distributed run (sync on several workers, local_sgd): the process entry point
and what every rank has whatever the algorithm: a replica, an optimizer, counters, and one
all-reduce per step or round that also carries the ranks' agreement on when to stop.

A rank speaks the workers' report protocol (``ready`` after setup, wait for ``go``, then ``done``,
``failed`` or ``diverged``), so the coordinator, its snapshots and the results files work
unchanged. Two rules keep every rank out of a collective that will never come:

- the budget in epochs is counted the same way on every rank, so they all stop at the same step;
- anything else that ends training (the coordinator's ``stop`` at the time budget, a failure,
  a NaN loss) travels as a flag in the step's or round's all-reduce, so every rank learns it at
  the same exchange and leaves after it.

The algorithm module provides ``RankLoop(spec, world, cfg, problem, state, group)`` with a
``rank`` attribute (a :class:`Rank`), ``notes()`` (``launch.NOTES`` numbers per rank for
summary.json) and ``run()``.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import TypeVar

import torch

from hetsgd.config import RunConfig
from hetsgd.devices import WorkerSpec
from hetsgd.distributed import Group
from hetsgd.flat import FlatModel
from hetsgd.losses import loss_fn, per_sample_loss
from hetsgd.shared import COUNTERS, CounterRow, Problem, SharedState, WorkerCounters
from hetsgd.workers import SGD, Batches, Link, default_link, reporting

B = TypeVar("B", bound=Batches)

# A speed measurement: untimed steps first, then timed ones until there are enough of them and
# the measurement ran long enough to trust; the median is the step time.
WARMUP_STEPS = 2
MIN_TIMED_STEPS, MAX_TIMED_STEPS, MIN_TIMED_S = 5, 200, 0.3


class Ledger(CounterRow):
    """This rank's counters (a row of ``shared.COUNTERS``), and every rank's as last exchanged.

    Rank 0 writes the world's table into the coordinator's shared counters, so the epoch count,
    the progress display and workers.csv cover every rank, on one machine or across several.
    Time spent in collectives (``comm_s``) includes waiting there for slower ranks.
    """

    def __init__(self, rank: int, batch_size: int, shared: WorkerCounters) -> None:
        super().__init__(torch.zeros(len(COUNTERS), dtype=torch.float64), batch_size)
        self.rank = rank
        self.shared = shared if rank == 0 else None

    def publish(self, table: torch.Tensor) -> None:
        """Rank 0: the world's counters ([ranks, columns]) into the coordinator's table."""
        if self.shared is not None:
            table = table.to("cpu", torch.float64)
            table[self.rank] = self.row  # its own row is always current
            self.shared.table.copy_(table)


@dataclass
class Verdict:
    """What the ranks agreed on at an exchange."""

    stop: bool
    diverged: bool
    seconds: float


class Exchange:
    """The one all-reduce of a step (sync) or a round (local SGD).

    The payload is a weighted flat state, two vectors (gradients and floating buffers, or
    parameters and floating buffers), summed over the ranks; the tail holds a stop flag, a
    divergence flag and every rank's counters (each rank fills its own row; the sum is the table).
    """

    def __init__(self, group: Group, ledger: Ledger, sizes: tuple[int, int]) -> None:
        self.group, self.ledger = group, ledger
        self.sizes = sizes
        tail = 2 + group.world_size * len(COUNTERS)
        self.buffer = group.buffer(sum(sizes) + tail)
        self.tail = torch.zeros(tail, dtype=torch.float32)

    def __call__(self, first: torch.Tensor, second: torch.Tensor, weight: float, stop: bool,
                 diverged: bool) -> Verdict:
        """Sum `weight * (first, second)` over the ranks, in place, and agree on the flags."""
        started = time.perf_counter()
        payload = self.buffer[:sum(self.sizes)]
        parts = payload.split(self.sizes)
        for part, values in zip(parts, (first, second)):
            part.copy_(values)
        payload.mul_(weight)
        self.tail.zero_()
        self.tail[0], self.tail[1] = float(stop), float(diverged)
        columns = len(COUNTERS)
        start = 2 + self.ledger.rank * columns
        self.tail[start:start + columns] = self.ledger.row
        self.buffer[sum(self.sizes):].copy_(self.tail)
        self.group.all_reduce_(self.buffer)
        for part, values in zip(parts, (first, second)):
            values.copy_(part)
        tail = self.buffer[sum(self.sizes):].to("cpu")
        self.ledger.publish(tail[2:].view(self.group.world_size, columns))
        return Verdict(bool(tail[0] > 0), bool(tail[1] > 0), time.perf_counter() - started)


class Rank:
    """One rank, set up: its replica, optimizer, loss, counters and exchange.

    With ``linked``, rank 0's replica reaches the coordinator's master like a lone worker's:
    in place on a CPU, resident on a GPU and published on request (sync, where rank 0's replica
    is the model after every step). Otherwise the algorithm writes the master itself
    (:meth:`write_master`; local SGD after each aggregation). Every rank starts from rank 0's
    model.
    """

    def __init__(self, spec: WorkerSpec, world: list[WorkerSpec], cfg: RunConfig,
                 problem: Problem, state: SharedState, group: Group, linked: bool) -> None:
        self.spec, self.world, self.cfg, self.problem = spec, world, cfg, problem
        self.state, self.group = state, group
        self.device = torch.device(spec.device)
        self.module = self._model()
        self.link: Link | None = (default_link(spec, self.module, state)
                                  if linked and spec.rank == 0 else None)
        self.flat = self.link.flat if self.link is not None else FlatModel(self.module)
        group.broadcast_from_0(self.flat.params)
        group.broadcast_from_0(self.flat.buffers)
        self.sgd = SGD(cfg.optim, self.flat)
        self.loss = loss_fn(problem.task)
        self.ledger = Ledger(spec.rank, spec.batch_size, state.counters)
        self._exchange = Exchange(group, self.ledger,
                                  (self.flat.params.numel(), self.flat.buffers.numel()))

    def _model(self) -> torch.nn.Module:
        cfg, problem = self.cfg, self.problem
        return problem.build_model(cfg.model, cfg.seed).to(self.device).train()

    @property
    def num_examples(self) -> int:
        return self.state.data.num_examples

    def batches(self, kind: type[B] = Batches) -> B:  # type: ignore[assignment]
        data = self.cfg.data
        return kind(self.state.data, self.device, data.shuffle, self.cfg.seed, data.on_device)

    def gradient(self, x: torch.Tensor, y: torch.Tensor, per_sample: bool = False
                 ) -> tuple[float, torch.Tensor | None]:
        """Forward and backward on one batch: the mean loss, and the per-sample losses if asked
        (biased sampling ranks examples by them)."""
        self.flat.zero_grad()
        out = self.module(x)
        losses = per_sample_loss(self.problem.task, out, y) if per_sample else None
        loss = losses.mean() if losses is not None else self.loss(out, y)
        loss.backward()
        return loss.item(), (losses.detach() if losses is not None else None)

    def exchange(self, first: torch.Tensor, second: torch.Tensor, weight: float,
                 loss: float | None) -> Verdict:
        verdict = self._exchange(first, second, weight, self.state.signals.stop.is_set(),
                                 loss is not None and not math.isfinite(loss))
        self.ledger.add("comm_s", verdict.seconds)
        return verdict

    def step_times(self, batches: Batches) -> list[float]:
        """Every rank's seconds per training step at its own batch size, the emulated slowdown
        included: a few steps on a throwaway copy of the model, not counted as training. An
        emulated rank sleeps after each of them as in training, since a step that follows a sleep
        runs slower than one in a tight loop."""
        module = self._model()
        flat = FlatModel(module)
        sgd = SGD(self.cfg.optim, flat)
        size = min(self.spec.batch_size, self.num_examples)
        times: list[float] = []
        began = time.perf_counter()
        while len(times) < WARMUP_STEPS + MAX_TIMED_STEPS:
            if (len(times) >= WARMUP_STEPS + MIN_TIMED_STEPS
                    and time.perf_counter() - began >= MIN_TIMED_S):
                break
            started = time.perf_counter()
            x, y = batches.get(0, len(times) * size % (self.num_examples - size + 1), size)
            flat.zero_grad()
            self.loss(module(x), y).backward()
            with torch.no_grad():
                sgd.step(0.0, size)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            times.append(time.perf_counter() - started)
            self.spec.emulate(times[-1])
        return self.group.gather(statistics.median(times[WARMUP_STEPS:]) * self.spec.slowdown)

    def write_master(self) -> None:
        """Rank 0: the current model into the coordinator's master (a snapshot may land during
        the copy and mix two consecutive models, as Hogwild snapshots can)."""
        if self.spec.rank == 0:
            self.state.master.params.copy_(self.flat.params)
            self.state.master.buffers.copy_(self.flat.buffers)

    def finish(self) -> None:
        """After the last exchange: rank 0's final publish, then every rank's exact counters."""
        if self.link is not None:
            self.ledger.add("comm_s", self.link.finish())
        table = torch.zeros(len(self.world), len(COUNTERS), dtype=torch.float64)
        table[self.spec.rank] = self.ledger.row
        self.ledger.publish(self.group.all_reduce_(table))


def rank_process(spec: WorkerSpec, cfg: RunConfig, problem: Problem, state: SharedState,
                 reports, world: list[WorkerSpec], notes: torch.Tensor) -> None:
    """Entry point of a rank: join the world, set up, report ready, wait for go, train, report.

    ``world`` is every rank's spec and ``notes`` a [ranks, launch.NOTES] table where rank 0 leaves
    what it settled at setup for summary.json (both bound with functools.partial by the
    coordinator)."""
    from hetsgd import algorithms  # the algorithm modules import this one

    torch.set_num_threads(spec.threads)
    group: Group | None = None
    with reporting(spec.rank, state, reports):
        try:
            group = Group(cfg.dist, spec.rank, world)
            loop = algorithms.get(cfg.algo.name).RankLoop(spec, world, cfg, problem, state, group)
            if spec.rank == 0:
                notes.copy_(torch.tensor(loop.notes(), dtype=torch.float64))
            reports.put(("ready", spec.rank, ""))
            state.signals.go.wait()
            loop.run()
            loop.rank.finish()
        finally:
            if group is not None:
                group.leave()
