"""A seeded split of a dataset's rows, drawn by scikit-learn once and kept in the data cache.

A later run of the same data and seed takes the split from the cache, without drawing it again
or importing scikit-learn. An entry is plain arrays, never a pickle: an ``.npz`` under
``splits/``, named by a hash of all the draw depends on (the labels' bytes, the task, the seed,
the sizes, scikit-learn's version), read with ``allow_pickle=False``, written atomically. What
it holds is one flag per row (kept, or the rest), so an entry of the right length is a split of
these rows if it keeps as many as the draw does; one that is not (unreadable, of another length
or count, crafted) costs a warning line naming it, and the split is drawn again and the entry
rewritten.
"""

from __future__ import annotations

import hashlib
import json
import math
import zipfile
from importlib.metadata import version
from pathlib import Path

import numpy as np

from hetsgd.atomic import replace_file
from hetsgd.data.cache import data_home
from hetsgd.data.download_progress import console
from hetsgd.data.files import open_data, reason
from hetsgd.data.native import loading_native
from hetsgd.errors import UserError

SPLIT_FORMAT = 1  # bump when what an entry holds, or how its key is made, changes
_HOWS = ("stratified", "random")


def split_rows(y: np.ndarray, task: str, seed: int, *, test_size: float | None = None,
               train_size: int | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """Seeded (kept, rest) row numbers, each in file order, stratified by class where possible:
    not for multilabel sets, nor where a part is too small to hold every class; and how it was
    drawn (``stratified`` or ``random``)."""
    entry = _entry(y, task, seed, test_size, train_size)
    cached = _read(entry, len(y), _kept_count(len(y), test_size, train_size))
    if cached is not None:
        kept, how = cached
    else:
        kept, how = _draw(y, task, seed, test_size, train_size)
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            replace_file(entry, lambda f: np.savez(f, kept=kept, how=np.array(how)), binary=True)
        except OSError as exc:  # a full disk or read-only cache costs speed later, not this run
            console.print(f"could not cache a split of {len(y)} rows at {entry}: {reason(exc)}",
                          markup=False, soft_wrap=True)
    return np.flatnonzero(kept), np.flatnonzero(~kept), how


def _entry(y: np.ndarray, task: str, seed: int, test_size: float | None,
           train_size: int | None) -> Path:
    """The cache file of this split. The draw is scikit-learn's with numpy's ``RandomState``,
    whose stream numpy keeps the same across its versions: scikit-learn's version keys it."""
    labels = np.ascontiguousarray(y)
    if labels.dtype.hasobject:  # the bytes of objects are their addresses: no key
        raise TypeError("a split's labels are encoded numbers, not objects")
    key = json.dumps({"format": SPLIT_FORMAT, "task": task, "seed": seed, "test_size": test_size,
                      "train_size": train_size, "scikit-learn": version("scikit-learn"),
                      "dtype": labels.dtype.str, "shape": labels.shape}, sort_keys=True)
    digest = hashlib.sha256(key.encode())
    digest.update(labels.data)
    return data_home() / "splits" / f"{digest.hexdigest()[:32]}.npz"


def _kept_count(rows: int, test_size: float | None, train_size: int | None) -> int:
    """How many of ``rows`` rows the draw keeps: ``train_size``, else all but
    ceil(``test_size`` x rows), scikit-learn's rounding (a test part rounds up)."""
    if train_size is not None:
        return train_size
    assert test_size is not None, "a split is given one of its sizes"
    return rows - math.ceil(test_size * rows)


def _read(entry: Path, rows: int, kept_count: int) -> tuple[np.ndarray, str] | None:
    """The entry's (kept flags, how), or None where there is none or it is not a split of
    ``rows`` rows keeping ``kept_count`` (then with a warning line naming it): an entry edited
    by hand would change the test fraction unseen."""
    if not entry.exists():
        return None
    try:
        with open_data(entry, decompress=False) as f, np.load(f, allow_pickle=False) as archive:
            kept, how = archive["kept"], str(archive["how"])
        if kept.dtype != np.bool_ or kept.shape != (rows,) or how not in _HOWS:
            raise ValueError(f"it holds no split of {rows} rows")
        if (count := int(kept.sum())) != kept_count:
            raise ValueError(f"it keeps {count} of {rows} rows, not {kept_count}")
    except (UserError, OSError, ValueError, KeyError, TypeError, AttributeError, EOFError,
            MemoryError, zipfile.BadZipFile) as exc:  # what np.load of a file no .npz raises
        console.print(f"the split cache's {entry} is unusable ({reason(exc)}): drawing the split "
                      "again", markup=False, soft_wrap=True)
        return None
    return kept, how


def _draw(y: np.ndarray, task: str, seed: int, test_size: float | None,
          train_size: int | None) -> tuple[np.ndarray, str]:
    """:func:`split_rows`'s draw, as one flag per row (True: kept) and how it was drawn."""
    with loading_native():
        from sklearn.model_selection import train_test_split  # scikit-learn loads for a split

    rows = np.arange(len(y))
    kwargs = {"test_size": test_size, "train_size": train_size, "random_state": seed}
    how = "random"
    kept = None
    if task != "multilabel":
        try:
            kept, _ = train_test_split(rows, stratify=y, **kwargs)
            how = "stratified"
        except ValueError:
            pass  # a part with fewer examples than classes: fall back to a plain draw
    if kept is None:
        try:
            kept, _ = train_test_split(rows, **kwargs)
        except ValueError as exc:  # a part would be empty
            raise UserError(f"cannot split {len(y)} example(s) into two parts: {exc}") from None
    flags = np.zeros(len(y), dtype=bool)
    flags[kept] = True
    return flags, how
