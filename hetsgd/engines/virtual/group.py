"""A simulated torch.distributed world: ranks as threads of one process, meeting at a barrier,
each with a virtual clock.

Each rank runs the algorithm's own loop (:class:`~hetsgd.engines.ranks.loop.RankLoop`)
against a :class:`VirtualGroup`, which has the real group's collectives. A rank's clock advances
by its step's time (:class:`~.step_times.StepTimes`: the profile's, jittered) whenever it has
computed a step; a collective ends for every rank
at the latest arrival plus the collective's cost: an exchange of the model as the mix's
calibration measured it (what a round costs beyond its slowest step, at the wait of the
earliest rank), or, for rooflines, ring traffic over the slowest link, ``2 (W - 1) / W`` copies
of the model, one taking the profile's ``copy_s`` (a CPU core's copies are free). A payload
smaller than the model costs as much (latency), a larger one in proportion.

Collectives sum in rank order, and whatever the coordinator does between exchanges (snapshots,
utilization samples, progress) runs at the barrier while every rank waits. The ranks compute
one at a time, in rank order, each with global random streams of its own (:class:`Turns`), so
a simulated run does not depend on how the threads interleave, and a model that draws there
(dropout) draws what it draws on the real engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hetsgd.engines.checkpoint import restore_rng, rng_state
from hetsgd.engines.common.worker import seed_global_streams, seeded_global_streams
from hetsgd.engines.ranks.group import Group, RankLost
from hetsgd.engines.virtual.busy import BusyTime
from hetsgd.engines.virtual.step_times import StepTimes
from hetsgd.workers import WorkerSpec

# what the barrier runs while every rank waits, with the time the collective ends
OnMeeting = Callable[[float], None]


class VirtualClock:
    """A rank's virtual seconds: its step's time passes when it has computed."""

    def __init__(self, rank: int, times: StepTimes, budget_s: float | None,
                 busy: BusyTime) -> None:
        self.rank, self.times = rank, times
        self.budget_s, self.busy = budget_s, busy
        self.time = 0.0

    def now(self) -> float:
        return self.time

    def computed(self, batch_size: int) -> None:
        seconds, _ = self.times.step(batch_size)
        self.busy.compute(self.rank, self.time, self.time + seconds)
        self.time += seconds

    def out_of_time(self) -> bool:
        return self.budget_s is not None and self.time >= self.budget_s

    def step_seconds(self, step: Callable[[int], None], spec: WorkerSpec, batch_size: int
                     ) -> float:
        """The profile's, on average, without running ``step``."""
        return self.times.mean_compute_s(batch_size)

    def state_dict(self) -> dict[str, Any]:
        return {"time": self.time, "draws": self.times.draws}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Back at the checkpoint's time, the step times' stream where it was."""
        self.time = float(state["time"])
        self.times.skip(int(state["draws"]) - self.times.draws)


class Turns:
    """The ranks' threads compute one at a time, in rank order between two meetings, each with
    torch's, numpy's and Python's global random streams of its own: seeded as a real rank's
    process seeds them (the run's seed and its rank), put in place when its turn comes and
    kept when it ends. One stream shared by threads that compute at once gave each rank the
    draws the scheduler dealt it."""

    def __init__(self, world: int, seed: int) -> None:
        self.world, self.current, self.aborted = world, 0, False
        self.ready = threading.Condition()
        cpu = torch.device("cpu")
        self.streams = []
        with seeded_global_streams(seed):  # the caller's own streams put back after
            for rank in range(world):
                seed_global_streams(seed, rank, cuda=False)
                self.streams.append(rng_state(cpu, None))

    def take(self, rank: int) -> None:
        """Wait for ``rank``'s turn, then compute with its streams."""
        with self.ready:
            self.ready.wait_for(lambda: self.current == rank or self.aborted)
            if self.aborted:
                raise RankLost(f"rank {rank}: another simulated rank failed")
        restore_rng(self.streams[rank], torch.device("cpu"), None)

    def hand_on(self, rank: int) -> None:
        """``rank`` has computed up to a meeting (or its end): the next rank's turn."""
        self.streams[rank] = rng_state(torch.device("cpu"), None)
        with self.ready:
            self.current = (rank + 1) % self.world
            self.ready.notify_all()

    def abort(self) -> None:
        with self.ready:
            self.aborted = True
            self.ready.notify_all()


class Meeting:
    """Where the ranks' collectives meet: one slot per rank, reduced at a barrier."""

    def __init__(self, clocks: list[VirtualClock], model_bytes: int,
                 on_meeting: OnMeeting, seed: int = 0) -> None:
        self.clocks, self.model_bytes, self.on_meeting = clocks, model_bytes, on_meeting
        world = len(clocks)
        self.turns = Turns(world, seed)
        self.slots: list[torch.Tensor | None] = [None] * world
        self.op = dist.ReduceOp.SUM
        self.result: torch.Tensor | None = None
        self.barrier = threading.Barrier(world, action=self._reduce)
        self.go = threading.Barrier(world, action=self._start_clocks)
        self.started = False  # every rank is set up: training has begun
        self.meetings = 0  # how many collectives have ended
        self.waiting: set[int] = set()  # the ranks waiting at the barrier now
        # ring all-reduce: 2 (W - 1) / W copies of the model over the slowest link
        self.ring_s = 2 * (world - 1) / world * max(clock.times.copy_s() for clock in clocks)

    def _reduce(self) -> None:
        slots = [slot for slot in self.slots if slot is not None]
        if self.op == dist.ReduceOp.MIN:
            self.result = torch.stack(slots).amin(dim=0)
        else:
            result = slots[0].clone()
            for slot in slots[1:]:
                result.add_(slot)  # in rank order, the same every run
            self.result = result
        # a payload smaller than the model costs as much: an all-reduce that small is latency
        nbytes = slots[0].numel() * slots[0].element_size()
        ends = (max(clock.time for clock in self.clocks)
                + self._model_s() * max(1.0, nbytes / max(self.model_bytes, 1)))
        for clock in self.clocks:
            clock.time = ends
        self.meetings += 1
        if self.started:  # a setup collective's time is no training time: no duties then
            self.on_meeting(ends)

    def _model_s(self) -> float:
        """An exchange of the model: as the mix's calibration measured it at the wait of the
        earliest rank, else the ring."""
        times = [clock.time for clock in self.clocks]
        measured = [clock.times.profile.exchange_s(max(times) - min(times))
                    for clock in self.clocks]
        known = [seconds for seconds in measured if seconds is not None]
        return self.ring_s if len(known) < len(measured) else max(known)

    def _start_clocks(self) -> None:
        for clock in self.clocks:
            clock.time = 0.0
        self.started = True

    def start(self, rank: int) -> None:
        """Every rank is set up: training starts, at time 0 on every clock (the collectives of
        the setup, like a real run's, are not training time)."""
        self.turns.hand_on(rank)
        self.waiting.add(rank)
        try:
            self.go.wait()
            self.turns.take(rank)
        except threading.BrokenBarrierError:
            raise RankLost("another simulated rank failed during setup") from None
        finally:
            self.waiting.discard(rank)

    def abort(self) -> None:
        """A rank failed: release the others from the barriers and their turns (they raise
        RankLost)."""
        self.barrier.abort()
        self.go.abort()
        self.turns.abort()


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

    def all_reduce_(self, tensor: torch.Tensor,
                    op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> torch.Tensor:
        meeting = self.meeting
        meeting.slots[self.rank] = tensor.detach().to("cpu")
        meeting.op = op
        meeting.waiting.add(self.rank)
        meeting.turns.hand_on(self.rank)
        try:
            meeting.barrier.wait()
            meeting.turns.take(self.rank)
        except threading.BrokenBarrierError:
            raise RankLost(f"rank {self.rank}: another simulated rank failed") from None
        finally:
            meeting.waiting.discard(self.rank)
        assert meeting.result is not None
        tensor.copy_(meeting.result)
        return tensor

    def leave(self) -> None:
        return None
