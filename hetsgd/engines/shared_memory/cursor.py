"""The epoch cursor: free workers claim the next chunk of the current epoch from it."""

from __future__ import annotations

import math
from contextlib import AbstractContextManager

import numpy as np
import numpy.typing as npt
import torch

from hetsgd.engines.shared_memory.numpy_views import SharedViews


class EpochCursor(SharedViews):
    """Hands out the next chunk of the current epoch to whichever worker asks first.

    One epoch is N examples consumed by all workers together; a chunk never crosses an epoch
    boundary, so the last chunk of an epoch may be shorter than the asking worker's batch. The
    budget in examples (``epochs * N``) ends the hand-out.
    """

    VIEWS = {"_handed": "_state"}
    _handed: npt.NDArray[np.int64]  # of _state, set by _build_views

    def __init__(self, num_examples: int, epochs: float | None,
                 lock: AbstractContextManager[bool]) -> None:
        self.num_examples = num_examples
        self.total = math.inf if epochs is None else round(epochs * num_examples)
        self._state = torch.zeros(1, dtype=torch.int64).share_memory_()  # examples handed out
        self._lock = lock
        self._build_views()

    @property
    def handed_out(self) -> int:
        """Examples handed out so far: where a checkpoint resumes the hand-out."""
        return int(self._handed[0])

    @handed_out.setter
    def handed_out(self, examples: int) -> None:
        self._handed[0] = examples

    def claim(self, batch_size: int) -> tuple[int, int, int] | None:
        """Returns (epoch, start within the epoch's order, size), or None when the budget is spent."""
        with self._lock:
            handed = int(self._handed[0])
            if handed >= self.total:
                return None
            epoch, start = divmod(handed, self.num_examples)
            size = int(min(batch_size, self.num_examples - start, self.total - handed))
            self._handed[0] = handed + size
        return epoch, start, size
