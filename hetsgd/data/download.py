"""Downloads into the cache, with checksums, a short timeout, and one clear error when offline.

Checksums: where the publisher gives one (or it is otherwise well known) it is in the source's
table, as SHA-256 or ``md5:...``, and pooch checks each download against it. Where none is known
the table says None and the first download is trusted: its SHA-256 is printed and written next to
the file as ``<file>.sha256``, and later parses and downloads check against it (trust on first
use).
Before a file is parsed, :func:`verify` checks it against whichever of the two exists.

``$HETSGD_DATA_MIRROR`` replaces the publisher's base URL (``<mirror>/<file name>``): for
machines behind a local mirror, and for the tests' server on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pooch
import requests

from hetsgd.atomic import give_umask_mode, remove_abandoned, writing_path
from hetsgd.data.cache import candidate_names, data_home, find_local, strip_compression
from hetsgd.data.download_progress import DownloadBar, console
from hetsgd.data.files import COMPRESSIONS, content_hash, reason
from hetsgd.errors import UserError

TIMEOUT_S = 5.0  # per connect and per read: an unreachable host fails fast instead of hanging
MIRROR_ENV = "HETSGD_DATA_MIRROR"


@dataclass(frozen=True)
class RemoteFile:
    """One published file: its name as published, where it is, and its checksum if known."""

    name: str
    url: str
    known_hash: str | None = None  # "<sha256>" or "md5:<md5>"; None: trust on first use

    @property
    def effective_url(self) -> str:
        mirror = os.environ.get(MIRROR_ENV)
        return f"{mirror.rstrip('/')}/{self.name}" if mirror else self.url


def local(remote: RemoteFile) -> Path | None:
    """The cached copy of ``remote`` in any accepted form, if there is one."""
    return find_local(data_home(), remote.name)


def ensure(remote: RemoteFile, dataset: str, progress: bool) -> Path:
    """The cached copy of ``remote``, downloading it first when there is none."""
    return local(remote) or download(remote, dataset, progress)


def _alternatives(published: str) -> str:
    if strip_compression(published) == published:
        return "(or a " + "/".join(COMPRESSIONS) + " of it)"
    others = candidate_names(published)[1:]
    return "(or the same content as " + ", ".join(others[:-1]) + " or " + others[-1] + ")"


def download(remote: RemoteFile, dataset: str, progress: bool) -> Path:
    """Download ``remote`` into the cache under its published name; UserError on any failure.
    The download is assembled in a folder of its own (``writing_path``), so that one a kill cut
    short is found and removed by the next."""
    home = data_home()
    target = home / remote.name
    url = remote.effective_url
    expected = _expected_hash(home, remote)
    remove_abandoned(home)
    writing = writing_path(target)
    bar = DownloadBar(remote.name) if progress else False
    downloader = pooch.HTTPDownloader(progressbar=bar, timeout=TIMEOUT_S)
    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel(logging.WARNING)  # pooch's own INFO lines would duplicate ours
    try:
        pooch.retrieve(url, known_hash=expected, fname=remote.name, path=writing,
                       downloader=downloader)
        give_umask_mode(writing / remote.name)  # pooch's temporary file is 0o600
        os.replace(writing / remote.name, target)
    except requests.exceptions.RequestException as exc:
        raise UserError(
            f"{dataset} is not in the cache and could not be downloaded from {url} "
            f"({type(exc).__name__}): put the file at {target} {_alternatives(remote.name)}"
        ) from exc
    except ValueError as exc:  # pooch's checksum mismatch; it has deleted the download
        raise UserError(f"checksum mismatch for {url}: {exc}") from exc
    except OSError as exc:  # a full disk, a read-only cache
        raise UserError(f"cannot write {target}: {reason(exc)}") from exc
    finally:
        logger.setLevel(level)
        if isinstance(bar, DownloadBar):
            bar.close()
        shutil.rmtree(writing, ignore_errors=True)
    if expected is None:
        _trust_on_first_use(target)
    return target


def _trust_on_first_use(path: Path) -> None:
    digest = content_hash(path)
    tofu = _tofu_file(path.parent, path.name)
    try:
        tofu.write_text(f"{digest}  {path.name}\n")
    except OSError as exc:
        raise UserError(f"cannot write {tofu}: {reason(exc)}") from exc
    console.print(f"{path.name}: no published checksum; sha256 {digest} recorded in "
                  f"{tofu.name} and checked on later loads", markup=False, soft_wrap=True)


def _tofu_file(directory: Path, published: str) -> Path:
    return directory / f"{published}.sha256"


def _expected_hash(directory: Path, remote: RemoteFile) -> str | None:
    """The published checksum, else the one recorded on first use, else None."""
    tofu = _tofu_file(directory, remote.name)
    if remote.known_hash is None and tofu.is_file():
        try:
            words = tofu.read_text().split()
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read {tofu}: {reason(exc)}") from exc
        algorithm = words[0].rpartition(":")[0] if words else ""
        if not words or (algorithm and algorithm not in hashlib.algorithms_available):
            raise UserError(f"{tofu} holds no checksum hetsgd can compute"
                            + (f" ({algorithm} is no hash it knows)" if words else "")
                            + ": delete it, and the next download records one")
        return words[0]
    return remote.known_hash


def verify(path: Path, remote: RemoteFile) -> None:
    """Check a cached file against the known or first-use checksum of ``remote``.

    The published bytes are hashed: the file itself when it has the published name, its
    decompressed content when it is a compressed copy of an uncompressed publication. A
    decompressed copy of a compressed publication cannot be checked (compression is not
    reproducible byte for byte) and passes.
    """
    expected = _expected_hash(path.parent, remote)
    if expected is None:
        return
    if path.name == remote.name:
        decompress = False
    elif strip_compression(path.name) == remote.name:
        decompress = True
    else:
        return
    algorithm, _, want = expected.rpartition(":")
    got = content_hash(path, algorithm or "sha256", decompress=decompress)
    if got.lower() != want.lower():
        raise UserError(f"checksum mismatch: {path} does not hold the published {remote.name} "
                        f"({algorithm or 'sha256'} {got}, expected {want}); delete it and fetch "
                        "again")
