"""The console command's standard streams, outlasting their reader: a run is not stopped by a
closed pipe or terminal, only by what it measures (:mod:`hetsgd.cli`'s ``main``)."""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO


class LastingStream:
    """sys.stdout or sys.stderr, outlasting its reader. Once a write fails (a pipe whose reader
    left, as in `hetsgd run | head`; a terminal gone; a full disk), the descriptor is pointed at
    /dev/null (Python's "Note on SIGPIPE"), so that the run, rich, Hydra's and Python's logging,
    worker processes started later and the interpreter's last flush all write into nothing
    instead of raising in the middle of a run or a sweep; the exit code stays the outcome's."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            to_devnull(self._stream.fileno())
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            to_devnull(self._stream.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def to_devnull(fd: int) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    if devnull != fd:
        os.dup2(devnull, fd)
        os.close(devnull)


def lasting_output() -> None:
    """Wrap stdout and stderr in :class:`LastingStream`. A descriptor closed from the start
    (`2>&-`) gets /dev/null first: otherwise the next file opened takes its number, and what the
    run and its workers print would land in that file."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = getattr(sys, name)
        try:
            os.fstat(fd)
        except OSError:
            to_devnull(fd)
            stream = None
        setattr(sys, name, LastingStream(stream or open(fd, "w", closefd=False)))
