"""The accelerator group's name, ``accel`` in every shipped mix, and how a run written when some
mixes (``gpu``, ``cpu+gpu``, ``gpus``, the ``paper_*`` ones) called it ``gpu`` reads back.

A run names its groups in its config, its overrides, ``summary.json`` and its CSVs; each is read
through this module (:func:`hetsgd.config.compose.rebuild_config`, :mod:`hetsgd.outputs.index`),
so that an earlier run's ``gpu`` group is the ``accel`` group of today's reports, recoveries and
resumes. A run that has a group named ``accel`` named its groups as today: they are kept.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf

#: The accelerator group of every shipped mix (``devices.groups.accel``).
ACCEL = "accel"
#: What the mixes with a CUDA group called it before.
EARLIER = "gpu"

V = TypeVar("V")

# the group a recorded override sets (``devices.groups.gpu.batch_size=256``)
_GROUP_KEY = re.compile(r"^([~+]*devices\.groups\.)([^.=]+)")
# overrides whose value names groups (``devices.only=[gpu]``, ``algo.tau={gpu:1,cpu:8}``)
_NAMING_KEYS = re.compile(r"^[~+]*(devices\.only|algo\.tau)=")
_EARLIER_IN_VALUE = re.compile(rf"(?<=[\[{{,\s]){EARLIER}(?=[\]}},:\s])")


def earlier_names(names: Collection[str]) -> bool:
    """Whether a run with these group ``names`` called its accelerator group ``gpu``."""
    return EARLIER in names and ACCEL not in names


def group_name(name: str, names: Collection[str]) -> str:
    """``name``, one of a run's group ``names``, as today's mixes call that group."""
    return ACCEL if name == EARLIER and earlier_names(names) else name


def by_group_name(values: Mapping[str, V]) -> dict[str, V]:
    """``values`` keyed by one run's groups, each key as today's mixes call it."""
    return {group_name(name, values): value for name, value in values.items()}


def recorded_groups(recorded: DictConfig) -> list[str]:
    """The names of the groups a recorded config's mix has, in order."""
    groups = OmegaConf.select(recorded, "devices.groups", default=None)
    return [str(name) for name in groups] if isinstance(groups, DictConfig) else []


def recorded_config(recorded: DictConfig) -> DictConfig:
    """A run's recorded config with its groups as today's mixes call them: the keys of
    ``devices.groups`` (in their order, which ranks the workers) and of a ``{group: steps}``
    ``algo.tau``, and the names in ``devices.only``."""
    names = recorded_groups(recorded)
    if not earlier_names(names):
        return recorded
    renamed = recorded.copy()
    renamed.devices.groups = {group_name(str(name), names): group
                              for name, group in recorded.devices.groups.items()}
    only = OmegaConf.select(recorded, "devices.only")
    if isinstance(only, ListConfig):
        renamed.devices.only = [group_name(str(name), names) for name in only]
    tau = OmegaConf.select(recorded, "algo.tau")
    if isinstance(tau, DictConfig):
        renamed.algo.tau = {group_name(str(name), names): steps for name, steps in tau.items()}
    return renamed


def recorded_override(override: str, names: Collection[str]) -> str:
    """A recorded override of a run whose groups are ``names``, with the groups it names as
    today's mixes call them."""
    if not earlier_names(names):
        return override
    if _NAMING_KEYS.match(override):
        return _EARLIER_IN_VALUE.sub(ACCEL, override)
    return _GROUP_KEY.sub(lambda m: m[1] + group_name(m[2], names), override)
