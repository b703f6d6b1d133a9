"""Worker processes of the shared-memory engine: claim a chunk, take an SGD step, count it.

The loop reads top to bottom: claim -> gather -> copy in -> step -> merge -> count -> (emulated)
sleep. The batch size is re-read every step, so a controller (Adaptive Hogbatch) can change it.
How the step's result reaches the master is the worker's link (:mod:`.links`).
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from hetsgd.config import RunConfig
from hetsgd.devices import WorkerSpec
from hetsgd.engines.shared_memory.batches import Batches, training_augment
from hetsgd.engines.shared_memory.counters import CounterRow
from hetsgd.engines.shared_memory.links import LinkFactory, default_link
from hetsgd.engines.shared_memory.state import SharedState
from hetsgd.errors import Diverged, UserError
from hetsgd.model.losses import loss_fn
from hetsgd.model.problem import Problem
from hetsgd.model.sgd import SGD


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
        self.device = torch.device(spec.device)
        module = problem.build_model(cfg.model, cfg.seed).to(self.device)
        self.module = module.train()
        self.link = (link_factory or default_link)(spec, module, state)
        self.sgd = SGD(cfg.optim, self.link.flat)
        self.loss = loss_fn(problem.task)
        self.batches = Batches(state.data, self.device, cfg.data.shuffle, cfg.seed,
                               cfg.data.on_device,
                               training_augment(cfg.data, problem, cfg.seed, spec.rank))

    def step(self, epoch: int, start: int, size: int) -> tuple[float, float]:
        """One SGD step on a chunk of the epoch's order; returns (loss, seconds spent copying
        to or from the master)."""
        x, y = self.batches.get(epoch, start, size)
        comm = self.link.before_step()
        self.link.flat.zero_grad()
        loss = self.loss(self.module(x), y)
        loss.backward()
        with torch.no_grad():
            self.sgd.step(epoch + start / self.batches.n, size)
        loss_value = loss.item()
        return loss_value, comm + self.link.after_step()

    def run(self, observe: Callable[[StepRecord], None] | None = None) -> None:
        state = self.state
        counters = CounterRow(state.counters.table[self.spec.rank], self.spec.batch_size)
        n = state.data.num_examples
        while not state.signals.stop.is_set():
            waited = time.perf_counter()
            claim = state.cursor.claim(int(counters["batch_size"]))
            started = time.perf_counter()
            if claim is None:
                break
            epoch, start, size = claim
            loss_value, comm = self.step(epoch, start, size)
            finished = time.perf_counter()
            counters.step(size, finished - started - comm, loss_value)
            counters.add("wait_s", started - waited)
            counters.add("comm_s", comm)
            if observe is not None:
                observe(StepRecord(epoch, start, size, loss_value))
            if not math.isfinite(loss_value):
                raise Diverged(f"training loss became {loss_value} at epoch {epoch + start / n:.3f}")
            self.spec.emulate(finished - started)
        counters.add("comm_s", self.link.finish())


def worker_process(spec: WorkerSpec, cfg: RunConfig, problem: Problem, state: SharedState,
                   reports, link_factory: LinkFactory | None = None) -> None:
    """Entry point of a spawned worker: threads first, then train, then report how it ended."""
    torch.set_num_threads(spec.threads)
    with reporting(spec.rank, state, reports):
        worker = Worker(spec, cfg, problem, state, link_factory)
        reports.put(("ready", spec.rank, ""))
        state.signals.go.wait()
        worker.run()


@contextmanager
def reporting(rank: int, state: SharedState, reports) -> Iterator[None]:
    """Report how a worker process's body ended: done, diverged or failed (with the traceback;
    a UserError, such as a setting that does not fit the data, with its one line only).
    Anything is reported, so the coordinator never waits on a dead worker; a failure also stops
    the others."""
    try:
        yield
        state.signals.retire(rank)
        reports.put(("done", rank, ""))
    except Diverged as exc:
        state.signals.retire(rank)
        state.signals.stop.set()
        reports.put(("diverged", rank, str(exc)))
    except UserError as exc:
        state.signals.retire(rank)
        state.signals.stop.set()
        reports.put(("failed", rank, str(exc)))
    except BaseException as exc:  # noqa: BLE001 - reported, not swallowed
        state.signals.retire(rank)
        state.signals.stop.set()
        reports.put(("failed", rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
