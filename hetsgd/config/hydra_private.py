"""Every private Hydra and OmegaConf call hetsgd makes, and only here. hydra-core 1.3 has no
public way to run ``@hydra.main``'s runner on given arguments, to parse them as it does, or to
expand a basic sweep without launching it; OmegaConf 2.3 none to look at a child node without
resolving it. tests/test_hydra_private.py pins each signature, so that an upgrade that changes
one fails that one test, and checks that no other module reaches for them."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig

#: The ``_target_`` of Hydra's own sweeper, as a multirun's ``hydra.sweeper`` node names it.
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def draws_jobs(sweeper: DictConfig) -> bool:
    """Whether a multirun's ``hydra.sweeper`` draws its jobs as it runs (Optuna's), rather than
    expanding them all first as Hydra's basic sweeper does (and writes its ``multirun.yaml``)."""
    return sweeper.get("_target_") != BASIC_SWEEPER


def args_parser() -> argparse.ArgumentParser:
    """The parser ``@hydra.main`` reads ``sys.argv`` with (``-m``, ``--cfg``, ``--config-dir``,
    the overrides). Imported when called: Hydra's runner is not needed to compose a config."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


def run_hydra(parsed: argparse.Namespace, parser: argparse.ArgumentParser,
              task: Callable[[DictConfig], Any], config_dir: str, config_name: str) -> None:
    """What ``@hydra.main`` does once it has parsed ``sys.argv``: compose, then run ``task`` once
    or launch a sweep of it, with Hydra's 1.3 defaults."""
    from hydra._internal.utils import _run_hydra
    from hydra.version import setbase

    setbase("1.3")
    _run_hydra(args=parsed, args_parser=parser, task_function=task, config_path=config_dir,
               config_name=config_name)


def basic_sweep(overrides: Sequence[str]) -> list[list[str]]:
    """The overrides of each job Hydra's basic sweeper makes of ``overrides`` (swept values
    such as ``seed=0,1``), in its order, as one batch."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    jobs, = BasicSweeper.split_arguments(parsed, max_batch_size=None)
    return jobs


def present_child(node: DictConfig, key: str) -> DictConfig | None:
    """``node[key]`` where it is a mapping that is neither missing (``???``) nor None, else None;
    read without resolving interpolations (reading ``node[key]`` would resolve them)."""
    child = node._get_node(key)
    if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
        return child
    return None
