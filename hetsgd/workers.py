"""Worker processes of the shared-master engine: claim a chunk, take an SGD step, count it.

A worker reaches the master model in one of three ways (its "link"):

- ``InPlace``: the model's parameters *are* the master in shared memory; each step updates it
  lock-free (Hogwild). Host workers of the asynchronous family, and the single-device CPU baseline.
- ``Replica``: the accelerator's path in Hogbatch: copy the master in before each batch, merge the
  result back after it (``delta`` or ``overwrite``). Runs on a CPU too (the emulated ``accel``).
- ``Resident``: the model lives on the worker's device and is copied into the master only when the
  coordinator asks for a snapshot, and at the end. The single-device GPU baseline.

The loop reads top to bottom: claim -> gather -> copy in -> step -> merge -> count -> (emulated)
sleep. The batch size is re-read every step, so a controller (Adaptive Hogbatch) can change it.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from hetsgd.config import OptimConfig, RunConfig
from hetsgd.devices import WorkerSpec
from hetsgd.flat import FlatModel
from hetsgd.losses import loss_fn
from hetsgd.shared import CounterRow, Problem, SharedData, SharedState


class Diverged(Exception):
    """The training loss became NaN or infinite."""


class SGD:
    """Plain SGD on flat vectors, the same arithmetic as ``torch.optim.SGD`` (no dampening,
    no Nesterov), with the learning-rate schedule and batch-size scaling of the config."""

    def __init__(self, optim: OptimConfig, flat: FlatModel) -> None:
        self.cfg = optim
        self.flat = flat
        self.momentum_buffer = torch.zeros_like(flat.params) if optim.momentum > 0 else None

    def lr(self, epoch: float, batch_size: int) -> float:
        lr = self.cfg.lr * self.cfg.lr_decay ** sum(epoch >= m for m in self.cfg.milestones)
        ratio = batch_size / self.cfg.base_batch
        if self.cfg.lr_scaling == "linear":
            lr *= ratio
        elif self.cfg.lr_scaling == "sqrt":
            lr *= math.sqrt(ratio)
        return lr

    def step(self, epoch: float, batch_size: int) -> None:
        grads = self.flat.grads
        if self.cfg.weight_decay:
            grads.add_(self.flat.params, alpha=self.cfg.weight_decay)
        if self.momentum_buffer is not None:
            grads = self.momentum_buffer.mul_(self.cfg.momentum).add_(grads)
        self.flat.params.add_(grads, alpha=-self.lr(epoch, batch_size))


class Batches:
    """Rows of the current epoch's order, on the worker's device.

    A GPU worker copies the whole training set to its device once when ``data.on_device`` allows
    (``auto``: when it takes under half the free device memory); otherwise each batch is gathered
    on the host and sent through pinned memory.
    """

    def __init__(self, data: SharedData, device: torch.device, shuffle: bool, seed: int,
                 on_device: str) -> None:
        self.device = device
        self.shuffle = shuffle
        self.seed = seed
        self.n = data.num_examples
        resident = device.type == "cpu" or on_device == "always" or (
            on_device == "auto" and data.nbytes < 0.5 * torch.cuda.mem_get_info(device)[0])
        self.x = data.x.to(device) if resident else data.x
        self.y = data.y.to(device) if resident else data.y
        self.stream = not resident
        self._order_epoch = -1
        self._order = torch.arange(self.n)

    def order(self, epoch: int) -> torch.Tensor:
        """The seeded permutation of an epoch; the same in every worker, file order if unshuffled."""
        if self.shuffle and epoch != self._order_epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order = torch.randperm(self.n, generator=generator)
            self._order_epoch = epoch
        return self._order

    def get(self, epoch: int, start: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.order(epoch)[start:start + size]
        if not self.stream:
            idx = idx.to(self.device, non_blocking=True)
        x, y = self.x.rows(idx), self.y.index_select(0, idx)
        if self.stream:
            x = x.pin_memory().to(self.device, non_blocking=True)
            y = y.pin_memory().to(self.device, non_blocking=True)
        return x, y


class InPlace:
    """Parameters are views of the shared master: every step lands in it directly."""

    def __init__(self, module: torch.nn.Module, state: SharedState) -> None:
        self.flat = FlatModel(module, state.master.params, state.master.buffers)

    def before_step(self) -> float:
        return 0.0

    def after_step(self) -> float:
        return 0.0

    def finish(self) -> float:
        return 0.0


class Resident:
    """A private copy on the worker's device, published into the master on request."""

    def __init__(self, module: torch.nn.Module, state: SharedState) -> None:
        self.flat = FlatModel(module)
        self.flat.load_(state.master.params.to(self.flat.params.device),
                        state.master.buffers.to(self.flat.params.device))
        self.state = state

    def before_step(self) -> float:
        return 0.0

    def publish(self) -> float:
        start = time.perf_counter()
        self.state.master.params.copy_(self.flat.params)
        self.state.master.buffers.copy_(self.flat.buffers)
        return time.perf_counter() - start

    def after_step(self) -> float:
        signals = self.state.signals
        requested = int(signals.publish_request[0])
        if requested == int(signals.publish_done[0]):
            return 0.0
        seconds = self.publish()
        signals.publish_done[0] = requested
        return seconds

    def finish(self) -> float:
        return self.publish()


class Replica:
    """A device copy refreshed from the master before each batch and merged back after it.

    ``delta`` adds the replica's own change (w_after - w_before) to the master, so CPU updates
    that landed during the batch survive; ``overwrite`` copies the replica over the master, as the
    authors' released code does, losing them. Buffers (BatchNorm statistics) are overwritten.
    """

    def __init__(self, module: torch.nn.Module, state: SharedState, merge: str) -> None:
        self.flat = FlatModel(module)
        self.master = state.master
        self.merge = merge
        device = self.flat.params.device
        self.start_params = torch.empty_like(self.flat.params)
        pin = device.type == "cuda"
        self.host_delta = torch.empty(self.flat.params.shape, pin_memory=pin)
        self.host_buffers = torch.empty(self.flat.buffers.shape, pin_memory=pin)

    def before_step(self) -> float:
        start = time.perf_counter()
        self.flat.load_(self.master.params, self.master.buffers)
        if self.merge == "delta":
            self.start_params.copy_(self.flat.params)
        return time.perf_counter() - start

    def after_step(self) -> float:
        start = time.perf_counter()
        if self.merge == "delta":
            self.host_delta.copy_(self.flat.params.sub_(self.start_params))
            self.master.params.add_(self.host_delta)  # lock-free, like every Hogwild update
        else:
            self.master.params.copy_(self.flat.params)
        self.host_buffers.copy_(self.flat.buffers)
        self.master.buffers.copy_(self.host_buffers)
        return time.perf_counter() - start

    def finish(self) -> float:
        return 0.0


Link = InPlace | Replica | Resident
# Chooses each worker's link; algorithms with a replica path pass their own. Must be picklable.
LinkFactory = Callable[[WorkerSpec, torch.nn.Module, SharedState], Link]


def default_link(spec: WorkerSpec, module: torch.nn.Module, state: SharedState) -> Link:
    """A lone worker: in place on a CPU, resident on a GPU."""
    return InPlace(module, state) if spec.device == "cpu" else Resident(module, state)


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
                               cfg.data.on_device)

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
    """Report how a worker process's body ended: done, diverged or failed (with the traceback).
    Anything is reported, so the coordinator never waits on a dead worker; a failure also stops
    the others."""
    try:
        yield
        reports.put(("done", rank, ""))
    except Diverged as exc:
        state.signals.stop.set()
        reports.put(("diverged", rank, str(exc)))
    except BaseException as exc:  # noqa: BLE001 - reported, not swallowed
        state.signals.stop.set()
        reports.put(("failed", rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
