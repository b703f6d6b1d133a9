"""A user's algorithm, by ``algo=custom algo._target_=PKG.MODULE_OR_OBJECT``.

The target (resolved by :func:`hetsgd.targets.locate`, as a model's is: its longest importable
module prefix, then attributes) is a module or any object providing what a built-in module provides
(:class:`~hetsgd.algorithms.base.Algorithm`): ``plan(cfg, specs) -> Plan`` and
``hooks(plan) -> Hooks``. Three attributes are optional:

- ``NAME``: what summaries and reports call it (default: the target's last component);
- ``CONFIG``: a dataclass subclassing :class:`~hetsgd.config.algorithms.AlgoConfig` that types
  its settings (``+algo.NAME=VALUE`` or a user's YAML), built through OmegaConf's type checks and
  its own ``__post_init__``; without one, ``plan`` reads them untyped from
  ``cfg.algo.settings``;
- ``CHECKPOINTS``: ``True`` where it checkpoints (default ``False``; see
  :mod:`hetsgd.algorithms.api`).

Each built-in module declares the first two (and ``CHECKPOINTS`` where it does), so
``algo._target_=hetsgd.algorithms.hogbatch`` is Hogbatch itself. What cannot be loaded, has
the wrong shape or raises in ``plan`` or ``hooks`` is one :class:`UserError` line naming the
target, as is a link that lacks a member of the link protocol; what raises in a worker or rank
fails the run as any worker's error does. The target comes from the run's own config only: a run folder or
torchrun's store that names one is trusted only where the user's command names it too
(:mod:`hetsgd.runs.trust`).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hetsgd.algorithms.base import Plan
from hetsgd.algorithms.watched import KEY, CheckedLink, Watched, bounded_call, namespaced, naming
from hetsgd.config import AlgoConfig, RunConfig
from hetsgd.config.algorithms import CustomAlgoConfig
from hetsgd.config.checks import ConfigError
from hetsgd.config.plain import plain
from hetsgd.engines.common.links import Link, LinkFactory, check_link
from hetsgd.engines.common.state import SharedState
from hetsgd.engines.hooks import Hooks, LinkHooks, RankLoopHooks, SetupSummary
from hetsgd.errors import UserError, one_line
from hetsgd.targets import locate
from hetsgd.workers import WorkerSpec


@dataclass
class Plugin:
    """A user's algorithm, loaded and checked; an :class:`~.base.Algorithm` whose calls end in
    one line naming the target."""

    target: str
    NAME: str
    provider: Any  # the module or object that provides plan and hooks
    CONFIG: type[AlgoConfig] | None
    CHECKPOINTS: bool = False

    @classmethod
    def load(cls, target: str) -> Plugin:
        provider = locate(KEY, target)
        missing = [name for name in ("plan", "hooks") if not callable(getattr(provider, name, None))]
        if missing:
            raise UserError(f"{KEY}={target}: a {type(provider).__name__} without "
                            f"{' and '.join(missing)}; an algorithm provides plan(cfg, specs) -> "
                            "Plan and hooks(plan) -> Hooks (see hetsgd.algorithms.api)")
        name = getattr(provider, "NAME", target.rsplit(".", 1)[-1])
        if not isinstance(name, str) or not name:
            raise UserError(f"{KEY}={target}: its NAME is {name!r}, not a name")
        config = getattr(provider, "CONFIG", None)
        if config is not None and not (isinstance(config, type) and dataclasses.is_dataclass(config)
                                       and issubclass(config, AlgoConfig)):
            raise UserError(f"{KEY}={target}: its CONFIG is {config!r}, not a dataclass "
                            "subclassing hetsgd.algorithms.api.AlgoConfig")
        checkpoints = getattr(provider, "CHECKPOINTS", False)
        if not isinstance(checkpoints, bool):
            raise UserError(f"{KEY}={target}: its CHECKPOINTS is {checkpoints!r}, not True or "
                            "False")
        return cls(target, name, provider, config, checkpoints)

    def typed(self, algo: CustomAlgoConfig) -> AlgoConfig:
        """``algo``'s settings as the algorithm's own ``CONFIG`` (range checks included), named
        by its ``NAME``; untyped in ``settings`` without one."""
        if self.CONFIG is None:
            return dataclasses.replace(algo, name=self.NAME)
        declared = {f.name for f in dataclasses.fields(self.CONFIG)}
        unknown = [f"algo.{key}" for key in algo.settings if key not in declared]
        if unknown:
            raise ConfigError(f"unknown config key(s) {', '.join(unknown)}: {self.target}'s "
                              f"CONFIG ({self.CONFIG.__name__}) has no such field")
        try:
            merged = OmegaConf.merge(OmegaConf.structured(self.CONFIG),
                                     OmegaConf.create({**algo.settings, "name": self.NAME}))
            typed = OmegaConf.to_object(merged)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"algo.{exc.full_key or ''}: {one_line(str(exc).splitlines()[0])}"
                              ) from None
        assert isinstance(typed, AlgoConfig)
        return typed

    def plan(self, cfg: RunConfig, specs: list[WorkerSpec]) -> Plan:
        # on a copy: the run's config changes only as the Plan returned says (config.yaml's)
        plan = bounded_call(self.target, "its plan", cfg.workers.stall_s,
                            lambda: self.provider.plan(copy.deepcopy(cfg), list(specs)))
        if not isinstance(plan, Plan):
            raise UserError(f"{KEY}={self.target}: its plan returned a {type(plan).__name__}, "
                            "not a Plan")
        if not isinstance(plan.cfg, RunConfig):
            raise UserError(f"{KEY}={self.target}: its plan returned a Plan whose cfg is a "
                            f"{type(plan.cfg).__name__}, not a RunConfig")
        return dataclasses.replace(plan, cfg=self._checked(plan.cfg))

    def _checked(self, cfg: RunConfig) -> RunConfig:
        """The config a plan returned, through the checks the command's went through (types,
        then each schema's ranges): a plan may change any value, never to one a run refuses."""
        try:
            checked = OmegaConf.to_object(OmegaConf.structured(cfg))
        except (ConfigError, OmegaConfBaseException, ValueError, TypeError) as exc:
            key = getattr(exc, "full_key", None)
            said = one_line(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            raise UserError(f"{KEY}={self.target}: the config its plan returned is refused: "
                            f"{f'{key}: ' if key else ''}{said}") from None
        assert isinstance(checked, RunConfig)
        return checked

    def hooks(self, plan: Plan) -> Hooks:
        hooks = bounded_call(self.target, "its hooks", plan.cfg.workers.stall_s,
                         lambda: self.provider.hooks(plan))
        if isinstance(hooks, LinkHooks):  # its links are built in the workers
            controller = (None if hooks.controller is None else
                          Watched(self.target, hooks.controller, plan.cfg.workers.stall_s))
            return LinkHooks(partial(_link, self.target, hooks.link), controller)
        if not isinstance(hooks, RankLoopHooks):
            raise UserError(f"{KEY}={self.target}: its hooks returned a {type(hooks).__name__}, "
                            "not LinkHooks or RankLoopHooks")
        return dataclasses.replace(hooks, setup_summary=partial(_setup_summary, self.target,
                                                                hooks.setup_summary))


def _link(target: str, factory: LinkFactory, spec: WorkerSpec, module: torch.nn.Module,
          state: SharedState) -> Link:
    """A worker's link from the algorithm's factory, in the worker: what the factory and the
    link raise fail the run in one line naming the target, as a worker's :class:`UserError`
    does, and the seconds it reports are checked (:class:`CheckedLink`)."""
    worker = f"worker {spec.rank} ({spec.group})"
    with naming(target, f"its link for {worker}"):
        link = factory(spec, module, state)
        link = check_link(link, spec)
    return cast(Link, CheckedLink(target, worker, link))  # a Link's attributes, each checked


def settings_of(plan: Plan, target: str) -> Plan:
    """``plan`` with its algorithm's typed settings (those ``plan`` settled included) back in
    the ``settings`` of a custom config naming ``target``: what another process reads back as
    plain data with the schemas it knows (a torchrun follower), then types again."""
    algo = plan.cfg.algo
    if isinstance(algo, CustomAlgoConfig):
        return plan
    values = plain(algo)
    values.pop("name")
    untyped = CustomAlgoConfig(_target_=target, settings=values)
    return dataclasses.replace(plan, cfg=dataclasses.replace(plan.cfg, algo=untyped))


def _setup_summary(target: str, summary: SetupSummary, world: list[WorkerSpec],
                   columns: dict[str, list[float]]) -> dict:
    """A distributed algorithm's own summary entries, under ``plugin`` (:func:`namespaced`)."""
    with naming(target, "its setup_summary"):
        return namespaced(target, summary(world, columns))
