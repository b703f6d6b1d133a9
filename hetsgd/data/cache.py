"""The data cache: where files live, how compressed copies are found and opened, parsed arrays.

A published file may sit in the cache as published or recompressed (``.xz``, ``.bz2``, ``.gz``,
or decompressed when the publisher compressed it), because users fetch files by hand on machines
without a network and compress them to save space. Any error reading one (not the compression its
name says, truncated, unreadable) is a ``UserError`` that names it.

Parsed arrays are kept under ``parsed/``, one folder per entry keyed by the source files (path,
size, mtime) and the parse parameters, so a second load skips the parser and a changed file is
parsed again. Each array is its own ``.npy`` file: dense features are then read a block of rows
at a time (``NpyRows``), never whole, and the parser's own arrays are dropped once written.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import json
import lzma
import os
import shutil
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import IO, Any

import numpy as np
import scipy.sparse as sp

from hetsgd.data.dataset import Parsed
from hetsgd.data.download_progress import console
from hetsgd.errors import UserError

COMPRESSIONS = (".xz", ".bz2", ".gz")
_OPENERS: dict[str, Callable[..., IO[bytes]]] = {".xz": lzma.open, ".bz2": bz2.open,
                                                 ".gz": gzip.open}
PARSED_FORMAT = 2  # bump when the layout of the cached arrays changes
# what reading a file can raise besides UserError: the OS's errors (a .gz that is not gzip is a
# gzip.BadGzipFile), truncation, and the decompressors' own
_READ_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error)


def data_home() -> Path:
    """``$HETSGD_DATA``, else ``~/.cache/hetsgd``; not created until something is written."""
    env = os.environ.get("HETSGD_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hetsgd"


def strip_compression(name: str) -> str:
    for suffix in COMPRESSIONS:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def candidate_names(published: str) -> list[str]:
    """The published name first, then the same content decompressed or compressed otherwise."""
    stem = strip_compression(published)
    names = [published, stem] + [stem + suffix for suffix in COMPRESSIONS]
    return list(dict.fromkeys(names))


def find_local(directory: Path, published: str) -> Path | None:
    """The first file in ``directory`` that holds ``published`` in any accepted form."""
    for name in candidate_names(published):
        path = directory / name
        if path.is_file():
            return path
    return None


def existing_file(path: str | Path) -> Path:
    """A user-given path, expanded, or a UserError when nothing is there."""
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise UserError(f"dataset file not found: {resolved}")
    return resolved


@contextlib.contextmanager
def open_data(path: Path, decompress: bool = True) -> Iterator[IO[bytes]]:
    """Open for binary reading, decompressing by suffix; an error opening or reading it inside the
    ``with`` block is a UserError that names the file."""
    opener = _OPENERS.get(path.suffix) if decompress else None
    try:
        with (opener or open)(path, "rb") as f:
            yield f
    except _READ_ERRORS as exc:
        raise UserError(f"cannot read {path}: {_reason(exc)}") from exc


def _reason(exc: Exception) -> str:
    """An OS error's own words (``No space left on device``, without its number and the path the
    message names already), else the exception's message."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def content_hash(path: Path, algorithm: str = "sha256", decompress: bool = False) -> str:
    """Hex digest of the file, or of its decompressed content when ``decompress``."""
    digest = hashlib.new(algorithm)
    with open_data(path, decompress) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# parsed arrays
# --------------------------------------------------------------------------------------------

_ARRAYS = ("x_train", "y_train", "x_test", "y_test")
_CSR_PARTS = ("data", "indices", "indptr")


@dataclass(frozen=True)
class NpyRows:
    """A cached 2-D ``.npy`` array as ``Rows``: each slice is read from the file, so a load holds
    one block, not the whole array (pages of a memory map would stay counted against the process
    until it is unmapped)."""

    path: Path
    shape: tuple[int, int]
    dtype: np.dtype
    offset: int  # where the data starts, past the header

    @classmethod
    def open(cls, path: Path) -> NpyRows:
        """The header of ``path``; ValueError when the file is not a whole row-major 2-D array."""
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran_order, dtype = read_header(f)
            offset = f.tell()
        if len(shape) != 2 or fortran_order:
            raise ValueError(f"{path} is not a row-major 2-D array")
        if path.stat().st_size != offset + shape[0] * shape[1] * dtype.itemsize:
            raise ValueError(f"{path} is truncated")
        return cls(path, shape, dtype, offset)

    def __getitem__(self, rows: slice) -> np.ndarray:
        start, stop, step = rows.indices(self.shape[0])
        if step != 1:
            raise ValueError("NpyRows are read in contiguous slices only")
        count = max(stop - start, 0) * self.shape[1]
        with open_data(self.path, decompress=False) as f:
            f.seek(self.offset + start * self.shape[1] * self.dtype.itemsize)
            return np.fromfile(f, self.dtype, count=count).reshape(-1, self.shape[1])


def parsed_path(name: str, files: list[Path], params: dict[str, Any]) -> Path:
    """The folder where the arrays parsed from ``files`` with ``params`` are cached."""
    stamp = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    key = json.dumps({"format": PARSED_FORMAT, "name": name, "files": stamp, "params": params},
                     sort_keys=True)
    return data_home() / "parsed" / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def load_or_parse(name: str, files: list[Path], params: dict[str, Any],
                  parse: Callable[[], Parsed]) -> Parsed:
    """Cached arrays for these files and parameters, else ``parse()``, cache the result and read
    it back from the cache, so that the parser's arrays are freed before preparation."""
    path = parsed_path(name, files, params)
    if path.exists():
        try:
            return _read(path)
        except (OSError, ValueError, KeyError):
            shutil.rmtree(path, ignore_errors=True)  # a truncated or stale entry is rebuilt below
    parsed = parse()
    try:
        _write(path, parsed)
    except OSError as exc:  # a full disk or read-only cache costs speed later, not this run
        console.print(f"could not cache the parsed arrays at {path}: {_reason(exc)}",
                      soft_wrap=True)
        return parsed
    del parsed
    return _read(path)


def _write(path: Path, parsed: Parsed) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # parallel runs may parse at once
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        for key in _ARRAYS:
            value = getattr(parsed, key)
            if sp.issparse(value):
                csr = sp.csr_matrix(value)
                for part in _CSR_PARTS:
                    np.save(tmp / f"{key}.{part}.npy", getattr(csr, part))
                np.save(tmp / f"{key}.shape.npy", np.array(csr.shape))
            elif value is not None:
                np.save(tmp / f"{key}.npy", np.asarray(value))
        meta = {f.name: getattr(parsed, f.name) for f in fields(Parsed) if f.name not in _ARRAYS}
        (tmp / "meta.json").write_text(json.dumps(meta))  # written last: marks a whole entry
        try:
            tmp.rename(path)  # atomic: a crash mid-write never leaves a half entry under the name
        except OSError:
            if not (path / "meta.json").exists():  # else a parallel run cached it first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _read(path: Path) -> Parsed:
    meta = json.loads((path / "meta.json").read_text())

    def get(key: str) -> Any:
        if (path / f"{key}.data.npy").exists():
            parts = [np.load(path / f"{key}.{part}.npy") for part in _CSR_PARTS]
            return sp.csr_matrix(tuple(parts), shape=tuple(np.load(path / f"{key}.shape.npy")))
        if not (path / f"{key}.npy").exists():
            return None
        if key.startswith("x_"):
            return NpyRows.open(path / f"{key}.npy")
        return np.load(path / f"{key}.npy")

    arrays = {key: get(key) for key in _ARRAYS}
    if meta.get("image_shape") is not None:
        meta["image_shape"] = tuple(meta["image_shape"])
    if meta.get("channel_stats") is not None:
        meta["channel_stats"] = tuple(tuple(s) for s in meta["channel_stats"])
    return Parsed(**arrays, **meta)
