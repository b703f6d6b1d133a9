"""Numpy views of small shared tensors, for the reads and writes of a worker's per-step loop.

Indexing a torch tensor with a scalar costs a few microseconds (a dispatcher round trip and a
0-dim tensor); the same access through a numpy view of its memory costs about a tenth of a
microsecond. A numpy array would pickle by value, though, losing the sharing: so objects handed
to spawned workers pickle the tensors only and rebuild their views on arrival.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt
import torch


class SharedViews:
    """Mixin: ``VIEWS`` maps a view attribute to the shared tensor attribute it views.

    ``_build_views`` sets the view attributes by name, so a subclass declares each one (its type
    only: the declaration assigns nothing)."""

    VIEWS: ClassVar[dict[str, str]]

    def _build_views(self) -> None:
        for view, tensor in self.VIEWS.items():
            setattr(self, view, getattr(self, tensor).numpy())

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self.VIEWS}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._build_views()


class SharedFlag(SharedViews):
    """A flag in shared memory that any process may set; reading it is one memory load (an
    ``Event`` takes a lock on every ``is_set``, and a worker checks its stop flag every step)."""

    VIEWS = {"_view": "_value"}
    _view: npt.NDArray[np.int8]  # of _value, set by _build_views

    def __init__(self) -> None:
        self._value = torch.zeros(1, dtype=torch.int8).share_memory_()
        self._build_views()

    def set(self) -> None:
        self._view[0] = 1

    def is_set(self) -> bool:
        return bool(self._view[0])
