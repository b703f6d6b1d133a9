"""A tuned comparison in two sweeps of the one way in (`hetsgd run -m`): the search, every
method at every setting of the grid on the trials' budget and seeds, under ``<sweep>/tuning/``;
then the comparison, each method at its chosen setting on the evaluation seeds, in ``<sweep>``
itself.

Hydra's basic sweeper launches the cartesian product of its swept keys, so each method's own
setting travels in a config of its own: ``<sweep>/tuning/conf/tuned/<method>.yaml``, the
method's config with the chosen values over it, swept as ``+tuned=<method>`` (the config
folder joins Hydra's search path for that sweep).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

from hetsgd.config import compose_run
from hetsgd.config.compose import quoted
from hetsgd.errors import UserError
from hetsgd.outputs.report import TRIALS_DIR, TUNED_GROUP, TUNING_CSV
from hetsgd.outputs.run_directory import write_csv, write_text
from hetsgd.tuning.choice import choose, trial_table
from hetsgd.tuning.spec import NODE, Tuning

#: Runs one Hydra multirun of these overrides (Hydra's own arguments parsed already).
Sweep = Callable[[list[str]], None]


def check_knobs(tuning: Tuning, fixed: list[str]) -> None:
    """Refuse a knob that a method's config does not have (``optim.lrr``), before any trial: a
    key added with ``+`` is the user's own and is not checked."""
    for method in tuning.method_names:
        config = compose_run([*fixed, f"+method={method}"])
        for knob in tuning.grid:
            if not knob.startswith("+") and not _has(config, knob):
                raise UserError(f"{NODE}.search: unknown knob {knob!r}: +method={method}'s "
                                "config has no such key")


def _has(config: DictConfig, key: str) -> bool:
    missing = object()
    return OmegaConf.select(config, key, default=missing) is not missing


def tune_then_compare(tuning: Tuning, overrides: list[str], sweep_dir: Path, sweep: Sweep) -> None:
    """The search into ``<sweep_dir>/tuning/``, its trials and choice into ``tuning.csv``,
    then the comparison of the chosen settings into ``sweep_dir``."""
    trials_dir = sweep_dir / TRIALS_DIR
    methods = ",".join(tuning.method_names)
    unset = f"{NODE}=null"  # the jobs are runs, not tuned sweeps
    sweep([*overrides, unset, f"hydra.sweep.dir={quoted(trials_dir)}", f"+method={methods}",
           *tuning.search_overrides(), *tuning.trial_overrides()])
    trials = trial_table(trials_dir, list(tuning.grid), tuning.objective)
    try:
        chosen = choose(trials, tuning.maximized)
    finally:
        write_csv(sweep_dir / TUNING_CSV, trials)
    conf = trials_dir / "conf"
    (conf / TUNED_GROUP).mkdir(parents=True, exist_ok=True)
    for method, setting in chosen.items():
        write_text(conf / TUNED_GROUP / f"{method}.yaml", tuned_config(method, setting))
    sweep([*overrides, unset, f"hydra.searchpath=[{quoted('file://' + str(conf.resolve()))}]",
           f"+{TUNED_GROUP}={methods}"])


def tuned_config(method: str, setting: dict[str, str]) -> str:
    """``+method=<method>`` with the chosen values over it, as a config of the ``tuned`` group."""
    values = OmegaConf.create()
    for knob, value in setting.items():
        OmegaConf.update(values, knob.lstrip("+"), yaml.safe_load(value), force_add=True)
    chosen = OmegaConf.to_container(values)
    assert isinstance(chosen, dict)
    body = {"defaults": [{"/method": method}, "_self_"], **chosen}
    return "# @package _global_\n" + yaml.safe_dump(body, sort_keys=False)
