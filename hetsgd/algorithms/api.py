"""What an algorithm of your own is written against: the stable public surface, re-exported here
so that a plugin never imports an engine's internals (walk-through: docs/own_method.md).

An algorithm is a module (or any object) providing ``plan(cfg, specs) -> Plan`` and
``hooks(plan) -> Hooks``, optionally ``NAME`` (what reports call it) and ``CONFIG`` (a dataclass
subclassing :class:`AlgoConfig` that types its settings); run it with
``algo=custom algo._target_=PKG.MODULE``. Every built-in module is one, and importable here.

- The plan: :class:`Plan` (the config with every derived value settled, the workers, the values
  for summary.json), from the :class:`RunConfig` and one :class:`WorkerSpec` per worker of the
  mix. A layout the algorithm cannot run is a one-line :class:`UserError`.
- Workers on the shared master (the shared-memory engine and its virtual clock):
  :class:`SharedMemoryHooks` with a :data:`LinkFactory` (picklable: a module-level function or a
  ``functools.partial`` of one) choosing each worker's :class:`Link` (:class:`InPlace`,
  :class:`Replica`, :class:`Resident`, or :func:`default_link`), and an optional
  :class:`Controller` that steers batch sizes from the coordinator through the
  :class:`WorkerCounters` (``counters.column("updates")``, ``counters.column("batch_size")``).
- Ranks of torch.distributed (real processes, torchrun, or threads on the virtual clock):
  :class:`DistributedHooks` with a :class:`RankLoop` class. :class:`Rank` is what every rank
  has: its replica (``rank.flat.params``, ``rank.flat.buffers``), ``train_step``, its
  ``clock``, ``ledger`` and the exchanges: :meth:`Rank.average` (the weighted average of the
  parameters and floating buffers) and :meth:`Rank.exchange` (any two vectors, e.g. gradients),
  each carrying the ranks' :class:`Verdict` (stop, diverged, checkpoint) for the step or round.
  :class:`LocalSGDLoop` is a complete round-based loop to subclass (override
  :meth:`LocalSGDLoop.aggregate`), with :func:`local_sgd_summary` as its setup summary.
"""

from __future__ import annotations

from hetsgd.algorithms import adaptive, hogbatch, hogwild, local_sgd, sync
from hetsgd.algorithms.base import Algorithm, Plan
from hetsgd.algorithms.local_sgd import RankLoop as LocalSGDLoop
from hetsgd.algorithms.local_sgd import setup_summary as local_sgd_summary
from hetsgd.config import (
    AdaptiveConfig,
    AlgoConfig,
    HogbatchConfig,
    LocalSGDConfig,
    RunConfig,
    SyncConfig,
)
from hetsgd.engines.checkpoint import WorkerState
from hetsgd.engines.counters import WorkerCounters
from hetsgd.engines.distributed.exchange import Verdict
from hetsgd.engines.distributed.group import Group
from hetsgd.engines.distributed.rank import Rank, RankLoop
from hetsgd.engines.hooks import DistributedHooks, Hooks, SharedMemoryHooks
from hetsgd.engines.shared.links import InPlace, Link, LinkFactory, Replica, Resident, default_link
from hetsgd.engines.shared.state import SharedState
from hetsgd.engines.training import Controller
from hetsgd.errors import Diverged, UserError
from hetsgd.model.problem import Problem
from hetsgd.workers import WorkerSpec

__all__ = [
    "AdaptiveConfig", "AlgoConfig", "Algorithm", "Controller", "Diverged", "DistributedHooks",
    "Group", "HogbatchConfig", "Hooks", "InPlace", "Link", "LinkFactory", "LocalSGDConfig",
    "LocalSGDLoop", "Plan", "Problem", "Rank", "RankLoop", "Replica", "Resident", "RunConfig",
    "SharedMemoryHooks", "SharedState", "SyncConfig", "UserError", "Verdict", "WorkerCounters",
    "WorkerSpec", "WorkerState", "adaptive", "default_link", "hogbatch", "hogwild", "local_sgd",
    "local_sgd_summary", "sync"]
