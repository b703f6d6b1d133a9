"""A worker's loop: claim a chunk, take an SGD step, count it; in a process of the asynchronous
engine (:mod:`hetsgd.engines.async_shared`), as the virtual clock's events, or calibrating.

The loop reads top to bottom: claim -> gather -> copy in -> step -> merge -> count -> (emulated)
sleep. The batch size is re-read every step, so a controller (Adaptive Hogbatch) can change it.
What a step computes is :mod:`hetsgd.model.step`; how its result reaches the master is the
worker's link (:mod:`.links`). Everything else in the loop (claiming, counting, the stop flag)
costs about a microsecond a step: shared scalars are read through numpy views, and the loss is
computed and read only a few times a second (a step leaves it to be computed when read).

A step's staleness is counted as the other workers' claims on the epoch cursor between its own
claim and its landing (the cursor numbers its claims under the lock it takes anyway; the count
is read once, without it, when the step has landed). That is the steps the others *began* while
this one ran, where the definition counts the updates they *landed* meanwhile: the two agree on
average for workers that keep stepping (each of the others' steps lands one step after it
began), but a single step may differ by up to one for each other worker (another's step begun
before this one's claim and landed during it is missed; one begun during it and landed after
it is counted), and an accelerator's replica reads the master just after its claim, a Hogwild
worker's step layer by layer while it computes.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
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
from hetsgd.engines.common.links import LinkFactory, default_link
from hetsgd.engines.common.state import SharedState
from hetsgd.engines.counters import CounterRow
from hetsgd.engines.denormals import flush_denormals
from hetsgd.engines.graphs import GraphedStep
from hetsgd.engines.method_log import bind
from hetsgd.errors import Diverged
from hetsgd.model.optimizer import copied, restore_state, saved_state
from hetsgd.model.problem import Problem
from hetsgd.model.step import Pending, Step, build_step
from hetsgd.workers import WorkerSpec

# How often a worker reads its latest mini-batch loss: reading it waits for a GPU to finish the
# step, so it is not read every step.
LOSS_READ_S = 0.1
# the key of a worker's global random streams among its run's seeded streams
GLOBAL_STREAMS = 0x610B


@dataclass
class Stale:
    """A worker's staleness so far: the sum and most of its landed steps' (the other workers'
    claims between a step's and its landing), and the claim number of a step its link has not
    landed yet (``flying``)."""

    total: int = 0
    most: int = 0
    flying: int | None = None

    def add(self, stale: int) -> None:
        self.total += stale
        self.most = max(self.most, stale)

    def stepped(self, number: int, claims: int, in_flight: bool) -> None:
        """A step of claim ``number`` was taken, ``claims`` made so far. A pipelined link (a
        replica's delta) lands a step in the next one: its staleness is read there, less that
        step's own claim."""
        if self.flying is not None:
            self.add(claims - self.flying - 1)
        self.flying = number if in_flight else None
        if not in_flight:
            self.add(claims - number)

    def landed(self, claims: int) -> None:
        """The step in flight has landed (a publish, the end) with ``claims`` made so far."""
        if self.flying is not None:
            self.add(claims - self.flying)
            self.flying = None


@dataclass
class StepRecord:
    """What one step did; handed to an optional observer (tests, traces)."""

    epoch: int
    start: int
    size: int
    loss: float


class Worker:
    """One worker's training loop. ``run`` works in-process too, which tests use."""

    def __init__(self, spec: WorkerSpec, cfg: RunConfig, problem: Problem, state: SharedState,
                 link_factory: LinkFactory | None = None) -> None:
        self.spec, self.cfg, self.state = spec, cfg, state
        bind(state.log)  # the link's log() in this process
        self.device = torch.device(spec.device)
        # cuda:1 and up: events, streams and graph captures otherwise land on cuda:0's queue
        device_ops.select(self.device)
        module = problem.build_model(cfg.model, cfg.seed).to(self.device)
        self.module = module.train()
        self.link = (link_factory or default_link)(spec, module, state)
        step = build_step(cfg.optim.step, self.link.flat, cfg.optim, problem.task)
        # an accelerator's whole step as one CUDA graph, where asked; never on the virtual clock,
        # whose steps land after they compute
        graphed = cfg.devices.cuda_graphs and spec.accel and not spec.simulated
        self.train_step: Step = GraphedStep(step, self.device) if graphed else step
        self.batches = Batches(state.data, self.device, cfg.data.shuffle, cfg.seed,
                               cfg.data.on_device,
                               training_augment(cfg.data, problem, cfg.seed, spec.rank),
                               min_rows(module))
        if state.restored is not None:
            self._restore(state.restored[spec.rank])

    def begin(self, epoch: int, start: int, size: int) -> tuple[Pending, float]:
        """The first half of a step on a chunk of the epoch's order: the batch, the copy in
        (a replica's), the step computed from the model as it is now. Returns the pending
        update and the seconds spent copying."""
        x, y = self.batches.get(epoch, start, size)
        comm = self.link.before_step()
        return self.train_step.compute(x, y, epoch + start / self.batches.n, size), comm

    def end(self, pending: Pending) -> float:
        """The second half: the update lands, and a replica merges into the master. Returns
        the seconds spent copying."""
        self.train_step.land(pending)
        return self.link.after_step()

    def step(self, epoch: int, start: int, size: int) -> tuple[Pending, float, float]:
        """One SGD step, both halves; returns (the landed step, whose loss is computed only if
        read; seconds spent copying the master in; seconds spent merging into it)."""
        pending, copy = self.begin(epoch, start, size)
        return pending, copy, self.end(pending)

    def run(self, observe: Callable[[StepRecord], None] | None = None,
            on_checkpoint: Callable[[WorkerState], None] | None = None) -> None:
        """Train until the cursor or the stop flag ends it. With ``on_checkpoint`` (and
        checkpointing on), the worker hands it its part of a checkpoint after the step that
        follows each request, and at the end."""
        state, emulate, rank = self.state, self.spec.emulate, self.spec.rank
        counters = CounterRow(state.counters.table[rank], self.spec.batch_size)
        stop, cursor = state.signals.stop, state.cursor
        waiting = partial(state.signals.waiting, rank)  # an emulated sleep or a claim beats
        checkpoints = state.signals if state.checkpointing and on_checkpoint else None
        last: Pending | None = None
        next_read = 0.0
        # kept here, written to the shared row a few times a second; a resumed run's row holds
        # the staleness before it
        stale = Stale(int(counters["stale_sum"]), int(counters["stale_max"]))
        # a link that lands steps late says so by an ``in_flight`` (asked once, not every step)
        pipelined: Any = self.link if hasattr(self.link, "in_flight") else None
        counters.start_cpu()
        while not stop.is_set():
            waited = time.perf_counter()
            claim = cursor.claim_numbered(counters.batch_size, waiting)
            started = time.perf_counter()
            if claim is None:
                break
            epoch, start, size, number = claim
            last, copy, merge = self.step(epoch, start, size)
            stepped = time.perf_counter() - started
            # an emulated device is slowdown x slower at its whole step, copies included, as
            # the simulated device's profile is
            slept = emulate(stepped, waiting)
            slowed = 1.0 + slept / stepped if slept and stepped > 0 else 1.0
            finished = started + stepped + slept
            counters.step(size, (stepped - copy - merge) * slowed, started - waited,
                          (copy + merge) * slowed, copy * slowed)
            stale.stepped(number, cursor.claims, pipelined is not None and pipelined.in_flight)
            if observe is not None:
                observe(StepRecord(epoch, start, size, float(last.loss)))
            if finished >= next_read:
                counters.staleness(stale.total, stale.most)
                counters.count_cpu()
                self.read_loss(last.loss, counters, epoch + start / self.batches.n)
                next_read = finished + LOSS_READ_S
            if checkpoints is not None and checkpoints.checkpoint_asked(rank):
                assert on_checkpoint is not None  # checkpoints is set only with on_checkpoint
                counters.add("comm_s", self.link.publish())  # the master holds every step
                stale.landed(cursor.claims)
                on_checkpoint(self.checkpoint(counters))
                checkpoints.answer_checkpoint(rank)
        counters.staleness(stale.total, stale.most)
        if last is not None:
            self.read_loss(last.loss, counters, counters["examples"] / self.batches.n)
        if checkpoints is not None:
            assert on_checkpoint is not None  # checkpoints is set only with on_checkpoint
            on_checkpoint(self.checkpoint(counters))
        counters.add("comm_s", self.link.finish())
        stale.landed(cursor.claims)
        counters.staleness(stale.total, stale.most)
        counters.count_cpu()

    def checkpoint(self, counters: CounterRow) -> WorkerState:
        """This worker's whole state between two steps: with one worker, the cursor's hand-out
        is exactly the examples it has trained on."""
        counters.count_cpu()
        flat = self.link.flat
        momentum, optimizer = saved_state(self.train_step.optimizer)
        return WorkerState(self.state.cursor.handed_out, time.perf_counter(),
                           copied(counters.row), momentum,
                           rng_state(self.device, augment_generator(self.batches.augment)),
                           model=(copied(flat.params), copied(flat.buffers)),
                           optimizer=optimizer)

    def _restore(self, part: WorkerState) -> None:
        restore_state(self.train_step.optimizer, part.momentum, part.optimizer)
        restore_rng(part.rng, self.device, augment_generator(self.batches.augment))

    @staticmethod
    def read_loss(loss: torch.Tensor, counters: CounterRow, epoch: float) -> None:
        """Read a step's loss (on a GPU: wait for the device) for the progress display; a
        non-finite one ends the run. A diverged model keeps giving non-finite losses, so reading
        only every LOSS_READ_S still catches it, a fraction of a second later."""
        value = float(loss)
        if not math.isfinite(value):
            raise Diverged(f"training loss became {value} at epoch {epoch:.3f}")
        counters.record_loss(value)


def set_up_math(spec: WorkerSpec, cfg: RunConfig) -> None:
    """A worker or rank process's float mode, then its threads: torch's intra-op threads, which
    start later, inherit the mode (``devices.flush_denormal``; :mod:`hetsgd.engines.denormals`).
    Then its global random streams, which a researcher's model draws from (dropout): a process
    starts them at torch's fixed default seed, the same mask in every worker and every seed."""
    flush_denormals(cfg.devices.flush_denormal)
    device_ops.set_tf32(torch.device(spec.device), cfg.devices.tf32)
    torch.set_num_threads(spec.threads)
    seed_global_streams(cfg.seed, spec.rank)


def seed_global_streams(*key: int, cuda: bool = True) -> None:
    """torch's (its CUDA devices' too, with ``cuda``), numpy's and Python's global random
    streams, seeded from ``key`` (the run's seed, a worker's rank)."""
    seeds = np.random.SeedSequence([*key, GLOBAL_STREAMS]).generate_state(3)
    (torch.manual_seed if cuda else torch.random.default_generator.manual_seed)(int(seeds[0]))
    np.random.seed(int(seeds[1]))
    random.seed(int(seeds[2]))


@contextmanager
def seeded_global_streams(*key: int) -> Iterator[None]:
    """:func:`seed_global_streams` meanwhile, in a process that is not the run's own (the
    virtual clock's workers compute in the caller's, on its CPU): the caller's streams are put
    back after, and its CUDA devices' are left alone."""
    cpu = torch.device("cpu")
    saved = rng_state(cpu, None)
    try:
        seed_global_streams(*key, cuda=False)
        yield
    finally:
        restore_rng(saved, cpu, None)

