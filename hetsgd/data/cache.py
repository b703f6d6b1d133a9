"""The data cache: where files live, how compressed copies are found and opened, parsed arrays.

A published file may sit in the cache as published or recompressed (``.xz``, ``.bz2``, ``.gz``,
or decompressed when the publisher compressed it), because users fetch files by hand on machines
without a network and compress them to save space. Parsed arrays are kept as ``.npz`` under
``parsed/``, keyed by the source files (path, size, mtime) and the parse parameters, so a second
load skips the parser and a changed file is parsed again.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import os
import zipfile
from collections.abc import Callable
from dataclasses import fields
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
PARSED_FORMAT = 1  # bump when the layout of the cached arrays changes


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


def open_decompressed(path: Path) -> IO[bytes]:
    """Open for binary reading, decompressing by suffix."""
    opener = _OPENERS.get(path.suffix)
    return opener(path, "rb") if opener else open(path, "rb")


def content_hash(path: Path, algorithm: str = "sha256", decompress: bool = False) -> str:
    """Hex digest of the file, or of its decompressed content when ``decompress``."""
    digest = hashlib.new(algorithm)
    with (open_decompressed(path) if decompress else open(path, "rb")) as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------------
# parsed arrays
# --------------------------------------------------------------------------------------------

_ARRAYS = ("x_train", "y_train", "x_test", "y_test")


def parsed_path(name: str, files: list[Path], params: dict[str, Any]) -> Path:
    """Where the arrays parsed from ``files`` with ``params`` are cached."""
    stamp = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    key = json.dumps({"format": PARSED_FORMAT, "name": name, "files": stamp, "params": params},
                     sort_keys=True)
    return data_home() / "parsed" / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz"


def load_or_parse(name: str, files: list[Path], params: dict[str, Any],
                  parse: Callable[[], Parsed]) -> Parsed:
    """Cached arrays for these files and parameters, else ``parse()`` and cache the result."""
    path = parsed_path(name, files, params)
    if path.exists():
        try:
            return _read(path)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):
            path.unlink(missing_ok=True)  # a truncated or stale entry is rebuilt below
    parsed = parse()
    try:
        _write(path, parsed)
    except OSError as exc:  # a read-only cache costs speed on the next load, not this run
        console.print(f"could not cache the parsed arrays at {path}: {exc}", soft_wrap=True)
    return parsed


def _write(path: Path, parsed: Parsed) -> None:
    arrays: dict[str, np.ndarray] = {}
    for key in _ARRAYS:
        value = getattr(parsed, key)
        if value is None:
            continue
        if sp.issparse(value):
            csr = sp.csr_matrix(value)
            arrays.update({f"{key}.data": csr.data, f"{key}.indices": csr.indices,
                           f"{key}.indptr": csr.indptr, f"{key}.shape": np.array(csr.shape)})
        else:
            arrays[key] = np.asarray(value)
    meta = {f.name: getattr(parsed, f.name) for f in fields(Parsed) if f.name not in _ARRAYS}
    arrays["meta"] = np.array(json.dumps(meta))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # parallel runs may parse at once
    try:
        with open(tmp, "wb") as f:  # a file object keeps numpy from appending another .npz
            np.savez(f, **arrays)
        tmp.replace(path)  # atomic: a crash mid-write never leaves a half entry under the name
    finally:
        tmp.unlink(missing_ok=True)


def _read(path: Path) -> Parsed:
    with np.load(path, allow_pickle=False) as npz:
        def get(key: str) -> Any:
            if f"{key}.data" in npz.files:
                parts = [npz[f"{key}.{part}"] for part in ("data", "indices", "indptr")]
                return sp.csr_matrix(tuple(parts), shape=tuple(npz[f"{key}.shape"]))
            return npz[key] if key in npz.files else None

        meta = json.loads(str(npz["meta"]))
        arrays = {key: get(key) for key in _ARRAYS}
    if meta.get("image_shape") is not None:
        meta["image_shape"] = tuple(meta["image_shape"])
    if meta.get("channel_stats") is not None:
        meta["channel_stats"] = tuple(tuple(s) for s in meta["channel_stats"])
    return Parsed(**arrays, **meta)
