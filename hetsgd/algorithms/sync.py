"""Synchronous data-parallel SGD.

On one worker it is the single-device baseline: plain SGD on the master model, in place on a CPU,
or resident on a GPU and published for snapshots (the shared-memory engine's own worker).

On several workers it runs on torch.distributed (see :mod:`hetsgd.engines.distributed`): every step
takes the next global batch of the epoch's order (``algo.global_batch``, by default the sum of the
workers' batch sizes; an epoch's last batch may be shorter, as with one worker) and cuts it into
one contiguous shard per rank, ``split: equal`` (as DistributedDataParallel) or ``proportional`` to
each rank's examples/s measured in a short warm-up. Each rank computes the mean-loss gradient of
its shard; the gradients are all-reduced weighted by shard size (so the result is the gradient of
the global batch's mean loss) and every replica takes the same step, with its own identical
momentum. Floating BatchNorm statistics are averaged the same way at every step (DDP instead
broadcasts rank 0's), which for the running mean equals what one worker on the global batch would
keep. The learning rate is that of the global batch size (``optim.lr_scaling``).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable
from typing import ClassVar

import torch

from hetsgd.algorithms.base import Plan
from hetsgd.config import RunConfig, SyncConfig
from hetsgd.engines.checkpoint import WorkerState
from hetsgd.engines.distributed.coordinator import per_group
from hetsgd.engines.distributed.group import Group, check_world, choose_backend
from hetsgd.engines.distributed.rank import Rank
from hetsgd.engines.hooks import DistributedHooks, Hooks, SharedMemoryHooks
from hetsgd.engines.shared.cursor import EpochCursor
from hetsgd.engines.shared.links import default_link
from hetsgd.engines.shared.state import SharedState
from hetsgd.errors import Diverged, UserError
from hetsgd.model.problem import Problem
from hetsgd.model.step import AutogradStep
from hetsgd.workers import WorkerSpec

NAME = "sync"
CONFIG = SyncConfig


def plan(cfg: RunConfig, specs: list[WorkerSpec]) -> Plan:
    """One worker: nothing to settle. Several: the global batch (by default the sum of the
    workers' batch sizes)."""
    if len(specs) == 1:
        return Plan(cfg, specs)
    check_world(specs, cfg.devices.name)
    choose_backend(cfg.dist.backend, specs)
    algo = cfg.algo
    assert isinstance(algo, SyncConfig)
    batch = algo.global_batch or sum(s.batch_size for s in specs)
    if batch < len(specs):
        raise UserError(f"algo.global_batch={batch} is smaller than the {len(specs)} workers "
                        f"of devices={cfg.devices.name}: every worker needs a share")
    cfg = dataclasses.replace(cfg, algo=dataclasses.replace(algo, global_batch=batch))
    return Plan(cfg, specs, {"global_batch": batch})


def hooks(plan: Plan) -> Hooks:
    if len(plan.workers) == 1:
        return SharedMemoryHooks(default_link)
    return DistributedHooks(RankLoop, setup_summary, publishing=plan.workers[0].accel)


def setup_summary(world: list[WorkerSpec], columns: dict[str, list[float]]) -> dict:
    """summary.json's `sync` entry: each group's share of a global batch, measured step time."""
    return {"sync": {"batch_share": per_group(world, columns["batch_share"], total=True),
                     "step_s": per_group(world, columns["step_s"])}}


def split(size: int, shares: list[float]) -> list[int]:
    """`size` examples cut in proportion to `shares` (largest remainders, ties to lower ranks),
    every rank getting at least one example while there are enough."""
    total = sum(shares)
    raw = [size * share / total for share in shares]
    sizes = [math.floor(r) for r in raw]
    by_remainder = sorted(range(len(raw)), key=lambda i: (sizes[i] - raw[i], i))
    for i in by_remainder[:size - sum(sizes)]:
        sizes[i] += 1
    if size >= len(sizes):
        for i in range(len(sizes)):
            if sizes[i] == 0:
                sizes[max(range(len(sizes)), key=sizes.__getitem__)] -= 1
                sizes[i] = 1
    return sizes


class RankLoop:
    """One rank of synchronous data-parallel SGD."""

    SETUP_COLUMNS: ClassVar[tuple[str, ...]] = ("batch_share", "step_s")

    def __init__(self, spec: WorkerSpec, world: list[WorkerSpec], cfg: RunConfig,
                 problem: Problem, state: SharedState, group: Group) -> None:
        self.rank = Rank(spec, world, cfg, problem, state, group, linked=True,
                         step_choice="autograd")
        assert isinstance(self.rank.train_step, AutogradStep)  # the gradient is all-reduced
        self.step = self.rank.train_step
        self.batches = self.rank.batches()
        assert isinstance(cfg.algo, SyncConfig) and cfg.algo.global_batch is not None, "see plan()"
        self.global_batch = cfg.algo.global_batch
        self.shares = [1.0] * len(world)
        self.step_times = [math.nan] * len(world)
        saved = self.rank.restored_loop
        if cfg.algo.split == "proportional":  # examples per second at each rank's batch size
            self.step_times = (saved["step_times"].tolist() if "step_times" in saved
                               else self.rank.step_times(self.batches, "autograd"))
            self.shares = [s.batch_size / t for s, t in zip(world, self.step_times)]
        # Every rank walks the same cursor, so all agree on every step and on the last one.
        self.cursor = EpochCursor(self.rank.num_examples, cfg.budget.epochs, threading.Lock())
        if self.rank.restored is not None:
            self.cursor.handed_out = self.rank.restored.position

    def setup(self) -> dict[str, list[float]]:
        return {"batch_share": [share / sum(self.shares) for share in self.shares],
                "step_s": self.step_times}

    def checkpoint(self) -> WorkerState:
        """After a step every replica and momentum is the same: the cursor says where we are
        (and a proportional split keeps the step times it was measured with)."""
        return self.rank.checkpoint(self.cursor.handed_out,
                                    {"step_times": torch.tensor(self.step_times)})

    def run(self, on_checkpoint: Callable[[WorkerState], None]) -> None:
        rank = self.rank
        me, n = rank.spec.rank, rank.num_examples
        rank.restore()
        while (claim := self.cursor.claim(self.global_batch)) is not None:
            epoch, start, size = claim
            sizes = split(size, self.shares)
            started = rank.clock.now()
            loss = None
            # the step's first half on this rank's shard, at the global batch's learning rate;
            # its loss is read every step, since the step's all-reduce waits for the device anyway
            if sizes[me]:
                x, y = self.batches.get(epoch, start + sum(sizes[:me]), sizes[me])
                pending = self.step.compute(x, y, epoch + start / n, size)
                loss = rank.read_loss(pending.loss)
                rank.clock.computed(sizes[me])  # the update's time counts in the profile's step
            else:
                pending = self.step.on_no_examples(epoch + start / n, size)
            computed = rank.clock.now()
            rank.spec.emulate(computed - started, rank.sleeping)
            verdict = rank.exchange(rank.flat.grads, rank.flat.buffers, sizes[me] / size, loss)
            stepped = rank.clock.now()
            self.step.land(pending)  # the all-reduced gradient, the same on every rank
            rank.ledger.step(sizes[me], computed - started + rank.clock.now() - stepped)
            if loss is not None:
                rank.ledger.record_loss(loss)
            if rank.link is not None:  # rank 0: publish when the coordinator asks
                rank.ledger.add("comm_s", rank.link.after_step())
            if verdict.diverged:
                raise Diverged(f"training loss became non-finite at epoch {epoch + start / n:.3f}")
            if verdict.stop:
                break
            if verdict.checkpoint:
                on_checkpoint(self.checkpoint())
        if rank.checkpointing:
            on_checkpoint(self.checkpoint())
