"""Progress shown on stderr while data is downloaded or parsed; silent when ``progress`` is off
(and, rich's own rule, when stderr is not a terminal).

pooch draws its own bar only with tqdm, which this project does not use; its HTTP downloader
also accepts any object with ``total``, ``update``, ``reset`` and ``close``, which ``DownloadBar``
provides on top of rich. A parse shows a spinner; reading a file of ``PROGRESS_MIN_BYTES`` or more
adds how much of it is read to the spinner's line (``report_read``), so that a long parse is seen
to advance. Text shown is never parsed as rich markup: file names may hold ``[`` and ``]``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.text import Text


def stderr_console() -> Console:
    """The console progress displays draw on (downloads, parsing, training, evaluation):
    stderr's; in a Jupyter notebook a plain one, as for a file (a display's last state printed
    once): rich's live display there needs ipywidgets, and warns at each refresh without it."""
    console = Console(stderr=True)
    return Console(stderr=True, force_jupyter=False, force_terminal=False) if console.is_jupyter \
        else console


console = stderr_console()
PROGRESS_MIN_BYTES = 16 << 20  # smaller files parse in about a second: the spinner says enough
# how the status shown now (if any) takes a line saying how far a read is
_shown: ContextVar[Callable[[str], None] | None] = ContextVar("shown", default=None)


class DownloadBar:
    """A rich progress bar in the shape pooch's ``HTTPDownloader(progressbar=...)`` drives."""

    def __init__(self, label: str) -> None:
        self.total = 0  # set by pooch from Content-Length before the first update
        self._progress = Progress(TextColumn(label, markup=False), BarColumn(), DownloadColumn(),
                                  TransferSpeedColumn(), TimeRemainingColumn(), console=console)
        self._task: TaskID | None = None

    def _ensure_task(self) -> TaskID:
        if self._task is None:
            self._progress.start()
            self._task = self._progress.add_task("download", total=self.total or None)
        return self._task

    def update(self, n: int) -> None:
        self._progress.update(self._ensure_task(), advance=n)

    def reset(self) -> None:
        self._progress.reset(self._ensure_task(), total=self.total or None)

    def close(self) -> None:
        """Stop drawing; safe to call again (``download`` also calls it after a failure)."""
        if self._task is not None:
            self._progress.stop()
            self._task = None


@contextlib.contextmanager
def status(message: str, progress: bool) -> Iterator[None]:
    """A spinner with ``message`` while a long parse runs."""
    if not progress:
        yield
        return
    with console.status(Text(message)) as shown:
        token = _shown.set(lambda detail: shown.update(Text(f"{message}: {detail}")))
        try:
            yield
        finally:
            _shown.reset(token)


def report_read(path: Path, done: int, total: int) -> None:
    """Say in the status shown, if any, that ``done`` of the ``total`` bytes of ``path`` are read."""
    show = _shown.get()
    if show is not None and total >= PROGRESS_MIN_BYTES:
        show(f"{done / 2**20:,.0f} of {total / 2**20:,.0f} MiB of {path.name} read "
             f"({done / total:.0%})")
