"""What an algorithm is written against, the built-ins and a user's own alike: the stable
public surface, re-exported here so that no algorithm imports an engine's internals
(walk-through: docs/own_method.md). Every built-in module (``sync``, ``hogwild``,
``hogbatch``, ``adaptive``, ``local_sgd``) imports from hetsgd only this module and the
built-ins it builds on (``tests/test_algorithm_api.py`` checks it); this module imports no
built-in, so a plugin reuses one by importing it (``from hetsgd.algorithms import local_sgd``).

An algorithm is a module (or any object) providing ``plan(cfg, specs) -> Plan`` and
``hooks(plan) -> Hooks``, optionally ``NAME`` (what reports call it), ``CONFIG`` (a dataclass
subclassing :class:`AlgoConfig` that types its settings) and ``CHECKPOINTS`` (``True`` where
every exchange ends in a state a checkpoint can keep: ``checkpoint.every_s`` and ``resume``
are refused for an algorithm that does not declare it); run it with
``algo=custom algo._target_=PKG.MODULE``.

- The plan: :class:`Plan` (the config with every derived value settled, the workers, the values
  for summary.json), from the :class:`RunConfig` and one :class:`WorkerSpec` per worker of the
  mix. A layout the algorithm cannot run is a one-line :class:`UserError`.
- Workers on the shared master (the shared-memory engine and its virtual clock):
  :class:`LinkHooks` with a :data:`LinkFactory` (picklable: a module-level function or a
  ``functools.partial`` of one) choosing each worker's :class:`Link` (the protocol; the
  built-in links :class:`InPlace`, :class:`Replica`, :class:`Resident`, or
  :func:`default_link`), and an optional :class:`Controller` that steers batch sizes from the
  coordinator through the :class:`WorkerCounters`.
- Ranks of torch.distributed (real processes, torchrun, or threads on the virtual clock):
  :class:`RankLoopHooks` with a :class:`RankLoop` subclass, which writes only its
  ``local_steps``, ``aggregate`` and ``state_dict``/``load_state_dict``; the loop owns the
  rest. :class:`Rank` is what every rank has (its replica, ``train_step``, ``clock``,
  ``ledger`` and the exchanges :meth:`Rank.average` and :meth:`Rank.exchange`, each
  returning the ranks' :class:`Verdict`). The run's optimizer (``optim``) is ``rank.optimizer``;
  an outer one (DiLoCo's) is an :class:`OuterOptimizer` built from a :class:`Target`
  (``algo.outer`` of :class:`LocalSGDConfig`, which local SGD steps after every average).
- A method's own numbers: :func:`log` (``log(name, value)``) from a link or a controller,
  :meth:`RankLoop.log` from a rank loop; :meth:`RankLoop.eval_parameters` names the model the
  run evaluates.
- Pieces the built-ins share: :func:`check_world` and :func:`choose_backend` (a rank layout's
  checks), :func:`per_group` (a per-rank column as summary.json's per-group entry),
  :class:`EpochCursor`, :class:`Batches`, :class:`AutogradStep` and :class:`Pending` (a step
  in two halves), :func:`renumber`.
"""

from __future__ import annotations

from hetsgd.algorithms.base import Algorithm, Plan
from hetsgd.config import (
    AdaptiveConfig,
    AlgoConfig,
    HogbatchConfig,
    LocalSGDConfig,
    RunConfig,
    SyncConfig,
)
from hetsgd.config.algorithms import HogwildConfig
from hetsgd.config.optim import Target
from hetsgd.engines.batches import Batches
from hetsgd.engines.checkpoint import WorkerState
from hetsgd.engines.common.cursor import EpochCursor
from hetsgd.engines.common.links import InPlace, Link, LinkFactory, Replica, Resident, default_link
from hetsgd.engines.common.state import SharedState
from hetsgd.engines.counters import WorkerCounters
from hetsgd.engines.hooks import (
    Hooks,
    LinkHooks,
    RankLoopHooks,
    SetupSummary,
    per_group,
)
from hetsgd.engines.method_log import log
from hetsgd.engines.ranks.exchange import Verdict
from hetsgd.engines.ranks.group import Group, check_world, choose_backend
from hetsgd.engines.ranks.loop import RankLoop
from hetsgd.engines.ranks.rank import Rank
from hetsgd.engines.training import Controller
from hetsgd.errors import Diverged, UserError
from hetsgd.model.optimizer import OuterOptimizer
from hetsgd.model.problem import Problem
from hetsgd.model.step import AutogradStep, Pending
from hetsgd.workers import WorkerSpec, renumber

__all__ = [
    "AdaptiveConfig", "AlgoConfig", "Algorithm", "AutogradStep", "Batches", "Controller",
    "Diverged", "EpochCursor", "Group", "HogbatchConfig", "HogwildConfig", "Hooks", "InPlace",
    "Link", "LinkFactory", "LinkHooks", "LocalSGDConfig", "OuterOptimizer", "Pending", "Plan",
    "Problem", "Rank", "RankLoop", "RankLoopHooks", "Replica", "Resident", "RunConfig",
    "SetupSummary", "SharedState", "SyncConfig", "Target", "UserError", "Verdict",
    "WorkerCounters", "WorkerSpec", "WorkerState", "check_world", "choose_backend",
    "default_link", "log", "per_group", "renumber"]
