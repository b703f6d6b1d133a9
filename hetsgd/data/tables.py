"""Your own data in a file (``dataset=files``): ``.npz``, a ``.npy`` pair, CSV, Parquet or LIBSVM.

The format is ``dataset.format``, else the file's suffix: ``.npz``, ``.npy``, ``.csv``,
``.parquet`` (or ``.pq``); anything else is LIBSVM, read by :mod:`hetsgd.data.libsvm` as
``dataset=libsvm`` reads it (and, with ``dataset.scale=auto``, left unscaled as it leaves it). A
CSV or LIBSVM file may be compressed (``.gz``, ``.bz2``, ``.xz``); binary formats are read in
place, uncompressed. ``dataset.test_path`` is a test file of the same format whose rows are the
test part; without it, :mod:`hetsgd.data.prepare` splits a seeded stratified part off.

Features are numbers: a value that is NaN, infinite or past float32's range is one UserError naming
the file, the row (a table's counted from 1 after its header; an array's by its index) and the
column. A table's feature columns are chosen, its rows with missing values refused or dropped,
and its text columns one-hot encoded by :mod:`hetsgd.data.columns` (``Parsed.table`` says what was done); a
table's features are float64 until scaled. An array's integer features (token ids) keep their integers
(:mod:`hetsgd.data.prepare` says when). Labels are numbers, encoded as every source encodes
them, or text, the classes then numbered 0..C-1 in sorted order of their names, which are kept
(``Parsed.class_names``).

Cache: text parses slowly (pandas reads a CSV at tens of MB/s), so CSV and LIBSVM arrays go
through the parsed cache; binary files read at disk speed, and a cached copy would be checked
(its CRC-32) about as fast as the file itself is read while doubling the disk it takes, so
``.npz``, ``.npy`` and Parquet are read from the file each time.

Memory: ``.npy`` features are memory-mapped and read a block of rows at a time, so the prepared
copy is the only private whole one (the mapped pages are the file's, which the kernel may drop);
an ``.npz`` array or a table is read whole, as every source holds its parsed arrays. A table is
measured before it is parsed (its columns and rows, :func:`table_shape`) and refused in one line
where reading it would take more memory than is available: a wide one takes far more than its
size on disk (100,000 columns by 400 rows, 80 MB of CSV, about 0.8 GB).
"""

from __future__ import annotations

import csv
import io
import math
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd

from hetsgd.config import DatasetConfig
from hetsgd.config.problem import FilesConfig
from hetsgd.data.cache import existing_file, load_or_parse, strip_compression
from hetsgd.data.columns import Encoding, complete_rows, feature_columns, listing, short
from hetsgd.data.dataset import FLOAT32_MAX, Parsed, Rows, row_blocks
from hetsgd.data.download_progress import status
from hetsgd.data.files import COMPRESSIONS, open_data
from hetsgd.data.labels import encode_named
from hetsgd.data.libsvm import read_libsvm
from hetsgd.data.source import Source
from hetsgd.errors import UserError, one_line
from hetsgd.machine import available_memory

_SUFFIXES = {".npz": "npz", ".npy": "npy", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
_CACHED = ("csv", "libsvm")  # text: slow to parse
_NPY_HEADERS = {(1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0}
_ZIP_MAGIC = b"PK\x03\x04"


def file_format(path: Path, wanted: str) -> str:
    """``dataset.format``, with ``auto`` read off the suffix (under any compression suffix)."""
    if wanted != "auto":
        return wanted
    return _SUFFIXES.get(Path(strip_compression(path.name)).suffix.lower(), "libsvm")


@dataclass(frozen=True)
class _Part:
    """One file's features and raw labels, and how errors name its cells."""

    x: Rows
    y: np.ndarray
    where: str
    cell: Callable[[int, int], str]  # (row index, column index) -> "row 3, column 'p7'"


def check_finite(part: _Part) -> None:
    """Every feature a finite number within float32's range (a model trains on float32, where a
    larger float64 is infinite), checked a block of rows at a time (a memory-mapped ``.npy`` is
    never read whole); the first that is not is named."""
    if part.x.dtype.kind != "f":
        return
    for start, stop in row_blocks(part.x):
        block = part.x[start:stop]
        bad = ~(np.abs(block) <= FLOAT32_MAX)  # NaN compares false: it is bad too
        if bad.any():
            row, column = (int(i) for i in np.argwhere(bad)[0])
            value = block[row, column]
            what = ("not a finite number" if not np.isfinite(value) else
                    f"past float32's range (±{FLOAT32_MAX:.3g}) that training computes in")
            raise UserError(f"{part.where}: {part.cell(start + row, column)} is {value}, {what}")


def _labels(values: np.ndarray, where: str, cell: Callable[[int], str]) -> np.ndarray:
    """Raw labels, one per row, every one present (and finite where they are numbers)."""
    values = np.asarray(values)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values.ravel()
    if values.ndim != 1:
        raise UserError(f"{where}: labels must be one per row, not of shape {values.shape}")
    missing = (~np.isfinite(values) if values.dtype.kind == "f"
               else pd.isna(values) if values.dtype.kind == "O" else np.zeros(len(values), bool))
    if missing.any():
        row = int(np.argmax(missing))
        value = values[row].item() if isinstance(values[row], np.generic) else values[row]
        raise UserError(f"{where}: {cell(row)} has no label ({short(repr(value))})")
    return values


def _parsed(parts: list[_Part], task: str, source: str,
            table: dict[str, Any] | None = None) -> Parsed:
    """Train (and test) parts checked and their labels encoded together; ``table`` says how a
    table's columns became features."""
    for part in parts:
        if part.x.shape[0] == 0:
            raise UserError(f"{part.where} holds no examples")
        if part.x.shape[0] != len(part.y):
            raise UserError(f"{part.where}: {part.x.shape[0]} rows of features but "
                            f"{len(part.y)} labels")
        check_finite(part)
    train, test = parts[0], (parts[1] if len(parts) > 1 else None)
    if test is not None and test.x.shape[1] != train.x.shape[1]:
        raise UserError(f"{test.where} has {test.x.shape[1]} features; {train.where} has "
                        f"{train.x.shape[1]}")
    where = " and ".join(part.where for part in parts)
    task, num_classes, ys, names = encode_named([part.y for part in parts], task, where)
    return Parsed(task, num_classes, train.x, ys[0], test.x if test is not None else None,
                  ys[1] if test is not None else None, source, class_names=names, table=table)


# --------------------------------------------------------------------------------------------
# arrays: .npz, .npy
# --------------------------------------------------------------------------------------------


def _features(x: np.ndarray, where: str) -> np.ndarray:
    """Numeric features as [rows, features]; higher ranks (images) are flattened per row. None
    at all is refused: a model would train on nothing and score chance."""
    if x.dtype.kind not in "biuf":
        raise UserError(f"{where}: features must be numbers, not of dtype {x.dtype}")
    if x.ndim < 2:
        raise UserError(f"{where}: features must be [rows, features], not of shape {x.shape}")
    width = math.prod(x.shape[1:])
    if width == 0:
        raise UserError(f"{where}: features of shape {x.shape} hold no feature to learn from")
    return x if x.ndim == 2 else x.reshape(len(x), width)


def _array_part(x: np.ndarray, y: np.ndarray, where: str, x_name: str, y_name: str) -> _Part:
    return _Part(_features(x, where), _labels(y, where, lambda row: f"{y_name}[{row}]"), where,
                 lambda row, column: f"{x_name}[{row}, {column}]")


def read_npz(path: Path, x_name: str, y_name: str) -> _Part:
    with open_data(path, decompress=False) as f:
        if f.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
            raise UserError(f"{path} is not an .npz archive (a single array is read as .npy, "
                            "with its labels in dataset.labels_path)")
        f.seek(0)
        try:
            with np.load(f, allow_pickle=False) as archive:
                for name, key in ((x_name, "x_array"), (y_name, "y_array")):
                    if name not in archive.files:
                        raise UserError(f"{path} has no array {name!r} (dataset.{key}); it "
                                        f"holds: {listing(archive.files) or 'nothing'}")
                x, y = archive[x_name], archive[y_name]
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, MemoryError) as exc:
            # MemoryError: an array header whose shape no memory holds (a damaged file)
            raise UserError(f"cannot read {path} as .npz: {one_line(exc)}") from exc
    return _array_part(x, y, str(path), x_name, y_name)


def map_npy(path: Path) -> np.ndarray:
    """The array of an ``.npy`` file memory-mapped read-only, from the descriptor that
    ``open_data`` checked: rows are read from disk only as they are used."""
    with open_data(path, decompress=False) as f:
        try:
            version = np.lib.format.read_magic(f)
            if version not in _NPY_HEADERS:
                raise ValueError(f"unsupported .npy version {version}")
            shape, fortran_order, dtype = _NPY_HEADERS[version](f)
            if dtype.hasobject:
                raise ValueError("it holds Python objects, which are not read (no pickles)")
            if 0 in shape:
                return np.empty(shape, dtype)
            return np.memmap(f, dtype=dtype, mode="r", offset=f.tell(), shape=shape,
                             order="F" if fortran_order else "C")
        except ValueError as exc:
            raise UserError(f"cannot read {path} as .npy: {one_line(exc)}") from exc


def load_npy(path: Path) -> np.ndarray:
    """A small ``.npy`` (labels) read whole, without pickles."""
    with open_data(path, decompress=False) as f:
        try:
            np.lib.format.read_magic(f)  # else np.load takes any other file for a pickle
            f.seek(0)
            return np.load(f, allow_pickle=False)
        except (ValueError, EOFError, MemoryError) as exc:  # a shape no memory holds, too
            raise UserError(f"cannot read {path} as .npy: {one_line(exc)}") from exc


def read_npy_pair(features: Path, labels: Path) -> _Part:
    return _array_part(map_npy(features), load_npy(labels), f"{features} (labels {labels})",
                       "x", "y")


# --------------------------------------------------------------------------------------------
# tables: CSV, Parquet
# --------------------------------------------------------------------------------------------


# What reading a table takes at its peak, per column and per cell (the parser's arrays, the
# frame, the features), measured with pandas 2.2 and pyarrow 18 on tables of 100 to 100,000
# columns and 40 to 200,000 rows, rounded up: a CSV about 1.2 KB and 18 bytes, a Parquet file
# (each column its own chunk, with its metadata) about 12 KB and 25 bytes, with float32
# features; the float64 features they are now take 4 bytes a cell more.
_TABLE_BYTES = {"csv": (1536, 24), "parquet": (16384, 32)}  # (per column, per cell)


def table_shape(path: Path, fmt: str) -> tuple[int, int]:
    """(columns, rows) of a table, without parsing it: a Parquet file's metadata; a CSV's
    header's commas and the lines after it, counted in one read of the file at disk speed (a
    quoted comma or newline counts too: an estimate that errs on the large side)."""
    if fmt == "parquet":
        pyarrow = _pyarrow()
        with open_data(path, decompress=False) as f:
            try:
                meta = pyarrow.parquet.ParquetFile(f).metadata
            except (ValueError, pyarrow.ArrowException) as exc:
                raise UserError(f"cannot read {path} as Parquet: {one_line(exc)}") from exc
            return meta.num_columns, meta.num_rows
    with open_data(path, text=True) as f:
        columns = f.readline().count(b",") + 1
        rows = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))
    return columns, rows + 1  # the last line may have no newline


def _pyarrow() -> ModuleType:
    """pyarrow with its Parquet reader, or the line that says how to install it."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise UserError("reading Parquet needs pyarrow: pip install 'hetsgd[tables]'") from None
    return pyarrow


def check_table_memory(path: Path, fmt: str) -> None:
    """Refuse, in one line, a table whose parse would take more memory than is available (a
    table 100,000 columns wide takes over a hundred times its size on disk), before parsing."""
    columns, rows = table_shape(path, fmt)
    per_column, per_cell = _TABLE_BYTES[fmt]
    need = columns * per_column + columns * rows * per_cell
    free = available_memory()
    if need > free:
        raise UserError(f"{path}: a table of {columns:,} columns and about {rows:,} rows takes "
                        f"about {_size(need)} to read, more than the {_size(free)} of memory "
                        "available")


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


def read_frame(path: Path, fmt: str) -> pd.DataFrame:
    """The whole table, once :func:`check_table_memory` says it fits: a CSV through pandas'
    parser (its first line the header), a Parquet file through pyarrow."""
    check_table_memory(path, fmt)
    if fmt == "csv":
        _check_header(path)
        with open_data(path, text=True) as f:
            try:
                # the whole file at once: pandas' default reads it in chunks, each with arrays of
                # every column (2 GB for 100,000 columns by 400 rows, against 0.8 GB)
                return pd.read_csv(f, low_memory=False)
            except ValueError as exc:  # pandas' ParserError and EmptyDataError, bad encodings
                raise UserError(f"cannot parse {path} as CSV: {one_line(exc)}") from exc
    pyarrow = _pyarrow()
    with open_data(path, decompress=False) as f:
        try:
            return pd.read_parquet(f, engine="pyarrow")
        except (ValueError, pyarrow.ArrowException) as exc:
            raise UserError(f"cannot read {path} as Parquet: {one_line(exc)}") from exc


def _check_header(path: Path) -> None:
    """Refuse a CSV header that names a column twice. pandas reads the second ``label`` as
    ``label.1``, a feature column: the label would be trained on as an input (Parquet refuses
    such a file itself)."""
    with open_data(path, text=True) as f:
        lines = io.TextIOWrapper(f, encoding="utf-8-sig", errors="replace", newline="")
        header = next(csv.reader(lines), [])
    repeated = [name for name, count in Counter(header).items() if count > 1]
    if repeated:
        raise UserError(f"{path}: its header names column(s) {listing(repeated)} more than "
                        "once; give each column a name of its own")


@dataclass(frozen=True)
class _Table:
    """A table file read: its part, the encoding of its columns, the rows left out."""

    part: _Part
    encoding: Encoding
    dropped: int  # rows left out for a missing value (dataset.missing=drop)


def read_table(path: Path, fmt: str, cfg: FilesConfig, encoding: Encoding | None = None) -> _Table:
    """A table's ``dataset.label`` column as the labels and its feature columns (see
    :mod:`hetsgd.data.columns`) as float64 features, in the training file's ``encoding`` where
    given, else in one fitted on this file."""
    frame = read_frame(path, fmt)
    frame.columns = [str(name) for name in frame.columns]
    frame.index = pd.RangeIndex(len(frame))  # rows are named by their place in the file
    if cfg.label not in frame.columns:
        raise UserError(f"{path} has no column {cfg.label!r} (dataset.label); its columns: "
                        f"{listing(frame.columns) or 'none'}")
    features = feature_columns(frame.columns, cfg, path)
    if encoding is not None and set(features) != set(encoding.columns):
        differ = sorted(set(features) ^ set(encoding.columns))
        raise UserError(f"{path}'s feature columns are not the training file's (differing: "
                        f"{listing(differ)})")
    rows = complete_rows(frame, (*features, cfg.label), cfg, path)
    dropped = len(frame) - len(rows)
    if dropped:
        frame = frame.iloc[rows]
    encoding = encoding or Encoding.fit(frame, features, cfg, path)
    x = encoding.features(frame, path, cfg.label)
    y = _table_labels(frame[cfg.label], path, rows)
    sources = encoding.sources()
    part = _Part(x, y, str(path),
                 lambda row, column: f"row {rows[row] + 1}, column {short(sources[column])!r}")
    return _Table(part, encoding, dropped)


def _table_labels(column: pd.Series, path: Path, rows: np.ndarray) -> np.ndarray:
    """A table's label column as raw labels (one that holds lists or records is refused by
    :func:`~hetsgd.data.columns.complete_rows` before); ``rows``: the file's row of each, so an
    error names the row the file has, whatever rows were dropped above it."""
    values = column.to_numpy()
    return _labels(values, str(path), lambda row: f"row {rows[row] + 1}")


# --------------------------------------------------------------------------------------------
# the source
# --------------------------------------------------------------------------------------------


def _check_options(cfg: FilesConfig, fmt: str, paths: list[Path]) -> None:
    """Options the format would ignore, compressed binaries and mixed formats: one line each."""
    if cfg.labels_path and fmt != "npy":
        raise UserError(f"dataset.labels_path is for .npy features; {paths[0]} is read as {fmt}")
    if cfg.test_labels_path and not (fmt == "npy" and cfg.test_path):
        raise UserError("dataset.test_labels_path is for the labels of a .npy dataset.test_path")
    table_keys = [key for key, given in (("dataset.features", cfg.features),
                                         ("dataset.drop", cfg.drop),
                                         ("dataset.missing", cfg.missing != "error")) if given]
    if table_keys and fmt not in ("csv", "parquet"):
        raise UserError(f"{table_keys[0]} is for CSV and Parquet tables; {paths[0]} is read as "
                        f"{fmt}")
    for path in paths:
        if fmt not in _CACHED and path.suffix in COMPRESSIONS:
            raise UserError(f"{path}: a compressed {fmt} file is not read; decompress it first")
        if file_format(path, cfg.format) != fmt:
            raise UserError(f"{path} is not of the training file's format ({fmt})")


def _npy_labels(cfg: FilesConfig) -> list[Path]:
    if not cfg.labels_path:
        raise UserError(f"{cfg.path}: .npy features need their labels: "
                        "dataset.labels_path=LABELS.npy")
    if cfg.test_path and not cfg.test_labels_path:
        raise UserError(f"{cfg.test_path}: .npy test features need their labels: "
                        "dataset.test_labels_path=LABELS.npy")
    return [existing_file(p) for p in (cfg.labels_path, cfg.test_labels_path) if p]


def read_files(cfg: FilesConfig, paths: list[Path], fmt: str, source: str) -> Parsed:
    """The train (and test) file of ``cfg`` in format ``fmt``, labels encoded for ``cfg.task``."""
    if fmt == "libsvm":
        return read_libsvm(paths[0], paths[1] if len(paths) > 1 else None, cfg.task, source)
    if fmt == "npz":
        parts = [read_npz(path, cfg.x_array, cfg.y_array) for path in paths]
    elif fmt == "npy":
        parts = [read_npy_pair(x, y) for x, y in zip(paths, _npy_labels(cfg))]
    else:
        train = read_table(paths[0], fmt, cfg)
        tables = [train] + [read_table(path, fmt, cfg, train.encoding) for path in paths[1:]]
        parts = [table.part for table in tables]
        return _parsed(parts, cfg.task, source, table={
            "columns": len(train.encoding.columns), "one_hot": train.encoding.widths(),
            "rows_dropped": sum(table.dropped for table in tables)})
    return _parsed(parts, cfg.task, source)


@dataclass(frozen=True)
class Files(Source):
    """The user's file as ``dataset.path`` (and ``dataset.test_path``)."""

    def load(self, cfg: DatasetConfig, seed: int, progress: bool) -> Parsed:
        assert isinstance(cfg, FilesConfig), "dataset=files is composed into a FilesConfig"
        if not cfg.path:
            raise UserError("dataset=files needs dataset.path=FILE (.npz, .npy, .csv, .parquet "
                            "or LIBSVM)")
        paths = [existing_file(p) for p in (cfg.path, cfg.test_path) if p]
        fmt = file_format(paths[0], cfg.format)
        _check_options(cfg, fmt, paths)
        source = f"{fmt} file {paths[0]}" + (f"; test: {paths[1]}" if len(paths) > 1 else "")

        def parse() -> Parsed:
            with status(f"reading {paths[0].name}", progress):
                return read_files(cfg, paths, fmt, source)

        if fmt not in _CACHED:
            return parse()
        return load_or_parse(self.name, paths, {
            "format": fmt, "label": cfg.label, "task": cfg.task, "features": list(cfg.features),
            "drop": list(cfg.drop), "missing": cfg.missing,
            "max_categories": cfg.max_categories}, parse)

    def cached(self) -> bool:
        return True

    def fetch(self, progress: bool) -> list[Path]:
        raise UserError("the files source reads dataset.path=FILE; there is nothing to fetch")

    def note(self) -> str:
        return ("reads dataset.path=FILE: .npz, .npy (+ dataset.labels_path), .csv or .parquet "
                "(dataset.label column), or LIBSVM")


SOURCES = (Files("files", "your own data: an .npz, .npy, CSV, Parquet or LIBSVM file", "auto"),)
