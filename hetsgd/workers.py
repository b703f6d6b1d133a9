"""Device mixes: the worker list a mix expands into, one :class:`WorkerSpec` per process, if
this machine has the GPUs and the memory for them.

GPUs are counted through NVML (:mod:`hetsgd.machine`), never through CUDA, so the coordinator
process stays free of a CUDA context (only workers create one).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from hetsgd.config import DevicesConfig
from hetsgd.errors import UserError
from hetsgd.machine import available_memory, cuda_devices

EMULATION_SLICE_S = 0.05  # an emulated worker notices the end of training this soon
# The memory a worker process takes of its own (its proportional set size: the data and master in
# shared memory count once, outside it), measured with psutil on the development machine (AMD
# EPYC, torch 2.13 CPU build): a spawned process that imported torch and the engine takes 176 MiB
# idle, 256 MiB as a Hogwild worker or a local SGD rank training the default MLP on digits, 300 MiB
# with mlp_paper. A lower bound: a larger model adds its copies, a CUDA worker its CUDA context.
WORKER_BYTES = 256 << 20


@dataclass(frozen=True)
class WorkerSpec:
    """One worker process: where it runs and how it trains."""

    rank: int
    group: str
    kind: str  # cpu | cuda: the device type it computes on (its label says more)
    device: str  # "cpu" or "cuda:<i>"
    threads: int
    batch_size: int
    slowdown: float
    accel: bool  # trains a replica and merges it (the GPU's path), else updates the master in place
    # on the virtual clock: its math runs on this machine's CPU, its time comes from its profile
    # (scaled by ``slowdown``), and it never sleeps
    simulated: bool = False

    @property
    def emulated(self) -> bool:
        """A CPU worker standing in for an accelerator, or one slowed down on purpose."""
        return not self.simulated and (self.slowdown > 1.0 or (self.accel and self.kind == "cpu"))

    def emulate(self, compute_s: float, stopped: Callable[[], bool] | None = None) -> float:
        """An emulated slow device: sleep (slowdown - 1) x the compute time just spent, in
        slices, so that a long sleep ends as soon as ``stopped()`` says training has. Returns
        the seconds slept: the slow device's step took them too, and its time split counts them
        where the simulated device's counts its slowdown."""
        if not self.emulated or self.slowdown <= 1.0:
            return 0.0
        began = time.perf_counter()
        deadline = began + (self.slowdown - 1.0) * compute_s
        while (left := deadline - time.perf_counter()) > 0:
            if stopped is not None and stopped():
                break
            time.sleep(min(left, EMULATION_SLICE_S))
        return time.perf_counter() - began

    @property
    def label(self) -> str:
        """What tables and plots call the worker: its ``kind``, unless it is simulated or
        emulated, which every result must say."""
        return "simulated" if self.simulated else "emulated" if self.emulated else self.kind


def expand(mix: DevicesConfig) -> list[WorkerSpec]:
    """The workers of a mix, ranked in group order; CUDA where there is none is an error,
    except in a simulated mix, whose workers all compute on this machine's CPU."""
    gpus = [] if mix.simulated else cuda_devices()
    specs: list[WorkerSpec] = []
    for group_name, group in mix.groups.items():
        if mix.only and group_name not in mix.only:
            continue
        for i in range(group.count):
            if group.kind == "cuda" and not mix.simulated:
                index = group.index + i
                if index >= len(gpus):
                    raise UserError(
                        f"devices={mix.name} asks for cuda:{index} in group '{group_name}', but "
                        f"{'no CUDA GPU is' if not gpus else f'only {len(gpus)} CUDA GPU(s) are'} "
                        "available here (try devices=cpu or devices=emulated)")
                device = f"cuda:{index}"
            else:
                device = "cpu"
            specs.append(WorkerSpec(len(specs), group_name, group.kind, device, group.threads,
                                    group.batch_size, group.slowdown, group.accel,
                                    mix.simulated))
    check_memory(mix, len(specs))
    return specs


def check_memory(mix: DevicesConfig, workers: int) -> None:
    """Refuse a mix whose worker processes cannot fit in the memory available here at
    :data:`WORKER_BYTES` each: they would start, then swap or be killed by the kernel mid-run.
    A simulated mix's workers are objects of one process (256 of them add about 20 MiB), and
    ``devices.memory_check=false`` trusts the user over the estimate."""
    if mix.simulated or not mix.memory_check:
        return
    needed, available = workers * WORKER_BYTES, available_memory()
    if needed > available:
        raise UserError(
            f"devices={mix.name} starts {workers} worker processes, about {needed / 2**30:.1f} "
            f"GiB at {WORKER_BYTES >> 20} MiB each, but {available / 2**30:.1f} GiB of memory is "
            f"available here: at most {available // WORKER_BYTES} fit (lower "
            "devices.groups.<group>.count, or set devices.memory_check=false to start them anyway)")


def renumber(specs: list[WorkerSpec]) -> list[WorkerSpec]:
    """The same workers ranked 0..n-1 (after an algorithm leaves some out)."""
    return [dataclasses.replace(spec, rank=rank) for rank, spec in enumerate(specs)]
