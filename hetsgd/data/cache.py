"""The data cache: where files live, how compressed copies are found, parsed arrays.

A published file may sit in the cache as published or recompressed (``.xz``, ``.bz2``, ``.gz``,
or decompressed when the publisher compressed it), because users fetch files by hand on machines
without a network and compress them to save space. Files are opened and read within bounds by
:mod:`hetsgd.data.files`.

Parsed arrays are kept under ``parsed/``, one folder per entry keyed by the source files (path,
size, mtime) and the parse parameters, so a second load skips the parser and a changed file is
parsed again. Each array is its own ``.npy`` file: dense features are then read a block of rows
at a time (``NpyRows``), never whole, and the parser's own arrays are dropped once written.

An entry is trusted only as written: ``meta.json`` lists each array file with its size and CRC-32
(about a GB/s: w8a's 60 MB add well under 0.1 s to a load), both checked on every load, so an
array that was deleted, cut short or altered (NaNs written into it) is parsed again, with one
warning line that names it. Writes (of an entry, or of a download) are assembled under a name that
says which process of which host writes them (:func:`hetsgd.atomic.writing_path`) and renamed into
place when whole; what a killed writer left is removed at the next load (``remove_abandoned``), and
a live writer's is left alone. Files and folders get the modes the umask gives, nothing wider.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from hetsgd.atomic import remove_abandoned, replace_folder
from hetsgd.data.dataset import Parsed
from hetsgd.data.download_progress import console
from hetsgd.data.files import COMPRESSIONS, content_hash, open_data, reason
from hetsgd.errors import UserError
from hetsgd.readback import read_bounded

PARSED_FORMAT = 5  # bump when the cached arrays change (5: float64 tables and digits; LIBSVM bases)


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
    # the inode and its change time too: a file rewritten in place with its size and mtime set
    # back (`touch -r`) keeps both of those, never its ctime
    stamp = [(str(p.resolve()), (s := p.stat()).st_size, s.st_mtime_ns, s.st_ino, s.st_ctime_ns)
             for p in files]
    key = json.dumps({"format": PARSED_FORMAT, "name": name, "files": stamp, "params": params},
                     sort_keys=True)
    return data_home() / "parsed" / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


class _Unusable(Exception):
    """A cache entry that is not as it was written; the message names the file and says how."""


def load_or_parse(name: str, files: list[Path], params: dict[str, Any],
                  parse: Callable[[], Parsed]) -> Parsed:
    """Cached arrays for these files and parameters, else ``parse()``, cache the result and read
    it back from the cache, so that the parser's arrays are freed before preparation."""
    path = parsed_path(name, files, params)
    remove_abandoned(path.parent)
    if path.exists():
        try:
            return _read(path)
        except _Unusable as exc:
            console.print(f"{exc}: parsing {name} again", markup=False, soft_wrap=True)
            shutil.rmtree(path, ignore_errors=True)
    parsed = parse()
    try:
        _write(path, parsed)
    except OSError as exc:  # a full disk or read-only cache costs speed later, not this run
        console.print(f"could not cache the parsed arrays at {path}: {reason(exc)}",
                      markup=False, soft_wrap=True)
        return parsed
    del parsed
    try:
        return _read(path)
    except _Unusable as exc:
        raise UserError(f"{exc}, just after it was written") from None


def _write(path: Path, parsed: Parsed) -> None:
    """The entry at ``path``, made atomically (parallel runs may parse at once: the first
    entry made is kept)."""

    def fill(folder: Path) -> None:
        listed: dict[str, tuple[int, str]] = {}

        def save(name: str, array: np.ndarray) -> None:
            np.save(folder / name, array)
            listed[name] = ((folder / name).stat().st_size, content_hash(folder / name, "crc32"))

        for key in _ARRAYS:
            value = getattr(parsed, key)
            if sp.issparse(value):
                csr = sp.csr_matrix(value)
                for part in _CSR_PARTS:
                    save(f"{key}.{part}.npy", getattr(csr, part))
                save(f"{key}.shape.npy", np.array(csr.shape))
            elif value is not None:
                save(f"{key}.npy", np.asarray(value))
        values = {f.name: getattr(parsed, f.name) for f in fields(Parsed) if f.name not in _ARRAYS}
        meta = {"fields": values, "files": listed}
        # written last: marks a whole entry
        (folder / "meta.json").write_text(json.dumps({**meta, "crc32": _crc(meta)}))

    replace_folder(path, fill)


def _read(path: Path) -> Parsed:
    """The entry at ``path``, each listed file checked against its size and CRC-32 first."""
    meta_file = path / "meta.json"
    try:
        meta = json.loads(read_bounded(meta_file))  # a dozen arrays and a source line
        if meta.pop("crc32") != _crc(meta):  # its fields, and which arrays it holds
            raise ValueError("its fields are not as written")
        values = dict(meta["fields"])
        listed = {str(name): (int(size), str(crc)) for name, (size, crc) in meta["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise _Unusable(f"the parsed cache's {meta_file} is unreadable ({reason(exc)})") from exc
    for name, (size, crc) in listed.items():
        _check(path / name, size, crc)

    def get(key: str) -> Any:
        if f"{key}.data.npy" in listed:
            parts = [np.load(path / f"{key}.{part}.npy") for part in _CSR_PARTS]
            return sp.csr_matrix(tuple(parts), shape=tuple(np.load(path / f"{key}.shape.npy")))
        if f"{key}.npy" not in listed:
            return None
        if key.startswith("x_"):
            return NpyRows.open(path / f"{key}.npy")
        return np.load(path / f"{key}.npy")

    try:
        arrays = {key: get(key) for key in _ARRAYS}
        if values.get("image_shape") is not None:
            values["image_shape"] = tuple(values["image_shape"])
        if values.get("channel_stats") is not None:
            values["channel_stats"] = tuple(tuple(s) for s in values["channel_stats"])
        return Parsed(**arrays, **values)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # a file swapped since its check
        raise _Unusable(f"the parsed cache at {path} is unreadable ({reason(exc)})") from exc


def _crc(meta: dict[str, Any]) -> str:
    """The CRC-32 of an entry's record, as JSON with sorted keys."""
    return f"{zlib.crc32(json.dumps(meta, sort_keys=True).encode()):08x}"


def _check(file: Path, size: int, crc: str) -> None:
    """``file`` as it was written: there, ``size`` bytes long, and of CRC-32 ``crc``."""
    try:
        found = file.stat().st_size
        if found != size:
            raise _Unusable(f"the parsed cache's {file} holds {found:,} bytes, not the "
                            f"{size:,} written")
        if content_hash(file, "crc32") != crc:
            raise _Unusable(f"the parsed cache's {file} was altered since it was written "
                            "(its CRC-32 differs)")
    except FileNotFoundError:
        raise _Unusable(f"the parsed cache's {file} is missing") from None
    except OSError as exc:
        raise _Unusable(f"the parsed cache's {file} is unreadable ({reason(exc)})") from None
    except UserError as exc:  # content_hash's own words for an unreadable file
        raise _Unusable(str(exc)) from None
