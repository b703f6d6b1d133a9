"""What a tuned comparison's report says of its search, from ``tuning.csv`` alone: what it cost
(trials, their wall seconds) and which choices sit on an edge of what was tried."""

from __future__ import annotations

import pandas as pd

from hetsgd.config.checks import finite_or_none
from hetsgd.outputs.safe_text import shown

EDGE = "edge"  # tuning.csv's column: on a chosen trial, the knobs at an edge (optim.lr:high)


def edge_mark(chosen: pd.DataFrame, knob: str) -> str:
    """`` (high edge)`` after a chosen value on the edge of its method's tried values, else ''."""
    if EDGE not in chosen.columns or chosen.empty:
        return ""
    sides = dict(item.rsplit(":", 1) for item in str(chosen[EDGE].iloc[0]).split() if ":" in item)
    return f" ({shown(sides[knob])} edge)" if knob in sides else ""


def search_cost(trials: pd.DataFrame) -> str:
    """One sentence: how many trials the search ran (and in how many rounds past its grid),
    their wall seconds, and any choice left on an edge. The file is data: a round that is no
    finite number counts as none, names are escaped."""
    rounds = int(finite_or_none(pd.to_numeric(trials.get("round", pd.Series([0])),
                                              errors="coerce").max()) or 0)
    wall = pd.to_numeric(trials.get("wall_s", pd.Series(dtype=float)), errors="coerce")
    text = (f"Search: {len(trials)} trials" + (f" (the grid, then {rounds} round(s) past edge "
                                               "choices)" if rounds else "") +
            (f", {wall.sum():.0f} s of trial wall time (each trial's setup, training and "
             "evaluation; the launches between trials not counted)" if wall.notna().any() else "")
            + ".")
    chosen = trials[trials["chosen"].astype(bool)] if "chosen" in trials.columns else trials[:0]
    if EDGE in chosen.columns:
        flagged = sorted({shown(f"{m} ({e})") for m, e in zip(chosen["method"], chosen[EDGE])
                          if isinstance(e, str) and e.strip()})
        if flagged:
            text += (" On an edge of the values tried, so the optimum may lie beyond: "
                     + ", ".join(flagged) + ".")
    return text
