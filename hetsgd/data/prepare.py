"""From parsed arrays to a ``Dataset``: test split, training subset, feature scaling.

Every choice here is seeded and fit on the training part only, so test numbers never leak into
training. Rows keep their file order inside each part: ``data.shuffle=false`` walks the data in
file order, as the Hogbatch authors' code does.

Scaling (``dataset.scale``), recorded in ``Dataset.scaling`` as actually applied:

- ``auto`` (the default) is the source's own ``default_scale``, resolved once by
  :func:`hetsgd.data.registry.load_dataset`: ``none`` for LIBSVM files, which are published
  already scaled (``standard`` for covtype_binary, whose file holds raw quantities);
  ``standard`` for every other source.
- dense sets: ``standard`` is zero mean, unit variance per feature; ``maxabs`` divides each
  feature by its largest absolute value; ``none`` leaves the values as they are.
- sparse sets are never densified: ``standard`` would subtract a mean from every zero, so it
  means max-abs scaling there (no centring: each column divided by its largest absolute value),
  and the matrix stays CSR with the same non-zeros; ``Dataset.scaling`` then says ``maxabs``.
- image sets: ``standard`` normalises each channel of [0, 1] pixels with the source's published
  mean and std (CIFAR-10: the biased local SGD authors') or, where there are none, with those of
  the training part; ``maxabs`` is pixels / 255; ``none`` is raw 0..255. ``Dataset.pixel_zero``
  records what a black pixel became, per channel: the padding of ``data.augment=crop_flip``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import scipy.sparse as sp
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import MaxAbsScaler, StandardScaler

from hetsgd.config import DatasetConfig
from hetsgd.data.dataset import Dataset, Features, Parsed


def prepare(parsed: Parsed, cfg: DatasetConfig, seed: int, scaling: str) -> Dataset:
    """Split, subset and scale; ``scaling`` is ``dataset.scale`` with ``auto`` already resolved."""
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
    if parsed.image_shape is not None and scaling == "standard" and parsed.channel_stats is None:
        # measured once, here, so that the scaling and pixel_zero use the same statistics
        parsed = replace(parsed, channel_stats=channel_stats(x_train, parsed.image_shape[0]))
    x_train, x_test, applied = scale(x_train, x_test, parsed, scaling)
    return Dataset(cfg.name, parsed.task, x_train, y_train, x_test, y_test, parsed.num_classes,
                   parsed.image_shape, parsed.synthetic, source, applied,
                   pixel_zero=pixel_zero(parsed, applied))


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
          how: str) -> tuple[Features, Features, str]:
    """float32 features scaled as ``how`` says, with statistics of the training part only, and
    the scaling applied (``maxabs`` where ``standard`` was asked of a sparse set)."""
    if how not in ("standard", "maxabs", "none"):
        raise ValueError(f"unresolved scaling {how!r}")
    if parsed.image_shape is not None:
        return (*_scale_images(x_train, x_test, parsed, how), how)
    x_train, x_test = (x.astype(np.float32, copy=False) for x in (x_train, x_test))
    if how == "none":
        return x_train, x_test, how
    if how == "standard" and not sp.issparse(x_train):
        scaler: StandardScaler | MaxAbsScaler = StandardScaler()
    else:
        scaler, how = MaxAbsScaler(), "maxabs"  # divides by column maxima: CSR in, CSR out
    scaler.fit(x_train)
    return scaler.transform(x_train), scaler.transform(x_test), how


def _scale_images(x_train: np.ndarray, x_test: np.ndarray, parsed: Parsed,
                  how: str) -> tuple[np.ndarray, np.ndarray]:
    x_train, x_test = (np.asarray(x, dtype=np.float32) for x in (x_train, x_test))
    if how == "none":
        return x_train, x_test
    x_train, x_test = x_train / 255.0, x_test / 255.0
    if how == "maxabs":
        return x_train, x_test
    channels = parsed.image_shape[0] if parsed.image_shape else 1
    stats = parsed.channel_stats or channel_stats(x_train, channels, top=1.0)
    mean, std = (np.asarray(s, dtype=np.float32) for s in stats)
    std = np.where(std > 0, std, 1.0).astype(np.float32)

    def normalise(x: np.ndarray) -> np.ndarray:
        shaped = x.reshape(len(x), channels, -1)
        return ((shaped - mean[:, None]) / std[:, None]).reshape(len(x), -1)

    return normalise(x_train), normalise(x_test)


def channel_stats(pixels: np.ndarray, channels: int,
                  top: float = 255.0) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel (mean, std) of [0, 1] pixels, from pixels in 0..``top`` (raw: 255)."""
    per_channel = np.asarray(pixels).reshape(len(pixels), channels, -1)
    mean = per_channel.mean(axis=(0, 2), dtype=np.float64) / top
    std = per_channel.std(axis=(0, 2), dtype=np.float64) / top
    return tuple(mean.tolist()), tuple(std.tolist())


def pixel_zero(parsed: Parsed, how: str) -> tuple[float, ...] | None:
    """Per channel, what a black (zero) pixel becomes under ``how``, through the very arithmetic
    of the scaling: ``(0 - mean) / std`` for ``standard``, 0 otherwise; None for flat sets."""
    if parsed.image_shape is None:
        return None
    if how == "standard" and parsed.channel_stats is None:
        raise ValueError("pixel_zero of a standard-scaled image set needs its channel statistics")
    channels, height, width = parsed.image_shape
    black = np.zeros((1, channels * height * width), dtype=np.uint8)
    scaled, _ = _scale_images(black, black, parsed, how)
    return tuple(float(v) for v in scaled.reshape(channels, -1)[:, 0])
