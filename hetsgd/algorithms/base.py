"""The interface every algorithm provides: a plan, then the hooks an engine runs it with.

An algorithm never starts processes or moves data itself. It settles a :class:`Plan` before any
work starts (the workers it trains on, every derived value filled into the config), then hands
an engine its hooks (:mod:`hetsgd.engines.hooks`: shared-memory workers' links and controller,
or torch.distributed ranks' loop). Which engine runs them is the engines' own choice
(:func:`hetsgd.engines.factory.build_engine`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from hetsgd.config import AlgoConfig, RunConfig
from hetsgd.engines.hooks import Hooks
from hetsgd.workers import WorkerSpec


@dataclass(frozen=True)
class Plan:
    """What an algorithm settled before training: the config with every derived value filled in
    (so no later code derives it again), the workers it trains on, and those values by name
    for summary.json's ``plan`` entry."""

    cfg: RunConfig
    workers: list[WorkerSpec]
    settled: dict[str, Any] = field(default_factory=dict)


class Algorithm(Protocol):
    """What each module of :mod:`hetsgd.algorithms` provides, and a user's algorithm too
    (:mod:`hetsgd.algorithms.plugin`, where ``NAME`` and ``CONFIG`` are optional)."""

    NAME: str  # what summaries and reports call it
    CONFIG: type[AlgoConfig] | None  # the dataclass its ``algo`` settings are typed as
    # Whether every exchange ends in a state a checkpoint keeps (its workers' parts, a rank
    # loop's ``state_dict``): ``checkpoint.every_s`` and ``resume`` need it. Optional for a
    # plugin (default False).
    CHECKPOINTS: bool

    def plan(self, cfg: RunConfig, specs: list[WorkerSpec]) -> Plan:
        """Pick the workers and settle derived values; a layout the algorithm cannot run is a
        one-line ``UserError``."""
        ...

    def hooks(self, plan: Plan) -> Hooks:
        """What the engine runs the planned workers with."""
        ...
