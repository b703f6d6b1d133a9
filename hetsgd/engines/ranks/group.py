"""torch.distributed for the synchronous family: launch mode, rendezvous, backend, timeouts.

Ranks meet in one of two ways. On one machine the coordinator picks a free port on
``dist.master_addr`` (loopback by default) and starts every rank itself; rank 0 hosts the
rendezvous (``tcp://``). Across machines ``torchrun`` starts one ``hetsgd run`` per rank on every
node; its environment says so, and the ranks meet through torchrun's store (``env://``).

Either way the rendezvous and every collective give up after ``dist.timeout_s``, and a collective
that fails (a peer died, or timed out) raises :class:`RankLost` with one clear line, so a dead
rank ends the run with an error instead of a hang.
"""

from __future__ import annotations

import dataclasses
import errno
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

from hetsgd.config import DistConfig, RunConfig
from hetsgd.engines import device_ops
from hetsgd.engines.ranks.clock import RankClock, WallClock
from hetsgd.engines.ranks.torchrun import torchrun
from hetsgd.errors import UserError
from hetsgd.workers import WorkerSpec


class RankLost(RuntimeError):
    """A collective failed: another rank died, or did not answer within dist.timeout_s."""


def free_port(addr: str) -> int:
    """A TCP port that is free on `addr` now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        _bind(sock, addr, 0)
        return int(sock.getsockname()[1])


def check_port(cfg: DistConfig) -> None:
    """A port the user chose for the ranks started here must be free: rank 0 could not host the
    rendezvous there, and the others would retry connecting until ``dist.timeout_s``."""
    assert cfg.master_port is not None, "a port the user chose"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store's own socket
        _bind(sock, cfg.master_addr, cfg.master_port)


def _bind(sock: socket.socket, addr: str, port: int) -> None:
    """``sock`` bound to ``addr`` and ``port`` (0: any free one); an address this machine cannot
    take (not one of its own, or a name that does not resolve), or a chosen port it cannot, is
    a one-line UserError naming the setting."""
    try:
        sock.bind((addr, port))
    except socket.gaierror as exc:
        raise UserError(f"dist.master_addr={addr} does not resolve ({exc.strerror or exc}): "
                        "give an address of this machine (the ranks started here meet there)"
                        ) from exc
    except OSError as exc:
        reason = exc.strerror or exc
        if exc.errno == errno.EADDRNOTAVAIL:
            raise UserError(f"dist.master_addr={addr} is not an address of this machine "
                            f"({reason}): give one of its own (the ranks started here meet "
                            "there)") from exc
        if not port:
            raise
        raise UserError(f"dist.master_port={port} on {addr} cannot host the ranks' rendezvous "
                        f"({reason}): free it, or set dist.master_port=null for a free one"
                        ) from exc


def with_free_port(cfg: RunConfig) -> RunConfig:
    """``cfg`` with a free port on ``dist.master_addr`` where ``dist.master_port`` is null: where
    the ranks started on this machine meet."""
    if cfg.dist.master_port is not None:
        return cfg
    port = free_port(cfg.dist.master_addr)
    return dataclasses.replace(cfg, dist=dataclasses.replace(cfg.dist, master_port=port))


def choose_backend(requested: str, specs: list[WorkerSpec]) -> str:
    """NCCL when every rank is a GPU (or when asked), else gloo; impossible choices are errors.
    A simulated world meets in this process's memory (``virtual``), whatever is asked."""
    if any(spec.simulated for spec in specs):
        return "virtual"
    all_gpus = all(spec.kind == "cuda" for spec in specs)
    if requested == "nccl" and not all_gpus:
        raise UserError("dist.backend=nccl needs every rank on a GPU; this mix has CPU ranks "
                        "(use dist.backend=auto or gloo)")
    backend = "nccl" if requested == "nccl" or (requested == "auto" and all_gpus) else "gloo"
    if backend == "nccl" and not dist.is_nccl_available():
        raise UserError("this torch build has no NCCL: use dist.backend=gloo")
    return backend


def check_world(specs: list[WorkerSpec], devices_name: str) -> None:
    """Under torchrun, the mix must name exactly one worker per torchrun rank."""
    launch = torchrun()
    if launch is not None and launch.world_size != len(specs):
        raise UserError(f"torchrun started {launch.world_size} rank(s), but devices={devices_name} "
                        f"has {len(specs)} worker(s): they must match (rank r takes worker r)")


class Group:
    """This rank's membership in the world. Collectives run on the backend's device: the GPU for
    NCCL, host memory for gloo (a GPU rank's tensors are copied through it). ``clock`` is where
    the rank's time comes from: the wall clock here (a simulated world's group has a virtual
    one)."""

    clock: RankClock

    def __init__(self, cfg: DistConfig, rank: int, specs: list[WorkerSpec]) -> None:
        self.rank, self.world_size = rank, len(specs)
        self.clock = WallClock()
        self.timeout_s = cfg.timeout_s
        self.backend = choose_backend(cfg.backend, specs)
        device = torch.device(specs[rank].device)
        device_ops.select(device)
        self.device = device if self.backend == "nccl" else torch.device("cpu")
        self.pinned = self.backend == "gloo" and device_ops.is_cuda(device)  # GPU rank on gloo
        timeout = timedelta(seconds=cfg.timeout_s)
        if torchrun() is not None:
            dist.init_process_group(self.backend, init_method="env://", timeout=timeout)
        else:
            dist.init_process_group(
                self.backend, init_method=f"tcp://{cfg.master_addr}:{cfg.master_port}",
                rank=rank, world_size=self.world_size, timeout=timeout)

    def buffer(self, size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A buffer on the collective device (pinned host memory for a GPU rank on gloo)."""
        return torch.zeros(size, dtype=dtype, device=self.device, pin_memory=self.pinned)

    def all_reduce_(self, tensor: torch.Tensor,
                    op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        """In place, for a tensor on any device (copied through the collective device if needed)."""
        staged = tensor if tensor.device == self.device else tensor.to(self.device)
        try:
            dist.all_reduce(staged, op=op)
        except RuntimeError as exc:  # gloo and NCCL errors, timeouts included
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RankLost(f"rank {self.rank}: a collective failed (another rank died or did not "
                           f"answer within dist.timeout_s={self.timeout_s:g} s): {first}") from exc
        if staged is not tensor:
            tensor.copy_(staged)
        return tensor

    def broadcast_from_0(self, tensor: torch.Tensor) -> None:
        """Every rank gets rank 0's values (a sum in which the other ranks add zeros)."""
        if self.rank != 0:
            tensor.zero_()
        self.all_reduce_(tensor)

    def gather(self, value: float) -> list[float]:
        """Every rank's `value`, in rank order."""
        table = torch.zeros(self.world_size, dtype=torch.float64, device=self.device)
        table[self.rank] = value
        return self.all_reduce_(table).tolist()

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
