"""`hetsgd runs`: the runs under a folder, one row each (status, algorithm, mix, final loss, time),
from their run folders alone (:func:`~hetsgd.outputs.index.index_runs`), filtered by their
values. A run folder may be someone else's: every cell is escaped before it is shown."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from rich import box
from rich.table import Table
from rich.text import Text

from hetsgd.errors import UserError
from hetsgd.outputs.index import STATUSES, index_runs
from hetsgd.outputs.report import mix_label
from hetsgd.outputs.safe_text import shown

#: The width to print at where the output is no terminal: any row on one line.
UNLIMITED = 100_000
#: What ``--status``, ``--algo``, ... select on: the summary's fields of those names.
FILTERS = ("status", "algo", "devices", "dataset", "model")
#: The columns shown: heading, and how a run's row gives it.
COLUMNS = ("run", "status", "algo", "mix", "dataset", "model", "train loss", "test acc",
           "time s")


def select_runs(path: Path, wanted: Mapping[str, str | None]) -> pd.DataFrame:
    """The index of the runs under ``path`` whose fields equal every value given in
    ``wanted`` (keys of :data:`FILTERS`; None: any); a path without runs, or a status no run
    can have (a typo, which would select none), is a UserError."""
    if (status := wanted.get("status")) is not None and status not in STATUSES:
        raise UserError(f"--status {status} is no run's status: one of {', '.join(STATUSES)}")
    runs = index_runs(path)
    for field, value in wanted.items():
        if value is not None:
            runs = runs[runs[field].astype(str) == value]
    return runs


def _number(value: Any, digits: str) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return format(value, digits)
    return "—"


def _seconds(run: Mapping[str, Any]) -> str:
    """The run's training time to 3 significant digits (a simulated run's 0.02 virtual s is no
    0.0), whole seconds from 1000 s on (never 1.2e+04), and marked when it is virtual."""
    value = run.get("time_s")
    big = isinstance(value, (int, float)) and abs(value) >= 999.5
    text = _number(value, ".0f" if big else ".3g")
    return f"{text} (virtual)" if run.get("simulated") and text != "—" else text


def _text(value: Any) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)


def _row(run: Mapping[str, Any], root: Path) -> list[str]:
    folder = Path(str(run["run_dir"]))
    name = str(folder.relative_to(root)) if folder.is_relative_to(root) else str(folder)
    return [name, *(_text(run.get(key)) for key in ("status", "algo")), mix_label(run),
            *(_text(run.get(key)) for key in ("dataset", "model")),
            _number(run.get("final.train_loss"), ".4g"), _number(run.get("final.test_acc"), ".4f"),
            _seconds(run)]


def runs_table(runs: pd.DataFrame, root: Path) -> Table:
    """``runs`` (:func:`select_runs`) as a table, every cell escaped (:func:`shown`) and taken as
    plain text, never as rich's markup."""
    table = Table(title=Text(shown(f"{len(runs)} run(s) under {root}")), box=box.SIMPLE_HEAD)
    for heading in COLUMNS:  # a narrow terminal wraps a cell, never cuts it
        table.add_column(heading, overflow="fold")
    for run in runs.to_dict("records"):
        table.add_row(*(Text(shown(cell)) for cell in _row(run, root)))
    return table
