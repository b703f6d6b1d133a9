"""Training-batch augmentation of flat image rows (``data.augment``); pure torch.

``crop_flip`` is the standard CIFAR recipe that Lim et al.'s released code applies ("RandomCrop
32 with padding 4, horizontal flip"): torchvision's ``RandomCrop(32, padding=4)`` then
``RandomHorizontalFlip()``, on the training set only, before ``ToTensor`` and ``Normalize``.

What is known of the paper is silent on the details below; this module follows torchvision's
defaults, which that code leaves untouched, and they are the project's reconstruction:

- the padding is constant black (``fill=0``, ``padding_mode="constant"``) in pixel space. hetsgd
  stores images already normalised (:mod:`hetsgd.data.prepare`), so the fill is, per channel, the
  value a zero pixel takes after scaling: ``(0 - mean) / std`` with ``dataset.scale=standard``
  (CIFAR-10: the authors' mean and std; other image sets: their published or measured ones), 0
  with ``maxabs`` or ``none``. :class:`hetsgd.data.Dataset` carries it as ``pixel_zero``;
  :class:`hetsgd.model.problem.Problem` as ``channel_fill``.
- each example's offset is uniform over the (2 * padding + 1)^2 positions of the crop, and it is
  flipped with probability 0.5, after the crop;
- the draws come from a ``torch.Generator`` of the worker, seeded from the run seed and the
  worker's rank (torchvision draws from the unseeded global RNG of the loader's processes), so a
  run is reproducible; they are made on the CPU, then moved to the batch's device, so a seed gives
  the same crops on any device.

Evaluation batches are never augmented (the authors' test transform is ToTensor + Normalize).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from hetsgd.errors import UserError

CROP_PADDING = 4  # the authors' RandomCrop(32, padding=4)
FLIP_PROBABILITY = 0.5  # torchvision's RandomHorizontalFlip default
# Tags this stream in a worker's seed sequence, apart from every other seeded stream of a run.
AUGMENT_STREAM = 0xA06


def crop_flip(x: torch.Tensor, image_shape: tuple[int, int, int], padding: int,
              fill: Sequence[float], generator: torch.Generator, flip: bool = True) -> torch.Tensor:
    """A random crop of each image of ``x`` from it padded by ``padding`` on every side with
    ``fill`` (one value per channel), then a random horizontal flip (with ``flip``).

    ``x`` is a dense flat batch ``[B, C*H*W]`` in (C, H, W) order; the result has its shape, dtype
    and device and is a new tensor (``x`` is left as it is). Vectorised: one gather for the batch.
    """
    channels, height, width = image_shape
    if x.layout != torch.strided or x.dim() != 2 or x.shape[1] != channels * height * width:
        raise ValueError(f"crop_flip needs a dense [B, {channels * height * width}] batch, "
                         f"got a {x.layout} tensor of shape {tuple(x.shape)}")
    if len(fill) != channels:
        raise ValueError(f"crop_flip needs one fill value per channel ({channels}), got {len(fill)}")
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    n = x.shape[0]
    # drawn on the CPU: the same generator gives the same crops on every device
    shifts = torch.randint(0, 2 * padding + 1, (n, 2), generator=generator)
    flips = (torch.rand(n, generator=generator) < FLIP_PROBABILITY) if flip else torch.zeros(
        n, dtype=torch.bool)
    shifts, flips = shifts.to(x.device), flips.to(x.device)
    # output pixel (i, j) of an example comes from source pixel (i + dy - p, j' + dx - p), where
    # j' = W - 1 - j if the example is flipped, else j; out of the image it is padding
    i = torch.arange(height, device=x.device)
    j = torch.arange(width, device=x.device)
    rows = i[None, :] + shifts[:, :1] - padding                        # [B, H]
    cols = torch.where(flips[:, None], width - 1 - j[None, :], j[None, :]) + shifts[:, 1:] - padding
    inside = (((rows >= 0) & (rows < height))[:, :, None]
              & ((cols >= 0) & (cols < width))[:, None, :])            # [B, H, W]
    images = x.view(n, channels, height, width)
    gathered = images[torch.arange(n, device=x.device)[:, None, None, None],
                      torch.arange(channels, device=x.device)[None, :, None, None],
                      rows.clamp(0, height - 1)[:, None, :, None],
                      cols.clamp(0, width - 1)[:, None, None, :]]      # [B, C, H, W]
    values = torch.tensor(list(fill), dtype=x.dtype, device=x.device).view(1, channels, 1, 1)
    return torch.where(inside[:, None], gathered, values).reshape(n, -1)


class CropFlip:
    """A worker's ``crop_flip`` with its own seeded generator: call it on each training batch."""

    def __init__(self, image_shape: tuple[int, int, int], fill: Sequence[float], seed: int,
                 padding: int = CROP_PADDING) -> None:
        self.image_shape, self.fill, self.padding = image_shape, tuple(fill), padding
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return crop_flip(x, self.image_shape, self.padding, self.fill, self.generator)


def augment_seed(seed: int, rank: int) -> int:
    """The generator seed of worker ``rank`` in a run of ``seed``: a stream of its own."""
    return int(np.random.SeedSequence([seed, rank, AUGMENT_STREAM]).generate_state(1)[0])


def check_augment(name: str, image_shape: tuple[int, int, int] | None) -> None:
    """A one-line UserError where ``data.augment`` (checked against its choices by the config)
    cannot apply to the data."""
    if name != "none" and image_shape is None:
        raise UserError(f"data.augment={name} needs an image dataset (e.g. cifar10, "
                        "fashion_mnist); this dataset has flat features: use data.augment=none")


def training_augment(name: str, image_shape: tuple[int, int, int] | None,
                     fill: Sequence[float] | None, seed: int, rank: int) -> CropFlip | None:
    """Worker ``rank``'s augmentation of its training batches, or None for ``none``."""
    check_augment(name, image_shape)  # the config allows only none and crop_flip
    if name == "none":
        return None
    assert image_shape is not None and fill is not None, "Problem.of sets both for image sets"
    return CropFlip(image_shape, fill, augment_seed(seed, rank))
