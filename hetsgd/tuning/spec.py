"""What a tuned comparison searches, and by which objective: the ``tuning`` node of an
experiment (hetsgd/conf/experiment/tuned_comparison.yaml).

The node is read as data (:meth:`Tuning.of`) from the sweep's composed config; the search itself
is run by `hetsgd run -m` (:mod:`hetsgd.invocation`), which sets it to null in every job it
starts. A run whose config still holds one (the experiment started without ``-m``) is refused by
the config's own check (``RunConfig.tuning``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Glob, Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from hetsgd.errors import UserError
from hetsgd.outputs.index import flatten
from hetsgd.outputs.report import MAXIMIZED, METRICS

NODE = "tuning"
#: The objectives a search may rank its settings by: the per-run metrics of a report, each
#: method's computed from its own trials alone (a time to a normalized loss uses the best
#: loss of that method's trials, as the report times it, never another method's); the lowest
#: wins except for those in MAXIMIZED. The default, ``test_loss`` (the final held-out loss at
#: the trial's budget), depends on the trial alone.
OBJECTIVES = tuple(column for column, _, _ in METRICS)
#: How many times, by default, a search extends a knob's grid past the edge its choice sat on.
EXTEND = 2
_NAME = re.compile(r"[A-Za-z0-9_]+")


@dataclass
class Tuning:
    """``methods``: the ``+method`` choices compared (``gpu,hogwild``), the package's or the
    user's own (``--config-dir``); ``search``: each knob's grid in Hydra's sweep syntax
    (``optim.lr: 0.01,0.1``); ``objective``: the metric that ranks a method's settings;
    ``trials``: the overrides of every search trial (its seeds; its budget is the comparison's
    unless given), over the experiment's; ``extend``: how many times a knob's grid is extended
    past the edge a method's choice sat on (0: flagged, never extended)."""

    methods: str
    search: dict[str, Any]
    objective: str = "test_loss"
    trials: dict[str, Any] = field(default_factory=dict)
    extend: int = EXTEND

    def __post_init__(self) -> None:
        self.method_names = [m.strip() for m in str(self.methods).split(",") if m.strip()]
        if not self.method_names:
            raise UserError(f"{NODE}.methods is empty: name the +method choices to compare")
        for method in self.method_names:  # whether a config has it: phases.check_knobs
            if not _NAME.fullmatch(method):
                raise UserError(f"{NODE}.methods: no +method choice {method!r}")
        _once(f"{NODE}.methods", self.method_names)
        if not isinstance(self.extend, int) or isinstance(self.extend, bool) or self.extend < 0:
            raise UserError(f"{NODE}.extend={self.extend!r}: a whole number >= 0 (how many "
                            "times a grid may grow past an edge)")
        if self.objective not in OBJECTIVES:
            raise UserError(f"{NODE}.objective={self.objective!r} is not a metric: choose one of "
                            f"{', '.join(OBJECTIVES)}")
        self.grid = {knob: _grid(knob, values) for knob, values in
                     flatten(dict(self.search or {})).items()}
        if not self.grid:
            raise UserError(f"{NODE}.search is empty: give each knob its values, e.g. "
                            "optim.lr: 0.01,0.1")
        try:
            trials = OverridesParser.create().parse_overrides(self.trial_overrides())
        except HydraException as exc:
            raise UserError(f"{NODE}.trials: {str(exc).splitlines()[0]}") from exc
        refuse_empty(trials, f"{NODE}.trials.", "the search would run no trial")

    @classmethod
    def of(cls, config: DictConfig) -> Tuning | None:
        """The tuning a composed sweep config asks for, or None for a sweep without one."""
        node = OmegaConf.select(config, NODE)
        if node is None:
            return None
        # `tuning=5` on the command line: a value, not a node
        given = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        if not isinstance(given, dict):
            raise UserError(f"{NODE}={given!r}: a tuned comparison's node is a mapping (methods, "
                            "search, objective, trials)")
        try:
            return cls(**{str(key): value for key, value in given.items()})
        except TypeError as exc:  # a key the node does not take, or a missing one
            raise UserError(f"{NODE}: {exc}") from exc

    @property
    def maximized(self) -> bool:
        return self.objective in MAXIMIZED

    def search_overrides(self) -> list[str]:
        """The knobs' sweeps, as overrides of the search's trials."""
        return [f"{knob}={','.join(values)}" for knob, values in self.grid.items()]

    def trial_overrides(self) -> list[str]:
        return [f"{key}={_text(value)}" for key, value in flatten(dict(self.trials or {})).items()]


def refuse_swept(overrides: Sequence[Override]) -> None:
    """A sweep of a ``tuning.*`` key (``tuning.methods=hogbatch,hogwild`` unquoted) would run
    the whole tuned comparison once per value: refused, naming the key and its quoted form."""
    for override in overrides:
        key = override.get_key_element()
        if override.is_sweep_override() and key.lstrip("+~").split(".")[0] == NODE:
            value = override.input_line.split("=", 1)[1] if override.input_line else ""
            raise UserError(f"{key} is swept ({override.input_line}), which would run the tuned "
                            f"comparison once per value: quote its value, "
                            f"\"{key}='{value}'\"")


def refuse_empty(overrides: Sequence[Override], prefix: str = "",
                 outcome: str = "the sweep would run no job") -> None:
    """A sweep of no values (``seed=range(0)``) runs nothing, which would read as a sweep that
    went well: refused, naming it (``prefix``: where it was given)."""
    for override in overrides:
        if (override.is_discrete_sweep() and not isinstance(override.value(), Glob)
                and next(override.sweep_string_iterator(), None) is None):
            raise UserError(f"{prefix}{override.input_line} sweeps no value: {outcome}")


def refuse_searched(tuning: Tuning, overrides: Sequence[Override]) -> None:
    """A command-line value of a key the search searches (``optim.lr=0.05``) would be the one
    the comparison ran, not the one the search chose and the report names: refused."""
    searched = {knob.lstrip("+") for knob in tuning.grid}
    for override in overrides:
        if override.key_or_group in searched:
            raise UserError(f"{override.input_line} sets a key that {NODE}.search searches, so "
                            "the comparison would run it rather than the value the search "
                            f"chooses: leave it out, or list it among {NODE}.search."
                            f"{override.key_or_group}'s values")


def _once(name: str, values: Sequence[Any]) -> None:
    """A method or a grid value given twice would run each of its (method, seed) twice, and
    count them as independent seeds, which narrows every interval they are in: refused."""
    twice = [v for i, v in enumerate(values) if v in values[:i]]
    if twice:
        raise UserError(f"{name} gives {twice[0]!r} more than once: give each once")


def _text(value: Any) -> str:
    """A YAML value as an override's value: a list is a sweep's values."""
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _grid(knob: str, values: Any) -> list[str]:
    """A knob's values, in the order given, from Hydra's sweep syntax (``0.01,0.1``,
    ``range(1,4)``) or a YAML list; an empty grid or a continuous interval is refused."""
    text = _text(values) if values is not None else ""
    if not text.strip():
        raise UserError(f"{NODE}.search.{knob} is empty: give it at least one value")
    try:
        override = OverridesParser.create().parse_override(f"{knob}={text}")
    except HydraException as exc:
        raise UserError(f"{NODE}.search.{knob}={text!r}: {str(exc).splitlines()[0]}") from exc
    if override.is_hydra_override() or override.is_delete():
        raise UserError(f"{NODE}.search.{knob}: a knob is a key of the run's config")
    if not override.is_sweep_override():
        return [override.get_value_element_as_str()]
    if not override.is_discrete_sweep():
        raise UserError(f"{NODE}.search.{knob}={text!r}: a grid takes listed values or range(), "
                        "not an interval")
    grid = list(override.sweep_string_iterator())
    if not grid:
        raise UserError(f"{NODE}.search.{knob}={text!r} is empty: give it at least one value")
    _once(f"{NODE}.search.{knob}", list(override.sweep_iterator()))  # 0.1 and 0.10 are one
    return grid
