"""Composing a run's config: the schemas and resolvers registered with Hydra, the YAML tree
shipped inside the package, and the step from a composed config to checked typed objects."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hetsgd.config.algorithms import ALGO_SCHEMAS, AlgoConfig, CustomAlgoConfig
from hetsgd.config.checks import ConfigError
from hetsgd.config.group_names import recorded_config, recorded_groups, recorded_override
from hetsgd.config.hydra_private import args_parser, basic_sweep, present_child
from hetsgd.config.labels import dataset_label
from hetsgd.config.optim import OPTIM_SCHEMAS, TorchOptimConfig
from hetsgd.config.paths import results_folder, safe_component
from hetsgd.config.problem import (
    MODEL_SCHEMAS,
    CustomModelConfig,
    DatasetConfig,
    FilesConfig,
    FolderConfig,
    SyntheticConfig,
)
from hetsgd.config.schema import DevicesConfig, RunConfig
from hetsgd.config.swept import sweep_overrides, swept_keys, swept_name
from hetsgd.config.typos import unknown_keys_hint
from hetsgd.errors import UserError, one_line
from hetsgd.machine import cuda_devices, usable_cores
from hetsgd.readback import load_yaml

# The config tree ships inside the package; HETSGD_CONF points elsewhere (e.g. a copy with your
# own mixes and experiments).
CONF_DIR = Path(os.environ.get("HETSGD_CONF", Path(__file__).resolve().parents[1] / "conf"))


def register_configs() -> None:
    """Register the schemas so that YAML files can name them in their defaults lists (an
    algorithm's with its own mix: :func:`_store_algo`), and the resolvers device mixes use:
    `${hetsgd.cores:}` (one worker per core), `${hetsgd.cores_but:1}` (all cores but one, left
    to a GPU worker's host thread), `${hetsgd.gpus:}`, and
    `${hetsgd.cuda_or:A,B}` (A where a CUDA GPU is usable, else B: the `auto` mixes);
    `${hetsgd.safe:...}`, which makes any value a safe directory name (run and sweep-job folders);
    `${hetsgd.dataset_label:${dataset}}`, what a run folder calls its dataset (a file's stem);
    `${hetsgd.results:}`, where runs go ($HETSGD_RESULTS, else results); and `${hetsgd.swept:}`,
    a sweep job's overrides of the keys its sweep varies (its folder's)."""
    resolvers: dict[str, Callable[..., Any]] = {
        "hetsgd.cores": usable_cores,
        "hetsgd.cuda_or": lambda with_cuda, without: with_cuda if cuda_devices() else without,
        "hetsgd.cores_but": lambda n: max(1, usable_cores() - int(n)),
        "hetsgd.gpus": lambda: max(1, len(cuda_devices())),
        "hetsgd.safe": safe_component,
        "hetsgd.dataset_label": dataset_label,
        "hetsgd.results": lambda: str(results_folder()),
        "hetsgd.swept": _swept}
    for name, resolver in resolvers.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver)
    cs = ConfigStore.instance()
    # Schemas live under schema/ so that they do not show up as choices of the config groups.
    cs.store(group="schema", name="run", node=RunConfig)
    cs.store(group="schema", name="dataset", node=DatasetConfig)
    for dataset_schema in (SyntheticConfig, FilesConfig, FolderConfig):
        cs.store(group="schema/dataset", name=dataset_schema.name, node=dataset_schema)
    for model_name, model_schema in MODEL_SCHEMAS.items():
        cs.store(group="schema/model", name=model_name, node=_open(model_schema)
                 if model_schema in OPEN_SCHEMAS else model_schema)
    cs.store(group="schema", name="devices", node=DevicesConfig)
    for algo_name, schema in ALGO_SCHEMAS.items():
        _store_algo(cs, algo_name, schema)
    for optim_name, optim_schema in OPTIM_SCHEMAS.items():
        cs.store(group="schema/optim", name=optim_name, node=_open(optim_schema)
                 if optim_schema in OPEN_SCHEMAS else optim_schema)


def _store_algo(cs: ConfigStore, name: str, schema: type[AlgoConfig]) -> None:
    """``schema/algo/NAME``, which each algo YAML starts from: the algorithm's schema and, where it
    declares one (:attr:`~hetsgd.config.algorithms.AlgoConfig.DEVICES`), its own mix, chosen as
    a default that `devices=` and a `+method=` override."""
    node = _open(schema) if schema in OPEN_SCHEMAS else schema
    if schema.DEVICES is None:
        cs.store(group="schema/algo", name=name, node=node)
        return
    cs.store(group="schema/algo_fields", name=name, node=node)
    cs.store(group="schema/algo", name=name, node={"defaults": [
        f"/schema/algo_fields/{name}@_here_",
        {"override /devices@_global_.devices": schema.DEVICES}, "_self_"]})


def _swept(*, _root_: DictConfig) -> str:
    """In a sweep job's config: its overrides of the keys that the sweep, as the sweep folder
    records it, varies."""
    hydra = _root_.hydra
    return swept_name(list(hydra.overrides.task), swept_keys(sweep_overrides(Path(hydra.sweep.dir))))


#: The schemas that take keys they do not declare: a custom model's factory arguments and a
#: custom algorithm's settings and a torch optimizer's arguments (:func:`to_run_config` gathers
#: them into ``kwargs``/``settings``).
OPEN_SCHEMAS: tuple[type, ...] = (CustomModelConfig, CustomAlgoConfig, TorchOptimConfig)


def _open(schema: type) -> DictConfig:
    """A schema that takes keys it does not declare (one of :data:`OPEN_SCHEMAS`), from a
    user's YAML or `+model.NAME=VALUE`, `+algo.NAME=VALUE`."""
    node = OmegaConf.structured(schema)
    OmegaConf.set_struct(node, False)
    return node


def compose_run(overrides: Sequence[str], hydra_config: bool = False) -> DictConfig:
    """The config that `hetsgd run OVERRIDES` composes, for code outside Hydra's own composition
    (calibration, torchrun followers, recovery, tests, benchmarks), or inside a `hetsgd run` job
    (resuming): Hydra has one global state, which the job holds, so it is set aside while
    composing and given back after. With ``hydra_config``, the config keeps its ``hydra``
    node (a sweep's ``hydra.sweeper.params``, say)."""
    from hydra import compose, initialize_config_dir

    register_configs()
    held = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=list(overrides),
                           return_hydra_config=hydra_config)
    finally:
        # on the instance that is global now: initialize_config_dir leaves a copy of the old one
        GlobalHydra.instance().hydra = held


def sweep_jobs(arguments: Sequence[str]) -> list[list[str]]:
    """The overrides of each job that `hetsgd run -m ARGUMENTS` launches, in order, as Hydra's
    basic sweeper makes them (its own expansion): the swept values an experiment gives in
    ``hydra.sweeper.params``, then the arguments. For scripts and tests that run or check a
    sweep's jobs without launching it."""
    arguments = with_first_group_choices(arguments)
    experiments = [a for a in arguments if a.startswith("+experiment=")]
    params = compose_run(experiments, hydra_config=True).hydra.sweeper.params
    return basic_sweep([f"{key}={value}" for key, value in (params or {}).items()] + arguments)


def quoted(value: object) -> str:
    """``value`` (a path, say) as one quoted Hydra override value."""
    return "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"


def hydra_arguments(args: Sequence[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """`hetsgd run ARGS` read by Hydra's own parser (``-m``, ``--cfg``, ``--config-dir``, the
    overrides; ``-m`` anywhere, as a shell user types it), its own errors one
    :class:`UserError` line instead of argparse's usage and exit."""
    parser = args_parser()
    parser.prog = "hetsgd run"

    def refuse(message: str) -> NoReturn:
        raise UserError(f"hetsgd run: {message}")

    parser.error = refuse  # type: ignore[method-assign]
    return parser, parser.parse_intermixed_args(with_first_group_choices(args))


def with_first_group_choices(args: Sequence[str]) -> list[str]:
    """Command-line arguments of `hetsgd run` with the first choice of each swept config group
    put just before its sweep: `+method=sync +method=sync,local_sgd`.

    Hydra composes a sweep's own config without the swept values, so a key that only a swept
    group brings (`devices.groups.accel.batch_size`, where every `+method` brings `devices=auto`)
    cannot be set there, although every job has it. With the first choice given too, the sweep's
    config is its first job's; the sweeper keeps the last value given for a key, so the jobs still
    take every choice, and it composes each job before it starts any."""
    parser = OverridesParser.create()
    arguments: list[str] = []
    for arg in args:
        first = _first_group_choice(parser, arg)
        arguments += [arg] if first is None else [first, arg]
    return arguments


def _first_group_choice(parser: OverridesParser, arg: str) -> str | None:
    """`group=<first choice>` for an argument that sweeps a config group over choices, else None."""
    try:
        override = parser.parse_override(arg)
    except HydraException:  # a flag such as -m, or a bad override that Hydra reports itself
        return None
    if override.is_hydra_override() or not isinstance(override.value(), ChoiceSweep) \
            or not (CONF_DIR / override.key_or_group).is_dir():
        return None
    return f"{override.get_key_element()}={next(iter(override.sweep_string_iterator()))}"


def _declared(schema: Any) -> set[str] | None:
    return {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None


def _unknown_keys(node: DictConfig, path: str = "") -> list[str]:
    """Keys that no schema declares (added with `+key=value`): OmegaConf would drop them. A
    custom model's undeclared keys are its factory's arguments, a custom algorithm's its
    settings."""
    schema = OmegaConf.get_type(node)
    declared = None if schema in OPEN_SCHEMAS else _declared(schema)
    keys = [str(key) for key in node.keys()]
    unknown = [f"{path}{key}" for key in keys if declared is not None and key not in declared]
    for key in keys:
        if (child := present_child(node, key)) is not None:
            unknown += _unknown_keys(child, f"{path}{key}.")
    return unknown


def to_run_config(cfg: DictConfig) -> RunConfig:
    """Turn a composed config into typed objects, running every range check."""
    unknown = _unknown_keys(cfg)
    if unknown:
        raise ConfigError(f"unknown config key(s) {', '.join(unknown)}: no schema has them"
                          + unknown_keys_hint(unknown, cfg))
    try:
        run = OmegaConf.to_object(cfg)
        if isinstance(run, RunConfig) and isinstance(run.model, CustomModelConfig):
            run.model.kwargs = {**run.model.kwargs, **_undeclared(cfg.model, CustomModelConfig)}
        if isinstance(run, RunConfig) and isinstance(run.algo, CustomAlgoConfig):
            run.algo.settings = {**run.algo.settings, **_undeclared(cfg.algo, CustomAlgoConfig)}
        if isinstance(run, RunConfig) and isinstance(run.optim, TorchOptimConfig):
            run.optim.kwargs = {**run.optim.kwargs, **_undeclared(cfg.optim, TorchOptimConfig)}
    except OmegaConfBaseException as exc:  # e.g. a key added with `+` that no schema has
        raise ConfigError(one_line(exc)) from exc
    assert isinstance(run, RunConfig)
    return run


def _undeclared(node: DictConfig, schema: type) -> dict[str, Any]:
    """The keys of ``node`` that its open ``schema`` does not declare, resolved to plain values."""
    declared = _declared(schema) or set()
    values = OmegaConf.to_container(node, resolve=True)
    assert isinstance(values, dict)
    return {str(key): value for key, value in values.items() if key not in declared}


#: The config groups whose choice decides a schema (an MLP's keys are not logreg's).
SCHEMA_GROUPS = ("algo", "dataset", "model", "devices", "optim")


def _recorded_choices(recorded: DictConfig) -> list[str]:
    """The config groups a recorded config chose, as overrides (``model=logreg``, from its
    ``model.name``): so that its values land on their own schemas even when the overrides it was
    composed from are gone (a run started without Hydra has none)."""
    choices = []
    for group in SCHEMA_GROUPS:
        name = OmegaConf.select(recorded, f"{group}.name")
        if group == "model" and OmegaConf.select(recorded, "model._target_") is not None:
            name = CustomModelConfig.name  # a user's model, whatever its YAML called it
        if isinstance(name, str) and (CONF_DIR / group / f"{name}.yaml").is_file():
            choices.append(f"{group}={name}")
    return choices


def recomposable(recorded: DictConfig, overrides: Sequence[str]) -> list[str]:
    """The overrides that compose a recorded run again from hetsgd's own config: the groups it
    chose (:func:`_recorded_choices`), then its ``overrides`` less the choices of options that
    hetsgd's config groups lack (a ``--config-dir``'s ``model=mynet``). The recorded config
    holds every value such an option gave, and recovery needs no config directory."""
    return [*_recorded_choices(recorded), *(o for o in overrides if not _chosen_elsewhere(o))]


def _chosen_elsewhere(override: str) -> bool:
    key, sep, value = str(override).partition("=")
    group = key.lstrip("+~")
    return (bool(sep) and "." not in group and (CONF_DIR / group).is_dir()
            and not (CONF_DIR / group / f"{value.strip()}.yaml").is_file())


#: The mappings keyed by names a run chose (its mix's groups, local SGD's steps per group): a
#: rebuilt config takes each whole from the record, never merged with the defaults' names (a
#: ``--config-dir`` mix's groups are not the default mix's).
RECORDED_WHOLE = ("devices.groups", "algo.tau")


def _with_recorded_mappings(composed: DictConfig, recorded: DictConfig) -> DictConfig:
    """A copy of ``composed``, each of its :data:`RECORDED_WHOLE` mappings that ``recorded``
    holds too keeping only the recorded names and open to the others, so that a merge of
    ``recorded`` gives that mapping as recorded (its values typed by the schema)."""
    composed = composed.copy()
    for key in RECORDED_WHOLE:
        mine, theirs = OmegaConf.select(composed, key), OmegaConf.select(recorded, key)
        if OmegaConf.is_dict(mine) and OmegaConf.is_dict(theirs):
            OmegaConf.set_struct(mine, False)
            for name in [name for name in mine if name not in theirs]:
                del mine[name]
    return composed


#: Keys added since runs were first recorded, each with the value that does what a run
#: recorded without it did, not today's default: before ``dataset.split_seed`` (default 0), a
#: run's own seed drew its test split, which its recovery or resume must evaluate on again.
ADDED_KEYS: dict[str, Any] = {"dataset.split_seed": None}


def _with_added_keys(recorded: DictConfig) -> DictConfig:
    """``recorded`` with each of :data:`ADDED_KEYS` it lacks set as its run behaved."""
    completed = copy.deepcopy(recorded)
    for key, value in ADDED_KEYS.items():
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(completed, parent)
        if isinstance(node, DictConfig) and leaf not in node:
            node[leaf] = value
    return completed


def rebuild_config(recorded: DictConfig | Path, overrides: Sequence[str], failure: str,
                   now: Sequence[str] = ()) -> tuple[DictConfig, RunConfig]:
    """A past run's config, for recovery and resuming: composed from the groups it chose and its
    ``overrides`` as `hetsgd run` did, then every value it ``recorded`` in config.yaml (or that
    file), so that later changes to the defaults do not count. Returned as composed, with
    ``now`` (a resume's overrides) composed on top and kept over the recorded values (the
    resume checks it), and typed, without ``now``. A config that cannot be rebuilt (e.g. with a
    key this version no longer has, or an emptied file, which would merge into no config at
    all) is a one-line :class:`UserError` after ``failure``."""
    try:
        loaded = OmegaConf.create(load_yaml(recorded)) if isinstance(recorded, Path) else recorded
        if not isinstance(loaded, DictConfig):
            raise ConfigError("the recorded config is not a mapping")
        if not loaded:  # an empty file's None, or {}: no value of the run's, nothing to type
            name = recorded.name if isinstance(recorded, Path) else "the recorded config"
            raise ConfigError(f"{name} is empty")
        names = recorded_groups(loaded)
        loaded = _with_added_keys(recorded_config(loaded))
        overrides = [*_recorded_choices(loaded), *(recorded_override(o, names) for o in overrides
                                                   if not _chosen_elsewhere(o))]
        config = OmegaConf.merge(_with_recorded_mappings(compose_run(overrides), loaded), loaded)
        assert isinstance(config, DictConfig)  # a merge onto a mapping is a mapping
        run = to_run_config(config)
        if now:
            composed = compose_run([*overrides, *now])
            config = OmegaConf.merge(_with_recorded_mappings(composed, loaded), loaded)
            for override in OverridesParser.create().parse_overrides(list(now)):
                key = override.key_or_group
                OmegaConf.update(config, key, OmegaConf.select(composed, key), merge=False)
        assert isinstance(config, DictConfig)
        return config, run
    except (OSError, ValueError, yaml.YAMLError, HydraException, OmegaConfBaseException) as err:
        raise UserError(f"{failure}: {err}".splitlines()[0]) from err


def changed_keys(overrides: Sequence[str], now: Sequence[str], keys: Sequence[str],
                 failure: str) -> list[str]:
    """Those of ``keys`` whose composed value ``now`` changes on top of ``overrides``: what a
    resume refuses, found before anything is rebuilt (another model's schema cannot even take
    the recorded model's values). A composition that fails is a one-line :class:`UserError`
    after ``failure``."""
    try:
        before, after = compose_run(overrides), compose_run([*overrides, *now])
    except (HydraException, OmegaConfBaseException) as err:
        raise UserError(f"{failure}: {err}".splitlines()[0]) from err
    return [key for key in keys if OmegaConf.select(before, key) != OmegaConf.select(after, key)]
