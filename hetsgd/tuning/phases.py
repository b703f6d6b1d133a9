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

import pandas as pd
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hetsgd.bounded import stop_verb
from hetsgd.config import compose_run
from hetsgd.config.compose import quoted
from hetsgd.errors import SearchInterrupted, UserError
from hetsgd.outputs.index import SEARCH_CLAIM, TRIALS_DIR
from hetsgd.outputs.report import TUNED_GROUP, TUNING_CSV
from hetsgd.outputs.run_directory import write_csv, write_text
from hetsgd.tuning.bracket import beyond, edges, report_edges
from hetsgd.tuning.choice import choose, trial_table
from hetsgd.tuning.figure import plot_search
from hetsgd.tuning.spec import NODE, Tuning

#: Runs one Hydra multirun of these overrides (Hydra's own arguments parsed already).
Sweep = Callable[[list[str]], None]
UNSET = f"{NODE}=null"  # the jobs are runs, not tuned sweeps
_MISSING = object()  # a key a config does not have


def check_knobs(tuning: Tuning, fixed: list[str]) -> None:
    """Refuse, before any trial, a method that no config has (the package's or the user's
    ``--config-dir``, whose search path ``fixed`` holds), and a knob that a method's config
    does not have (``optim.lrr``), that is a node or a config group rather than a value
    (``model``: its trials would run, then its tuned config not compose) or that does not take
    a value of its grid (``optim.lr=O.1``): a key added with ``+`` is the user's own and is
    not checked."""
    for method in tuning.method_names:
        try:
            config = compose_run([*fixed, f"+method={method}"])
        except MissingConfigException as exc:
            raise UserError(f"{NODE}.methods: no +method choice {method!r}") from exc
        for knob, values in tuning.grid.items():
            if not knob.startswith("+"):
                _check_knob(config, f"+method={method}", knob, values)


def _check_knob(config: DictConfig, method: str, knob: str, values: list[str]) -> None:
    """``knob`` as :func:`check_knobs` checks it, each value set in ``config`` (this check's
    own) as Hydra's override of it would be."""
    found = OmegaConf.select(config, knob, default=_MISSING)
    if found is _MISSING:
        raise UserError(f"{NODE}.search: unknown knob {knob!r}: {method}'s config has no such key")
    if isinstance(found, DictConfig):
        raise UserError(f"{NODE}.search: knob {knob!r} is a config group or node of {method}'s "
                        "config, not a value: search one of its keys instead "
                        f"({knob}.<key>)")
    parser = OverridesParser.create()
    for value in values:
        try:
            given = parser.parse_override(f"{knob}={value}").value()
            OmegaConf.update(config, knob, given, merge=True)
        except (HydraException, OmegaConfBaseException) as exc:
            raise UserError(f"{NODE}.search.{knob}={value!r} does not compose for {method}: "
                            f"{str(exc).splitlines()[0]}") from exc


def claim(folder: Path) -> None:
    """Make ``folder`` this search's, or refuse it: an exclusive create of a marker in it, so
    that a rerun into an interrupted tuned comparison (or two started together) never
    overwrites its trials."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with open(folder / SEARCH_CLAIM, "x"):
            pass
    except FileExistsError:
        raise UserError(f"{folder} already holds a search, whose trials this one would "
                        "overwrite: choose another hydra.sweep.dir (or leave it out for a new "
                        "folder), or move that sweep away first") from None


def tune_then_compare(tuning: Tuning, overrides: list[str], sweep_dir: Path, sweep: Sweep) -> None:
    """The search into ``<sweep_dir>/tuning/`` (its grid, then its extensions past edge
    choices), its trials, choice and figure into ``tuning.csv`` and ``tuning.png``, then the
    comparison of the chosen settings into ``sweep_dir``."""
    trials_dir = sweep_dir / TRIALS_DIR
    claim(trials_dir)
    methods = ",".join(tuning.method_names)
    fixed = [*overrides, UNSET, *tuning.trial_overrides()]
    rounds = [(0, trials_dir)]
    try:
        sweep([*fixed, f"hydra.sweep.dir={quoted(trials_dir)}", f"+method={methods}",
               *tuning.search_overrides()])
        trials, chosen = _search(tuning, rounds, lambda extra, folder: sweep(
            [*fixed, f"hydra.sweep.dir={quoted(folder)}", *extra]))
    except KeyboardInterrupt as stop:
        ran = _write(sweep_dir, trial_table(rounds, list(tuning.grid), tuning.objective))
        raise SearchInterrupted(f"hetsgd: search {stop_verb(stop)} after {ran} trial(s), in "
                                f"{sweep_dir / TUNING_CSV}; no comparison ran") from stop
    conf = trials_dir / "conf"
    (conf / TUNED_GROUP).mkdir(parents=True, exist_ok=True)
    for method, setting in chosen.items():
        write_text(conf / TUNED_GROUP / f"{method}.yaml", tuned_config(method, setting))
    sweep([*overrides, UNSET, f"hydra.searchpath=[{quoted('file://' + str(conf.resolve()))}]",
           f"+{TUNED_GROUP}={methods}"])


def _search(tuning: Tuning, rounds: list[tuple[int, Path]],
            run: Callable[[list[str], Path], None]) -> tuple[pd.DataFrame, dict[str, dict[str, str]]]:
    """Choose from the trials of ``rounds``; while a choice sits on an edge and
    ``tuning.extend`` allows, run one more value past it (``run``: the extra overrides, the
    folder) and choose again. Returns the trials (written to tuning.csv) and the choices."""
    sweep_dir, number = rounds[0][1].parent, 0
    while True:
        trials = trial_table(rounds, list(tuning.grid), tuning.objective)
        try:
            chosen = choose(trials, tuning.maximized, tuning.method_names)
            found = edges(trials)
        finally:
            _write(sweep_dir, trials)
        report_edges(trials, found, extending=number < tuning.extend)
        if number == tuning.extend or not _extend(trials, chosen, found, rounds, run):
            return trials, chosen
        number += 1


def _extend(trials: pd.DataFrame, chosen: dict[str, dict[str, str]],
            found: dict[str, dict[str, str]], rounds: list[tuple[int, Path]],
            run: Callable[[list[str], Path], None]) -> bool:
    """Run, for each edge choice, its method at the next value past the edge (its other knobs
    at their choices), in a folder of its own under the search's; whether any ran."""
    number = rounds[-1][0] + 1
    ran = False
    for method, sides in found.items():
        for knob, side in sides.items():
            value = beyond(trials, method, knob, side)
            if value is None:
                continue
            folder = rounds[0][1] / f"extend{number}_{method}_{knob}"
            rounds.append((number, folder))
            others = [f"{k}={v}" for k, v in chosen[method].items() if k != knob]
            run([f"+method={method}", f"{knob}={value}", *others], folder)
            ran = True
    return ran


def _write(sweep_dir: Path, trials: pd.DataFrame) -> int:
    """``tuning.csv`` and, where a setting has an objective, ``tuning.png``; how many trials."""
    write_csv(sweep_dir / TUNING_CSV, trials)
    plot_search(trials, sweep_dir)
    return len(trials)


def tuned_config(method: str, setting: dict[str, str]) -> str:
    """``+method=<method>`` with the chosen values over it, as a config of the ``tuned`` group."""
    values = OmegaConf.create()
    for knob, value in setting.items():
        OmegaConf.update(values, knob.lstrip("+"), yaml.safe_load(value), force_add=True)
    chosen = OmegaConf.to_container(values)
    assert isinstance(chosen, dict)
    body = {"defaults": [{"/method": method}, "_self_"], **chosen}
    return "# @package _global_\n" + yaml.safe_dump(body, sort_keys=False)
