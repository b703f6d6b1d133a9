"""An image folder (``dataset=folder``): one subfolder of images per class, read by torchvision.

``torchvision.datasets.ImageFolder`` finds the classes, the subfolder names in sorted order,
numbered 0..C-1 so (kept as ``Parsed.class_names``), and the images in them by extension. Each
image is opened within bounds (:mod:`hetsgd.data.files`), converted by PIL to
``dataset.channels`` (1: grey, 3: RGB), resized by torchvision's ``Resize`` to
``dataset.image_size`` where that is set (else every image must have the first one's size), and
kept as raw ``uint8`` pixels in (C, H, W) order, as the built-in image sets are: preparation
normalises each channel with statistics of the training part. ``dataset.test_path`` is a second
folder of the same classes; without it a seeded stratified test part is split off.

Decoding images is the slowest parse there is, so the pixels go through the parsed cache, keyed
by every image file (a changed or added image is decoded again).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hetsgd.config import DatasetConfig
from hetsgd.config.problem import FolderConfig
from hetsgd.data.cache import existing_file, load_or_parse
from hetsgd.data.dataset import Parsed
from hetsgd.data.download_progress import status
from hetsgd.data.files import open_data, reason
from hetsgd.data.labels import encode
from hetsgd.data.source import Source
from hetsgd.errors import UserError

_MODES = {1: "L", 3: "RGB"}
_LAYOUT = "one subfolder of images per class"


def torchvision_parts() -> tuple[Any, Any]:
    """torchvision's ``datasets`` and ``transforms``, or one line saying how to install them (a
    torchvision built for another torch fails its import with a RuntimeError or an OSError)."""
    try:
        from torchvision import datasets, transforms
    except ImportError:
        raise UserError("dataset=folder needs torchvision: pip install 'hetsgd[images]'") from None
    except (RuntimeError, OSError) as exc:
        raise UserError(f"dataset=folder needs torchvision, which fails to import here "
                        f"({' '.join(str(exc).split())}): install the release made for this "
                        "torch (pip install 'hetsgd[images]')") from None
    return datasets, transforms


def check_folder(root: Path) -> None:
    """A folder holding at least one subfolder; else one line saying what it is instead."""
    if not root.is_dir():
        raise UserError(f"{root} is not a folder: dataset=folder reads {_LAYOUT}")
    try:
        with os.scandir(root) as entries:
            kinds = [entry.is_dir() for entry in entries]
    except OSError as exc:
        raise UserError(f"cannot read {root}: {reason(exc)}") from None
    if not kinds:
        raise UserError(f"{root} is empty: dataset=folder reads {_LAYOUT}")
    if not any(kinds):
        raise UserError(f"{root} holds no subfolder: dataset=folder reads {_LAYOUT}")


def image_loader(channels: int) -> Callable[[str], Any]:
    """ImageFolder's loader: the file opened as a regular file within bounds, decoded whole while
    it is open, converted to ``channels``; an undecodable file is one line naming it."""
    from PIL import Image

    def load(path: str) -> Any:
        with open_data(Path(path), decompress=False) as f:
            try:
                with Image.open(f) as image:
                    return image.convert(_MODES[channels])
            except (OSError, ValueError, Image.DecompressionBombError) as exc:
                raise UserError(f"cannot read {path} as an image: {exc}") from None

    return load


def open_folder(root: Path, cfg: FolderConfig) -> Any:
    """``root`` as an ImageFolder yielding uint8 (C, H, W) tensors, resized where asked."""
    datasets, transforms = torchvision_parts()
    check_folder(root)
    steps = [transforms.Resize(tuple(cfg.image_size))] if cfg.image_size else []
    transform = transforms.Compose([*steps, transforms.PILToTensor()])
    try:
        return datasets.ImageFolder(str(root), transform=transform,
                                    loader=image_loader(cfg.channels))
    except OSError as exc:  # FileNotFoundError: a class subfolder without a single image
        raise UserError(f"{root}: {' '.join(str(exc).split())}") from None


def read_pixels(folder: Any, size: tuple[int, int] | None) -> tuple[np.ndarray, tuple[int, int]]:
    """Every image's pixels as a row of [N, C*H*W] uint8, each of ``size`` (height, width), or of
    the first image's size where ``size`` is None."""
    pixels: np.ndarray | None = None
    like = "as the training images are"
    for index, (path, _) in enumerate(folder.samples):
        image = folder[index][0].numpy()
        if pixels is None:
            if size is None:
                size, like = (image.shape[1], image.shape[2]), f"as {path} is"
            pixels = np.empty((len(folder.samples), image.size), np.uint8)
        assert size is not None  # given, or the first image's from here on
        if image.shape[1:] != size:
            raise UserError(f"{path} is {image.shape[1]}x{image.shape[2]} pixels (height x "
                            f"width), not {size[0]}x{size[1]} {like}: set "
                            "dataset.image_size=[height,width] to resize every image")
        pixels[index] = image.reshape(-1)
    assert pixels is not None and size is not None  # ImageFolder holds at least one image
    return pixels, size


def read_folders(train: Any, test: Any | None, cfg: FolderConfig, source: str) -> Parsed:
    """Pixels and labels of the train folder (and the test folder, of the same classes and
    image size)."""
    if test is not None and test.classes != train.classes:
        raise UserError(f"{test.root}'s classes ({', '.join(test.classes)}) are not those of "
                        f"{train.root} ({', '.join(train.classes)})")
    size = (cfg.image_size[0], cfg.image_size[1]) if cfg.image_size else None
    x_train, size = read_pixels(train, size)
    x_test = read_pixels(test, size)[0] if test is not None else None
    targets = [np.asarray(f.targets, np.int64) for f in (train, test) if f is not None]
    task, num_classes, ys = encode(targets, cfg.task, " and ".join(
        str(f.root) for f in (train, test) if f is not None))
    return Parsed(task, num_classes, x_train, ys[0], x_test, ys[1] if test is not None else None,
                  source, image_shape=(cfg.channels, *size), class_names=tuple(train.classes))


@dataclass(frozen=True)
class Folder(Source):
    """An image folder given as ``dataset.path`` (and ``dataset.test_path``)."""

    def load(self, cfg: DatasetConfig, seed: int, progress: bool) -> Parsed:
        assert isinstance(cfg, FolderConfig), "dataset=folder is composed into a FolderConfig"
        if not cfg.path:
            raise UserError(f"dataset=folder needs dataset.path=DIR ({_LAYOUT})")
        roots = [existing_file(p) for p in (cfg.path, cfg.test_path) if p]
        folders = [open_folder(root, cfg) for root in roots]
        source = f"image folder {roots[0]}" + (f"; test: {roots[1]}" if len(roots) > 1 else "")

        def parse() -> Parsed:
            with status(f"decoding the images of {roots[0].name}", progress):
                return read_folders(folders[0], (folders[1:] or [None])[0], cfg, source)

        images = [Path(path) for folder in folders for path, _ in folder.samples]
        return load_or_parse(self.name, images, {"roots": [str(r.resolve()) for r in roots],
                                                 "image_size": list(cfg.image_size),
                                                 "channels": cfg.channels, "task": cfg.task},
                             parse)

    def cached(self) -> bool:
        return True

    def fetch(self, progress: bool) -> list[Path]:
        raise UserError("the folder source reads dataset.path=DIR; there is nothing to fetch")

    def note(self) -> str:
        return f"reads dataset.path=DIR, {_LAYOUT} (needs torchvision: pip install 'hetsgd[images]')"


SOURCES = (Folder("folder", "your own images: a folder with one subfolder per class", "auto"),)
