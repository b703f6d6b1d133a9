"""Generated data of any shape, for scale tests: always marked ``synthetic``.

Inputs are standard normal; labels come from a random one-hidden-layer tanh network (the
"teacher"), so they are a learnable but non-linear function of the inputs. Everything is drawn
from ``seed``, so the same seed gives the same data. The inputs are never held whole: each block
of rows has its own seeded stream and is generated when it is read, once for the labels and once
more when preparation copies it into the training set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetsgd.config import DatasetConfig
from hetsgd.config.problem import SyntheticConfig
from hetsgd.data.dataset import Parsed, block_rows, row_blocks
from hetsgd.data.source import Source

TEACHER_HIDDEN = 32


@dataclass(frozen=True)
class TeacherInputs:
    """The standard normal inputs as ``Rows``: block b (of ``row_blocks``' size, so that a load
    reading block by block generates each once) is drawn from the seed's b-th spawned stream, and
    any slice reads the same values whatever was read before."""

    n_samples: int
    n_features: int
    seed: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.n_samples, self.n_features

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    @property
    def _block_rows(self) -> int:
        return block_rows(self.n_features * self.dtype.itemsize)

    def __getitem__(self, rows: slice) -> np.ndarray:
        start, stop, step = rows.indices(self.n_samples)
        if step != 1:
            raise ValueError("TeacherInputs are read in contiguous slices only")
        size = self._block_rows
        first, last = start // size, max(start, stop - 1) // size
        block = np.concatenate([self._block(b) for b in range(first, last + 1)])
        return block[start - first * size: stop - first * size]

    def _block(self, index: int) -> np.ndarray:
        rows = min(self._block_rows, self.n_samples - index * self._block_rows)
        stream = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(index,)))
        return stream.standard_normal((rows, self.n_features), dtype=np.float32)


def make_synthetic(n_samples: int, n_features: int, n_classes: int, seed: int) -> Parsed:
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((n_features, TEACHER_HIDDEN)).astype(np.float32) / np.sqrt(n_features)
    b1 = rng.standard_normal(TEACHER_HIDDEN).astype(np.float32) * 0.1
    w2 = rng.standard_normal((TEACHER_HIDDEN, n_classes)).astype(np.float32)
    x = TeacherInputs(n_samples, n_features, seed)
    logits = np.concatenate([np.tanh(x[start:stop] @ w1 + b1) @ w2
                             for start, stop in row_blocks(x)])
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
        assert isinstance(cfg, SyntheticConfig), "dataset=synthetic is composed into a SyntheticConfig"
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
