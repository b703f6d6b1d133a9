"""Two shapes of data: ``Parsed`` (a source's arrays as read) and ``Dataset`` (ready to train).

A source only reads its files into ``Parsed``; splitting, subsetting and scaling happen once, in
:mod:`hetsgd.data.prepare`, so that every source gets the same treatment and the parsed arrays can
be cached independently of the seed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

import numpy as np
import scipy.sparse as sp

Features: TypeAlias = np.ndarray | sp.csr_matrix
# Where a prepared array is written: ``np.empty`` by default; a run passes an allocator of shared
# memory, so that the training set exists once, where the workers read it.
Allocate = Callable[[tuple[int, ...], np.dtype], np.ndarray]
# what a load reads, generates or scales at a time: bounds what it holds besides its result
BLOCK_BYTES = 4 << 20
# the largest feature value a model trains on: past it, float32 is infinite
FLOAT32_MAX = float(np.finfo(np.float32).max)


class Rows(Protocol):
    """Dense features too large to hold twice (generated, or in the cache), read only as
    contiguous blocks of rows, ``rows[start:stop]``; numpy arrays qualify too."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype: ...

    def __getitem__(self, rows: slice) -> np.ndarray: ...


def block_rows(row_bytes: int) -> int:
    """Rows in a block of about ``BLOCK_BYTES``."""
    return max(1, BLOCK_BYTES // max(row_bytes, 1))


def row_blocks(x: Rows) -> Iterator[tuple[int, int]]:
    """(start, stop) of consecutive blocks of about ``BLOCK_BYTES`` covering the rows of ``x``."""
    step = block_rows(x.shape[1] * x.dtype.itemsize)
    for start in range(0, x.shape[0], step):
        yield start, min(start + step, x.shape[0])


@dataclass(frozen=True)
class Parsed:
    """A source's arrays before split and scaling; labels are already in ``Dataset`` form.

    Images keep raw ``uint8`` pixels here (small to cache); ``channel_stats`` holds the per-channel
    (mean, std) of [0, 1] pixels to normalise with, or None to measure them on the training part.
    ``x_test`` is None where the source publishes no test split. Dense features may be ``Rows``
    read block by block, so that preparation never holds them whole besides its result.
    ``class_names`` names the classes 0..C-1 where the data names them (text labels, the
    subfolders of an image folder), None where classes are numbers only.
    """

    task: str
    num_classes: int
    x_train: Features | Rows
    y_train: np.ndarray
    x_test: Features | Rows | None
    y_test: np.ndarray | None
    source: str
    image_shape: tuple[int, int, int] | None = None
    channel_stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    synthetic: bool = False
    class_names: tuple[str, ...] | None = None
    # a table's: its feature columns counted, those one-hot encoded with the features each
    # became, and the rows left out for a missing value (see hetsgd.data.columns)
    table: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # the parsed cache gives the names back as a JSON list
        if self.class_names is not None:
            object.__setattr__(self, "class_names", tuple(self.class_names))


@dataclass(frozen=True)
class Dataset:
    """Features float32 [N, D] (CSR for sparse sets, images flattened from ``image_shape``), or
    int64 where an array's integers are kept for a model that takes them (token ids).

    Labels: binary float32 {0, 1} [N]; multiclass int64 in 0..C-1 [N]; multilabel float32
    multi-hot [N, C].
    """

    name: str
    task: str
    x_train: Features
    y_train: np.ndarray
    x_test: Features
    y_test: np.ndarray
    num_classes: int
    image_shape: tuple[int, int, int] | None
    synthetic: bool = False
    source: str = ""
    # the scaling applied to the features: "standard", "maxabs" or "none" (``dataset.scale``
    # with ``auto`` resolved for the source; a sparse set asked for "standard" gets "maxabs")
    scaling: str = "none"
    # image sets: per channel, the value a zero (black) pixel takes after the scaling, which is
    # what zero padding in pixel space becomes (data.augment=crop_flip pads with it)
    pixel_zero: tuple[float, ...] | None = None
    # the names of classes 0..C-1 where the data gives them (text labels, image subfolders)
    class_names: tuple[str, ...] | None = None
    table: dict[str, Any] | None = None  # ``Parsed.table``

    @property
    def num_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.x_test.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.x_train.shape[1])

    @property
    def num_outputs(self) -> int:
        """Width of the model's last layer: one logit for binary, one per class otherwise."""
        return 1 if self.task == "binary" else self.num_classes

    @property
    def is_sparse(self) -> bool:
        return sp.issparse(self.x_train)
