"""Opening a data file: regular files only, decompressed by suffix, read within bounds.

Only regular files are read (compressed or not: :func:`hetsgd.readback.open_regular`). A parser
reads its file more than once (a sniff of the first lines, the parse, the scan for the bad line
an error names), which a FIFO or a pipe (``<(cat file)``) cannot give, and a device such as
``/dev/zero`` never ends: each is refused with one line, and the file is opened once per read.

Reads are bounded, so that a file that is not data fails with a line that names it instead of
exhausting memory: a text line may be at most ``MAX_LINE_BYTES`` long, and a compressed file may
decompress to at most ``MAX_EXPANSION`` times its size on disk. Any error opening or reading a
file is a ``UserError`` that names it.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import hashlib
import io
import lzma
import os
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from hetsgd.data.download_progress import report_read
from hetsgd.errors import UserError
from hetsgd.readback import NotRegular, open_regular

COMPRESSIONS = (".xz", ".bz2", ".gz")
# each opens a binary stream (LZMAFile, BZ2File, GzipFile), a BufferedIOBase
_OPENERS: dict[str, Callable[..., io.BufferedIOBase]] = {".xz": lzma.open, ".bz2": bz2.open,
                                                         ".gz": gzip.open}
# what reading a file can raise besides UserError: the OS's errors (a .gz that is not gzip is a
# gzip.BadGzipFile), truncation, and the decompressors' own
_READ_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error)
# The longest text line read: 8 MiB is 25 times news20's longest line (about 330 KB), the widest
# set in the registry; a longer one is not a text data file (a binary file, a disk image, zeros).
MAX_LINE_BYTES = 8 << 20
# The most a compressed file may expand: text data compresses 4 to 30 times (w8a 10x with xz,
# covtype 7x with gzip, news20 4x with bzip2); 200 times is a run of repeated bytes, a
# compression bomb. A genuine file that repetitive can be decompressed by hand and read as is.
MAX_EXPANSION = 200
# what any compressed file may decompress to, however small: a short file of repeated lines
# compresses a thousand times, and 64 MiB costs nothing to read
EXPANSION_FREE_BYTES = 64 << 20
_CHUNK_BYTES = 1 << 20  # what one read of the decompressed stream takes

@contextlib.contextmanager
def open_data(path: Path, decompress: bool = True, text: bool = False) -> Iterator[IO[bytes]]:
    """Open a regular file for binary reading, decompressing by suffix; ``text`` bounds its lines.
    An error opening or reading it inside the ``with`` block is a UserError that names the file;
    a decompressed or text stream reports its progress to the status shown around it."""
    opener = _OPENERS.get(path.suffix) if decompress else None
    try:
        with _data_file(path) as raw:
            if opener is None and not text:
                yield raw
                return
            with opener(raw, "rb") if opener else contextlib.nullcontext(raw) as stream:
                size = os.fstat(raw.fileno()).st_size
                cap = max(MAX_EXPANSION * size, EXPANSION_FREE_BYTES) if opener else None
                bounded = _Bounded(stream, raw, path, size, cap, MAX_LINE_BYTES if text else None)
                with io.BufferedReader(bounded, _CHUNK_BYTES) as f:
                    yield f
    except _READ_ERRORS as exc:
        raise UserError(f"cannot read {path}: {reason(exc)}") from exc


def _data_file(path: Path) -> IO[bytes]:
    """:func:`open_regular`, its refusal saying why a data file must be a file."""
    try:
        return open_regular(path)
    except NotRegular as exc:
        raise OSError(exc.errno, f"{exc.strerror}; hetsgd reads a data file more than once, so "
                                 "save the stream to a file") from exc


class _Bounded(io.RawIOBase):
    """A decompressed (or plain text) stream that stops, naming file and line, at a line longer
    than ``max_line`` or at more than ``max_total`` bytes; reads at most ``max_line`` bytes at a
    time, so a line inside one read is shorter than the bound and only the line that runs across
    reads needs counting."""

    def __init__(self, stream: IO[bytes] | io.BufferedIOBase, raw: IO[bytes], path: Path, size: int,
                 max_total: int | None, max_line: int | None) -> None:
        super().__init__()
        self._stream, self._raw, self._path, self._size = stream, raw, path, size
        self._max_total, self._max_line = max_total, max_line
        self._chunk = min(_CHUNK_BYTES, max_line or _CHUNK_BYTES)
        self._total = 0  # bytes read
        self._newlines = 0
        self._open_line = 0  # bytes of the line still open at the end of the last read

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self._stream.read(min(len(buffer), self._chunk))
        n = len(data)
        buffer[:n] = data
        self._total += n
        if self._max_total is not None and self._total > self._max_total:
            past = self._max_total - (self._total - n)  # the first byte past the bound, in data
            line = self._newlines + data.count(b"\n", 0, past) + 1
            raise UserError(f"{self._path}: line {line} is past {self._max_total:,} bytes "
                            f"decompressed, the bound for {self._size:,} bytes on disk: a "
                            "compression bomb, or a file to decompress by hand first")
        first, last = data.find(b"\n"), data.rfind(b"\n")
        if self._max_line is not None:
            longest = self._open_line + (n if first < 0 else first)
            if longest > self._max_line:
                raise UserError(f"{self._path}: line {self._newlines + 1} is longer than "
                                f"{self._max_line:,} bytes: not a text data file")
        if first < 0:
            self._open_line += n
        else:
            self._newlines += data.count(b"\n")
            self._open_line = n - last - 1
        report_read(self._path, self._raw.tell(), self._size)
        return n


class _Crc32:
    """zlib's CRC-32 behind hashlib's ``update``/``hexdigest``: a checksum at memory speed, for
    content that only an accident (not an adversary) alters."""

    def __init__(self) -> None:
        self._value = 0

    def update(self, block: bytes) -> None:
        self._value = zlib.crc32(block, self._value)

    def hexdigest(self) -> str:
        return f"{self._value:08x}"


def content_hash(path: Path, algorithm: str = "sha256", decompress: bool = False) -> str:
    """Hex digest of the file (``algorithm`` is hashlib's, or ``crc32``), or of its decompressed
    content when ``decompress``."""
    digest = _Crc32() if algorithm == "crc32" else hashlib.new(algorithm)
    with open_data(path, decompress) as f:
        for block in iter(lambda: f.read(_CHUNK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def reason(exc: Exception) -> str:
    """An OS error's own words (``No space left on device``, without its number and the path the
    message names already), else the exception's message."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
