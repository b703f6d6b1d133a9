"""UCI covertype, the 7-class version: 581,012 x 54 (10 quantities, 4 + 40 one-hot), classes 1..7.

The file is comma-separated with the class last; there is no published test split. UCI gives no
checksum, so the file is trusted once it first parses (see :mod:`hetsgd.data.download`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hetsgd.data.dataset import Parsed
from hetsgd.data.download import RemoteFile
from hetsgd.data.files import open_data
from hetsgd.data.labels import encode
from hetsgd.data.source import SingleFile
from hetsgd.errors import UserError

NUM_FEATURES = 54


def read_covtype(path: Path, source: str) -> Parsed:
    """Parse the UCI file (54 feature columns and the class, comma-separated); ``open_data``
    names the file in an error reading it, so only the parser's errors are caught here."""
    try:
        with open_data(path, text=True) as f:
            table = pd.read_csv(f, header=None, dtype=np.float32).to_numpy()
    except (ValueError, pd.errors.ParserError) as exc:
        raise UserError(f"cannot parse {path} as the UCI covtype CSV: {exc}") from exc
    if table.ndim != 2 or table.shape[1] != NUM_FEATURES + 1:
        raise UserError(f"{path} has {table.shape[1] if table.ndim == 2 else 0} columns; the UCI "
                        f"covtype file has {NUM_FEATURES + 1} (54 features and the class)")
    bad = ~np.isfinite(table)  # an empty cell reads as NaN: it would spread through scaling
    if bad.any():
        row, column = (int(i) for i in np.argwhere(bad)[0])
        what = "the class" if column == NUM_FEATURES else f"column {column + 1}"
        raise UserError(f"{path}: line {row + 1}, {what} is {table[row, column]}, not a finite "
                        "number")
    _, num_classes, (y,) = encode([table[:, -1]], "multiclass", str(path))
    return Parsed("multiclass", num_classes, np.ascontiguousarray(table[:, :-1]), y, None, None,
                  source)


SOURCES = (
    SingleFile("covtype", "UCI covertype, 7 classes (forest cover type from cartographic data)",
               "multiclass", "581,012 x 54",
               (RemoteFile("covtype.data.gz", "https://archive.ics.uci.edu/ml/"
                           "machine-learning-databases/covtype/covtype.data.gz"),),
               reader=read_covtype, label="covtype"),
)
