"""The run directory: the files that reports, plots, tests and scripts rely on (docs/architecture.md)."""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import platform
import socket
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

import pandas as pd
import psutil
from omegaconf import OmegaConf

from hetsgd.machine import cpu_model, cuda_devices, usable_cores

SUMMARY = "summary.json"
#: The raw snapshots of a run that has not evaluated them yet (:mod:`hetsgd.outputs.journal`).
SNAPSHOTS = "snapshots"


class WriteError(OSError):
    """A file of a run or sweep directory that could not be written, named in the message: a
    full disk reads ``no space left on device, writing FILE``, whatever layer noticed it."""

    @classmethod
    def of(cls, path: Path, cause: OSError) -> WriteError:
        reason = (f"no space left on device, writing {path}" if cause.errno == errno.ENOSPC
                  else f"cannot write {path}: {cause.strerror or cause}")
        return cls(cause.errno, reason, str(path))

    def __str__(self) -> str:
        return str(self.strerror)


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Raise any failure to write ``path`` as a :class:`WriteError` naming it. torch.save reports
    a failed write of its file handle as a RuntimeError (``[enforce fail at
    inline_container.cc] unexpected pos``) with the OSError only as its context: that OSError
    is the error."""
    try:
        yield
    except WriteError:
        raise
    except Exception as err:
        cause: BaseException | None = err
        while cause is not None and not isinstance(cause, OSError):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        raise WriteError.of(path, cause) from err


def replace_file(path: Path, write: Callable[[IO], object], binary: bool = False) -> None:
    """Write ``path`` atomically: ``write`` fills a temporary file (text, or ``binary``) in the
    same folder, which is flushed, synced to disk and only then renamed onto ``path``. A failure
    at any point (a full disk, a serializer that raises midway) leaves the previous complete
    file, or none, never a truncated one; an I/O error is a :class:`WriteError` naming ``path``."""
    path = Path(path)
    tmp: str | None = None
    mode: dict[str, Any] = {"mode": "wb"} if binary else {"mode": "w", "encoding": "utf-8",
                                                          "newline": ""}
    try:
        with writing(path):
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            os.fchmod(fd, 0o644)  # mkstemp makes 0600; results are for everyone who may read them
            with os.fdopen(fd, **mode) as handle:
                write(handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
            tmp = None
    finally:
        if tmp is not None:
            with suppress(OSError):
                os.unlink(tmp)
    sync_folder(path.parent)


def sync_folder(folder: Path) -> None:
    """Make a rename into ``folder`` durable, where the system allows syncing a folder."""
    with suppress(OSError):
        handle = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)


def write_text(path: Path, text: str) -> None:
    """``path.write_text(text)``, atomically (:func:`replace_file`)."""
    replace_file(path, lambda handle: handle.write(text))


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    """``frame.to_csv(path, index=False)``, atomically (:func:`replace_file`)."""
    replace_file(path, lambda handle: frame.to_csv(handle, index=False))


def append_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Append ``rows`` (each with the columns of the file, or of the first row for a new file)
    to the CSV at ``path`` and sync them to disk: for a file that grows while the run goes, so
    that a crash loses none of the rows already appended."""
    path = Path(path)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]), lineterminator="\n")
    if not path.exists() or path.stat().st_size == 0:
        writer.writeheader()
    writer.writerows(rows)
    with writing(path), open(path, "a", encoding="utf-8", newline="") as handle:
        handle.write(text.getvalue())  # one write: a killed process leaves whole rows
        handle.flush()
        os.fsync(handle.fileno())


def this_process() -> dict[str, Any]:
    """The process writing a run directory, as summary.json records it while the run goes:
    :func:`is_alive` tells a run still going from one whose coordinator died."""
    me = psutil.Process()
    return {"host": socket.gethostname(), "pid": me.pid, "started": me.create_time()}


def is_alive(process: Any) -> bool:
    """Whether the process :func:`this_process` described still runs; a reused pid has another
    start time. One on another host (a cluster job seen from the login node) cannot be asked:
    it reads as still running rather than as crashed, and its summary names the host."""
    try:
        if process["host"] != socket.gethostname():
            return True
        proc = psutil.Process(process["pid"])
        return (abs(proc.create_time() - process["started"]) < 0.01
                and proc.status() != psutil.STATUS_ZOMBIE)
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def environment() -> dict[str, Any]:
    import torch  # the command line reads run directories without loading torch

    gpus = cuda_devices()
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_model": cpu_model(),
        "cores": usable_cores(),
        "gpus": [g["name"] for g in gpus],
        "driver": gpus[0]["driver"] if gpus else None,
    }


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


class RunDirectory:
    """Writes one run's files; each writer can be called on its own, so a failed run still
    leaves a summary that says why. Every file is replaced atomically (:func:`replace_file`):
    a reader sees the previous complete version or the new one, never a partial file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    def write_config(self, config: Any) -> None:
        write_text(self.path / "config.yaml", OmegaConf.to_yaml(config, resolve=True))

    def write_table(self, name: str, rows: list[dict[str, Any]] | pd.DataFrame) -> None:
        frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
        write_csv(self.path / f"{name}.csv", frame)

    def write_summary(self, summary: dict[str, Any]) -> None:
        summary = dict(summary, run_dir=str(self.path))
        write_text(self.path / SUMMARY, json.dumps(_clean(summary), indent=2) + "\n")
