"""Downloads into the cache, with checksums, bounded waits, and one clear error when offline.

Checksums: where the publisher gives one (or it is otherwise well known) it is in the source's
table, as SHA-256 or ``md5:...``, and pooch checks each download against it. Where none is known
the table says None and the file is trusted once it has been used: when it first parses, its
SHA-256 is printed and written next to it as ``<file>.sha256``, and later parses and downloads
check against it (trust on first use). A download that fails to parse (an error page, a body cut
short) is therefore never recorded: deleting it and fetching again is enough. A download whose first
bytes are a web page (``<``: an error or captive-portal page served with status 200) is refused
at once, whatever its checksum. Before a file is parsed, and by ``hetsgd data fetch`` for a file
already cached, :func:`verify` checks it against whichever of the two checksums exists.

Waits: each connect and each read may take ``TIMEOUT_S``, and the whole transfer must average
``MIN_RATE_BYTES_S`` once ``RATE_GRACE_S`` seconds have passed, so that neither a silent server nor one
that trickles bytes holds a run; either ends in the same one-line error as being offline.

``$HETSGD_DATA_MIRROR`` replaces the publisher's base URL (``<mirror>/<file name>``): for
machines behind a local mirror, and for the tests' server on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pooch
import requests
import urllib3

from hetsgd.atomic import give_umask_mode, remove_abandoned, writing_path
from hetsgd.data.cache import candidate_names, data_home, find_local, strip_compression
from hetsgd.data.download_progress import DownloadBar, console
from hetsgd.data.files import COMPRESSIONS, content_hash, reason
from hetsgd.errors import UserError, one_line

TIMEOUT_S = 5.0  # per connect and per read: an unreachable host fails fast instead of hanging
# The slowest average a transfer may keep past its first RATE_GRACE_S seconds: a 100 MB file
# may so take up to 51 minutes, and a server that sends a byte every few seconds (each read
# within TIMEOUT_S) fails after RATE_GRACE_S instead of taking days.
MIN_RATE_BYTES_S = 32 << 10
RATE_GRACE_S = 30.0
MIRROR_ENV = "HETSGD_DATA_MIRROR"
_READ_BYTES = 1 << 20  # the most one read of the response takes
_PAGE_SNIFF_BYTES = 512
_Parsed = TypeVar("_Parsed")


class NotDownloaded(UserError):
    """A file that could not be downloaded (offline, refused, too slow, a web page instead)."""


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


def ensure(remote: RemoteFile, dataset: str, progress: bool, check: bool = False) -> Path:
    """The cached copy of ``remote``, downloading it first when there is none; with ``check``, a
    copy already cached is checked against its checksum too (``hetsgd data fetch``; a load checks
    it before parsing it, which a cached parse skips)."""
    cached = local(remote)
    if cached is None:
        return download(remote, dataset, progress)
    if check:
        verify(cached, remote)
    return cached


def _alternatives(published: str) -> str:
    if strip_compression(published) == published:
        return "(or a " + "/".join(COMPRESSIONS) + " of it)"
    others = candidate_names(published)[1:]
    return "(or the same content as " + ", ".join(others[:-1]) + " or " + others[-1] + ")"


def download(remote: RemoteFile, dataset: str, progress: bool) -> Path:
    """Download ``remote`` into the cache under its published name; UserError on any failure,
    ``NotDownloaded`` where the file could not be had. The download is assembled in a folder of
    its own (``writing_path``), so that one a kill cut short is found and removed by the next."""
    home = data_home()
    target = home / remote.name
    url = remote.effective_url
    expected, recorded = _expected_hash(home, remote)
    remove_abandoned(home)
    writing = writing_path(target)
    bar = DownloadBar(remote.name) if progress else None
    logger = pooch.get_logger()
    level = logger.level
    logger.setLevel(logging.WARNING)  # pooch's own INFO lines would duplicate ours
    try:
        pooch.retrieve(url, known_hash=expected, fname=remote.name, path=writing,
                       downloader=_Transfer(bar))
        give_umask_mode(writing / remote.name)  # pooch's temporary file is 0o600
        os.replace(writing / remote.name, target)
    except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError) as exc:
        what = remote.name if remote.name == dataset else f"{dataset}'s {remote.name}"
        why = str(exc) if isinstance(exc, _Refused) else type(exc).__name__
        raise NotDownloaded(
            f"{what} is not in the cache and could not be downloaded from {url} ({why}): put the "
            f"file at {target} {_alternatives(remote.name)}") from exc
    except ValueError as exc:  # pooch's checksum mismatch; it has deleted the download
        against = "" if recorded is None else (
            f" The known hash is the one {recorded} holds, recorded when the file was first used: "
            f"where the file changed at its source, delete {recorded} and fetch it again")
        raise UserError(f"checksum mismatch for {url}: {one_line(exc)}{against}") from exc
    except OSError as exc:  # a full disk, a read-only cache
        raise UserError(f"cannot write {target}: {reason(exc)}") from exc
    finally:
        logger.setLevel(level)
        if bar is not None:
            bar.close()
        shutil.rmtree(writing, ignore_errors=True)
    return target


class _Refused(requests.exceptions.RequestException):
    """A transfer refused by hetsgd rather than failed: its message says why."""


class _Transfer:
    """pooch's downloader: a ``requests`` stream read as its bytes arrive (``read1``), not a
    chunk at a time, so that the pace is checked however slowly they come. A transfer that
    averages under ``MIN_RATE_BYTES_S`` past ``RATE_GRACE_S``, or that is a web page, is refused."""

    def __init__(self, bar: DownloadBar | None) -> None:
        self.bar = bar

    def __call__(self, url: str, output_file: str, pooch: object) -> None:
        with requests.get(url, timeout=TIMEOUT_S, stream=True) as response, \
                open(output_file, "wb") as out:
            response.raise_for_status()
            size = response.headers.get("content-length", "")
            if self.bar is not None:
                self.bar.total = int(size) if size.isdigit() else 0
            start, received, head = time.monotonic(), 0, b""
            while chunk := response.raw.read1(_READ_BYTES, decode_content=True):
                out.write(chunk)
                received += len(chunk)
                head += chunk[:_PAGE_SNIFF_BYTES - len(head)]
                if self.bar is not None:
                    self.bar.update(len(chunk))
                elapsed = time.monotonic() - start
                if elapsed > RATE_GRACE_S and received < MIN_RATE_BYTES_S * elapsed:
                    raise _Refused(f"{received:,} bytes in {elapsed:.0f} s, under the "
                                   f"{MIN_RATE_BYTES_S >> 10} KiB/s a download must average")
        head = head.lstrip()
        if head.startswith(b"<"):  # no data file here starts so, compressed or not
            shown = one_line(head[:60].decode(errors="replace"))
            raise _Refused(f"the server sent a web page, not the file: {shown!r}")


def _tofu_file(directory: Path, published: str) -> Path:
    return directory / f"{published}.sha256"


def _expected_hash(directory: Path, remote: RemoteFile) -> tuple[str | None, Path | None]:
    """The published checksum, else the one recorded on first use (and the file that holds it),
    else None."""
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
                            + ": delete it, and the next use records one")
        return words[0], tofu
    return remote.known_hash, None


def _compressed_copy(path: Path, remote: RemoteFile) -> bool | None:
    """Whether ``path`` holds the published bytes of ``remote`` compressed (True: its
    decompressed content is hashed) or as they are (False); None for a decompressed copy of a
    compressed publication, which cannot be checked (compression is not reproducible byte for
    byte)."""
    if path.name == remote.name:
        return False
    return True if strip_compression(path.name) == remote.name else None


def verify(path: Path, remote: RemoteFile) -> None:
    """Check a cached file against the known or first-use checksum of ``remote``."""
    expected, recorded = _expected_hash(path.parent, remote)
    decompress = _compressed_copy(path, remote)
    if expected is None or decompress is None:
        return
    algorithm, _, want = expected.rpartition(":")
    got = content_hash(path, algorithm or "sha256", decompress=decompress)
    if got.lower() == want.lower():
        return
    if recorded is None:
        raise UserError(f"checksum mismatch: {path} does not hold the published {remote.name} "
                        f"({algorithm or 'sha256'} {got}, expected {want}); delete it and fetch "
                        "again")
    raise UserError(f"checksum mismatch: {path} does not hold the {remote.name} first used here "
                    f"({algorithm or 'sha256'} {got}, expected {want}, recorded in {recorded}); "
                    f"delete it and {recorded}, and it is fetched again (its checksum recorded "
                    "again at its first use)")


def checked_parse(files: Sequence[tuple[Path, RemoteFile]],
                  parse: Callable[[], _Parsed]) -> _Parsed:
    """``parse()`` of cached files, each checked first against its checksum; a file that has
    none is trusted once it has parsed, and its checksum recorded then: a download that is not
    the file (an error page, a body cut short) fails to parse and is never recorded."""
    for path, remote in files:
        verify(path, remote)
    parsed = parse()
    for path, remote in files:
        _trust_on_first_use(path, remote)
    return parsed


def _trust_on_first_use(path: Path, remote: RemoteFile) -> None:
    """Record the checksum of a file that has none, published or recorded, now that it parsed."""
    expected, _ = _expected_hash(path.parent, remote)
    decompress = _compressed_copy(path, remote)
    if expected is not None or decompress is None:
        return
    digest = content_hash(path, decompress=decompress)
    tofu = _tofu_file(path.parent, remote.name)
    try:
        tofu.write_text(f"{digest}  {remote.name}\n")
    except OSError as exc:
        raise UserError(f"cannot write {tofu}: {reason(exc)}") from exc
    console.print(f"{remote.name}: no published checksum; sha256 {digest} recorded in "
                  f"{tofu.name} at its first use and checked on later loads", markup=False,
                  soft_wrap=True)
