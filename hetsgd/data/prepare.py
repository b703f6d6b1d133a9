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

Integer features: an ``.npz`` or ``.npy`` of integers (token ids, say) read by ``dataset=files``
for a model of the user's own (``model=custom``), which may take them as they are (an
``nn.Embedding``), stays integer, as int64, the dtype torch's index operations take, and is not
scaled under ``dataset.scale=auto`` or ``none``; ``standard`` or ``maxabs`` asked of it scale it
as float32, as they do for every other model, whose first layer multiplies its input.

Memory and precision: dense parts are written once, straight into arrays from the caller's
``allocate`` (a run's are in shared memory), reading the parsed features a block of rows at a
time; the statistics are those of the training rows of the parsed features, accumulated block by
block in float64, and each block is scaled in float64 as it is written, then rounded to the
part's dtype. So features wider than float32 (a table's, a float64 array's) are centred before
they are rounded: a Unix timestamp's seconds would not survive float32 (its steps are 128 s near
1.7e9), its distance from the mean does. A load holds little besides its result.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from hetsgd.config import DatasetConfig
from hetsgd.data.dataset import Allocate, Dataset, Parsed, Rows, row_blocks
from hetsgd.data.splits import split_rows
from hetsgd.errors import UserError


def prepare(parsed: Parsed, cfg: DatasetConfig, seed: int, scaling: str,
            allocate: Allocate = np.empty, features_dtype: type = np.float32) -> Dataset:
    """Split, subset and scale; ``scaling`` is ``dataset.scale`` with ``auto`` already resolved;
    dense features (as ``features_dtype``: float32, or int64 for integers kept unscaled) and
    every label array are written into arrays from ``allocate``."""
    source = parsed.source
    if parsed.x_test is None or parsed.y_test is None:
        check_two_per_class(parsed.y_train, parsed.task, cfg.path or cfg.name)
        train, test, how = split_rows(parsed.y_train, parsed.task, seed,
                                      test_size=cfg.test_fraction)
        x_test_from, y_test_from = parsed.x_train, parsed.y_train
        source += f"; test: {how} {cfg.test_fraction:g} split of it (seed {seed})"
    else:
        train, test = np.arange(len(parsed.y_train)), np.arange(len(parsed.y_test))
        x_test_from, y_test_from = parsed.x_test, parsed.y_test
    if cfg.limit is not None and cfg.limit < len(train):
        keep, _, how = split_rows(parsed.y_train[train], parsed.task, seed, train_size=cfg.limit)
        train = train[keep]
        source += f"; train: {how} subset of {cfg.limit} (seed {seed})"
    y_train, y_test = (_take(y, rows, allocate) for y, rows in
                       ((parsed.y_train, train), (y_test_from, test)))
    if sp.issparse(parsed.x_train):  # each part selected once, fitted on the training one
        x_train, x_test = _select(parsed.x_train, train), _select(x_test_from, test)
        scaler = fit_scaler(x_train, np.arange(x_train.shape[0]), parsed, scaling)
        x_train, x_test = scaler.sparse(x_train), scaler.sparse(x_test)
    else:
        if parsed.image_shape is not None and scaling == "standard" \
                and parsed.channel_stats is None:
            # measured once, here, so that the scaling and pixel_zero use the same statistics
            stats = channel_stats(parsed.x_train, train, parsed.image_shape[0])
            parsed = replace(parsed, channel_stats=stats)
        scaler = fit_scaler(parsed.x_train, train, parsed, scaling)
        x_train, x_test = (allocate((len(rows), parsed.x_train.shape[1]), np.dtype(features_dtype))
                           for rows in (train, test))
        copies = [(train, x_train), (test, x_test)]
        if x_test_from is parsed.x_train:  # one pass over the file's rows fills both parts
            copy_rows(parsed.x_train, copies, scaler)
        else:
            copy_rows(parsed.x_train, copies[:1], scaler)
            copy_rows(x_test_from, copies[1:], scaler)
    return Dataset(cfg.name, parsed.task, x_train, y_train, x_test, y_test, parsed.num_classes,
                   parsed.image_shape, parsed.synthetic, source, scaler.name,
                   pixel_zero=pixel_zero(parsed, scaler), class_names=parsed.class_names,
                   table=parsed.table)


def _take(y: np.ndarray, rows: np.ndarray, allocate: Allocate) -> np.ndarray:
    out = allocate((len(rows), *y.shape[1:]), y.dtype)
    np.take(y, rows, axis=0, out=out)
    return out


def _select(x: sp.csr_matrix, rows: np.ndarray) -> sp.csr_matrix:
    """``x[rows]``, or ``x`` itself rather than a copy where ``rows`` are all its rows (a part's
    row numbers are ascending and distinct, so there are as many only when they are all)."""
    return x if len(rows) == x.shape[0] else x[rows]


def picked(x: Rows, rows: np.ndarray) -> Iterator[np.ndarray]:
    """``x[rows]`` a block of ``x`` at a time, rows ascending and distinct: a generated or cached
    ``Rows`` is never held whole."""
    for start, stop in row_blocks(x):
        lo, hi = np.searchsorted(rows, (start, stop))
        if lo < hi:
            yield _rows_of(x[start:stop], rows[lo:hi] - start)


def _rows_of(block: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``block[rows]``, a view where the rows are consecutive (no gathered copy)."""
    first, last = rows[0], rows[-1]
    return block[first:last + 1] if last - first == len(rows) - 1 else block[rows]


def copy_rows(x: Rows, copies: Sequence[tuple[np.ndarray, np.ndarray]],
              scaler: Scaler) -> None:
    """``out[i]`` = ``x[rows[i]]`` scaled, for every (rows, out), rows ascending and distinct, reading
    ``x`` once, a block of rows at a time."""
    for start, stop in row_blocks(x):
        block = None
        for rows, out in copies:
            lo, hi = np.searchsorted(rows, (start, stop))
            if lo < hi:
                block = x[start:stop] if block is None else block
                scaler.into(_rows_of(block, rows[lo:hi] - start), out[lo:hi])


def check_two_per_class(y: np.ndarray, task: str, where: str) -> None:
    """A test part split off by class needs every class on both sides: two examples at least."""
    if task == "multilabel":
        return
    values, counts = np.unique(y, return_counts=True)
    if counts.min() < 2:
        raise UserError(f"{where}: class {values[counts.argmin()]:g} (of 0..{len(values) - 1}, "
                        "in sorted label order) has a single example; splitting off a test part "
                        "needs at least 2 of each class (drop it, or give a test file)")


@dataclass(frozen=True)
class Scaler:
    """Per feature ``(x - shift) / divisor``, in float64; ``name`` is the scaling applied
    (``none``: no arithmetic at all)."""

    name: str
    shift: np.ndarray | None = None
    divisor: np.ndarray | float | None = None  # a number: the same for every feature

    def into(self, x: np.ndarray, out: np.ndarray) -> None:
        """``out[...]`` = ``x`` scaled, computed in the narrowest float that holds ``x`` exactly:
        in ``out`` itself for pixels and float32 features; in float64 for wider ones, which so
        are centred before they are rounded to ``out``'s float32."""
        if self.divisor is None:
            out[...] = x
            return
        dtype = np.result_type(x.dtype, np.float32)
        work = out if dtype == out.dtype else np.empty(x.shape, dtype)
        work[...] = x
        if self.shift is not None:
            work -= self.shift.astype(dtype, copy=False)
        work /= np.asarray(self.divisor, dtype=dtype)
        if work is not out:
            out[...] = work

    def sparse(self, x: sp.csr_matrix) -> sp.csr_matrix:
        """A float32 CSR matrix scaled: zeros stay zeros (a shift would densify, so sparse sets
        have none), and ``x``, which may be the parsed matrix itself, is left as it is."""
        if self.divisor is None:
            return x
        assert isinstance(self.divisor, np.ndarray)  # per feature: a number is for images only
        x = sp.csr_matrix(x, dtype=np.float32)
        scaled = np.divide(x.data, self.divisor[x.indices], dtype=np.float32)
        return sp.csr_matrix((scaled, x.indices, x.indptr), shape=x.shape)


def fit_scaler(x: Rows | sp.csr_matrix, train: np.ndarray, parsed: Parsed, how: str) -> Scaler:
    """The scaling ``how`` says, with statistics of the training rows ``train`` of ``x`` only
    (``maxabs`` where ``standard`` was asked of a sparse set)."""
    if how not in ("standard", "maxabs", "none"):
        raise ValueError(f"unresolved scaling {how!r}")
    if how == "none":
        return Scaler(how)
    if parsed.image_shape is not None:  # [0, 1] pixels, then each channel's statistics
        if how == "maxabs":
            return Scaler(how, None, 255.0)
        if parsed.channel_stats is None:
            raise ValueError("standard scaling of an image set needs its channel statistics")
        per_pixel = x.shape[1] // parsed.image_shape[0]
        mean, std = (np.repeat(np.asarray(s, dtype=np.float64), per_pixel)
                     for s in parsed.channel_stats)
        return Scaler(how, 255.0 * mean, 255.0 * _nonzero(std))
    if sp.issparse(x):
        top = abs(_select(x, train)).max(axis=0).toarray().ravel()
        return Scaler("maxabs", None, _nonzero(top).astype(np.float32))
    if how == "maxabs":
        top = np.zeros(x.shape[1])
        for part in picked(x, train):
            # in float64: the absolute value of int8's -128 (any signed minimum) wraps in its own type
            top = np.maximum(top, np.abs(part, dtype=np.float64).max(axis=0))
        return Scaler(how, None, _nonzero(top))
    mean, var = column_moments(x, train)
    return Scaler(how, mean, _nonzero(np.sqrt(var)))


def _nonzero(scale: np.ndarray) -> np.ndarray:
    """A constant feature is left as it is: a divisor of 1 where the statistic is 0."""
    return np.where(scale > 0, scale, 1.0)


def column_moments(x: Rows, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column mean and (population) variance of ``x[rows]``, in one pass, block by block, in
    float64: each block's own mean and squared deviations, merged (Chan et al.'s update), so a
    large mean never cancels against the squares, nor does a square leave float32's range."""
    count, mean, squares = 0, np.zeros(x.shape[1]), np.zeros(x.shape[1])
    for part in picked(x, rows):
        part = part.astype(np.float64)
        n, part_mean = len(part), part.mean(axis=0)
        part -= part_mean
        delta, total = part_mean - mean, count + n
        mean += delta * (n / total)
        squares += np.square(part, out=part).sum(axis=0) + np.square(delta) * (count * n / total)
        count = total
    return mean, squares / max(count, 1)


def channel_stats(pixels: Rows, rows: np.ndarray,
                  channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel (mean, std) of [0, 1] pixels, from the raw pixels (0..255) of ``rows``, pooled
    from the moments of each pixel position (every position has the same count)."""
    mean, var = (m.reshape(channels, -1) for m in column_moments(pixels, rows))
    channel_mean = mean.mean(axis=1)
    channel_var = (var + np.square(mean - channel_mean[:, None])).mean(axis=1)
    return (tuple((channel_mean / 255.0).tolist()),
            tuple((np.sqrt(channel_var) / 255.0).tolist()))


def pixel_zero(parsed: Parsed, scaler: Scaler) -> tuple[float, ...] | None:
    """Per channel, what a black (zero) pixel became, through the very arithmetic of the
    scaling: ``(0 - mean) / std`` for ``standard``, 0 otherwise; None for flat sets."""
    if parsed.image_shape is None:
        return None
    channels, height, width = parsed.image_shape
    black = np.empty((1, channels * height * width), dtype=np.float32)
    scaler.into(np.zeros(black.shape, dtype=np.uint8), black)
    return tuple(float(v) for v in black.reshape(channels, -1)[:, 0])
