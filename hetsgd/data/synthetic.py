"""Generated data of any shape, for scale tests: always marked ``synthetic``.

Inputs are standard normal; labels come from a random one-hidden-layer tanh network (the
"teacher"), so they are a learnable but non-linear function of the inputs. Everything is drawn
from ``seed``, so the same seed gives the same data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetsgd.config import DatasetConfig
from hetsgd.data.dataset import Parsed
from hetsgd.data.source import Source

TEACHER_HIDDEN = 32
_CHUNK = 65536  # rows per block, so the teacher's hidden layer never holds all rows at once


def make_synthetic(n_samples: int, n_features: int, n_classes: int, seed: int) -> Parsed:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_samples, n_features), dtype=np.float32)
    w1 = rng.standard_normal((n_features, TEACHER_HIDDEN)).astype(np.float32) / np.sqrt(n_features)
    b1 = rng.standard_normal(TEACHER_HIDDEN).astype(np.float32) * 0.1
    w2 = rng.standard_normal((TEACHER_HIDDEN, n_classes)).astype(np.float32)
    logits = np.concatenate([np.tanh(x[i:i + _CHUNK] @ w1 + b1) @ w2
                             for i in range(0, n_samples, _CHUNK)])
    logits -= logits.mean(axis=0)  # centring keeps every class in use
    labels = logits.argmax(axis=1)
    binary = n_classes == 2
    y = labels.astype(np.float32) if binary else labels.astype(np.int64)
    source = (f"synthetic: {n_samples} x {n_features}, {n_classes} classes from a random "
              f"tanh teacher ({TEACHER_HIDDEN} hidden), seed {seed}")
    return Parsed("binary" if binary else "multiclass", n_classes, x, y, None, None, source,
                  synthetic=True)


@dataclass(frozen=True)
class Synthetic(Source):
    def load(self, cfg: DatasetConfig, seed: int, progress: bool) -> Parsed:
        self.no_path(cfg)
        return make_synthetic(cfg.n_samples, cfg.n_features, cfg.n_classes, seed)

    def cached(self) -> bool:
        return True

    def fetch(self, progress: bool) -> list[Path]:
        return []

    def note(self) -> str:
        return "generated from dataset.n_samples, n_features, n_classes and the seed"


SOURCES = (Synthetic("synthetic", "generated: random inputs labelled by a random MLP teacher",
                     "auto", "dataset.n_samples x dataset.n_features"),)
