"""The accelerator's CUDA-only pieces (engines/device_ops.py): the master page-locked in place, a
fence the host waits on, TF32, and the pipelined replica on a real GPU landing every step once.
They skip, with the reason, without CUDA; scripts/gpu_check.sh runs them (`pytest -m gpu`). The
same replica code runs on the CPU in tests/test_async.py."""

from __future__ import annotations

import pytest
import torch

from hetsgd.engines import device_ops
from hetsgd.engines.common.links import Replica
from hetsgd.workers import WorkerSpec
from tests.test_async import _state_with_master

CUDA = torch.device("cuda:0")
GPU = WorkerSpec(rank=0, group="accel", kind="cuda", device="cuda:0", threads=1, batch_size=8,
                 slowdown=1.0, accel=True)


@pytest.mark.gpu
def test_a_registered_host_tensor_is_pinned_and_an_empty_one_is_left_alone() -> None:
    host = torch.zeros(1 << 16).share_memory_()
    assert not host.is_pinned()
    unregister = device_ops.register_host(host, CUDA)
    assert host.is_pinned()
    device_ops.register_host(host, CUDA)()  # once only: a second call leaves it as it is ...
    assert host.is_pinned()  # ... and its undo undoes nothing
    empty = torch.zeros(0)
    device_ops.register_host(empty, CUDA)
    assert not empty.is_pinned()
    on_gpu = torch.ones(1 << 16, device=CUDA)
    host.copy_(on_gpu, non_blocking=True)
    fence = device_ops.Fence(CUDA)
    fence.record()
    fence.wait()
    assert float(host.sum()) == 1 << 16
    unregister()
    unregister()  # the undo runs once
    assert not host.is_pinned()


@pytest.mark.gpu
def test_tf32_is_set_for_a_gpu_and_labelled() -> None:
    try:
        device_ops.set_tf32(CUDA, True)
        assert torch.backends.cuda.matmul.allow_tf32
        assert device_ops.precision(True, [torch.device("cpu"), CUDA]) == "tf32"
    finally:
        device_ops.set_tf32(CUDA, False)
    assert not torch.backends.cuda.matmul.allow_tf32


@pytest.mark.gpu
@pytest.mark.parametrize("merge", ["delta", "overwrite"])
def test_the_replica_on_a_gpu_lands_every_step_once_and_keeps_cpu_updates_between_steps(
        merge: str) -> None:
    """The same bookkeeping as on the CPU (tests/test_async.py), with asynchronous copies from
    the page-locked master: a CPU update between two steps survives under either merge."""
    torch.manual_seed(0)
    state = _state_with_master(torch.nn.Linear(3, 1, bias=False))
    master = state.master.params
    start = master.clone()
    replica = Replica(GPU, torch.nn.Linear(3, 1, bias=False).to(CUDA), state, merge)
    assert master.is_pinned()  # registered by the replica's link
    total = torch.zeros(3)
    for i in range(50):
        step = torch.full((3,), 0.01 * (i + 1))
        replica.before_step()
        replica.flat.params.add_(step.to(CUDA))
        replica.after_step()
        total += step
        if i == 10:  # a CPU worker's update, between two of the accelerator's steps
            cpu_update = torch.tensor([0.5, -1.0, 2.0])
            master.add_(cpu_update)
            total += cpu_update
    replica.finish()
    assert not master.is_pinned()  # released at the end, before the master can be freed
    torch.testing.assert_close(master, start + total)
    torch.testing.assert_close(replica.flat.params.cpu(), start + total)
