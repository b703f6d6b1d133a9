"""The algorithms, by config name. Each module says which worker layouts it accepts (``check``);
the engine that runs the workers is shared by the asynchronous family and single-worker sync."""

from __future__ import annotations

from types import ModuleType

from hetsgd.algorithms import sync
from hetsgd.errors import UserError

ALGORITHMS: dict[str, ModuleType] = {"sync": sync}


def get(name: str) -> ModuleType:
    if name not in ALGORITHMS:
        raise UserError(f"unknown algorithm '{name}': choose one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]
