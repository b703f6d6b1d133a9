"""The epoch cursor: free workers claim the next chunk of the current epoch from it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from hetsgd.engines.common.numpy_views import SharedViews

# How often a worker that waits for the lock says it is alive, and checks whether training ended.
WAIT_S = 0.1


class Lock(Protocol):
    """A lock of the engine's context: a process's (``multiprocessing``) or a thread's."""

    def acquire(self, blocking: bool = ..., timeout: float = ..., /) -> bool: ...

    def release(self) -> None: ...


class EpochCursor(SharedViews):
    """Hands out the next chunk of the current epoch to whichever worker asks first.

    One epoch is N examples consumed by all workers together; a chunk never crosses an epoch
    boundary, so the last chunk of an epoch may be shorter than the asking worker's batch. The
    budget in examples (``epochs * N``) ends the hand-out.

    The cursor also numbers its claims, under the same lock: a worker reads the count, without
    the lock, when its step has landed, and the claims since its own are the steps the other
    workers began meanwhile, its staleness as the shared-memory workers measure it
    (:meth:`~.worker.Worker.run`).

    A worker that waits for the lock says so every :data:`WAIT_S` (it waits, it is not hung):
    one stopped inside the lock holds up every other at its next claim, and the coordinator's
    watch is to blame that one alone. The waiting ones give up when training ends.
    """

    VIEWS = {"_handed": "_state", "_claims": "_claimed"}
    _handed: npt.NDArray[np.int64]  # of _state, set by _build_views
    _claims: npt.NDArray[np.int64]  # of _claimed

    def __init__(self, num_examples: int, epochs: float | None,
                 lock: Lock) -> None:
        self.num_examples = num_examples
        self.total = math.inf if epochs is None else round(epochs * num_examples)
        self._state = torch.zeros(1, dtype=torch.int64).share_memory_()  # examples handed out
        self._claimed = torch.zeros(1, dtype=torch.int64).share_memory_()  # claims so far
        self._lock = lock
        self._build_views()

    @property
    def handed_out(self) -> int:
        """Examples handed out so far: where a checkpoint resumes the hand-out."""
        return int(self._handed[0])

    @handed_out.setter
    def handed_out(self, examples: int) -> None:
        self._handed[0] = examples

    @property
    def claims(self) -> int:
        """Claims so far, read without the lock (one aligned 8-byte load: never torn)."""
        return int(self._claims[0])

    def claim(self, batch_size: int) -> tuple[int, int, int] | None:
        """Returns (epoch, start within the epoch's order, size), or None when the budget is spent."""
        numbered = self.claim_numbered(batch_size)
        return None if numbered is None else numbered[:3]

    def claim_numbered(self, batch_size: int, waiting: Callable[[], bool] | None = None
                       ) -> tuple[int, int, int, int] | None:
        """:meth:`claim`, and the claim's number (1 for the first: :attr:`claims` just after it).
        ``waiting`` is called every :data:`WAIT_S` while another worker holds the lock (a
        heartbeat); where it returns True (training has ended) the claim gives up: None."""
        if not self._acquire(waiting):
            return None
        try:
            handed = int(self._handed[0])
            if handed >= self.total:
                return None
            epoch, start = divmod(handed, self.num_examples)
            size = int(min(batch_size, self.num_examples - start, self.total - handed))
            self._handed[0] = handed + size
            number = int(self._claims[0]) + 1
            self._claims[0] = number
        finally:
            self._lock.release()
        return epoch, start, size, number

    def _acquire(self, waiting: Callable[[], bool] | None) -> bool:
        if waiting is None:
            return self._lock.acquire()
        while not self._lock.acquire(True, WAIT_S):
            if waiting():
                return False
        return True
