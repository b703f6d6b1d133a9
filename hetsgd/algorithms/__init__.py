"""The algorithms, by config name.

Each algorithm module provides ``plan(cfg, specs) -> specs``, which picks the workers it trains
on and rejects layouts it cannot run with a one-line ``UserError``, and
``coordinator(cfg, specs, problem, data, master, on_tick)``, which returns the
:class:`hetsgd.engine.Coordinator` that runs its workers.
"""

from __future__ import annotations

from types import ModuleType

from hetsgd.algorithms import adaptive, hogbatch, hogwild, local_sgd, sync
from hetsgd.errors import UserError

ALGORITHMS: dict[str, ModuleType] = {"sync": sync, "hogwild": hogwild, "hogbatch": hogbatch,
                                     "adaptive": adaptive, "local_sgd": local_sgd}


def get(name: str) -> ModuleType:
    if name not in ALGORITHMS:
        raise UserError(f"unknown algorithm '{name}': choose one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]
