"""Image sets: Fashion-MNIST (IDX files) and CIFAR-10 (the python-pickle tarball).

Pixels are kept as raw ``uint8``, flattened in (C, H, W) order; :mod:`hetsgd.data.prepare`
turns them into float32 and normalises them per channel.
"""

from __future__ import annotations

import io
import math
import pickle
import struct
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from hetsgd.config import DatasetConfig
from hetsgd.data.cache import existing_file, find_local, load_or_parse
from hetsgd.data.dataset import Parsed
from hetsgd.data.download import RemoteFile, checked_parse, ensure
from hetsgd.data.download_progress import status
from hetsgd.data.files import open_data
from hetsgd.data.source import SingleFile, Source, SourceInfo
from hetsgd.errors import UserError

# --------------------------------------------------------------------------------------------
# Fashion-MNIST
# --------------------------------------------------------------------------------------------

_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """An IDX array (the MNIST format): two zero bytes, a type code, the rank, big-endian
    uint32 dimensions, then the data."""
    with open_data(path) as f:
        data = f.read()
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] not in _IDX_TYPES:
        raise UserError(f"{path} is not an IDX file (bad magic number)")
    rank = data[3]
    header = 4 + 4 * rank
    if len(data) < header:
        raise UserError(f"{path} is truncated inside its IDX header")
    dims = struct.unpack(f">{rank}I", data[4:header])
    dtype = np.dtype(_IDX_TYPES[data[2]])
    body = data[header:]
    if len(body) != math.prod(dims) * dtype.itemsize:  # numpy's product would overflow
        raise UserError(f"{path}: the IDX header says {dims} but the file holds {len(body)} "
                        "bytes of data")
    return np.frombuffer(body, dtype).reshape(dims).astype(dtype.newbyteorder("="))


def read_fashion(images_train: Path, labels_train: Path, images_test: Path, labels_test: Path,
                 source: str) -> Parsed:
    parts: list[np.ndarray] = []
    for images_path, labels_path in ((images_train, labels_train), (images_test, labels_test)):
        images, labels = read_idx(images_path), read_idx(labels_path)
        if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.shape != images.shape[:1]:
            raise UserError(f"{images_path} and {labels_path} do not hold 28x28 images with one "
                            f"label each (shapes {images.shape}, {labels.shape})")
        if labels.size and (labels.min() < 0 or labels.max() > 9):
            raise UserError(f"{labels_path} has labels outside 0..9")
        parts += [images.reshape(len(images), -1).astype(np.uint8), labels.astype(np.int64)]
    x_train, y_train, x_test, y_test = parts
    return Parsed("multiclass", 10, x_train, y_train, x_test, y_test, source=source,
                  image_shape=(1, 28, 28))


DEBIAN_FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist
_FASHION_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
# md5 checksums published in Fashion-MNIST's README
_FASHION_FILES = (("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
                  ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
                  ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
                  ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"))


@dataclass(frozen=True)
class FashionMnist(Source):
    """Looked for in ``dataset.path`` (a directory), then Debian's package directory, then the
    cache, and fetched last. Debian recompresses the files, so their bytes differ from the
    published checksums; dpkg has checked them, and they are taken as they are."""

    def _in(self, directory: Path) -> list[Path] | None:
        found = [find_local(directory, remote.name) for remote in self.remotes]
        return None if None in found else [p for p in found if p is not None]

    def load(self, cfg: DatasetConfig, seed: int, progress: bool) -> Parsed:
        checked = False
        if cfg.path:
            directory = existing_file(cfg.path)
            files = self._in(directory)
            if files is None:
                raise UserError(f"{directory} does not hold the four Fashion-MNIST files "
                                f"({', '.join(r.name for r in self.remotes)})")
        else:
            files = self._in(DEBIAN_FASHION_DIR)
            if files is None:
                files, checked = [ensure(r, self.name, progress) for r in self.remotes], True

        def parse() -> Parsed:
            with status("parsing Fashion-MNIST", progress):
                images_train, labels_train, images_test, labels_test = files  # one per remote
                return read_fashion(images_train, labels_train, images_test, labels_test,
                                    source=f"Fashion-MNIST: {files[0].parent}")

        pairs = list(zip(files, self.remotes, strict=True)) if checked else []
        return load_or_parse(self.name, files, {}, lambda: checked_parse(pairs, parse))

    def cached(self) -> bool:
        return self._in(DEBIAN_FASHION_DIR) is not None or super().cached()

    def fetch(self, progress: bool) -> list[Path]:
        return self._in(DEBIAN_FASHION_DIR) or super().fetch(progress)

    def info(self) -> SourceInfo:
        debian = self._in(DEBIAN_FASHION_DIR)
        info = super().info()
        if debian is None:
            return info
        return SourceInfo(info.name, info.description, info.task, info.urls, tuple(debian), True,
                          info.sizes, f"from Debian's dataset-fashion-mnist in {debian[0].parent}")


# --------------------------------------------------------------------------------------------
# CIFAR-10
# --------------------------------------------------------------------------------------------

# per-channel mean and std of [0, 1] pixels used by the biased local SGD authors
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2023, 0.1994, 0.2010)
_CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_TEST = "test_batch"


class _BatchUnpickler(pickle.Unpickler):
    """Unpickles only what a CIFAR batch holds (dicts, lists, numpy arrays): a tampered archive
    cannot run code through pickle."""

    _ALLOWED = {("numpy.core.multiarray", "_reconstruct"),
                ("numpy._core.multiarray", "_reconstruct"),
                ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a CIFAR batch")
        return super().find_class(module, name)


def read_cifar10(path: Path, source: str) -> Parsed:
    """The train batches and the test batch of the python-pickle tarball, read as one stream
    (``open_data`` decompresses it by suffix, within its bounds, as it does every data file)."""
    batches: dict[str, dict[bytes, Any]] = {}
    try:
        with open_data(path) as f, tarfile.open(fileobj=f, mode="r|*") as tar:
            for member in tar:
                base = PurePosixPath(member.name).name
                if member.isfile() and base in (*_CIFAR_TRAIN, _CIFAR_TEST):
                    raw = tar.extractfile(member).read()  # type: ignore[union-attr]
                    batches[base] = _BatchUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except (tarfile.TarError, OSError, EOFError, pickle.UnpicklingError, ValueError) as exc:
        raise UserError(f"cannot read {path} as the CIFAR-10 python tarball: {exc}") from exc
    missing = [b for b in (*_CIFAR_TRAIN, _CIFAR_TEST) if b not in batches]
    if missing:
        raise UserError(f"{path} lacks the CIFAR-10 batches {', '.join(missing)}")

    def stack(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        try:
            x = np.concatenate([np.asarray(batches[n][b"data"], dtype=np.uint8) for n in names])
            y = np.concatenate([np.asarray(batches[n][b"labels"], dtype=np.int64) for n in names])
        except (KeyError, ValueError) as exc:
            raise UserError(f"{path}: a CIFAR-10 batch is malformed ({exc})") from exc
        if x.ndim != 2 or x.shape[1] != 3 * 32 * 32 or len(y) != len(x):
            raise UserError(f"{path}: CIFAR-10 batches must hold 3072 bytes per image and one "
                            f"label each (got {x.shape}, {y.shape})")
        if len(y) and not 0 <= y.min() <= y.max() <= 9:
            bad = y.min() if y.min() < 0 else y.max()
            raise UserError(f"{path}: a CIFAR-10 label is {bad}, not one of 0..9")
        return x, y

    x_train, y_train = stack(_CIFAR_TRAIN)
    x_test, y_test = stack((_CIFAR_TEST,))
    return Parsed("multiclass", 10, x_train, y_train, x_test, y_test, source,
                  image_shape=(3, 32, 32), channel_stats=(CIFAR_MEAN, CIFAR_STD))


SOURCES = (
    FashionMnist("fashion_mnist", "Fashion-MNIST: 28x28 grey images of clothes, 10 classes",
                 "multiclass", "60,000 train / 10,000 test x 784 (1x28x28)",
                 tuple(RemoteFile(n, _FASHION_URL + n, f"md5:{md5}") for n, md5 in _FASHION_FILES)),
    SingleFile("cifar10", "CIFAR-10: 32x32 colour images, 10 classes", "multiclass",
               "50,000 train / 10,000 test x 3,072 (3x32x32)",
               (RemoteFile("cifar-10-python.tar.gz",
                           "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                           "md5:c58f30108f718f92721af3b95e74349a"),),
               reader=read_cifar10, label="CIFAR-10"),
)
