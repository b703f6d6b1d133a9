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

The algorithm provides the per-rank loop (a :class:`RankLoop`), bound into the process entry
by the coordinator, so this module never looks an algorithm up.
"""

from __future__ import annotations

import math
import statistics
from typing import ClassVar, Protocol, TypeVar

import torch

from hetsgd.config import RunConfig
from hetsgd.devices import WorkerSpec
from hetsgd.engines import device_ops
from hetsgd.engines.distributed.exchange import Exchange, Ledger, Verdict
from hetsgd.engines.distributed.group import Group
from hetsgd.engines.shared_memory.batches import Batches, training_augment
from hetsgd.engines.shared_memory.counters import COUNTERS
from hetsgd.engines.shared_memory.links import Link, default_link
from hetsgd.engines.shared_memory.state import SharedState
from hetsgd.engines.shared_memory.worker import reporting
from hetsgd.engines.step_timing import StepTimer
from hetsgd.model.flat import FlatModel
from hetsgd.model.losses import loss_fn, per_sample_loss
from hetsgd.model.problem import Problem
from hetsgd.model.sgd import SGD

B = TypeVar("B", bound=Batches)

# A rank's speed measurement before training; the median of the timed steps is its step time.
SPEED_TIMER = StepTimer(warmup=2, min_steps=5, min_seconds=0.3, max_steps=200)


class Rank:
    """One rank, set up: its replica, optimizer, loss, counters and exchange.

    With ``linked``, rank 0's replica reaches the coordinator's master like a lone worker's:
    in place for a host, resident and published on request for an accelerator (sync, where rank 0's replica
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
        augment = training_augment(data, self.problem, self.cfg.seed, self.spec.rank)
        return kind(self.state.data, self.device, data.shuffle, self.cfg.seed, data.on_device,
                    augment=augment)

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
        included: a few steps on a throwaway copy of the model, not counted as training."""
        module = self._model()
        flat = FlatModel(module)
        sgd = SGD(self.cfg.optim, flat)
        size = min(self.spec.batch_size, self.num_examples)

        def step(i: int) -> None:
            x, y = batches.get(0, i * size % (self.num_examples - size + 1), size)
            flat.zero_grad()
            self.loss(module(x), y).backward()
            with torch.no_grad():
                sgd.step(0.0, size)
            device_ops.synchronize(self.device)

        return self.group.gather(statistics.median(SPEED_TIMER.times(step, self.spec)))

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


class RankLoop(Protocol):
    """An algorithm's loop on one rank: built on every rank after the group forms, then run.

    ``SETUP_COLUMNS`` names what rank 0 settles at setup, one number per rank each (say the tau
    that ``tau: auto`` chose); :meth:`setup` returns them by name, for summary.json."""

    SETUP_COLUMNS: ClassVar[tuple[str, ...]]
    rank: Rank

    def __init__(self, spec: WorkerSpec, world: list[WorkerSpec], cfg: RunConfig,
                 problem: Problem, state: SharedState, group: Group) -> None: ...

    def setup(self) -> dict[str, list[float]]: ...

    def run(self) -> None: ...


def rank_process(spec: WorkerSpec, cfg: RunConfig, problem: Problem, state: SharedState,
                 reports, world: list[WorkerSpec], loop_type: type[RankLoop],
                 setup: torch.Tensor) -> None:
    """Entry point of a rank: join the world, set up, report ready, wait for go, train, report.

    ``world`` is every rank's spec, ``loop_type`` the algorithm's loop and ``setup`` a [ranks,
    len(SETUP_COLUMNS)] table where rank 0 leaves what it settled, for summary.json (all bound
    with functools.partial by the coordinator)."""
    torch.set_num_threads(spec.threads)
    group: Group | None = None
    with reporting(spec.rank, state, reports):
        try:
            group = Group(cfg.dist, spec.rank, world)
            loop = loop_type(spec, world, cfg, problem, state, group)
            if spec.rank == 0:
                values = loop.setup()
                setup.copy_(torch.tensor([values[c] for c in loop_type.SETUP_COLUMNS],
                                         dtype=torch.float64).T)
            reports.put(("ready", spec.rank, ""))
            state.signals.go.wait()
            loop.run()
            loop.rank.finish()
        finally:
            if group is not None:
                group.leave()
