"""Typed configuration: the schemas that hold every default, and composition through Hydra.

The schemas are in :mod:`~hetsgd.config.schema` (one run), :mod:`~hetsgd.config.problem` (its
dataset and model), :mod:`~hetsgd.config.optim` (one per optimizer) and
:mod:`~hetsgd.config.algorithms` (one per algorithm); :mod:`~hetsgd.config.compose` turns
command-line overrides into them.
"""

from hetsgd.config.algorithms import (
    AdaptiveConfig,
    AlgoConfig,
    HogbatchConfig,
    LocalSGDConfig,
    SyncConfig,
    Tau,
)
from hetsgd.config.checks import ConfigError
from hetsgd.config.compose import CONF_DIR, compose_run, register_configs, to_run_config
from hetsgd.config.optim import OptimConfig, SGDConfig, Target, TorchOptimConfig
from hetsgd.config.problem import TASKS, DatasetConfig, ModelConfig
from hetsgd.config.schema import DevicesConfig, DistConfig, GroupConfig, RunConfig

__all__ = ["CONF_DIR", "TASKS", "AdaptiveConfig", "AlgoConfig", "ConfigError", "DatasetConfig",
           "DevicesConfig", "DistConfig", "GroupConfig", "HogbatchConfig", "LocalSGDConfig",
           "ModelConfig", "OptimConfig", "RunConfig", "SGDConfig", "SyncConfig", "Target", "Tau",
           "TorchOptimConfig", "compose_run", "register_configs", "to_run_config"]
