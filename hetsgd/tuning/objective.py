"""The float a run hands back to Hydra, so that Hydra's own sweepers can search hetsgd
(``hetsgd run -m hydra/sweeper=optuna 'optim.lr=tag(log,interval(1e-3,1))'``): the run's final
``objective.metric``, or the metric's worst value (+inf for a loss, -inf for ``test_acc``) for a
run that did not complete and learn. Optuna ranks such a trial last and searches on: it refuses
NaN (the sweep then stopped), and a failed trial would stop it too (``max_failure_rate=0``)."""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from hetsgd.config.checks import finite
from hetsgd.config.schema import OBJECTIVE_METRICS, ObjectiveConfig
from hetsgd.errors import UserError


def run_objective(cfg: DictConfig, summary: dict[str, Any] | None) -> float:
    """The run's objective from its summary (``final.<metric>``); the metric's worst value where
    the run did not complete and learn, or left no summary (None: refused as it started)."""
    metric = str(OmegaConf.select(cfg, "objective.metric", default="test_loss"))
    worst = -math.inf if OBJECTIVE_METRICS.get(metric) else math.inf
    if summary is None or summary.get("status") != "completed" or summary.get("learnt") is False:
        return worst
    value = (summary.get("final") or {}).get(metric)
    return float(value) if finite(value) else worst


def check_objective(config: DictConfig) -> None:
    """A sweep's ``objective.metric`` must be one (each job would fail on it), and a sweeper
    that optimizes in a direction (Optuna's ``hydra.sweeper.direction``) must go the metric's
    way: minimizing test_acc would search for the worst lr. Refused before any job."""
    metric = str(OmegaConf.select(config, "objective.metric", default="test_loss"))
    ObjectiveConfig(metric)  # its own check: one line naming the metrics
    direction = OmegaConf.select(config, "hydra.sweeper.direction", default=None)
    if direction is None or isinstance(direction, ListConfig):
        return
    wanted = "maximize" if OBJECTIVE_METRICS[metric] else "minimize"
    given = str(getattr(direction, "name", direction)).lower()
    if given != wanted:
        raise UserError(f"hydra.sweeper.direction={given} would search for the worst "
                        f"objective.metric={metric}: set hydra.sweeper.direction={wanted}")
