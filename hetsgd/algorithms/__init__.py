"""The algorithms, by config name. Each module provides the :class:`~.base.Algorithm`
interface: ``plan`` (workers and derived values) and ``hooks`` (what an engine runs them with).

This is the one place an algorithm is found by name: from the run's config, by the runner.
"""

from __future__ import annotations

from hetsgd.algorithms import adaptive, hogbatch, hogwild, local_sgd, sync
from hetsgd.algorithms.base import Algorithm
from hetsgd.errors import UserError

ALGORITHMS: dict[str, Algorithm] = {m.NAME: m for m in (sync, hogwild, hogbatch, adaptive,
                                                        local_sgd)}


def get(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise UserError(f"unknown algorithm '{name}': choose one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]
