"""The algorithms, by config name or by ``_target_``. Each module provides the
:class:`~.base.Algorithm` interface: ``plan`` (workers and derived values) and ``hooks`` (what an
engine runs them with); a user's own comes in by ``algo=custom algo._target_=...``
(:mod:`.plugin`), and is written against :mod:`.api`.

This is the one place an algorithm is found: from the run's config, by the runner (and a
torchrun follower, from rank 0's plan).
"""

from __future__ import annotations

import dataclasses

from hetsgd.algorithms import adaptive, hogbatch, hogwild, local_sgd, sync
from hetsgd.algorithms.base import Algorithm, Plan
from hetsgd.algorithms.plugin import Plugin, settings_of
from hetsgd.config import RunConfig
from hetsgd.config.algorithms import CustomAlgoConfig
from hetsgd.config.checks import ConfigError
from hetsgd.errors import UserError

ALGORITHMS: dict[str, Algorithm] = {m.NAME: m for m in (sync, hogwild, hogbatch, adaptive,
                                                        local_sgd)}


def get(name: str) -> Algorithm:
    """A built-in algorithm by its config name."""
    if name not in ALGORITHMS:
        raise UserError(f"unknown algorithm '{name}': choose one of {', '.join(ALGORITHMS)}, "
                        "or custom (+ algo._target_)")
    return ALGORITHMS[name]


def choose(cfg: RunConfig) -> tuple[Algorithm, RunConfig]:
    """The run's algorithm, and ``cfg`` with the algorithm's own typed settings (a custom one's
    ``CONFIG``; a built-in's config is typed already). Checkpoints are refused in one line for
    an algorithm that does not declare ``CHECKPOINTS``."""
    if not isinstance(cfg.algo, CustomAlgoConfig):
        algorithm: Algorithm = get(cfg.algo.name)
    else:
        plugin = Plugin.load(cfg.algo._target_)
        cfg = dataclasses.replace(cfg, algo=plugin.typed(cfg.algo))
        algorithm = plugin
    if cfg.checkpoint.every_s is not None and not getattr(algorithm, "CHECKPOINTS", False):
        checkpointing = ", ".join(name for name, m in ALGORITHMS.items()
                                  if getattr(m, "CHECKPOINTS", False))
        raise ConfigError(f"checkpoint.every_s={cfg.checkpoint.every_s:g}: algo={cfg.algo.name} "
                          "does not checkpoint (an algorithm declares CHECKPOINTS = True where "
                          f"every exchange ends in a state a checkpoint keeps: {checkpointing})")
    return algorithm, cfg


def handed_off(plan: Plan, algorithm: Algorithm) -> Plan:
    """``plan`` as rank 0 hands it to torchrun's other ranks (plain data, read back with the
    schemas they know): a custom algorithm's typed settings back in the ``settings`` of a
    config naming its target."""
    return settings_of(plan, algorithm.target) if isinstance(algorithm, Plugin) else plan


def followed(plan: Plan) -> tuple[Algorithm, Plan]:
    """A plan handed off by rank 0: its algorithm, and the plan with its settings typed again."""
    algorithm, cfg = choose(plan.cfg)
    return algorithm, dataclasses.replace(plan, cfg=cfg)
