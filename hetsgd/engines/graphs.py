"""A worker's whole step captured in a CUDA graph and replayed (``devices.cuda_graphs``).

A small net's step on a GPU is bound by the host: some thirty kernels launched one by one from
Python, each costing more to launch than to run. Replaying them as one captured graph launches
the step at once. ``torch.compile``'s reduce-overhead mode does not capture this step (its flat
parameters are bound through ``.data``), so the graph is captured by hand, as the PyTorch docs
describe: static input buffers, a few warm-up steps on a side stream, then the capture.

One graph per (batch size, learning rate): the learning rate is baked into the captured kernels,
and a schedule changes it only at its milestones. A key is captured at its second step in a row,
so an epoch's last, shorter chunk (of whatever size the other workers left) steps eagerly rather
than costing a capture each epoch; so do sparse batches, whose nonzero count varies. A graph
replays the step's forward, backward and update into the same tensors every time, so the step's
parameters and momentum must not move (a replica's and its SGD's never do). The warm-up steps
train, so the parameters, buffers and momentum are put back after them. Capture runs only on a
CUDA device; elsewhere (the CPU emulating an accelerator) and after a failed capture the worker
steps eagerly, said in one line. The graphed step lands in :meth:`compute` (the real engines
land at once; the virtual clock, which lands later, never graphs). The fused step's mean loss is
not captured: as its eager step's, it is computed when read, from the logits the last replay
left (a worker reads it before its next step); the autograd step's is, as its backward needs it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from hetsgd.engines import device_ops
from hetsgd.model.sgd import SGD
from hetsgd.model.step import Pending, Step

log = logging.getLogger("hetsgd")

# Steps run eagerly on a side stream before a capture (the PyTorch docs' warm-up for autograd).
WARM_UP_STEPS = 3
# Graphs a worker keeps; a key beyond them (a controller trying many batch sizes) steps eagerly.
MAX_GRAPHS = 32


def label(on: bool, simulated: bool, ranks: bool, accelerators: list[torch.device]) -> str:
    """The summary's ``cuda_graphs`` entry: ``off``, ``on`` (each CUDA accelerator captures its
    step, falling back to eager steps with a note if capture fails), or why every step is eager:
    a simulated mix, rank processes (sync, local SGD: their steps are not graphed), or no CUDA
    accelerator among ``accelerators``."""
    if not on:
        return "off"
    if simulated:
        return "eager (simulated)"
    if ranks:
        return "eager (rank processes)"
    return "on" if any(device_ops.is_cuda(d) for d in accelerators) else "eager (no CUDA)"


@dataclass
class _Graph:
    """One captured step: its graph, its static inputs, and what it computed (kept referenced,
    as a graph's outputs and any tensor it reads must stay alive)."""

    graph: torch.cuda.CUDAGraph
    x: torch.Tensor
    y: torch.Tensor
    pending: Pending


def _loss_now(captured: Pending) -> torch.Tensor:
    """The mean loss of the last replay's logits, in a tensor of its own: the next replay
    overwrites the graph's."""
    return captured.loss_of().clone()


class GraphedStep(Step):
    """``step`` run whole (computed and landed) in :meth:`compute`, replayed from a CUDA graph
    per (batch size, learning rate) where one could be captured, eagerly otherwise."""

    def __init__(self, step: Step, device: torch.device) -> None:
        self.step, self.optimizer, self.device = step, step.optimizer, device
        self.graphs: dict[tuple[int, float], _Graph] = {}
        self.eager_reason = None if device_ops.is_cuda(device) else "no CUDA"
        if self.eager_reason is not None:
            log.warning("cuda graphs: this worker computes on %s, not a CUDA device: it steps "
                        "eagerly", device)
        elif not isinstance(self.optimizer, SGD):  # a torch.optim state is not ours to restore
            self.eager_reason = "optim=torch"
            log.warning("cuda graphs: only plain SGD's step is captured (optim=sgd); this worker "
                        "steps eagerly")
        self.full = False  # MAX_GRAPHS reached, and said
        self.last_key: tuple[int, float] | None = None

    def compute(self, x: torch.Tensor, y: torch.Tensor, epoch: float, batch_size: int,
                per_sample: bool = False) -> Pending:
        key = (len(x), self.optimizer.lr(epoch, batch_size))
        repeated, self.last_key = key == self.last_key, key
        graph = self.graphs.get(key)
        if graph is None and repeated and self._may_capture(key, x, per_sample):
            graph = self._capture(key, x, y, partial(self._eager, epoch=epoch,
                                                     batch_size=batch_size))
        if graph is None:
            return self._eager(x, y, epoch, batch_size, per_sample)
        graph.x.copy_(x, non_blocking=True)
        graph.y.copy_(y, non_blocking=True)
        graph.graph.replay()
        return Pending(partial(_loss_now, graph.pending), None, key[1])

    def land(self, pending: Pending) -> None:
        """Nothing left to do: :meth:`compute` landed the step."""

    def _eager(self, x: torch.Tensor, y: torch.Tensor, epoch: float, batch_size: int,
               per_sample: bool = False) -> Pending:
        pending = self.step.compute(x, y, epoch, batch_size, per_sample)
        self.step.land(pending)
        return pending

    def _may_capture(self, key: tuple[int, float], x: torch.Tensor, per_sample: bool) -> bool:
        if self.eager_reason is not None or per_sample or x.layout != torch.strided:
            return False
        if len(self.graphs) < MAX_GRAPHS:
            return True
        if not self.full:
            log.warning("cuda graphs: %d graphs captured already; batch size %d at learning rate "
                        "%g and any other new one step eagerly", MAX_GRAPHS, *key)
            self.full = True
        return False

    def _capture(self, key: tuple[int, float], x: torch.Tensor, y: torch.Tensor,
                 run: Callable[[torch.Tensor, torch.Tensor], Pending]) -> _Graph | None:
        """Warm up, put the model back, capture; None (and eager steps from now on, said once)
        if capture fails."""
        static_x, static_y = x.clone(), y.clone()
        assert isinstance(self.optimizer, SGD)
        state = [t for t in (self.optimizer.flat.params, self.optimizer.flat.buffers,
                             self.optimizer.momentum_buffer) if t is not None]
        saved = [t.clone() for t in state]

        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(WARM_UP_STEPS):
                    run(static_x, static_y)
            torch.cuda.current_stream(self.device).wait_stream(side)
            for tensor, value in zip(state, saved):
                tensor.copy_(value)
            graph = torch.cuda.CUDAGraph()
            first = next(iter(self.graphs.values()), None)  # whose memory pool all share
            with torch.cuda.graph(graph, pool=None if first is None else first.graph.pool()):
                pending = run(static_x, static_y)
        except Exception as exc:  # any failure to capture: this worker steps eagerly
            for tensor, value in zip(state, saved):
                tensor.copy_(value)
            self.eager_reason = f"capture failed: {type(exc).__name__}"
            log.warning("cuda graphs: capturing the step of batch size %d failed (%s: %s); "
                        "this worker steps eagerly", key[0], type(exc).__name__,
                        " ".join(str(exc).split())[:200])
            return None
        self.graphs[key] = _Graph(graph, static_x, static_y, pending)
        return self.graphs[key]
