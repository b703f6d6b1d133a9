"""The words `hetsgd run` takes: each config group's choices and the composed config's dotted keys,
for the shell's completion and for the nearest valid word after a typo (``budget.second=3``,
``algo=hogbach``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from hetsgd.config.compose import CONF_DIR, compose_run
from hetsgd.config.typos import did_you_mean, dotted_keys, nearest, nearest_key
from hetsgd.errors import out_of_memory

#: The config groups an override chooses from; those with ``+`` are not in the defaults list.
GROUPS = ("algo", "devices", "dataset", "model", "optim", "logger", "+method", "+experiment")
# Hydra's "Could not override 'budget.second'." (a key that the config does not have), and
# OmegaConf's refusal of a value where devices.groups holds a GroupConfig (what
# `+devices.groups.NEW=...` asks for), each with its key
_NOT_OVERRIDDEN = re.compile(r"Could not override '([^']+)'")
_NEW_GROUP = re.compile(r"Error merging override \+{1,2}(devices\.groups\.[^=]+)=.*: Invalid type "
                        r"assigned: \w+ is not a subclass of GroupConfig")


def group_choices(group: str) -> list[str]:
    """The configs a group offers (``algo`` -> adaptive, custom, ...), from the config tree."""
    folder = CONF_DIR / group.lstrip("+~")
    return sorted(path.stem for path in folder.glob("*.yaml")) if folder.is_dir() else []


def chosen_groups(arguments: Iterable[str]) -> list[str]:
    """Those of ``arguments`` that choose a config group's single config (``algo=local_sgd``):
    the keys a config has depend on them. Flags, sweeps and what does not parse are left out."""
    parser = OverridesParser.create()
    chosen = []
    for argument in arguments:
        try:
            override = parser.parse_override(argument)
        except HydraException:
            continue
        group = override.key_or_group
        if (not override.is_sweep_override() and not override.is_delete()
                and (CONF_DIR / group).is_dir() and group != "hydra"):
            chosen.append(argument)
    return chosen


def composed(arguments: Sequence[str]) -> DictConfig | None:
    """The config that the group choices among ``arguments`` compose (the defaults where they
    do not compose; None where neither does)."""
    for overrides in (chosen_groups(arguments), []):
        try:
            return compose_run(overrides)
        except (HydraException, OmegaConfBaseException, OSError):
            continue
    return None


def config_keys(arguments: Sequence[str]) -> list[str]:
    """The dotted keys of :func:`composed`'s config."""
    config = composed(arguments)
    return [] if config is None else dotted_keys(config)


def mistyped_key(message: str, arguments: Sequence[str]) -> str | None:
    """For the refusal of an override whose key the config does not have (Hydra's of
    ``budget.second=3``, OmegaConf's of ``+devices.groups.cpuu.count=1``): that it has none and
    the nearest key it has; for a device group no key is near, how to add one; None for any
    other error, or where no key is near."""
    match = _NOT_OVERRIDDEN.search(message) or _NEW_GROUP.search(message)
    if match is None:
        return None
    key = match.group(1)
    if (near := nearest_key(key, config_keys(arguments))) is not None:
        return f"the config has no key {key}{did_you_mean(near)}"
    if key.startswith("devices.groups."):
        return (f"{key}: a device group cannot be added by an override (OmegaConf cannot type a "
                "new entry of devices.groups); write the mix in DIR/devices/NAME.yaml "
                "(`defaults: [MIX, _self_]`, MIX the mix it extends, `name: NAME`, then its "
                "`groups:`) and give --config-dir DIR devices=NAME (docs/devices.md)")
    return None


def missing_config(exc: MissingConfigException) -> str:
    """A group choice that does not exist (``algo=hogbach``), the nearest one, and the others."""
    options = list(exc.options or [])
    chosen = str(exc.missing_cfg_file).rpartition("/")[2]
    return (f"no config '{exc.missing_cfg_file}'" + did_you_mean(nearest(chosen, options)) +
            (f": choose one of {', '.join(options)}" if options else ""))


def composition_error(exc: Exception, arguments: Sequence[str] = ()) -> str:
    """What a bad override among ``arguments`` did, with its cause and the nearest valid key, or
    that memory ran out. Hydra raises some errors without a message (an assertion deep in its
    defaults list, e.g. for `algo=${x}`): those still get a line that says what failed; a group
    choice that does not exist is :func:`missing_config`'s line."""
    if isinstance(exc, MissingConfigException):
        return missing_config(exc)
    if (memory := out_of_memory(exc)) is not None:  # not the overrides' fault
        return memory
    message = str(exc) or f"the overrides cannot be composed into a config ({type(exc).__name__})"
    message += f": {exc.__cause__}" if exc.__cause__ is not None else ""
    unquoted = next((a for a in arguments if "=" in a.split("=", 1)[-1] and "'" not in a
                     and '"' not in a), None) if "mismatched input '='" in message else None
    if unquoted is not None:  # a path with `=` in it, such as a sweep job's folder (1_seed=1)
        key, value = unquoted.split("=", 1)
        return f"{message}; a value holding '=' is quoted: {key}='{value}'"
    return mistyped_key(message, arguments) or message
