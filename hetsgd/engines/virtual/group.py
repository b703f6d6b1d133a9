"""A simulated torch.distributed world: ranks as threads of one process, meeting at a barrier,
each with a virtual clock.

Each rank runs the algorithm's own loop (:class:`~hetsgd.engines.distributed.rank.RankLoop`)
against a :class:`VirtualGroup`, which has the real group's collectives. A rank's clock advances
by its device profile's time whenever it has computed a step; a collective ends for every rank
at the latest arrival plus the collective's cost, ring all-reduce traffic over the slowest
link: ``2 (W - 1) / W`` copies of the payload, a copy of the model taking the profile's
``copy_s``. (A CPU's profile copies for free: ranks on one host meet in its memory.)

Collectives sum in rank order, and whatever the coordinator does between exchanges (snapshots,
utilization samples, progress) runs at the barrier while every rank waits, so a simulated run
does not depend on how the threads interleave.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
import torch.distributed as dist

from hetsgd.devices import WorkerSpec
from hetsgd.engines.distributed.group import Group, RankLost
from hetsgd.engines.virtual.busy import BusyTime
from hetsgd.engines.virtual.profiles import DeviceProfile

# what the barrier runs while every rank waits, with the time the collective ends
OnMeeting = Callable[[float], None]


class VirtualClock:
    """A rank's virtual seconds: its profile's compute time passes when it has computed."""

    def __init__(self, rank: int, profile: DeviceProfile, slowdown: float, budget_s: float | None,
                 busy: BusyTime) -> None:
        self.rank, self.profile, self.slowdown = rank, profile, slowdown
        self.budget_s, self.busy = budget_s, busy
        self.time = 0.0

    def now(self) -> float:
        return self.time

    def computed(self, batch_size: int) -> None:
        seconds = self.profile.compute_s(batch_size) * self.slowdown
        self.busy.compute(self.rank, self.time, self.time + seconds)
        self.time += seconds

    def out_of_time(self) -> bool:
        return self.budget_s is not None and self.time >= self.budget_s

    def step_seconds(self, step: Callable[[int], None], spec: WorkerSpec, batch_size: int
                     ) -> float:
        """The profile's, without running ``step``."""
        return self.profile.compute_s(batch_size) * self.slowdown


class Meeting:
    """Where the ranks' collectives meet: one slot per rank, reduced at a barrier."""

    def __init__(self, clocks: list[VirtualClock], model_bytes: int,
                 on_meeting: OnMeeting) -> None:
        self.clocks, self.model_bytes, self.on_meeting = clocks, model_bytes, on_meeting
        world = len(clocks)
        self.slots: list[torch.Tensor | None] = [None] * world
        self.op = dist.ReduceOp.SUM
        self.result: torch.Tensor | None = None
        self.barrier = threading.Barrier(world, action=self._reduce)
        # ring all-reduce: every rank sends and receives 2 (W - 1) / W payloads, over the slowest link
        self.copy_s = max(clock.profile.copy_s() * clock.slowdown for clock in clocks)
        self.traffic = 2 * (world - 1) / world

    def _reduce(self) -> None:
        slots = [slot for slot in self.slots if slot is not None]
        if self.op == dist.ReduceOp.MIN:
            self.result = torch.stack(slots).amin(dim=0)
        else:
            result = slots[0].clone()
            for slot in slots[1:]:
                result.add_(slot)  # in rank order, the same every run
            self.result = result
        nbytes = slots[0].numel() * slots[0].element_size()
        ends = (max(clock.time for clock in self.clocks)
                + self.traffic * self.copy_s * nbytes / max(self.model_bytes, 1))
        for clock in self.clocks:
            clock.time = ends
        self.on_meeting(ends)

    def abort(self) -> None:
        """A rank failed: release the others from the barrier (they raise RankLost)."""
        self.barrier.abort()


class VirtualGroup(Group):
    """One rank's membership in a simulated world (the real :class:`Group`'s collectives)."""

    def __init__(self, rank: int, meeting: Meeting) -> None:  # noqa: D107 - no process group
        self.rank, self.world_size = rank, len(meeting.clocks)
        self.meeting = meeting
        self.clock = meeting.clocks[rank]
        self.device = torch.device("cpu")
        self.pinned = False
        self.timeout_s = 0.0
        self.backend = "virtual"

    def all_reduce_(self, tensor: torch.Tensor, op: dist.ReduceOp = dist.ReduceOp.SUM
                    ) -> torch.Tensor:
        meeting = self.meeting
        meeting.slots[self.rank] = tensor.detach().to("cpu")
        meeting.op = op
        try:
            meeting.barrier.wait()
        except threading.BrokenBarrierError:
            raise RankLost(f"rank {self.rank}: another simulated rank failed") from None
        assert meeting.result is not None
        tensor.copy_(meeting.result)
        return tensor

    def leave(self) -> None:
        return None
