"""scikit-learn's bundled digits (1,797 8x8 images, 10 classes): the default, needs no network.

Pixels are counts 0..16 and are scaled like any other dense set; there is no test split.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetsgd.config import DatasetConfig
from hetsgd.data.dataset import Parsed
from hetsgd.data.source import Source


@dataclass(frozen=True)
class Digits(Source):
    def load(self, cfg: DatasetConfig, seed: int, progress: bool) -> Parsed:
        from sklearn.datasets import load_digits  # scikit-learn loads only to read the set

        self.no_path(cfg)
        x, y = load_digits(return_X_y=True)
        return Parsed("multiclass", 10, x.astype(np.float32), y.astype(np.int64), None, None,
                      "scikit-learn's bundled digits (sklearn.datasets.load_digits)")

    def cached(self) -> bool:
        return True

    def fetch(self, progress: bool) -> list[Path]:
        return []

    def note(self) -> str:
        return "bundled with scikit-learn: nothing to fetch"


SOURCES = (Digits("digits", "scikit-learn's bundled 8x8 handwritten digits", "multiclass",
                  "1,797 x 64"),)
