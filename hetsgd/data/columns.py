"""A table's columns as features: which columns, which rows, and text or categories one-hot.

The feature columns are every column but ``dataset.label``, or those ``dataset.features``
names, or all but those ``dataset.drop`` names; a name that is no column of the file is one
line naming it. A row with a missing value (an empty CSV cell, NA, a null) in a feature or the
label column is an error naming it, or, with ``dataset.missing=drop``, left out and counted.

A column of numbers is one feature, as it is. A column of text (or a pandas categorical, or a
Parquet dictionary column) becomes one feature per distinct value, one-hot, through
scikit-learn's ``OneHotEncoder``: fitted on the training file (the whole file where the test
part is split off it, so that the parsed cache, which does not depend on the seed, holds the
features; the categories are values of the features, never labels) and applied to a test file
with ``handle_unknown='ignore'``, so that a category the training file lacks encodes as all
zeros. A column of text with more distinct values than ``dataset.max_categories`` (an
identifier, free text) is refused in one line rather than widened into a feature per row, as is
a column holding numbers and text both (a stray ``?`` or ``n/a`` among numbers is a missing value
to clean, not a category).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from hetsgd.config.problem import FilesConfig
from hetsgd.data.native import loading_native
from hetsgd.errors import UserError
from hetsgd.machine import available_memory

_SHOWN = 5  # the names an error line lists, before it says how many there are


def listing(names: Sequence[str]) -> str:
    """At most ``_SHOWN`` names, each cut short, then how many there are in all: an error line
    about a table of 100,000 columns stays one short line."""
    more = f", ... ({len(names):,} in all)" if len(names) > _SHOWN else ""
    return ", ".join(short(name) for name in names[:_SHOWN]) + more


def short(text: str, limit: int = 40) -> str:
    """``text``, or its first ``limit`` characters and an ellipsis: a name or a cell in a line."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def feature_columns(columns: Sequence[str], cfg: FilesConfig, path: Path) -> tuple[str, ...]:
    """The feature columns of a table with ``columns``, in its order, as the config chooses."""
    named = cfg.features or cfg.drop
    absent = [name for name in named if name not in columns]
    if absent:
        key = "dataset.features" if cfg.features else "dataset.drop"
        raise UserError(f"{path} has no column {short(absent[0])!r} ({key}); its columns: "
                        f"{listing(columns)}")
    if cfg.features:
        return tuple(name for name in columns if name in cfg.features)
    features = tuple(name for name in columns if name != cfg.label and name not in cfg.drop)
    if not features:
        raise UserError(f"{path} has no feature column besides dataset.label={cfg.label!r}"
                        + (" and dataset.drop" if cfg.drop else ""))
    return features


def complete_rows(frame: pd.DataFrame, columns: Sequence[str], cfg: FilesConfig,
                  path: Path) -> np.ndarray:
    """The positions of the rows with a value in every one of ``columns`` (the features and the
    label); under ``dataset.missing=error``, a row without one is a UserError naming it. Rows
    are named by ``frame``'s index, which the caller makes their positions in the file."""
    _check_flat(frame, columns, cfg.label, path)
    missing = frame[list(columns)].isna().to_numpy()
    incomplete = missing.any(axis=1)
    if incomplete.any() and cfg.missing == "error":
        row, column = (int(i) for i in np.argwhere(missing)[0])
        name = columns[column]
        where = (f"row {row + 1} has no label (column {short(name)!r})" if name == cfg.label
                 else f"row {row + 1}, column {short(name)!r} has no value")
        raise UserError(f"{path}: {where}; {int(incomplete.sum()):,} row(s) miss a value: "
                        "dataset.missing=drop leaves them out"
                        + ("" if name == cfg.label else f", dataset.drop=[{name}] the column"))
    return np.flatnonzero(~incomplete)


#: What a Parquet column of structs, maps or lists reads as, cell by cell: no one feature.
_NESTED = (dict, list, tuple, np.ndarray)


def _check_flat(frame: pd.DataFrame, columns: Sequence[str], label: str, path: Path) -> None:
    """Every one of ``columns`` holds one value per cell: a Parquet struct, map or list column
    is refused, naming it, where pandas would fail on it unnamed (``unhashable type``). A feature
    column may be left out; the ``label`` column cannot, so its line shows the first such row."""
    for name in columns:
        column = frame[name]
        if column.dtype != object:
            continue
        nested = column.map(lambda cell: isinstance(cell, _NESTED)).to_numpy(dtype=bool)
        if nested.any():
            row = int(np.argmax(nested))
            cell = column.iloc[row]
            kind = "struct" if isinstance(cell, dict) else "map or list"
            if name == label:
                raise UserError(f"{path}: column {short(str(name))!r} (dataset.label) holds a "
                                f"{kind} in row {row + 1} ({short(repr(cell))}), not a label: "
                                "one number or name per row")
            raise UserError(f"{path}: column {short(str(name))!r} holds a {kind} in each "
                            "cell, not one value: leave it out (dataset.drop=[" + str(name)
                            + "]) or flatten it into columns of its own")


def _coerced(column: pd.Series) -> tuple[pd.Series, np.ndarray]:
    """A column as numbers (as read where pandas read numbers, else its text parsed: a Parquet
    column of number strings), NaN where a cell is none, and the mask of its cells that hold
    text that is no number."""
    if pd.api.types.is_numeric_dtype(column) and not isinstance(column.dtype, pd.CategoricalDtype):
        return column, np.zeros(len(column), dtype=bool)
    values = column.astype(object)
    numbers = pd.to_numeric(values, errors="coerce")
    return numbers, (numbers.isna() & values.notna()).to_numpy()


def _is_text(column: pd.Series) -> bool:
    """A column to one-hot encode: text that is no number, or a categorical whatever its values
    (codes such as "10", "20" name categories, not quantities)."""
    return isinstance(column.dtype, pd.CategoricalDtype) or bool(_coerced(column)[1].any())


def _check_text(column: pd.Series, path: Path, cfg: FilesConfig) -> None:
    """A column of text to encode (a complete one): text throughout, and few enough distinct
    values."""
    numbers, text = _coerced(column)
    parsed = numbers.notna().to_numpy()
    if parsed.any() and not isinstance(column.dtype, pd.CategoricalDtype):
        number, word = int(np.argmax(parsed)), int(np.argmax(text))
        raise UserError(f"{path}: row {column.index[word] + 1}, column "
                        f"{short(str(column.name))!r} holds {short(repr(column.iloc[word]))}, not "
                        f"a number, among numbers (row {column.index[number] + 1}: "
                        f"{short(repr(column.iloc[number]))}): a feature column is numbers, or "
                        "text to one-hot encode, not both")
    distinct = column.nunique()
    if distinct > cfg.max_categories:
        raise UserError(f"{path}: column {short(str(column.name))!r} holds {distinct:,} distinct "
                        f"values, more than dataset.max_categories={cfg.max_categories} to one-hot "
                        f"encode: leave it out (dataset.drop=[{column.name}]) or raise "
                        "dataset.max_categories")


@dataclass(frozen=True)
class Encoding:
    """How a table's feature columns become features, fitted on the training file: the columns
    in order, and the scikit-learn ``OneHotEncoder`` of those that hold text (None without)."""

    columns: tuple[str, ...]
    text: tuple[str, ...]
    encoder: Any = None

    @classmethod
    def fit(cls, frame: pd.DataFrame, columns: tuple[str, ...], cfg: FilesConfig,
            path: Path) -> Encoding:
        """The encoding of ``frame``'s ``columns`` (its complete rows only)."""
        text = tuple(name for name in columns if _is_text(frame[name]))
        if not text:
            return cls(columns, text)
        for name in text:
            _check_text(frame[name], path, cfg)
        with loading_native():
            from sklearn.preprocessing import OneHotEncoder  # loads where a table has text

        encoder = OneHotEncoder(handle_unknown="ignore", sparse_output=False, dtype=np.float32)
        encoder.fit(frame[list(text)].astype(str))
        return cls(columns, text, encoder)

    def widths(self) -> dict[str, int]:
        """The features each text column becomes: one per category of the training file."""
        if self.encoder is None:
            return {}
        return {name: len(c) for name, c in zip(self.text, self.encoder.categories_)}

    @property
    def num_features(self) -> int:
        return len(self.columns) - len(self.text) + sum(self.widths().values())

    def sources(self) -> tuple[str, ...]:
        """The column each feature comes from, in the order of the features."""
        widths = self.widths()
        return tuple(name for name in self.columns for _ in range(widths.get(name, 1)))

    def features(self, frame: pd.DataFrame, path: Path, label: str) -> np.ndarray:
        """``frame``'s features, float64 [rows, :attr:`num_features`], written column by column:
        numbers as they are, text one-hot; a cell of a number column that is not one is a
        UserError naming it. Float64, as pandas read them: rounded to float32 only after they
        are centred (:mod:`hetsgd.data.prepare`), a timestamp's seconds survive."""
        rows = len(frame)
        need, free = 8 * rows * self.num_features, available_memory()
        if need > free:
            raise UserError(f"{path}: {rows:,} rows of {self.num_features:,} features (text "
                            f"one-hot encoded) take {need / 2**20:,.0f} MiB, more than the "
                            f"{free / 2**20:,.0f} MiB of memory available")
        x = np.empty((rows, self.num_features), np.float64)
        widths = self.widths()
        encoded = (self.encoder.transform(frame[list(self.text)].astype(str))
                   if self.encoder is not None else None)
        at, block = 0, 0
        for name in self.columns:
            width = widths.get(name)
            if width is None:
                x[:, at] = _numeric(frame[name], path, label)
                at += 1
            else:
                assert encoded is not None
                x[:, at:at + width] = encoded[:, block:block + width]
                at, block = at + width, block + width
        return x


def _numeric(column: pd.Series, path: Path, label: str) -> pd.Series:
    """A number column of a test file as numbers, or a UserError naming its first cell that is
    not one."""
    numbers, text = _coerced(column)
    if not text.any():
        return numbers
    row = int(np.argmax(text))
    raise UserError(f"{path}: row {column.index[row] + 1}, column {short(str(column.name))!r} holds "
                    f"{short(repr(column.iloc[row]))}, not a number as in the training file "
                    f"(every column but dataset.label={label!r} is a feature)")
