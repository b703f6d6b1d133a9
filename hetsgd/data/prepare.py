"""From parsed arrays to a ``Dataset``: test split, training subset, feature scaling.

Every choice here is seeded and fit on the training part only, so test numbers never leak into
training. Rows keep their file order inside each part: ``data.shuffle=false`` walks the data in
file order, as the Hogbatch authors' code does.

Scaling (``dataset.scale``):

- dense sets: ``standard`` is zero mean, unit variance per feature; ``maxabs`` divides each
  feature by its largest absolute value; ``none`` leaves the values as they are.
- sparse sets: ``standard`` would fill in every zero, so it means max-abs scaling there too,
  which keeps the matrix sparse.
- image sets: ``standard`` normalises each channel of [0, 1] pixels with the source's published
  mean and std (CIFAR-10: the biased local SGD authors') or, where there are none, with those of
  the training part; ``maxabs`` is pixels / 255; ``none`` is raw 0..255.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import MaxAbsScaler, StandardScaler

from hetsgd.config import DatasetConfig
from hetsgd.data.dataset import Dataset, Features, Parsed


def prepare(parsed: Parsed, cfg: DatasetConfig, seed: int) -> Dataset:
    source = parsed.source
    x_train, y_train = parsed.x_train, parsed.y_train
    if parsed.x_test is None or parsed.y_test is None:
        train, test, how = split_rows(y_train, parsed.task, seed, test_size=cfg.test_fraction)
        x_test, y_test = x_train[test], y_train[test]
        x_train, y_train = x_train[train], y_train[train]
        source += f"; test: {how} {cfg.test_fraction:g} split of it (seed {seed})"
    else:
        x_test, y_test = parsed.x_test, parsed.y_test
    if cfg.limit is not None and cfg.limit < len(y_train):
        keep, _, how = split_rows(y_train, parsed.task, seed, train_size=cfg.limit)
        x_train, y_train = x_train[keep], y_train[keep]
        source += f"; train: {how} subset of {cfg.limit} (seed {seed})"
    x_train, x_test = scale(x_train, x_test, parsed, cfg.scale)
    return Dataset(cfg.name, parsed.task, x_train, y_train, x_test, y_test, parsed.num_classes,
                   parsed.image_shape, parsed.synthetic, source)


def split_rows(y: np.ndarray, task: str, seed: int, *, test_size: float | None = None,
               train_size: int | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """Seeded (kept, rest) row numbers, each in file order, stratified by class where possible:
    not for multilabel sets, nor where a class is too small to appear on both sides."""
    rows = np.arange(len(y))
    kwargs = {"test_size": test_size, "train_size": train_size, "random_state": seed}
    if task != "multilabel":
        try:
            kept, rest = train_test_split(rows, stratify=y, **kwargs)
            return np.sort(kept), np.sort(rest), "stratified"
        except ValueError:
            pass  # a class with too few members for stratification: fall back to a plain draw
    kept, rest = train_test_split(rows, **kwargs)
    return np.sort(kept), np.sort(rest), "random"


def scale(x_train: Features, x_test: Features, parsed: Parsed,
          how: str) -> tuple[Features, Features]:
    """float32 features scaled as ``how`` says, with statistics of the training part only."""
    if parsed.image_shape is not None:
        return _scale_images(x_train, x_test, parsed, how)
    x_train, x_test = (x.astype(np.float32, copy=False) for x in (x_train, x_test))
    if how == "none":
        return x_train, x_test
    scaler = StandardScaler() if how == "standard" and not sp.issparse(x_train) else MaxAbsScaler()
    scaler.fit(x_train)
    return scaler.transform(x_train), scaler.transform(x_test)


def _scale_images(x_train: np.ndarray, x_test: np.ndarray, parsed: Parsed,
                  how: str) -> tuple[np.ndarray, np.ndarray]:
    x_train, x_test = (np.asarray(x, dtype=np.float32) for x in (x_train, x_test))
    if how == "none":
        return x_train, x_test
    x_train, x_test = x_train / 255.0, x_test / 255.0
    if how == "maxabs":
        return x_train, x_test
    channels = parsed.image_shape[0] if parsed.image_shape else 1
    if parsed.channel_stats is not None:
        mean, std = (np.asarray(s, dtype=np.float32) for s in parsed.channel_stats)
    else:
        per_channel = x_train.reshape(len(x_train), channels, -1)
        mean = per_channel.mean(axis=(0, 2), dtype=np.float64).astype(np.float32)
        std = per_channel.std(axis=(0, 2), dtype=np.float64).astype(np.float32)
    std = np.where(std > 0, std, 1.0).astype(np.float32)

    def normalise(x: np.ndarray) -> np.ndarray:
        shaped = x.reshape(len(x), channels, -1)
        return ((shaped - mean[:, None]) / std[:, None]).reshape(len(x), -1)

    return normalise(x_train), normalise(x_test)
