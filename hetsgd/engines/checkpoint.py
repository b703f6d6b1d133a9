"""What a checkpoint holds, and how a worker's own part of it is taken and put back.

A checkpoint is taken where every worker's state is consistent: after a step of sync SGD (every
replica equal) or after an aggregation round of local SGD (the models equal, each momentum its
own). The coordinator only asks (:class:`~hetsgd.engines.common.state.Signals`); each
worker answers at its next such point with a :class:`WorkerState`, the part only it holds: its
momentum or optimizer state, its RNG streams, its counters, its algorithm's own state, and, from
the worker that holds the model (the lone worker, rank 0), the model. The coordinator assembles
the parts of one position into a :class:`Checkpoint`, adds the snapshots taken up to then, and
has it written (:mod:`hetsgd.outputs.checkpoint`). A resumed run hands each worker its part back
before the clock starts.
"""

from __future__ import annotations

import io
import math
import random
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from hetsgd.engines import device_ops
from hetsgd.engines.counters import COUNTERS
from hetsgd.engines.snapshots import Snapshot


@dataclass
class WorkerState:
    """One worker's part of a checkpoint.

    ``position`` says where in training it was taken, the same on every worker of one
    checkpoint: examples handed out by the epoch cursor (sync) or rounds done (local SGD)."""

    position: int
    time: float  # when taken: time.perf_counter() (one clock for every process of a machine),
    # or a virtual clock's time
    counters: torch.Tensor  # the worker's row of COUNTERS
    momentum: torch.Tensor | None  # plain SGD's flat momentum buffer
    rng: dict[str, torch.Tensor]  # torch's CPU stream, the device's, the augmentation's
    loop: dict[str, Any] = field(default_factory=dict)  # the algorithm's own state
    model: tuple[torch.Tensor, torch.Tensor] | None = None  # (params, buffers), from its holder
    optimizer: dict[str, Any] = field(default_factory=dict)  # a torch optimizer's and scheduler's
    clock: dict[str, Any] = field(default_factory=dict)  # a rank's virtual clock

    def __post_init__(self) -> None:
        # a checkpoint written before the later counters existed: they start from 0
        if (missing := len(COUNTERS) - self.counters.numel()) > 0:
            self.counters = torch.cat([self.counters, self.counters.new_zeros(missing)])

    def to_bytes(self) -> bytes:
        """Serialised by value: a tensor sent through a queue would be shared with a process
        that may have exited by the time the coordinator reads it."""
        buffer = io.BytesIO()
        torch.save(self.__dict__, buffer)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> WorkerState:
        return cls(**torch.load(io.BytesIO(data), weights_only=True))


@dataclass
class Checkpoint:
    """A whole run's state at one position: what a resumed run starts from."""

    time_s: float  # training time at the checkpoint
    params: torch.Tensor
    buffers: torch.Tensor
    workers: list[WorkerState]  # by rank, without the model
    snapshots: list[Snapshot]  # those kept, taken up to time_s
    snapshot_spacing: tuple[float, float]  # Snapshots' every_s and every_epochs by then

    @property
    def position(self) -> int:
        return self.workers[0].position

    @property
    def counters(self) -> torch.Tensor:
        return torch.stack([worker.counters for worker in self.workers])

    @property
    def examples(self) -> float:
        """The examples every worker had trained on by the checkpoint."""
        return float(self.counters[:, COUNTERS.index("examples")].sum())

    def counter_rows(self) -> list[dict[str, float]]:
        """Each worker's counters by name, as the journal writes them."""
        return [dict(zip(COUNTERS, worker.counters.tolist())) for worker in self.workers]

    @classmethod
    def assemble(cls, parts: list[WorkerState], t0: float, snapshots: list[Snapshot],
                 spacing: tuple[float, float]) -> Checkpoint:
        """The checkpoint of ``parts`` (one per rank, one position; rank 0's holds the model)
        on a clock that started at ``t0``."""
        model = parts[0].model
        assert model is not None, "the model comes with rank 0's part"
        time_s = parts[0].time - t0
        return cls(time_s, *model, [replace(part, model=None) for part in parts],
                   [s for s in snapshots if s.time_s <= time_s], spacing)


def rng_state(device: torch.device, augment: torch.Generator | None) -> dict[str, torch.Tensor]:
    """Every random stream a worker draws from: torch's CPU stream, its CUDA device's, the
    generator of its training-batch augmentation, and numpy's and Python's global streams (a
    researcher's model may draw from them), as tensors."""
    state = {"cpu": torch.get_rng_state()}
    if (device_state := device_ops.rng_state(device)) is not None:
        state["device"] = device_state
    if augment is not None:
        state["augment"] = augment.get_state()
    _, keys, position, has_gauss, gauss = np.random.get_state(legacy=True)
    state["numpy"] = torch.from_numpy(np.asarray(keys, dtype=np.int64))
    state["numpy_at"] = torch.tensor([position, has_gauss, gauss], dtype=torch.float64)
    version, internal, gauss_next = random.getstate()
    state["random"] = torch.tensor([version, *internal], dtype=torch.int64)
    state["random_gauss"] = torch.tensor([math.nan if gauss_next is None else gauss_next],
                                         dtype=torch.float64)
    return state


def restore_rng(state: dict[str, torch.Tensor], device: torch.device,
                augment: torch.Generator | None) -> None:
    """Every stream of :func:`rng_state` put back; numpy's and Python's where the checkpoint
    holds them (one written before holds neither)."""
    torch.set_rng_state(state["cpu"])
    if "device" in state:
        device_ops.set_rng_state(device, state["device"])
    if augment is not None:
        augment.set_state(state["augment"])
    if "numpy" in state:
        position, has_gauss, gauss = state["numpy_at"].tolist()
        np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), int(position),
                             int(has_gauss), gauss))
    if "random" in state:
        version, *internal = state["random"].tolist()
        gauss_next = float(state["random_gauss"][0])
        random.setstate((version, tuple(internal), None if math.isnan(gauss_next) else gauss_next))


def augment_generator(augment: object) -> torch.Generator | None:
    """The generator of a worker's training-batch augmentation (None without one)."""
    return getattr(augment, "generator", None)
