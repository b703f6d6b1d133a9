"""The Makefile's test tiers: `make test` and `make test-wall` together run every test exactly
once, whatever registered markers it carries, and CI runs both."""

from __future__ import annotations

import itertools
import re
import shlex

import pytest
from _pytest.mark.expression import Expression

from tests.conftest import ROOT

TIERS = ("test", "test-wall")


def _selections(target: str) -> list[str]:
    """The `-m` expressions of the pytest commands in the recipe of `target`."""
    recipe = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)",
                       (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe is not None, f"no target {target} in the Makefile"
    # `-m EXPR` of pytest's own options, not `python -m pytest`
    found = re.findall(r'-m "([^"]+)"|-m (?!pytest)(\w+)', recipe.group(1))
    return [quoted or bare for quoted, bare in found]


def test_every_combination_of_markers_runs_in_exactly_one_tier_command(
        pytestconfig: pytest.Config) -> None:
    selections = {expr: Expression.compile(expr)
                  for target in TIERS for expr in _selections(target)}
    assert len(selections) == 3  # the fast tier, the wall tier two at a time, the serial ones
    # every registered marker: the project's (pyproject.toml) and its plugins'
    markers = [re.split(r"[:(]", line, maxsplit=1)[0] for line in pytestconfig.getini("markers")]
    assert {"wall", "serial"} <= set(markers)
    for count in range(len(markers) + 1):
        for marks in map(frozenset, itertools.combinations(markers, count)):
            chosen = [expr for expr, compiled in selections.items()
                      if compiled.evaluate(marks.__contains__)]
            assert len(chosen) == 1, f"a test marked {set(marks)} runs under {chosen}"


def _commands(target: str) -> list[list[str]]:
    """The recipe lines of ``target``, each split into words as the shell would."""
    recipe = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)",
                       (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert recipe is not None, f"no target {target} in the Makefile"
    return [shlex.split(line.strip()) for line in recipe.group(1).splitlines()]


def test_each_tier_command_selects_by_marker_alone_and_fails_the_target() -> None:
    """A path, `-k`, `--deselect` or `--ignore` would leave tests out of both tiers (or run some
    twice); a recipe line that make ignores (`-` before it, `|| true`) would let CI pass a
    failing tier; the serial tests, which time the machine, run one at a time (no `-n`)."""
    for target in TIERS:
        for words in _commands(target):
            assert words[:3] == ["$(BIN)/python", "-m", "pytest"], words
            options = words[3:]
            assert options.count("-m") == 1 and "||" not in options and ";" not in options
            chosen = options[options.index("-m") + 1]
            rest = options[:options.index("-m")] + options[options.index("-m") + 2:]
            assert rest in (["-q", "-n", "2"], ["-q"]), f"{target}: {words}"
            assert ("-n" in rest) is (chosen != "serial"), f"{target}: {words}"


def test_ci_runs_both_tiers() -> None:
    commands = (ROOT / ".ci" / "run").read_text().splitlines()
    assert all(f"make {target}" in commands for target in TIERS)
