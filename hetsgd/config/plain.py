"""A typed run config as plain values (JSON's: mappings, lists, strings, numbers, null), and
back: for sending a config to another process that must not unpickle what it receives.

The way back builds nothing but the schemas' own dataclasses: the algorithm, dataset, model and
optimizer schemas are looked up by class name among this package's, and every value goes through
OmegaConf's type checks and the schemas' range checks (:func:`to_run_config`), as a composed
config does. Strings are taken literally: a ``${...}`` in one is never resolved.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hetsgd.config.algorithms import ALGO_SCHEMAS, Tau
from hetsgd.config.checks import ConfigError
from hetsgd.config.compose import to_run_config
from hetsgd.config.optim import OPTIM_SCHEMAS
from hetsgd.config.problem import (
    MODEL_SCHEMAS,
    DatasetConfig,
    FilesConfig,
    FolderConfig,
    SyntheticConfig,
)
from hetsgd.config.schema import RunConfig

#: The parts of a run config whose schema depends on the choice (``algo=local_sgd``).
CHOSEN = ("algo", "dataset", "model", "optim")
SCHEMAS: dict[str, type] = {schema.__name__: schema for schema in (
    *ALGO_SCHEMAS.values(), DatasetConfig, SyntheticConfig, FilesConfig, FolderConfig,
    *MODEL_SCHEMAS.values(), *OPTIM_SCHEMAS.values())}


def plain(value: Any) -> Any:
    """``value`` (a config, a worker spec, or what they hold) as plain values; a ``Tau`` as the
    ``algo.tau`` it was parsed from."""
    if isinstance(value, Tau):
        return "auto" if value.mode == "auto" else value.steps.get("*", dict(value.steps))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"a {type(value).__name__} is not plain data")


def config_to_plain(cfg: RunConfig) -> dict[str, Any]:
    """``cfg`` as plain values, with the schema of each chosen part by name."""
    return {"schemas": {part: type(getattr(cfg, part)).__name__ for part in CHOSEN},
            "values": plain(cfg)}


def config_from_plain(data: Any) -> RunConfig:
    """The config :func:`config_to_plain` gave, checked; anything else is a
    :class:`ConfigError` saying what is wrong with it."""
    try:
        node = OmegaConf.structured(RunConfig)
        for part in CHOSEN:
            name = data["schemas"][part]
            if name not in SCHEMAS:
                raise ConfigError(f"no {part} schema is called {name!r}")
            node[part] = OmegaConf.structured(SCHEMAS[name])
        merged = OmegaConf.merge(node, _literal(data["values"]))
        assert isinstance(merged, DictConfig)  # a merge onto a mapping is a mapping
        return to_run_config(merged)
    except ConfigError:
        raise
    except (KeyError, TypeError, ValueError, OmegaConfBaseException) as err:
        raise ConfigError(f"not a run config ({type(err).__name__}: {err})".splitlines()[0]) \
            from err


def _literal(value: Any) -> Any:
    """Every string escaped for OmegaConf, so that ``${...}`` reads as those characters."""
    if isinstance(value, str):
        return value.replace("${", "\\${")
    if isinstance(value, dict):
        return {key: _literal(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_literal(item) for item in value]
    return value
