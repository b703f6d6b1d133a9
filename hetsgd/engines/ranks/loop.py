"""The rank loop: one rank of a torch.distributed algorithm, its bookkeeping owned here.

A method on ranks (sync SGD, local SGD, a plugin's DiLoCo) writes only what makes it itself, as
torchft's ``LocalSGD``/``DiLoCo`` and Lightning's ``Strategy`` do: :meth:`RankLoop.local_steps`
(this rank's work up to the next exchange) and :meth:`RankLoop.aggregate` (the exchange, which
returns the ranks' :class:`~.exchange.Verdict`), and what a checkpoint keeps of it
(:meth:`RankLoop.state_dict` / :meth:`RankLoop.load_state_dict`); optionally the model to
evaluate (:meth:`RankLoop.eval_parameters`) and numbers of its own (:meth:`RankLoop.log`). The
loop here does the rest, the same for every method, in the order that keeps every rank out of
a collective that will never come: a resumed run's restore, the round's model into the master,
the verdict's divergence, stop and checkpoint, and the final checkpoint. :meth:`RankLoop.train`
is one local step with its clocks, emulated slowdown, counters and loss reads, for methods whose steps are
whole ones.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from hetsgd.config import RunConfig
from hetsgd.engines.checkpoint import WorkerState
from hetsgd.engines.common.state import SharedState
from hetsgd.engines.method_log import check_name, check_value
from hetsgd.engines.ranks.exchange import Verdict
from hetsgd.engines.ranks.group import Group
from hetsgd.engines.ranks.rank import Rank
from hetsgd.errors import Diverged
from hetsgd.model.problem import Problem
from hetsgd.workers import WorkerSpec


class RankLoop(ABC):
    """An algorithm's loop on one rank: built on every rank after the group forms, then run.

    Class settings: ``SETUP_COLUMNS`` names what rank 0 settles at setup, one number per rank
    each (say the tau that ``tau: auto`` chose; :meth:`setup` returns them by name, for
    summary.json); ``LINKED``: rank 0's replica is the master's, reached like a lone worker's
    (in place on a host, published on request from an accelerator: sync, whose replica is the
    model after every step); otherwise rank 0 writes its replica into the master after every
    aggregation. ``STEP`` is the training step the loop asks for (``None``: the config's
    ``optim.step``; ``"autograd"`` for a loop that exchanges gradients between a step's halves).

    A subclass keeps ``position`` (the same on every rank: where a resumed run starts, say
    rounds done) and ``where`` (how a divergence names the step or round) up to date.
    """

    SETUP_COLUMNS: ClassVar[tuple[str, ...]] = ()
    LINKED: ClassVar[bool] = False
    STEP: ClassVar[str | None] = None

    @classmethod
    def step_choice(cls, cfg: RunConfig) -> str:
        """The training step this loop's ranks take: its own ``STEP``, else ``optim.step``."""
        return cls.STEP or cfg.optim.step

    def __init__(self, spec: WorkerSpec, world: list[WorkerSpec], cfg: RunConfig,
                 problem: Problem, state: SharedState, group: Group) -> None:
        self.rank = Rank(spec, world, cfg, problem, state, group, linked=self.LINKED,
                         step_choice=self.step_choice(cfg))
        self.position = self.rank.restored.position if self.rank.restored is not None else 0
        self.where = "before the first step"
        self.loss: float | None = None  # the latest loss read since the last aggregation

    # -- what a method provides ---------------------------------------------------------------

    def setup(self) -> dict[str, list[float]]:
        """Rank 0, before training: the ``SETUP_COLUMNS`` by name."""
        return {}

    @abstractmethod
    def local_steps(self) -> bool:
        """This rank's work up to the next aggregation; ``False`` where there is none left (the
        budget in epochs, counted the same way on every rank so that all end together)."""

    @abstractmethod
    def aggregate(self) -> Verdict:
        """The exchange that ends the work of :meth:`local_steps` (on every rank, once each
        time): :meth:`Rank.average` or :meth:`Rank.exchange`, whose verdict it returns. The
        replica it leaves is the model of this step or round."""

    def state_dict(self) -> dict[str, Any]:
        """This rank's own state for a checkpoint (tensors, numbers and containers of them),
        besides what every rank has (model, optimizer, counters, random streams,
        ``position``): e.g. an outer optimizer's (:class:`~hetsgd.model.optimizer.OuterOptimizer`)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 - optional
        """A resumed run's :meth:`state_dict`, before its first step. (What the loop needs while
        it is built, say measured step times, it reads from ``self.rank.restored_loop``.)"""

    def eval_parameters(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The model the run evaluates, as (flat parameters, flat buffers) on rank 0, written
        into the master after each aggregation: by default rank 0's replica; a method whose
        model is another (EASGD's centre) returns that. Not read by a ``LINKED`` loop, whose
        link publishes the replica itself."""
        return self.rank.flat.params, self.rank.flat.buffers

    def log(self, name: str, value: object) -> None:
        """Log a number of the method's own under ``name`` (convergence.csv's column of that
        name at each snapshot, summary.json's ``method_log``, the trackers' ``method/<name>``):
        rank 0's values are the run's, as its model is; every rank's are checked (a name that
        is an identifier and no built-in column, a finite value: one line if not)."""
        if self.rank.spec.rank == 0:
            self.rank.state.log.log(name, value)
        else:
            check_value(check_name(name), value)

    # -- the loop ------------------------------------------------------------------------------

    def run(self, on_checkpoint: Callable[[WorkerState], None]) -> None:
        """Train; hand ``on_checkpoint`` this rank's part after each exchange that agreed on a
        checkpoint and, with checkpoints on, at the end."""
        rank = self.rank
        if rank.restored is not None:
            self.load_state_dict(rank.restored.loop)
        rank.restore()
        while self.local_steps():
            verdict = self.aggregate()
            self.publish()
            if verdict.diverged:
                raise Diverged(f"training loss became non-finite {self.where}")
            if verdict.stop:
                break
            if verdict.checkpoint:
                on_checkpoint(self.checkpoint())
        if rank.checkpointing:
            on_checkpoint(self.checkpoint())

    def publish(self) -> None:
        """After an aggregation, the model reaches the master: rank 0's link answers a publish
        request (``LINKED``), or rank 0 writes its replica in."""
        rank = self.rank
        if rank.link is not None:
            rank.ledger.add("comm_s", rank.link.after_step())
        else:
            rank.write_master(*self.eval_parameters())

    def checkpoint(self) -> WorkerState:
        """This rank's part of a checkpoint at ``position``, with :meth:`state_dict`."""
        return self.rank.checkpoint(self.position, self.state_dict())

    def train(self, x: torch.Tensor, y: torch.Tensor, epoch: float, size: int, *,
              read: bool = False,
              per_sample: Callable[[torch.Tensor], None] | None = None) -> float | None:
        """One whole local step with its bookkeeping: the step, this rank's clock, its loss
        when due on the workers' cadence (or ``read``: a read waits for a GPU, so not every
        step), its counters and its emulated slowdown. ``per_sample`` receives the step's
        per-example losses (biased sampling's table). Returns the loss read, if any."""
        rank = self.rank
        started = rank.clock.now()
        mean, losses = rank.train_step(x, y, epoch, size, per_sample=per_sample is not None)
        if per_sample is not None and losses is not None:
            per_sample(losses)
        rank.clock.computed(size)
        value = rank.read_loss(mean) if read or rank.loss_due() else None
        busy = rank.clock.now() - started
        busy += rank.spec.emulate(busy, rank.waiting)
        rank.ledger.step(size, busy)
        if value is not None:
            self.loss = value
            rank.ledger.record_loss(value)
        return value

    @staticmethod
    def finite(loss: float | None) -> bool:
        """Whether a loss read (or none) lets the local steps go on."""
        return loss is None or math.isfinite(loss)
