"""Progress shown on stderr while data is downloaded or parsed; silent when ``progress`` is off.

pooch draws its own bar only with tqdm, which this project does not use; its HTTP downloader
also accepts any object with ``total``, ``update``, ``reset`` and ``close``, which ``DownloadBar``
provides on top of rich.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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

console = Console(stderr=True)


class DownloadBar:
    """A rich progress bar in the shape pooch's ``HTTPDownloader(progressbar=...)`` drives."""

    def __init__(self, label: str) -> None:
        self.total = 0  # set by pooch from Content-Length before the first update
        self._progress = Progress(TextColumn(label), BarColumn(), DownloadColumn(),
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
    with console.status(message):
        yield
