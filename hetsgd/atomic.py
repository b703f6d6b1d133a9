"""Writing a file or a folder atomically, with the mode the umask gives: the one way hetsgd
writes what a reader may find half-written (:func:`replace_file`, :func:`replace_folder`).

A write is assembled beside its target under a name that says which process writes it
(:func:`writing_path`) and renamed onto the target only when whole, so a reader finds the
previous complete version or the new one, never a part of one. What a writer killed mid-write
left is removed by a later one (:func:`remove_abandoned`); a live writer's, or another host's on
a shared folder, is left alone.

Modes: a file is created with 0o666 and a folder with 0o777, less the umask, as any program's
are; nothing here sets a wider mode, so results and caches are exactly as private or as shared
as the user's umask says. A file a library made with a mode of its own (``tempfile``'s 0o600)
is given the umask's mode instead (:func:`give_umask_mode`).
"""

from __future__ import annotations

import errno
import functools
import os
import re
import secrets
import shutil
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import IO, Any

from hetsgd.liveness import is_alive, this_process

# a write in progress: "<target>.<random>.<pid>-<start in 1/100 s>@<host>.tmp"
_WRITING = re.compile(r"\.(\d{1,9})-(\d{1,15})@([^/]+)\.tmp$")


def writing_path(target: Path) -> Path:
    """Where a write of ``target`` is assembled before it is renamed into place: a name of its
    own (two threads may write one target) that says which process of which host writes it."""
    me = this_process()
    return target.with_name(f"{target.name}.{secrets.token_hex(4)}.{me['pid']}-"
                            f"{round(me['started'] * 100)}@{me['host']}.tmp")


def remove_abandoned(directory: Path) -> None:
    """Remove what writers that died left in ``directory`` (a SIGKILL mid-write): only those of
    this host whose process is gone (a reused pid included); another host's (a shared cache) or
    a live process's may still be written."""
    try:
        children = list(directory.iterdir())
    except OSError:  # no such directory yet, or unreadable: nothing of ours to remove
        return
    for child in children:
        match = _WRITING.search(child.name)
        if match and not is_alive({"host": match[3], "pid": int(match[1]),
                                   "started": int(match[2]) / 100}):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)


def replace_file(path: Path, write: Callable[[IO], Any], binary: bool = False) -> None:
    """Write ``path`` atomically: ``write`` fills a new file (text, or ``binary``) at
    :func:`writing_path`, which is flushed, synced to disk and only then renamed onto ``path``.
    A failure at any point (a full disk, a serializer that raises midway) leaves the previous
    complete file, or none, and no temporary; the error is raised as it came."""
    path = Path(path)
    tmp = writing_path(path)
    mode: dict[str, Any] = {"mode": "wb"} if binary else {"mode": "w", "encoding": "utf-8",
                                                          "newline": ""}
    try:
        # 0o666 less the umask, as open() creates a file; O_EXCL: never another's file
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        with os.fdopen(fd, **mode) as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with suppress(OSError):
            os.unlink(tmp)
        raise
    sync_folder(path.parent)


def replace_folder(path: Path, fill: Callable[[Path], Any]) -> bool:
    """Make the folder ``path`` atomically: ``fill`` writes its files into a new folder at
    :func:`writing_path`, which is synced and renamed onto ``path`` only when whole, so a reader
    finds the whole folder or none. A folder that is there already (a parallel writer's, of the
    same content) is kept, and False returned. A failure leaves no temporary; the error is
    raised as it came."""
    path = Path(path)
    tmp = writing_path(path)
    tmp.mkdir(parents=True)
    try:
        fill(tmp)
        sync_folder(tmp)
        try:
            os.rename(tmp, path)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # after the rename there is nothing left there
    sync_folder(path.parent)
    return True


def sync_folder(folder: Path) -> None:
    """Make a rename into ``folder`` durable, where the system allows syncing a folder."""
    with suppress(OSError):
        handle = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)


@functools.cache
def umask() -> int:
    """This process's umask, read once. ``os.umask`` reads it only by setting it, process-wide
    and racing every thread that creates a file meanwhile, so Linux's ``/proc/self/status`` is
    asked first; elsewhere it is set (to 0o077: a file another thread creates meanwhile is
    private, never wider) and set back, once."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def give_umask_mode(path: Path) -> None:
    """Give the file at ``path`` the mode a file created under the umask has (0o666 less it):
    for a file a library created with a mode of its own."""
    os.chmod(path, 0o666 & ~umask())
