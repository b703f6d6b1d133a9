"""Two shapes of data: ``Parsed`` (a source's arrays as read) and ``Dataset`` (ready to train).

A source only reads its files into ``Parsed``; splitting, subsetting and scaling happen once, in
:mod:`hetsgd.data.prepare`, so that every source gets the same treatment and the parsed arrays can
be cached independently of the seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

Features = np.ndarray | sp.csr_matrix

@dataclass(frozen=True)
class Parsed:
    """A source's arrays before split and scaling; labels are already in ``Dataset`` form.

    Images keep raw ``uint8`` pixels here (small to cache); ``channel_stats`` holds the per-channel
    (mean, std) of [0, 1] pixels to normalise with, or None to measure them on the training part.
    ``x_test`` is None where the source publishes no test split.
    """

    task: str
    num_classes: int
    x_train: Features
    y_train: np.ndarray
    x_test: Features | None
    y_test: np.ndarray | None
    source: str
    image_shape: tuple[int, int, int] | None = None
    channel_stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    synthetic: bool = False


@dataclass(frozen=True)
class Dataset:
    """Features float32 [N, D] (CSR for sparse sets, images flattened from ``image_shape``).

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
