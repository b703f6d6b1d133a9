"""The device operations that differ between a CUDA device and the CPU standing in for one.

An accelerator worker runs the same code whether its device is a GPU or the CPU that emulates
one; only these functions branch on the device type. Their CUDA branches are the only lines of
the engines that no test reaches without a GPU (docs/how_it_works.md lists them).
"""

from __future__ import annotations

import psutil
import torch


def is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


def select(device: torch.device) -> None:
    """Make ``device`` the current CUDA device of this process (collectives and new tensors)."""
    if is_cuda(device):
        torch.cuda.set_device(device)


def host_buffer(shape: torch.Size | tuple[int, ...], device: torch.device) -> torch.Tensor:
    """A host tensor that copies to and from ``device`` fast: pinned for a GPU."""
    return torch.empty(shape, pin_memory=is_cuda(device))


def stage(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``, asynchronously through pinned memory on a GPU."""
    if is_cuda(device):
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


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
