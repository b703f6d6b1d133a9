"""Opening what another program, or an earlier run, wrote: regular files only, and YAML read
back as plain data within bounds.

A FIFO opened for reading waits for a writer that may never come, and a device such as
``/dev/zero`` never ends: :func:`open_regular` refuses each without blocking on it, checking the
very descriptor it read from. A YAML file a run wrote (its ``config.yaml``, its overrides, a
sweep's ``multirun.yaml``) holds a few kilobytes of plain values; one that holds anchors and
aliases can expand a few hundred bytes into gigabytes, and one nested thousands of levels deep
exhausts Python's stack: :func:`load_yaml` refuses both, and reads at most
``MAX_YAML_BYTES`` (:func:`read_bounded`, which a small JSON record is read with too).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO, Any

import yaml

# a run's config.yaml is a few kilobytes; a sweep's multirun.yaml lists its overrides once
MAX_YAML_BYTES = 1 << 20

_NOT_REGULAR = ((stat.S_ISFIFO, "a FIFO or pipe"), (stat.S_ISCHR, "a character device"),
                (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class NotRegular(OSError):
    """A path that names a FIFO, a device or a socket, not a regular file."""


def open_regular(path: Path) -> IO[bytes]:
    """``path`` opened for reading, or an OSError saying what else it is (a
    :class:`NotRegular`). The open does not wait for a FIFO's writer (``O_NONBLOCK``), and the
    check is of the descriptor opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
        for test, kind in _NOT_REGULAR:
            if test(mode):
                raise NotRegular(errno.EINVAL, f"not a regular file but {kind}")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class _PlainLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing an alias: hetsgd and Hydra write none."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"an alias (*{event.anchor}), which "
                                              "no run writes", event.start_mark)
        return super().compose_node(parent, index)


def read_bounded(path: Path, limit: int = MAX_YAML_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (:func:`open_regular`), a ValueError where it
    holds more than ``limit``: what a run wrote is small, and what is not was not written so."""
    with open_regular(path) as handle:
        raw = handle.read(limit + 1)
    if len(raw) > limit:
        raise ValueError(f"larger than {limit >> 20} MiB")
    return raw


def load_yaml(path: Path) -> Any:
    """The plain data in the YAML file ``path``: an OSError where it cannot be read (or is no
    regular file), a ValueError saying why it is not such a file (larger than
    ``MAX_YAML_BYTES``, not UTF-8, not YAML, an alias, nested too deep)."""
    raw = read_bounded(path)
    try:
        return yaml.load(raw.decode("utf-8"), Loader=_PlainLoader)  # noqa: S506 (safe loader)
    except yaml.MarkedYAMLError as err:  # its problem and line, without the text it quotes
        line = f" (line {err.problem_mark.line + 1})" if err.problem_mark else ""
        raise ValueError(f"{err.problem}{line}") from err
    except yaml.YAMLError as err:
        raise ValueError(" ".join(str(err).split())) from err
    except RecursionError as err:
        raise ValueError("nested too deep") from err
