"""UCI covertype, the 7-class version: 581,012 x 54 (10 quantities, 4 + 40 one-hot), classes 1..7.

The file is comma-separated with the class last; there is no published test split. UCI gives no
checksum, so the first download is trusted (see :mod:`hetsgd.data.download`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from hetsgd.config import DatasetConfig
from hetsgd.data.cache import existing_file, load_or_parse, open_decompressed
from hetsgd.data.dataset import Parsed
from hetsgd.data.download import RemoteFile, ensure, verify
from hetsgd.data.labels import encode
from hetsgd.data.progress import status
from hetsgd.data.source import Source
from hetsgd.errors import UserError

NUM_FEATURES = 54


def read_covtype(path: Path, source: str) -> Parsed:
    """Parse the UCI file (54 feature columns and the class, comma-separated)."""
    try:
        with open_decompressed(path) as f:
            table = pd.read_csv(f, header=None, dtype=np.float32).to_numpy()
    except (ValueError, OSError, EOFError, pd.errors.ParserError) as exc:
        raise UserError(f"cannot parse {path} as the UCI covtype CSV: {exc}") from exc
    if table.ndim != 2 or table.shape[1] != NUM_FEATURES + 1:
        raise UserError(f"{path} has {table.shape[1] if table.ndim == 2 else 0} columns; the UCI "
                        f"covtype file has {NUM_FEATURES + 1} (54 features and the class)")
    _, num_classes, (y,) = encode([table[:, -1]], "multiclass", str(path))
    return Parsed("multiclass", num_classes, np.ascontiguousarray(table[:, :-1]), y, None, None,
                  source)


@dataclass(frozen=True)
class Covtype(Source):
    """``dataset.path`` replaces the cached ``covtype.data.gz``."""

    def load(self, cfg: DatasetConfig, seed: int, progress: bool) -> Parsed:
        remote = self.remotes[0]
        path = existing_file(cfg.path) if cfg.path else ensure(remote, self.name, progress)

        def parse() -> Parsed:
            if not cfg.path:
                verify(path, remote)
            with status(f"parsing {path.name}", progress):
                return read_covtype(path, f"covtype from {remote.url}: {path}")

        return load_or_parse(self.name, [path], {}, parse)


SOURCES = (
    Covtype("covtype", "UCI covertype, 7 classes (forest cover type from cartographic data)",
            "multiclass", "581,012 x 54",
            (RemoteFile("covtype.data.gz", "https://archive.ics.uci.edu/ml/"
                        "machine-learning-databases/covtype/covtype.data.gz"),)),
)
