"""Label encoding shared by the file parsers: raw label values in, ``Dataset`` label arrays out.

Binary files label their classes {-1, +1}, {0, 1} or {1, 2}: the smaller value becomes 0, the
larger 1. Multiclass labels become 0..C-1 in sorted order of their values. Text labels (a CSV's
class names) are numbered the same way, in sorted order of the names, which are kept for the
run's summary. Train and test are encoded together, so a class missing from the test part keeps
its index; a label of the test part that the training part lacks is refused, as no model learns a
class it never sees, and two files labelled differently ({-1, +1} and {0, 1}) would otherwise
read as three classes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hetsgd.errors import UserError


def encode(parts: Sequence[np.ndarray], task: str, where: str) -> tuple[str, int, list[np.ndarray]]:
    """Encode single-label parts for ``task`` ("auto" infers binary or multiclass).

    Returns the task, the number of classes and the encoded parts.
    """
    _check_test_labels(parts, where)
    values = np.unique(np.concatenate([np.asarray(p) for p in parts]))
    if len(values) < 2:
        raise UserError(f"{where} has {len(values)} distinct label value(s); a classifier needs "
                        "at least two")
    if task == "auto":
        fractional = values[values != np.round(values)]
        if len(fractional):
            raise UserError(f"{where} has non-integer labels (e.g. {fractional[0]}); it looks "
                            "like a regression set, and hetsgd trains classifiers")
        task = "binary" if len(values) == 2 else "multiclass"
    if task == "binary":
        if len(values) != 2:
            raise UserError(f"dataset.task=binary but {where} has {len(values)} distinct labels")
        return task, 2, [(np.asarray(p) == values[1]).astype(np.float32) for p in parts]
    if task != "multiclass":
        raise UserError(f"{where}: single-label data cannot be read as task={task}")
    return task, len(values), [np.searchsorted(values, p).astype(np.int64) for p in parts]


def encode_named(parts: Sequence[np.ndarray], task: str,
                 where: str) -> tuple[str, int, list[np.ndarray], tuple[str, ...] | None]:
    """``encode`` for labels that may be text: numbers (and booleans) as ``encode`` takes them,
    with no names; anything else read as names, numbered in sorted order, names returned."""
    arrays = [np.asarray(p) for p in parts]
    if all(a.dtype.kind in "biuf" for a in arrays):
        return (*encode([a.astype(np.float64) if a.dtype.kind == "b" else a for a in arrays],
                        task, where), None)
    texts = [a.astype(str) for a in arrays]
    _check_test_labels(texts, where)
    names = np.unique(np.concatenate(texts))
    task, num_classes, encoded = encode([np.searchsorted(names, t) for t in texts], task, where)
    return task, num_classes, encoded, tuple(str(name) for name in names)


def _check_test_labels(parts: Sequence[np.ndarray], where: str) -> None:
    """Refuse a test part (the second of ``parts``) holding a label the training part lacks."""
    if len(parts) < 2:
        return
    unseen = np.setdiff1d(np.asarray(parts[1]), np.asarray(parts[0]))
    if len(unseen):
        value = unseen[0].item() if isinstance(unseen[0], np.generic) else unseen[0]
        raise UserError(f"{where}: the test part holds label {value!r} ({len(unseen)} such "
                        "value(s)), which the training part does not: a model cannot learn a "
                        "class it never sees (are both labelled alike?)")


def multi_hot(parts: Sequence[Sequence[Sequence[float]]], where: str,
              num_classes: int | None = None) -> tuple[int, list[np.ndarray]]:
    """Multi-hot float32 [N, C] from per-example label lists.

    With ``num_classes`` the labels are taken as indices 0..C-1 (the extreme classification
    format); without, the distinct values are numbered in sorted order.
    """
    if num_classes is None:
        values = sorted({label for part in parts for labels in part for label in labels})
        index = {value: float(i) for i, value in enumerate(values)}
        num_classes = len(values)
        parts = [[[index[label] for label in labels] for labels in part] for part in parts]
    encoded = []
    for part in parts:
        rows = np.repeat(np.arange(len(part)), [len(labels) for labels in part])
        cols = np.fromiter((label for labels in part for label in labels), dtype=np.float64,
                           count=len(rows))
        if len(cols) and (cols.min() < 0 or cols.max() >= num_classes or
                          np.any(cols != np.round(cols))):
            raise UserError(f"{where} has labels outside 0..{num_classes - 1}")
        y = np.zeros((len(part), num_classes), dtype=np.float32)
        y[rows, cols.astype(np.int64)] = 1.0
        encoded.append(y)
    return num_classes, encoded
