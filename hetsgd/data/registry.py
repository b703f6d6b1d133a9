"""All data sources by name, and the four entry points the runner and the CLI call."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from hetsgd.config import DatasetConfig
from hetsgd.config.problem import FilesConfig
from hetsgd.data import covtype, embedded, folder, images, libsvm, synthetic, tables, xc
from hetsgd.data.dataset import Allocate, Dataset, Parsed, row_blocks
from hetsgd.data.freed import give_back_freed
from hetsgd.data.prepare import prepare
from hetsgd.data.source import Source, SourceInfo
from hetsgd.errors import UserError

SOURCES: dict[str, Source] = {
    source.name: source
    for module in (embedded, libsvm, covtype, xc, images, synthetic, tables, folder)
    for source in module.SOURCES
}


def get_source(name: str) -> Source:
    try:
        return SOURCES[name]
    except KeyError:
        raise UserError(f"unknown dataset {name!r}; known: {', '.join(SOURCES)}") from None


def _check_task(wanted: str, task: str, name: str) -> None:
    if wanted != "auto" and task != "auto" and wanted != task:
        raise UserError(f"{name} is a {task} dataset; dataset.task={wanted} does not apply "
                        "(use dataset.task=auto)")


def load_dataset(cfg: DatasetConfig, seed: int, progress: bool = True,
                 allocate: Allocate = np.empty, integers: bool = False) -> Dataset:
    """Load, split, subset and scale ``cfg.name`` (fetching it into the cache if needed), with the
    split and subset (and generated data) seeded by :func:`data_seed`;
    ``dataset.scale=auto`` is the source's own default (``Dataset.scaling`` says what applied).
    Dense features and labels are written into arrays from ``allocate``. ``integers``: the
    model takes integer features as they are, so a file's integer array stays one (see
    :mod:`hetsgd.data.prepare`)."""
    source = get_source(cfg.name)
    _check_task(cfg.task, source.task, source.name)
    seed = data_seed(cfg, seed)
    parsed = source.load(cfg, seed, progress)
    _check_task(cfg.task, parsed.task, source.name)
    kept = integers and cfg.scale in ("auto", "none") and integer_array(cfg, parsed)
    dataset = prepare(parsed, cfg, seed, "none" if kept else resolve_scale(cfg.scale, source, cfg),
                      allocate, np.int64 if kept else np.float32)
    del parsed  # the parser's arrays (a table's frame among them): given back just below
    give_back_freed()
    return dataset


def data_seed(cfg: DatasetConfig, seed: int) -> int:
    """The seed of the data a run of seed ``seed`` sees: ``dataset.split_seed``, unless null."""
    return seed if cfg.split_seed is None else cfg.split_seed


def integer_array(cfg: DatasetConfig, parsed: Parsed) -> bool:
    """Whether ``parsed`` is a user's array of integers (``dataset=files``, ``.npz`` or
    ``.npy``), each within int64; an unsigned one past it is a UserError."""
    parts = [x for x in (parsed.x_train, parsed.x_test) if x is not None]
    if not isinstance(cfg, FilesConfig) or any(sp.issparse(x) or x.dtype.kind not in "iu"
                                               for x in parts):
        return False
    limit = np.iinfo(np.int64).max
    for x in (x for x in parts if x.dtype == np.uint64):
        for start, stop in row_blocks(x):  # a Rows reads its rows by block
            if x[start:stop].max(initial=0) > limit:
                raise UserError(f"{cfg.path}: its uint64 features exceed int64, the integers a "
                                "model takes")
    return True


def resolve_scale(scale: str, source: Source, cfg: DatasetConfig | None = None) -> str:
    """``dataset.scale`` with ``auto`` replaced by the source's ``default_scale``; for a LIBSVM
    file read by ``dataset=files`` (``cfg`` given), that of ``dataset=libsvm``, so that the same
    file is treated alike by both."""
    if scale != "auto":
        return scale
    if (isinstance(cfg, FilesConfig) and cfg.path
            and tables.file_format(Path(cfg.path), cfg.format) == "libsvm"):
        return get_source("libsvm").default_scale
    return source.default_scale


def list_sources() -> list[SourceInfo]:
    return [source.info() for source in SOURCES.values()]


def source_info(name: str) -> SourceInfo:
    return get_source(name).info()


def fetch(name: str, progress: bool = True) -> list[Path]:
    """Download the source's files into the cache; the paths of those already there are returned
    as they are. Built-in and generated sources have no files: an empty list."""
    return get_source(name).fetch(progress)
