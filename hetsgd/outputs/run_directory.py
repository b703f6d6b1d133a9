"""The run directory: the files that reports, plots, tests and scripts rely on (docs/architecture.md)."""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import platform
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import pandas as pd
from omegaconf import OmegaConf

from hetsgd import atomic
from hetsgd.errors import UserError
from hetsgd.machine import cpu_model, cpu_sharing, cuda_devices, usable_cores
from hetsgd.outputs.safe_text import redacted, spreadsheet_cell

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
    """Write ``path`` atomically (:func:`hetsgd.atomic.replace_file`: the previous complete
    file, or none, never a truncated one, in the umask's mode); an I/O error is a
    :class:`WriteError` naming ``path``."""
    with writing(Path(path)):
        atomic.replace_file(path, write, binary)


def write_text(path: Path, text: str) -> None:
    """``path.write_text(text)``, atomically (:func:`replace_file`)."""
    replace_file(path, lambda handle: handle.write(text))


def check_no_links(folder: Path, doing: str) -> None:
    """Refuse (a one-line :class:`UserError` after ``doing``) to write into a folder read back
    (a run to resume or recover) that holds a symbolic link anywhere: hetsgd writes and deletes
    there (``checkpoint/``, ``figures/``, old snapshots), and a link, say in a folder copied
    from someone else, would take those writes and deletions outside it."""
    for root, dirs, files in os.walk(folder):  # never into a linked folder: it is listed only
        for name in (*dirs, *files):
            if (Path(root) / name).is_symlink():
                raise UserError(f"{doing}: {Path(root) / name} is a symbolic link; hetsgd "
                                "writes a run's files only inside its folder, never through a "
                                "link: replace it with what it points to, or remove it")


def redact_files(paths: Iterable[Path]) -> None:
    """Rewrite those of ``paths`` (files Hydra wrote: ``.hydra/*.yaml``, a sweep's
    ``multirun.yaml``) that hold a secret of a URI with it redacted; the others stay as they
    are."""
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):  # none there (Hydra's output_subdir: null)
            continue
        if (safe := redacted(text)) != text:
            write_text(path, safe)


def write_csv(path: Path, frame: pd.DataFrame) -> None:
    """``frame.to_csv(path, index=False)``, atomically (:func:`replace_file`), its texts kept from
    being read as formulas (:func:`spreadsheet_cell`)."""
    texts = frame.select_dtypes(include=["object", "string"]).columns
    if len(texts):
        frame = frame.copy()
        frame[texts] = frame[texts].map(spreadsheet_cell)
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
    writer.writerows({key: spreadsheet_cell(value) for key, value in row.items()} for row in rows)
    with writing(path), open(path, "a", encoding="utf-8", newline="") as handle:
        handle.write(text.getvalue())  # one write: a killed process leaves whole rows
        handle.flush()
        os.fsync(handle.fileno())


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
        "cpu_sharing": cpu_sharing(),  # SMT, affinity, cgroup limit: what explains contention
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
        # readable by all: the password of a URI in it (a tracker's) is not written
        write_text(self.path / "config.yaml", redacted(OmegaConf.to_yaml(config, resolve=True)))

    def write_table(self, name: str, rows: list[dict[str, Any]] | pd.DataFrame) -> None:
        frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
        write_csv(self.path / f"{name}.csv", frame)

    def write_summary(self, summary: dict[str, Any]) -> None:
        summary = dict(summary, run_dir=str(self.path))
        write_text(self.path / SUMMARY, json.dumps(_clean(summary), indent=2) + "\n")
