"""Whether each method's choice brackets its optimum: a chosen value that is the lowest or the
highest value its method tried of a numeric knob (diverged and failed trials count as tried: a
value whose trials diverged bounds the search on that side) sits on an edge, and the search
extends that knob's grid one step past it (geometric for positive values, as log-spaced grids
are, else arithmetic) with the method's other knobs at their choices. A knob given one value
is a fixed setting, not a search, and has no edge; nor has a knob whose values are not numbers.
"""

from __future__ import annotations

import logging
import math

import pandas as pd

from hetsgd.outputs.report import KNOB_PREFIX
from hetsgd.outputs.search_cost import EDGE
from hetsgd.tuning.choice import METHOD

log = logging.getLogger(__name__)

SIDES = ("low", "high")


def _number(text: object) -> float | None:
    try:
        value = float(str(text))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def edges(trials: pd.DataFrame) -> dict[str, dict[str, str]]:
    """Per method, each knob whose chosen value is the lowest or highest it tried, with the
    side (``low``/``high``); also written to the ``edge`` column of the chosen trials."""
    knobs = [c for c in trials.columns if c.startswith(KNOB_PREFIX)]
    found: dict[str, dict[str, str]] = {}
    trials[EDGE] = ""
    for method, mine in trials.groupby(METHOD, sort=False):
        chosen = mine[mine["chosen"].astype(bool)]
        if chosen.empty:
            continue
        for knob in knobs:
            tried = [_number(v) for v in dict.fromkeys(mine[knob].astype(str))]
            value = _number(chosen[knob].iloc[0])
            if value is None or None in tried or len(tried) < 2:
                continue
            numbers = [v for v in tried if v is not None]
            if value in (min(numbers), max(numbers)):
                side = SIDES[value == max(numbers)]
                found.setdefault(str(method), {})[knob[len(KNOB_PREFIX):]] = side
        sides = found.get(str(method), {})
        trials.loc[chosen.index, EDGE] = " ".join(f"{k}:{s}" for k, s in sides.items())
    return found


def beyond(trials: pd.DataFrame, method: str, knob: str, side: str) -> str | None:
    """The next value of ``knob`` past ``method``'s ``side`` edge: one step of the ratio (or
    the difference) of its two outermost values on that side, an integer for an integer knob;
    None where no new value comes of it (below 1, a positive integer grid has none)."""
    given = list(dict.fromkeys(trials.loc[trials[METHOD] == method, f"{KNOB_PREFIX}{knob}"]
                               .astype(str)))
    numbers = sorted(v for v in map(_number, given) if v is not None)
    if len(numbers) < 2:
        return None
    edge, inner = (numbers[-1], numbers[-2]) if side == "high" else (numbers[0], numbers[1])
    geometric = edge > 0 and inner > 0
    step = edge * (edge / inner) if geometric else edge + (edge - inner)
    if all(_is_int(v) for v in given):
        step = float(round(step)) if round(step) != edge else edge + (1 if side == "high" else -1)
        return None if geometric and step < 1 else str(int(step))
    return format(step, ".3g") if format(step, ".3g") not in given else None


def _is_int(text: str) -> bool:
    return text.lstrip("+-").isdigit()


def report_edges(trials: pd.DataFrame, found: dict[str, dict[str, str]],
                 extending: bool) -> None:
    """One log line per edge choice: extended (to which value), left on the edge where no value
    lies past it, or left there once the bound on extensions is hit."""
    for method, sides in found.items():
        for knob, side in sides.items():
            past = beyond(trials, method, knob, side) if extending else None
            log.warning("+method=%s chose %s on the %s edge of the values it tried: %s", method,
                        knob, side, f"extending the grid past it ({knob}={past})" if past else
                        "no value lies past it, so the choice stays flagged" if extending else
                        "the bound on extensions (tuning.extend) is reached, so the choice "
                        "stays flagged")
