"""What every data source is: a name, what it holds, the files it needs, and how to read them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hetsgd.config import DatasetConfig
from hetsgd.data.cache import data_home, existing_file, load_or_parse
from hetsgd.data.dataset import Parsed
from hetsgd.data.download import RemoteFile, checked_parse, ensure, local
from hetsgd.data.download_progress import status
from hetsgd.errors import UserError


@dataclass(frozen=True)
class SourceInfo:
    """What ``hetsgd data list|info`` shows about a source."""

    name: str
    description: str
    task: str  # "binary" | "multiclass" | "multilabel" | "auto" (inferred from the file)
    urls: tuple[str, ...]
    files: tuple[Path, ...]  # where the cache keeps (or expects) the files
    cached: bool  # everything needed to load it offline is here
    sizes: str = ""  # published sizes, e.g. "49,749 train / 14,951 test x 300"
    note: str = ""


@dataclass(frozen=True)
class Source:
    """A data source. The default behaviour covers sources whose files are all downloadable."""

    name: str
    description: str
    task: str
    sizes: str = ""
    remotes: tuple[RemoteFile, ...] = ()
    # what dataset.scale=auto applies: "standard" for raw features; a source whose files are
    # published already scaled says "none"
    default_scale: str = "standard"

    def load(self, cfg: DatasetConfig, seed: int, progress: bool) -> Parsed:
        """The source's arrays; ``seed`` matters only to generated data."""
        raise NotImplementedError

    def cached(self) -> bool:
        return all(local(remote) is not None for remote in self.remotes)

    def fetch(self, progress: bool) -> list[Path]:
        """Download whatever is missing and check what was cached against its checksum; return
        the paths of all the source's files."""
        return [ensure(remote, self.name, progress, check=True) for remote in self.remotes]

    def note(self) -> str:
        return ""

    def info(self) -> SourceInfo:
        files = tuple(local(r) or data_home() / r.name for r in self.remotes)
        return SourceInfo(self.name, self.description, self.task,
                          tuple(r.effective_url for r in self.remotes), files, self.cached(),
                          self.sizes, self.note())

    def no_path(self, cfg: DatasetConfig) -> None:
        """For sources that read no file: reject a ``dataset.path`` rather than ignore it."""
        if cfg.path:
            raise UserError(f"dataset.path is not used by the {self.name} source "
                            f"(got {cfg.path}); use dataset=libsvm dataset.path=... for a file")


@dataclass(frozen=True)
class SingleFile(Source):
    """A source read from one downloadable file by ``reader(path, source_line)``;
    ``dataset.path`` replaces the cached copy (and is then not checksum-checked)."""

    reader: Callable[[Path, str], Parsed] | None = None
    label: str = ""

    def load(self, cfg: DatasetConfig, seed: int, progress: bool) -> Parsed:
        reader = self.reader
        assert reader is not None
        remote = self.remotes[0]
        path = existing_file(cfg.path) if cfg.path else ensure(remote, self.name, progress)

        def parse() -> Parsed:
            with status(f"reading {path.name}", progress):
                return reader(path, f"{self.label} from {remote.url}: {path}")

        # a file the user points at is taken as it is
        checked = [] if cfg.path else [(path, remote)]
        return load_or_parse(self.name, [path], {}, lambda: checked_parse(checked, parse))
