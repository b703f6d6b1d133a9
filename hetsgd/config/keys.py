"""The words `hetsgd run` takes: each config group's choices and the composed config's dotted keys,
for the shell's completion and for the nearest valid word after a typo (``budget.second=3``,
``algo=hogbach``)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from hetsgd.config.compose import CONF_DIR, compose_run

#: The config groups an override chooses from; those with ``+`` are not in the defaults list.
GROUPS = ("algo", "devices", "dataset", "model", "logger", "+method", "+experiment")
# Hydra's "Could not override 'budget.second'." (a key that the config does not have)
_NOT_OVERRIDDEN = re.compile(r"Could not override '([^']+)'")


def group_choices(group: str) -> list[str]:
    """The configs a group offers (``algo`` -> adaptive, custom, ...), from the config tree."""
    folder = CONF_DIR / group.lstrip("+~")
    return sorted(path.stem for path in folder.glob("*.yaml")) if folder.is_dir() else []


def dotted_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """Every leaf key of ``node`` as an override names it (``budget.seconds``), unresolved."""
    keys = []
    for key in node.keys():
        child = node._get_node(key)
        path = f"{prefix}{key!s}"
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            keys += dotted_keys(child, f"{path}.")
        else:
            keys.append(path)
    return keys


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


def nearest(word: str, candidates: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The candidate closest to ``word`` (difflib's ratio, at least ``cutoff``), if any."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=cutoff)
    return close[0] if close else None


def nearest_key(key: str, keys: Iterable[str]) -> str | None:
    """The key nearest ``key``: one beside it (``budget.seconds`` for ``budget.second``), by its
    last part, else one whose whole path is nearly the same (``budget.seconds`` for
    ``budgt.seconds``). The whole path alone would find ``algo.name`` for ``algo.tauu``: they
    share their first five characters."""
    parent, _, leaf = key.rpartition(".")
    keys = [k for k in keys if k != key]
    siblings = {k.rpartition(".")[2]: k for k in keys if k.rpartition(".")[0] == parent}
    near = nearest(leaf, siblings)
    return siblings[near] if near is not None else nearest(key, keys, cutoff=0.85)


def _did_you_mean(word: str | None) -> str:
    return "" if word is None else f" (did you mean {word}?)"


def mistyped_key(exc: BaseException, arguments: Sequence[str]) -> str | None:
    """For Hydra's refusal of an override whose key the config does not have
    (``budget.second=3``): that it has none, and the nearest key it has; None for any other
    error, or where no key is near."""
    match = _NOT_OVERRIDDEN.search(str(exc))
    if match is None:
        return None
    key = match.group(1)
    near = nearest_key(key, config_keys(arguments))
    return None if near is None else f"the config has no key {key}{_did_you_mean(near)}"


def unknown_keys_hint(unknown: Sequence[str], config: DictConfig) -> str:
    """The same for keys added with ``+`` that no schema has (``+budget.second=3``)."""
    known = [key for key in dotted_keys(config) if key not in unknown]
    near = [near for key in unknown if (near := nearest_key(key, known)) is not None]
    return _did_you_mean(", ".join(near) if near else None)


def missing_config(exc: MissingConfigException) -> str:
    """A group choice that does not exist (``algo=hogbach``), the nearest one, and the others."""
    options = list(exc.options or [])
    chosen = str(exc.missing_cfg_file).rpartition("/")[2]
    return (f"no config '{exc.missing_cfg_file}'" + _did_you_mean(nearest(chosen, options)) +
            (f": choose one of {', '.join(options)}" if options else ""))
