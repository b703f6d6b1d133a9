"""How a worker's step reaches the master model (its "link").

- ``InPlace``: the model's parameters *are* the master in shared memory; each step updates it
  lock-free (Hogwild). Host workers of the asynchronous family, and the single-device CPU baseline.
- ``Replica``: the accelerator's path in Hogbatch: copy the master in before each batch, merge the
  result back after it (``delta`` or ``overwrite``); ``delta`` is pipelined: a step's change lands
  in the master at the end of the next step, or when published. Runs on a CPU too (the emulated
  ``accel``).
- ``Resident``: the model lives on the worker's device and is copied into the master only when the
  coordinator asks for a snapshot, and at the end. The single-device GPU baseline.

What a step computes (the worker) is kept apart from how its result lands (the link), so an
algorithm chooses only the link of each worker (a :data:`LinkFactory`). Each link says how many
copies of the model it makes per step (``COPIES_PER_STEP``, which the virtual-clock engine times
with the device's link) and can ``publish``: bring the master up to date between two steps. A
link's ``after_step`` need not have landed its step in the master; ``publish`` and ``finish``
land every step taken (the virtual-clock engine publishes at each step's virtual end, where the
device's timing puts the merge). The contract each member keeps is :class:`Link`'s; a user's link
is checked against it when it is built (:func:`check_link`), and the shared-memory coordinator
names the member of a link that leaves its publish requests unanswered.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from hetsgd.engines import device_ops
from hetsgd.engines.common.state import SharedState
from hetsgd.errors import UserError
from hetsgd.model.flat import FlatModel
from hetsgd.workers import WorkerSpec


@runtime_checkable
class Link(Protocol):
    """How one worker's steps reach the master (``state.master``), between the worker's steps.

    A worker calls, per step: ``before_step()``, the step on ``flat``, ``after_step()``; once
    when it leaves its loop, ``finish()``. Each returns the seconds it spent copying (counted
    as the worker's ``comm_s``, not its busy time). The engines rely on each member:

    - ``flat``: the :class:`~hetsgd.model.flat.FlatModel` the worker's step trains (the
      master's own tensors for a link that steps in place, a replica's otherwise).
    - ``COPIES_PER_STEP``: how many copies of the model a step makes (0, or 2 for a replica
      copied in and merged back); the virtual clock charges each one the device's copy time.
    - ``before_step()``: make ``flat`` ready for the next step (a replica loads the master).
    - ``after_step()``: the step's result is on its way to the master as the method wants (a
      merge; a pipelined replica lands it at the end of the next step), and the worker
      **answers any publish request** raised before it (``state.signals.asked(rank)`` then
      ``state.signals.answer(rank)``) once the master holds every step it has taken: the
      coordinator waits for that answer before each snapshot of an accelerator worker (one with
      ``spec.accel``), and fails the run, naming this member, when the worker takes
      :data:`UNANSWERED_STEPS` steps without answering.
    - ``publish()``: bring the master up to date now, between two steps: every step taken
      lands (the virtual clock calls it at each step's virtual end; the shared-memory engine,
      through ``after_step``, and the worker before a checkpoint).
    - ``finish()``: the worker's last word: the master holds all its steps afterwards.
    - ``in_flight`` (optional, read after ``after_step()``): True while the step just taken has
      not landed; the worker then counts its staleness when it lands (the next step, a
      publish, the end) instead of at once.
    """

    COPIES_PER_STEP: int  # a class constant
    flat: FlatModel

    def before_step(self) -> float: ...

    def after_step(self) -> float: ...

    def publish(self) -> float: ...

    def finish(self) -> float: ...


# An accelerator worker whose link took this many steps after a publish request without
# answering it breaks the contract (a step under way when the request came answers at the next).
UNANSWERED_STEPS = 2


def check_link(link: object, spec: WorkerSpec) -> Link:
    """``link`` if it has every member of :class:`Link`, else one line naming the first it
    lacks or gets wrong (a user's link factory, before the worker's first step)."""
    name = f"the link of worker {spec.rank} ({spec.group}), a {type(link).__name__},"
    for member in ("before_step", "after_step", "publish", "finish"):
        if not callable(getattr(link, member, None)):
            raise UserError(f"{name} has no {member}() (see hetsgd.algorithms.api.Link)")
    if not isinstance(getattr(link, "flat", None), FlatModel):
        raise UserError(f"{name} has no flat: the FlatModel its steps train "
                        "(see hetsgd.algorithms.api.Link)")
    copies = getattr(link, "COPIES_PER_STEP", None)
    if not isinstance(copies, int) or isinstance(copies, bool) or copies < 0:
        raise UserError(f"{name} has COPIES_PER_STEP={copies!r}, not a count of copies "
                        "(see hetsgd.algorithms.api.Link)")
    assert isinstance(link, Link)
    return link


class InPlace:
    """Parameters are views of the shared master: every step lands in it directly."""

    COPIES_PER_STEP = 0

    def __init__(self, spec: WorkerSpec, module: torch.nn.Module, state: SharedState) -> None:
        self.flat = FlatModel(module, state.master.params, state.master.buffers)

    def before_step(self) -> float:
        return 0.0

    def after_step(self) -> float:
        return 0.0

    def publish(self) -> float:
        return 0.0  # every landed step is in the master already

    def finish(self) -> float:
        return 0.0


class Resident:
    """A private copy on the worker's device, published into the master on request."""

    COPIES_PER_STEP = 0

    def __init__(self, spec: WorkerSpec, module: torch.nn.Module, state: SharedState) -> None:
        self.flat = FlatModel(module)
        self.flat.load_(state.master.params.to(self.flat.params.device),
                        state.master.buffers.to(self.flat.params.device))
        self.rank, self.state = spec.rank, state

    def before_step(self) -> float:
        return 0.0

    def publish(self) -> float:
        start = time.perf_counter()
        self.state.master.params.copy_(self.flat.params)
        self.state.master.buffers.copy_(self.flat.buffers)
        return time.perf_counter() - start

    def after_step(self) -> float:
        signals = self.state.signals
        if not signals.asked(self.rank):
            return 0.0
        seconds = self.publish()
        signals.answer(self.rank)
        return seconds

    def finish(self) -> float:
        return self.publish()


class Replica:
    """A device copy refreshed from the master before each batch and merged back after it.

    ``delta`` adds the replica's own change (w_after - w_before) to the master, so CPU updates
    that landed during the batch survive; ``overwrite`` copies the replica over the master, as the
    authors' released code does, losing them. Buffers (BatchNorm statistics) are overwritten.

    The ``delta`` merge is pipelined: a step's change is queued to the host as the step ends and
    added into the master at the end of the *next* step, once that step's device work is queued
    (on a GPU it runs meanwhile). The replica adds the change still on its way to the master it
    has just copied in, so no parameter update is lost or counted twice, and each step lands
    exactly once. Buffers (running statistics) are not added but overwritten: while a step is
    in flight the next one keeps the replica's own, which the master would get on landing, so
    they advance in one chain through every step, as under ``overwrite``.
    The one host wait of such a step is :attr:`loaded`: the master's copy into the replica has
    finished (and, before it on the device's queue, the previous step's copy out), so the master
    may change again. ``publish`` (a snapshot's request, a checkpoint, the end) lands the change
    in flight, so the master holds every step.

    ``overwrite`` lands each step before the next copies the master in, as the authors' code
    orders it: CPU updates made between two accelerator batches reach the next batch, those made
    during one are lost. Pipelined, the next batch would start from the replica's own parameters
    and no CPU update would ever reach it, so this merge waits for its copy out instead. So does
    ``delta`` with ``pipelined=False`` (``algo.pipelined``): each step lands as it ends, one step
    fresher for the CPU workers, where nothing overlaps the landing (a CPU accelerator).
    """

    COPIES_PER_STEP = 2  # in before the batch, out after it

    def __init__(self, spec: WorkerSpec, module: torch.nn.Module, state: SharedState,
                 merge: str, pipelined: bool = True) -> None:
        self.flat = FlatModel(module)
        self.master, self.signals, self.rank = state.master, state.signals, spec.rank
        self.merge = merge
        self.lands_at_once = merge == "overwrite" or not pipelined
        device = self.flat.params.device
        # the master's one page lock in this process: this replica's, released by its finish
        self.unregister = [device_ops.register_host(shared, device)
                           for shared in (self.master.params, self.master.buffers)]
        self.start_params = torch.empty_like(self.flat.params)
        self.change = torch.empty_like(self.flat.params)  # delta: this step's, on the device
        # what lands in the master: the change (delta) or the parameters (overwrite), on the host
        self.outgoing = (device_ops.host_mirror(self.change) if merge == "delta"
                         else device_ops.host_buffer(self.flat.params.shape, device))
        self.host_buffers = device_ops.host_buffer(self.flat.buffers.shape, device)
        self.loaded, self.copied = device_ops.Fence(device), device_ops.Fence(device)
        self.in_flight = False  # a step's result is on its way to the master

    def before_step(self) -> float:
        start = time.perf_counter()
        if self.in_flight:  # delta: the master lacks the last step, whose buffers are ours
            self.flat.params.copy_(self.master.params, non_blocking=True)
            self.flat.params.add_(self.change)
        else:
            self.flat.load_(self.master.params, self.master.buffers)
        self.loaded.record()
        if self.merge == "delta":
            self.start_params.copy_(self.flat.params)
        return time.perf_counter() - start

    def after_step(self) -> float:
        """Land the last step's result and queue this one's; returns the seconds it took, not
        counting the waits for the device (a step's time, as a synchronize was before): for the
        master's copy in and, under ``overwrite``, for the step and its copy out."""
        self.loaded.wait()  # the master's copy in has finished: the last step's result may land
        start = time.perf_counter()
        self._land()
        if self.merge == "delta":
            torch.sub(self.flat.params, self.start_params, out=self.change)
            device_ops.to_host(self.outgoing, self.change)
        else:
            self.outgoing.copy_(self.flat.params, non_blocking=True)
        self.host_buffers.copy_(self.flat.buffers, non_blocking=True)
        self.copied.record()
        self.in_flight = True
        seconds = time.perf_counter() - start
        if self.lands_at_once:
            self.copied.wait()
            landing = time.perf_counter()
            self._land()
            seconds += time.perf_counter() - landing
        if self.signals.asked(self.rank):
            seconds += self.publish()
            self.signals.answer(self.rank)
        return seconds

    def _land(self) -> None:
        """Add (or copy) the result in flight into the master: lock-free, like every Hogwild
        update."""
        if not self.in_flight:
            return
        if self.merge == "delta":
            self.master.params.add_(self.outgoing)
        else:
            self.master.params.copy_(self.outgoing)
        self.master.buffers.copy_(self.host_buffers)
        self.in_flight = False

    def publish(self) -> float:
        """Land the result in flight, once its copy out has finished."""
        start = time.perf_counter()
        self.copied.wait()
        self._land()
        return time.perf_counter() - start

    def finish(self) -> float:
        """Land the last step, then release the master's page lock (no copy of it is queued:
        each step waited for its copy in)."""
        seconds = self.publish()
        for unregister in self.unregister:
            unregister()
        return seconds


# Chooses each worker's link; algorithms with a replica path pass their own. Must be picklable.
LinkFactory = Callable[[WorkerSpec, torch.nn.Module, SharedState], Link]


def default_link(spec: WorkerSpec, module: torch.nn.Module, state: SharedState) -> Link:
    """A lone worker, by role: a host steps in place on the master; an accelerator (a GPU, or
    the CPU standing in for one) keeps a resident replica and publishes it on request."""
    return Resident(spec, module, state) if spec.accel else InPlace(spec, module, state)
