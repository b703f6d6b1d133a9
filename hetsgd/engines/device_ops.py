"""The device operations that differ between a CUDA device and the CPU standing in for one.

An accelerator worker runs the same code whether its device is a GPU or the CPU that emulates
one; only these functions branch on the device type. Their CUDA branches are the only lines of
the engines that no test reaches without a GPU (docs/how_it_works.md lists them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import psutil
import torch

log = logging.getLogger("hetsgd")


def is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


def select(device: torch.device) -> None:
    """Make ``device`` the current CUDA device of this process (collectives and new tensors)."""
    if is_cuda(device):
        torch.cuda.set_device(device)


def host_buffer(shape: torch.Size | tuple[int, ...], device: torch.device) -> torch.Tensor:
    """A host tensor that copies to and from ``device`` fast: pinned for a GPU."""
    return torch.empty(shape, pin_memory=is_cuda(device))


def host_mirror(tensor: torch.Tensor) -> torch.Tensor:
    """Where ``tensor`` is read on the host: a pinned buffer for a GPU's (fill it with
    :func:`to_host`), the tensor itself on the CPU."""
    return host_buffer(tensor.shape, tensor.device) if is_cuda(tensor.device) else tensor


def to_host(mirror: torch.Tensor, tensor: torch.Tensor) -> None:
    """Queue the copy of ``tensor`` into its :func:`host_mirror` (nothing to do on the CPU)."""
    if mirror is not tensor:
        mirror.copy_(tensor, non_blocking=True)


def register_host(tensor: torch.Tensor, device: torch.device) -> Callable[[], None]:
    """Page-lock a host tensor (the shared master) in place for ``device``'s copies: copies from
    and to it are then asynchronous and at pinned bandwidth. Only for a GPU, and not for an
    empty or already pinned tensor. Returns the undo, to call once no copy from or to the
    tensor is queued and before it is freed: memory mapped again at the same address would
    otherwise pass for pinned while the device reads the old pages (an exiting process's
    registrations end with it)."""
    if not is_cuda(device) or tensor.numel() == 0 or tensor.is_pinned():
        return _nothing
    cudart = torch.cuda.cudart()
    pointer = tensor.data_ptr()
    torch.cuda.check_error(cudart.cudaHostRegister(
        pointer, tensor.numel() * tensor.element_size(), 0))
    registered = [pointer]

    def unregister() -> None:
        """Release the lock once; a failure (a sticky CUDA error at the end) is said, not
        raised: the process's exit releases it anyway."""
        if registered:
            error = cudart.cudaHostUnregister(registered.pop())
            if error != cudart.cudaError.success:
                log.warning("could not release a page-locked host tensor: %s", error)
    return unregister


def _nothing() -> None:
    """The undo of what was not done."""


class Fence:
    """A point in ``device``'s queue that the host can wait for (a CUDA event); on the CPU
    every operation has finished when it returns, so there is nothing to record or wait for."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.event = torch.cuda.Event() if is_cuda(device) else None

    def record(self) -> None:
        if self.event is not None:
            self.event.record(torch.cuda.current_stream(self.device))

    def wait(self) -> None:
        """Block the host until the work queued before :meth:`record` is done."""
        if self.event is not None:
            self.event.synchronize()


def stage(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``, asynchronously through pinned memory on a GPU."""
    if is_cuda(device):
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def gather(source: torch.Tensor, idx: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Rows ``idx`` of a host tensor, on ``device``. For a GPU they are gathered straight into
    pinned memory and copied asynchronously: one host copy per batch, where gathering and then
    :func:`stage` makes two. The pinned block comes from torch's caching host allocator, which
    reuses it only once the copy that reads it is done."""
    rows = torch.empty((len(idx), *source.shape[1:]), dtype=source.dtype,
                       pin_memory=is_cuda(device))
    return torch.index_select(source, 0, idx, out=rows).to(device, non_blocking=True)


def free_bytes(device: torch.device) -> int:
    """Memory free on ``device`` now: the GPU's, or the host's available memory."""
    if is_cuda(device):
        return int(torch.cuda.mem_get_info(device)[0])
    return int(psutil.virtual_memory().available)


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (a step's time must include it)."""
    if is_cuda(device):
        torch.cuda.synchronize(device)


def rng_state(device: torch.device) -> torch.Tensor | None:
    """The random stream of ``device`` itself (a GPU's), for a checkpoint; None for the CPU,
    whose stream is torch's global one."""
    return torch.cuda.get_rng_state(device) if is_cuda(device) else None


def set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if is_cuda(device):
        torch.cuda.set_rng_state(state, device)


def set_tf32(device: torch.device, on: bool) -> None:
    """Let ``device``'s FP32 matmuls and convolutions run on TF32 tensor cores (``devices.tf32``).
    A CPU computes in FP32 either way."""
    if is_cuda(device):
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on


def precision(tf32: bool, devices: list[torch.device]) -> str:
    """The matmul precision a run's workers compute in: ``tf32`` only where asked for and some
    worker is a CUDA device (the summary's label), else ``fp32``."""
    return "tf32" if tf32 and any(is_cuda(d) for d in devices) else "fp32"
