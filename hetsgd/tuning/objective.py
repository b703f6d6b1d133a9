"""The float a run hands back to Hydra, so that Hydra's own sweepers can search hetsgd
(``hetsgd run -m hydra/sweeper=optuna 'optim.lr=tag(log,interval(1e-3,1))'``): the run's final
``objective.metric``, or NaN for a run that did not complete and learn (Optuna records a NaN
trial as failed, so a diverged lr is never its best)."""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from hetsgd.config.schema import OBJECTIVE_METRICS
from hetsgd.errors import UserError


def run_objective(cfg: DictConfig, summary: dict[str, Any]) -> float:
    """The run's objective from its summary (``final.<metric>``)."""
    metric = str(OmegaConf.select(cfg, "objective.metric", default="test_loss"))
    if summary.get("status") != "completed" or summary.get("learnt") is False:
        return math.nan
    value = (summary.get("final") or {}).get(metric)
    return float(value) if isinstance(value, (int, float)) else math.nan


def check_direction(config: DictConfig) -> None:
    """A sweeper that optimizes in a direction (Optuna's ``hydra.sweeper.direction``) must go
    the metric's way: minimizing test_acc would search for the worst lr."""
    direction = OmegaConf.select(config, "hydra.sweeper.direction", default=None)
    metric = str(OmegaConf.select(config, "objective.metric", default="test_loss"))
    if direction is None or isinstance(direction, ListConfig) or metric not in OBJECTIVE_METRICS:
        return
    wanted = "maximize" if OBJECTIVE_METRICS[metric] else "minimize"
    given = str(getattr(direction, "name", direction)).lower()
    if given != wanted:
        raise UserError(f"hydra.sweeper.direction={given} would search for the worst "
                        f"objective.metric={metric}: set hydra.sweeper.direction={wanted}")
