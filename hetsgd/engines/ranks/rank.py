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

A checkpoint request travels the same way, so every rank takes its part of a checkpoint after
the same exchange (:meth:`Rank.checkpoint`), and of a resumed run every rank starts from it.

The algorithm's per-rank loop (a :class:`~.loop.RankLoop`) is built on a :class:`Rank`, and the
process entry (:mod:`~.process`) runs it, so this module knows no loop and no algorithm.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, TypeVar, overload

import torch

from hetsgd.config import RunConfig
from hetsgd.engines import device_ops
from hetsgd.engines.batches import Batches, min_rows, training_augment
from hetsgd.engines.checkpoint import (
    WorkerState,
    augment_generator,
    restore_rng,
    rng_state,
)
from hetsgd.engines.common.links import Link, default_link
from hetsgd.engines.common.state import SharedState
from hetsgd.engines.common.worker import LOSS_READ_S
from hetsgd.engines.counters import COUNTERS
from hetsgd.engines.ranks.exchange import Exchange, Ledger, Verdict
from hetsgd.engines.ranks.group import Group
from hetsgd.model.flat import FlatModel
from hetsgd.model.optimizer import copied, restore_state, saved_state
from hetsgd.model.problem import Problem
from hetsgd.model.step import build_step
from hetsgd.workers import WorkerSpec

B = TypeVar("B", bound=Batches)


class Rank:
    """One rank, set up: its replica, optimizer, loss, counters and exchange.

    With ``linked``, rank 0's replica reaches the coordinator's master like a lone worker's:
    in place for a host, resident and published on request for an accelerator (sync, where rank 0's replica
    is the model after every step). Otherwise the algorithm writes the master itself
    (:meth:`write_master`; local SGD after each aggregation). Every rank starts from rank 0's
    model.
    """

    def __init__(self, spec: WorkerSpec, world: list[WorkerSpec], cfg: RunConfig,
                 problem: Problem, state: SharedState, group: Group, linked: bool,
                 step_choice: str) -> None:
        self.spec, self.world, self.cfg, self.problem = spec, world, cfg, problem
        self.state, self.group = state, group
        self.clock = group.clock
        self.device = torch.device(spec.device)
        self.module = self._model()
        self.link: Link | None = (default_link(spec, self.module, state)
                                  if linked and spec.rank == 0 else None)
        self.flat = self.link.flat if self.link is not None else FlatModel(self.module)
        if spec.rank == 0:  # the master: the run's initial model, or a checkpoint's
            self.flat.load_(state.master.params, state.master.buffers)
        group.broadcast_from_0(self.flat.params)
        group.broadcast_from_0(self.flat.buffers)
        # the step the loop asks for (``optim.step`` for local SGD; ``autograd`` for sync, which
        # all-reduces the gradient between the step's two halves)
        self.train_step = build_step(step_choice, self.flat, cfg.optim, problem.task)
        self.optimizer = self.train_step.optimizer
        self.next_loss_read = 0.0
        self.ledger = Ledger(spec.rank, spec.batch_size, state.counters,
                             partial(state.signals.beat, spec.rank))
        self._exchange = Exchange(group, self.ledger,
                                  (self.flat.params.numel(), self.flat.buffers.numel()))
        self.restored = state.restored[spec.rank] if state.restored is not None else None
        self.augment: torch.Generator | None = None  # set by batches()

    def _model(self) -> torch.nn.Module:
        cfg, problem = self.cfg, self.problem
        return problem.build_model(cfg.model, cfg.seed).to(self.device).train()

    @property
    def num_examples(self) -> int:
        return self.state.data.num_examples

    @overload
    def batches(self) -> Batches: ...

    @overload
    def batches(self, batches_type: type[B]) -> B: ...

    def batches(self, batches_type: type[Batches] = Batches) -> Batches:
        """This rank's batches, of ``batches_type`` (a subclass of :class:`Batches`, which is the default)."""
        data = self.cfg.data
        augment = training_augment(data, self.problem, self.cfg.seed, self.spec.rank)
        self.augment = augment_generator(augment)
        return batches_type(self.state.data, self.device, data.shuffle, self.cfg.seed, data.on_device,
                    augment=augment, min_rows=min_rows(self.module))

    def loss_due(self) -> bool:
        """Whether a step's loss is due for reading: every ``LOSS_READ_S`` of this rank's clock,
        the workers' cadence (a read waits for a GPU to finish its queued steps)."""
        return self.clock.now() >= self.next_loss_read

    def read_loss(self, mean: torch.Tensor) -> float:
        """A step's mean loss, read. Called inside the step's timed span, so on a GPU the wait
        for the device counts as busy time."""
        value = float(mean)
        self.next_loss_read = self.clock.now() + LOSS_READ_S
        return value

    def waiting(self) -> bool:
        """The check of each slice of this rank's emulated sleep: a heartbeat, then whether
        training ended (named for the :meth:`Signals.waiting` it calls)."""
        return self.state.signals.waiting(self.spec.rank)

    def exchange(self, first: torch.Tensor, second: torch.Tensor, weight: float,
                 loss: float | None) -> Verdict:
        signals = self.state.signals
        verdict = self._exchange(first, second, weight,
                                 signals.stop.is_set() or self.clock.out_of_time(),
                                 loss is not None and not math.isfinite(loss),
                                 self.state.checkpointing
                                 and signals.checkpoint_asked(self.spec.rank))
        self.ledger.add("comm_s", verdict.seconds)
        return verdict

    def average(self, weight: float, loss: float | None) -> Verdict:
        """This replica's parameters and floating buffers replaced by their sum over the ranks,
        each rank's times its ``weight`` (weights summing to 1: the weighted average), in the
        same all-reduce as the ranks' agreement on stopping, on divergence (a non-finite
        ``loss`` anywhere) and on a checkpoint. Every rank calls it at the same point of its
        loop (local SGD: once per round)."""
        return self.exchange(self.flat.params, self.flat.buffers, weight, loss)

    def average_state(self, tensor: torch.Tensor, weight: float) -> None:
        """``tensor`` (optimizer state, say momentum) replaced by its sum over the ranks, each
        rank's times its ``weight``, as :meth:`average` does the model; its time counted as the
        exchange's (``comm_s``)."""
        started = self.clock.now()
        self.group.all_reduce_(tensor.mul_(weight))
        self.ledger.add("comm_s", self.clock.now() - started)

    def step_times(self, batches: Batches, step_choice: str) -> list[float]:
        """Every rank's seconds per training step at its own batch size, the emulated slowdown
        included: a few steps of ``step_choice`` (``optim.step``; ``autograd`` for sync, whose ranks
        exchange gradients) on a throwaway copy of the model, not counted as training (on a
        virtual clock: its profile's time)."""
        train_step = build_step(step_choice, FlatModel(self._model()), self.cfg.optim, self.problem.task)
        size = min(self.spec.batch_size, self.num_examples)

        def step(i: int) -> None:
            x, y = batches.get(0, i * size % (self.num_examples - size + 1), size)
            train_step(x, y, 0.0, size)
            device_ops.synchronize(self.device)

        return self.group.gather(self.clock.step_seconds(step, self.spec, size))

    @property
    def checkpointing(self) -> bool:
        return self.state.checkpointing

    @property
    def restored_loop(self) -> dict[str, Any]:
        """The loop's own state in the checkpoint this run resumes ({} for a fresh run)."""
        return self.restored.loop if self.restored is not None else {}

    def restore(self) -> None:
        """Before the first step of a resumed run: this rank's optimizer state, counters and random
        streams as the checkpoint left them (after any speed measurement, which draws too)."""
        if self.restored is None:
            return
        restore_state(self.optimizer, self.restored.momentum, self.restored.optimizer)
        if self.restored.clock:
            self.clock.load_state_dict(self.restored.clock)
        self.ledger.row.copy_(self.restored.counters)
        restore_rng(self.restored.rng, self.device, self.augment)

    def checkpoint(self, position: int, loop: dict[str, Any]) -> WorkerState:
        """This rank's part of a checkpoint at ``position`` (the same on every rank), with the
        loop's own state; rank 0's holds the model. Answers the coordinator's request."""
        self.ledger.count_cpu()
        self.state.signals.answer_checkpoint(self.spec.rank)
        model = None
        if self.spec.rank == 0:
            model = (copied(self.flat.params), copied(self.flat.buffers))
        momentum, optimizer = saved_state(self.optimizer)
        return WorkerState(position, self.clock.now(), copied(self.ledger.row), momentum,
                           rng_state(self.device, self.augment), loop, model, optimizer,
                           self.clock.state_dict())

    def write_master(self, params: torch.Tensor, buffers: torch.Tensor) -> None:
        """Rank 0: the model to evaluate (its replica's, or the loop's own) into the
        coordinator's master (a snapshot may land during the copy and mix two consecutive
        models, as Hogwild snapshots can)."""
        if self.spec.rank == 0:
            self.state.master.params.copy_(params)
            self.state.master.buffers.copy_(buffers)

    def finish(self) -> None:
        """After the last exchange: rank 0's final publish, then every rank's exact counters."""
        if self.link is not None:
            self.ledger.add("comm_s", self.link.finish())
        self.ledger.count_cpu()
        table = torch.zeros(len(self.world), len(COUNTERS), dtype=torch.float64)
        table[self.spec.rank] = self.ledger.row
        self.ledger.publish(self.group.all_reduce_(table))
