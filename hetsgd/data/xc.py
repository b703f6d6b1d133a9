"""Multi-label sets from the Extreme Classification Repository (delicious).

The repository hands its small sets out as zip archives behind links that are not stable, so
they are not fetched: the user downloads the archive and puts its files in the cache. Its text
format: a first line ``N D L`` (examples, features, labels), then one example per line,
``l1,l2,... f:v f:v ...`` with 0-based label and feature indices. The split files beside it
(``<name>_trSplit.txt``, ``<name>_tstSplit.txt``) list 1-based example numbers, one column per
published split; the first column is used. Without them a seeded test part is split off.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetsgd.config import DatasetConfig
from hetsgd.data.cache import data_home, existing_file, find_local, load_or_parse
from hetsgd.data.dataset import Parsed
from hetsgd.data.download_progress import status
from hetsgd.data.files import open_data
from hetsgd.data.labels import multi_hot
from hetsgd.data.libsvm import DENSE_MAX_FEATURES, MAX_FEATURES, check_parsed, corrupt_error
from hetsgd.data.native import loading_native
from hetsgd.data.source import Source, SourceInfo
from hetsgd.errors import UserError

# Labels are held multi-hot, float32 [N, L]: 2^16 labels take 256 KiB an example (3 GiB for
# delicious' 12,920 examples, which have 983 labels); a larger L is a header typo or a set too
# big to hold this way.
MAX_LABELS = 1 << 16


def read_xc(path: Path, splits: tuple[Path, Path] | None, source: str) -> Parsed:
    """Parse an extreme classification data file (and its split files) into multi-hot labels."""
    with loading_native():
        from sklearn.datasets import load_svmlight_file  # scikit-learn loads to parse a file

    with open_data(path, text=True) as f:
        header = f.readline().split()
        try:
            n, d, num_labels = (int(v) for v in header)
        except ValueError:
            raise UserError(f"{path}: line 1 must be 'N D L' (examples, features, labels), "
                            f"got {b' '.join(header).decode(errors='replace')!r}") from None
        for what, value, bound in (("features", d, MAX_FEATURES), ("labels", num_labels,
                                                                   MAX_LABELS)):
            if not 0 < value <= bound:
                raise UserError(f"{path}: line 1 gives {value} {what}; hetsgd takes 1 to "
                                f"{bound:,}")
        try:
            x, y = load_svmlight_file(f, n_features=d, dtype=np.float32, multilabel=True,
                                      zero_based=True)
        except ValueError as exc:
            raise corrupt_error(path, True, exc, skip_lines=1) from exc
    check_parsed(path, True, x, y, skip_lines=1)
    if x.shape[0] != n:
        raise UserError(f"{path}: the header says {n} examples but the file holds {x.shape[0]}")
    _, (labels,) = multi_hot([y], str(path), num_classes=num_labels)
    features = x.toarray() if d <= DENSE_MAX_FEATURES else x
    if splits is None:
        return Parsed("multilabel", num_labels, features, labels, None, None, source)
    train, test = (_split_rows(p, n) for p in splits)
    if len(shared := np.intersect1d(train, test)):
        raise UserError(f"{splits[1]} names example {shared[0] + 1} ({len(shared)} in all) that "
                        f"{splits[0]} names too: a test example must not be trained on")
    return Parsed("multilabel", num_labels, features[train], labels[train], features[test],
                  labels[test], source)


def _split_rows(path: Path, n: int) -> np.ndarray:
    """0-based row numbers of the first split in a split file."""
    try:
        with open_data(path, text=True) as f, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # an empty file: said below
            rows = np.loadtxt(f, dtype=np.int64, ndmin=2)[:, 0] - 1
    except ValueError as exc:
        raise UserError(f"{path} is not a split file of example numbers: {exc}") from exc
    if not len(rows):
        raise UserError(f"{path} names no example")
    if rows.min() < 0 or rows.max() >= n:
        raise UserError(f"{path} names examples outside 1..{n}")
    return rows


@dataclass(frozen=True)
class XcSet(Source):
    """``dataset.path`` replaces the cached data file; split files are looked for beside it."""

    data_file: str = ""
    split_prefix: str = ""
    page: str = ""

    def _split_names(self) -> tuple[str, str]:
        return f"{self.split_prefix}_trSplit.txt", f"{self.split_prefix}_tstSplit.txt"

    def _missing(self) -> UserError:
        return UserError(
            f"{self.name} is not in the cache and cannot be downloaded automatically: get it "
            f"from the Extreme Classification Repository ({self.page}) and put "
            f"{self.data_file} (and {' and '.join(self._split_names())}) in {data_home()}")

    def load(self, cfg: DatasetConfig, seed: int, progress: bool) -> Parsed:
        path = existing_file(cfg.path) if cfg.path else find_local(data_home(), self.data_file)
        if path is None:
            raise self._missing()
        found = [find_local(path.parent, name) for name in self._split_names()]
        splits = (found[0], found[1]) if found[0] is not None and found[1] is not None else None
        source = f"{self.name} from the Extreme Classification Repository: {path}"
        if splits is None:
            source += "; no split files beside it"

        def parse() -> Parsed:
            with status(f"parsing {path.name}", progress):
                return read_xc(path, splits, source)

        return load_or_parse(self.name, [path, *(splits or ())], {}, parse)

    def cached(self) -> bool:
        return find_local(data_home(), self.data_file) is not None

    def fetch(self, progress: bool) -> list[Path]:
        path = find_local(data_home(), self.data_file)
        if path is None:
            raise self._missing()
        return [path]

    def info(self) -> SourceInfo:
        path = find_local(data_home(), self.data_file) or data_home() / self.data_file
        return SourceInfo(self.name, self.description, self.task, (self.page,), (path,),
                          self.cached(), self.sizes,
                          f"not downloadable: put {self.data_file} and the split files from the "
                          "repository's archive in the cache")


SOURCES = (
    XcSet("delicious", "Delicious: social bookmarks tagged with 983 labels (multi-label)",
          "multilabel", "12,920 train / 3,185 test x 500, 983 labels",
          data_file="Delicious_data.txt", split_prefix="delicious",
          page="http://manikvarma.org/downloads/XC/XMLRepository.html"),
)
