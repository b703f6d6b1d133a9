"""Synchronous data-parallel SGD.

On one worker it is the single-device baseline: plain SGD on the master model, in place on a CPU,
or resident on a GPU and published for snapshots (the shared-memory engine's own worker).

On several workers it runs on torch.distributed (see :mod:`hetsgd.engines.ranks`): every step
takes the next global batch of the epoch's order (``algo.global_batch``, by default the sum of the
workers' batch sizes; an epoch's last batch may be shorter, as with one worker) and cuts it into
one contiguous shard per rank, ``split: equal`` (as DistributedDataParallel) or ``proportional`` to
each rank's examples/s measured in a short warm-up. Each rank computes the mean-loss gradient of
its shard; the gradients are all-reduced weighted by shard size (so the result is the gradient of
the global batch's mean loss, for a model without batch statistics) and every replica takes the
same step, with its own identical momentum. A BatchNorm layer normalizes each shard by its own
statistics, as under DDP, so its gradient is not one worker's on the global batch (a shard of
one row is normalized with a neighbour: ``engines/batches.py``). Floating BatchNorm statistics
are averaged the same way at every step (DDP instead broadcasts rank 0's), which for the running
mean equals what one worker on the global batch would keep. The learning rate is that of the
global batch size (``optim.lr_scaling``).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from typing import ClassVar

import torch

from hetsgd.algorithms.api import (
    AutogradStep,
    EpochCursor,
    Hooks,
    LinkHooks,
    Pending,
    Plan,
    RankLoop,
    RankLoopHooks,
    RunConfig,
    SyncConfig,
    UserError,
    Verdict,
    WorkerSpec,
    check_world,
    choose_backend,
    default_link,
    per_group,
)

NAME = "sync"
CONFIG = SyncConfig
CHECKPOINTS = True  # after every step all replicas and momenta agree


def plan(cfg: RunConfig, specs: list[WorkerSpec]) -> Plan:
    """The global batch (by default the sum of the workers' batch sizes): one worker steps on
    all of it, several split it."""
    algo = cfg.algo
    assert isinstance(algo, SyncConfig)
    if len(specs) == 1:
        if algo.global_batch is None:
            return Plan(cfg, specs)
        return Plan(cfg, [dataclasses.replace(specs[0], batch_size=algo.global_batch)],
                    {"global_batch": algo.global_batch})
    check_world(specs, cfg.devices.name)
    choose_backend(cfg.dist.backend, specs)
    batch = algo.global_batch or sum(s.batch_size for s in specs)
    if batch < len(specs):
        raise UserError(f"algo.global_batch={batch} is smaller than the {len(specs)} workers "
                        f"of devices={cfg.devices.name}: every worker needs a share")
    cfg = dataclasses.replace(cfg, algo=dataclasses.replace(algo, global_batch=batch))
    return Plan(cfg, specs, {"global_batch": batch})


def hooks(plan: Plan) -> Hooks:
    if len(plan.workers) == 1:
        return LinkHooks(default_link)
    return RankLoopHooks(SyncLoop, setup_summary, publishing=plan.workers[0].accel)


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


class SyncLoop(RankLoop):
    """One rank of synchronous data-parallel SGD: each step's gradient, computed on this rank's
    shard of the global batch, is all-reduced between the step's two halves."""

    SETUP_COLUMNS: ClassVar[tuple[str, ...]] = ("batch_share", "step_s")
    LINKED = True
    STEP = "autograd"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        rank = self.rank
        assert isinstance(rank.train_step, AutogradStep)  # the gradient is all-reduced
        self.step = rank.train_step
        self.batches = rank.batches()
        cfg, world = rank.cfg, rank.world
        assert isinstance(cfg.algo, SyncConfig) and cfg.algo.global_batch is not None, "see plan()"
        self.global_batch = cfg.algo.global_batch
        self.shares = [1.0] * len(world)
        self.step_times = [math.nan] * len(world)
        saved = rank.restored_loop
        if cfg.algo.split == "proportional":  # examples per second at each rank's batch size
            self.step_times = (saved["step_times"].tolist() if "step_times" in saved
                               else rank.step_times(self.batches, "autograd"))
            self.shares = [s.batch_size / t for s, t in zip(world, self.step_times)]
        # what this rank's steps take of a whole global batch (workers.csv's batch sizes)
        rank.ledger.starts_at(split(self.global_batch, self.shares)[rank.spec.rank])
        # Every rank walks the same cursor, so all agree on every step and on the last one.
        self.cursor = EpochCursor(rank.num_examples, cfg.budget.epochs, threading.Lock())
        self.cursor.handed_out = self.position
        self.pending: Pending | None = None
        self.size = 0  # the step's global batch; this rank's share of it is ``self.mine``
        self.mine = 0
        self.busy = 0.0  # the step's compute time so far

    def setup(self) -> dict[str, list[float]]:
        return {"batch_share": [share / sum(self.shares) for share in self.shares],
                "step_s": self.step_times}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """After a step every replica and momentum is the same: ``position`` says where we are
        (and a proportional split keeps the step times it was measured with)."""
        return {"step_times": torch.tensor(self.step_times)}

    def local_steps(self) -> bool:
        """The step's first half on this rank's shard, at the global batch's learning rate; its
        loss is read every step, since the step's all-reduce waits for the device anyway."""
        rank = self.rank
        claim = self.cursor.claim(self.global_batch)
        self.position = self.cursor.handed_out
        if claim is None:
            return False
        epoch, start, size = claim
        n, me = rank.num_examples, rank.spec.rank
        sizes = split(size, self.shares)
        self.size, self.mine, self.loss = size, sizes[me], None
        self.where = f"at epoch {epoch + start / n:.3f}"
        started = rank.clock.now()
        if sizes[me]:
            x, y = self.batches.get(epoch, start + sum(sizes[:me]), sizes[me])
            self.pending = self.step.compute(x, y, epoch + start / n, size)
            self.loss = rank.read_loss(self.pending.loss)
            rank.clock.computed(sizes[me])  # the update's time counts in the profile's step
        else:
            self.pending = self.step.on_no_examples(epoch + start / n, size)
        self.busy = rank.clock.now() - started
        self.busy += rank.spec.emulate(self.busy, rank.waiting)
        return True

    def aggregate(self) -> Verdict:
        """The gradients' weighted all-reduce, then the step's second half, the same on every
        rank."""
        rank = self.rank
        assert self.pending is not None, "local_steps() computed the step's first half"
        verdict = rank.exchange(rank.flat.grads, rank.flat.buffers, self.mine / self.size,
                                self.loss)
        stepped = rank.clock.now()
        self.step.land(self.pending)
        rank.ledger.step(self.mine, self.busy + rank.clock.now() - stepped)
        if self.loss is not None:
            rank.ledger.record_loss(self.loss)
        return verdict
