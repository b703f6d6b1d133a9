"""scikit-learn's bundled digits (1,797 8x8 images, 10 classes): the default, needs no network.

Pixels are counts 0..16, kept as scikit-learn gives them (float64), and are scaled like any
other dense set (so exactly as the same numbers in a file of the user's are); there is no test
split.

The arrays go into the parsed cache like any file's, keyed by scikit-learn's version (the set
ships with it), so only a machine's first run imports scikit-learn to read them: about 2 s of a
short run's start.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import numpy as np

from hetsgd.config import DatasetConfig
from hetsgd.data.cache import load_or_parse
from hetsgd.data.dataset import Parsed
from hetsgd.data.native import loading_native
from hetsgd.data.source import Source


def _read_digits() -> Parsed:
    with loading_native():
        from sklearn.datasets import load_digits  # scikit-learn loads only to read the set

    x, y = load_digits(return_X_y=True)
    return Parsed("multiclass", 10, x, y.astype(np.int64), None, None,
                  "scikit-learn's bundled digits (sklearn.datasets.load_digits)")


@dataclass(frozen=True)
class Digits(Source):
    def load(self, cfg: DatasetConfig, seed: int, progress: bool) -> Parsed:
        self.no_path(cfg)
        return load_or_parse(self.name, [], {"scikit-learn": version("scikit-learn")},
                             _read_digits)

    def cached(self) -> bool:
        return True

    def fetch(self, progress: bool) -> list[Path]:
        return []

    def note(self) -> str:
        return "bundled with scikit-learn: nothing to fetch"


SOURCES = (Digits("digits", "scikit-learn's bundled 8x8 handwritten digits", "multiclass",
                  "1,797 x 64"),)
