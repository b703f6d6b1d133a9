"""data.augment=crop_flip: the crop and flip against hand-made crops, the fill, seeding, the
wiring into training batches (never evaluation) and the error on flat data."""

from __future__ import annotations

import gzip
import multiprocessing as mp
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_config

from hetsgd.algorithms.local_sgd import ShardBatches
from hetsgd.config.checks import ConfigError
from hetsgd.config.problem import DatasetConfig
from hetsgd.config.schema import DataConfig
from hetsgd.data import load_dataset
from hetsgd.data.augment import CropFlip, augment_seed, crop_flip, training_augment
from hetsgd.data.dataset import Parsed
from hetsgd.data.images import CIFAR_MEAN, CIFAR_STD
from hetsgd.data.prepare import prepare
from hetsgd.engines.batches import Batches
from hetsgd.engines.batches import training_augment as engine_augment
from hetsgd.engines.common.memory import SharedData, SharedMaster
from hetsgd.engines.common.state import SharedState
from hetsgd.engines.common.worker import StepRecord, Worker
from hetsgd.errors import UserError
from hetsgd.model.problem import Problem
from hetsgd.workers import expand


def by_hand(image: np.ndarray, padding: int, fill: tuple[float, ...]) -> dict[bytes, set]:
    """Every crop of ``image`` [C, H, W] padded with ``fill``, plain and flipped, by its bytes:
    -> the (dy, dx, flipped) that give it."""
    channels, height, width = image.shape
    padded = np.empty((channels, height + 2 * padding, width + 2 * padding), dtype=np.float32)
    for c in range(channels):
        padded[c] = fill[c]
    padded[:, padding:padding + height, padding:padding + width] = image
    crops: dict[bytes, set] = {}
    for dy in range(2 * padding + 1):
        for dx in range(2 * padding + 1):
            crop = padded[:, dy:dy + height, dx:dx + width]
            for flipped, out in ((False, crop), (True, crop[:, :, ::-1])):
                crops.setdefault(np.ascontiguousarray(out).tobytes(), set()).add((dy, dx, flipped))
    return crops


def test_shape_dtype_and_input_are_kept() -> None:
    x = torch.randn(5, 3 * 8 * 8)
    before = x.clone()
    out = crop_flip(x, (3, 8, 8), 4, (0.0, 1.0, 2.0), torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    assert torch.equal(x, before)


def test_every_crop_of_a_known_image_is_one_computed_by_hand() -> None:
    image = np.arange(1, 17, dtype=np.float32).reshape(1, 4, 4)  # distinct values, fill -1
    crops = by_hand(image, 4, (-1.0,))
    assert sum(len(v) for v in crops.values()) == 81 * 2
    n = 3000
    x = torch.from_numpy(image.reshape(1, -1)).repeat(n, 1)
    out = crop_flip(x, (1, 4, 4), 4, (-1.0,), torch.Generator().manual_seed(1)).numpy()
    seen = [crops.get(np.ascontiguousarray(row).reshape(1, 4, 4).tobytes()) for row in out]
    assert all(s is not None for s in seen)
    # outputs that only one (dy, dx, flipped) gives: both flips and many shifts must occur
    unique = [next(iter(s)) for s in seen if len(s) == 1]
    assert {flipped for _, _, flipped in unique} == {False, True}
    assert len({(dy, dx) for dy, dx, _ in unique}) >= 30
    # the image itself, unflipped, is about one draw in 162
    plain = sum(1 for s in seen if (4, 4, False) in s)
    assert 0 < plain < 3 * n / 162


def test_padding_is_each_channel_fill() -> None:
    rng = np.random.default_rng(0)
    image = rng.normal(size=(2, 3, 5)).astype(np.float32)
    fill = (-7.0, 9.0)
    crops = by_hand(image, 2, fill)
    x = torch.from_numpy(image.reshape(1, -1)).repeat(400, 1)
    out = crop_flip(x, (2, 3, 5), 2, fill, torch.Generator().manual_seed(2)).numpy()
    for row in out:
        assert np.ascontiguousarray(row).reshape(2, 3, 5).tobytes() in crops
    # every shift of 0 to 2 x padding occurs, either way (none of the end ones left out)
    shifts = set().union(*(crops[np.ascontiguousarray(row).reshape(2, 3, 5).tobytes()]
                           for row in out))
    assert {dy for dy, _, _ in shifts} == set(range(5)) == {dx for _, dx, _ in shifts}
    channels = out.reshape(-1, 2, 15)
    assert (channels[:, 0] == -7.0).any() and (channels[:, 1] == 9.0).any()
    assert not (channels[:, 0] == 9.0).any() and not (channels[:, 1] == -7.0).any()


def test_no_padding_and_no_flip_is_the_identity() -> None:
    x = torch.randn(6, 3 * 5 * 4)
    out = crop_flip(x, (3, 5, 4), 0, (0.0, 0.0, 0.0), torch.Generator().manual_seed(3), flip=False)
    assert torch.equal(out, x)


def test_the_same_seed_gives_the_same_batch() -> None:
    x = torch.randn(16, 3 * 8 * 8)
    fill = (-1.0, -2.0, -3.0)
    a = CropFlip((3, 8, 8), fill, seed=5)
    b = CropFlip((3, 8, 8), fill, seed=5)
    first = [a(x), a(x)]
    assert all(torch.equal(u, v) for u, v in zip(first, [b(x), b(x)], strict=True))
    assert not torch.equal(first[0], first[1])  # the generator moves on
    assert not torch.equal(CropFlip((3, 8, 8), fill, seed=6)(x), first[0])
    assert len({augment_seed(s, r) for s in range(4) for r in range(8)}) == 32


def test_fill_is_what_a_black_pixel_became() -> None:
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (12, 3 * 2 * 2)).astype(np.uint8)
    pixels[0] = 0  # a black image
    labels = np.arange(12) % 2
    cifar = Parsed("multiclass", 2, pixels, labels, pixels[:4], labels[:4], "test",
                   image_shape=(3, 2, 2), channel_stats=(CIFAR_MEAN, CIFAR_STD))
    cfg = DatasetConfig(name="cifar10")
    data = prepare(cifar, cfg, 0, "standard")
    expected = [-m / s for m, s in zip(CIFAR_MEAN, CIFAR_STD, strict=True)]
    assert data.pixel_zero == pytest.approx(expected, rel=1e-6)
    assert Problem.of(data).channel_fill == data.pixel_zero
    np.testing.assert_array_equal(data.x_train[0].reshape(3, 4),
                                  np.repeat(np.float32(data.pixel_zero)[:, None], 4, axis=1))
    assert prepare(cifar, cfg, 0, "maxabs").pixel_zero == (0.0, 0.0, 0.0)
    assert prepare(cifar, cfg, 0, "none").pixel_zero == (0.0, 0.0, 0.0)
    measured = prepare(Parsed("multiclass", 2, pixels, labels, pixels[:4], labels[:4], "test",
                              image_shape=(3, 2, 2)), cfg, 0, "standard")
    np.testing.assert_array_equal(measured.x_train[0].reshape(3, 4),
                                  np.repeat(np.float32(measured.pixel_zero)[:, None], 4, axis=1))
    assert all(v < 0 for v in measured.pixel_zero)


def test_unknown_augmentation_is_refused_by_the_config() -> None:
    with pytest.raises(ConfigError, match="data.augment"):
        DataConfig(augment="cutout")


def test_crop_flip_on_flat_features_is_a_one_line_user_error() -> None:
    cfg = run_config("algo=sync", "dataset=digits", "model=mlp", "data.augment=crop_flip",
                     "budget.epochs=1")
    dataset = load_dataset(cfg.dataset, cfg.seed, progress=False)
    problem = Problem.of(dataset)
    assert problem.image_shape is None and problem.channel_fill is None
    data = SharedData.from_arrays(dataset.x_train, dataset.y_train)
    state = SharedState.create(data, SharedMaster.initial(cfg.model, problem, cfg.seed), 1, 1,
                               mp.get_context("spawn"))
    spec, = expand(cfg.devices)
    with pytest.raises(UserError, match="data.augment=crop_flip needs an image dataset") as info:
        Worker(spec, cfg, problem, state)
    assert "\n" not in str(info.value)
    assert engine_augment(DataConfig(), problem, 0, 0) is None  # none: nothing to check


def _images(n: int = 20, shape: tuple[int, int, int] = (1, 6, 6)) -> SharedData:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, int(np.prod(shape)))).astype(np.float32)
    return SharedData.from_arrays(x, np.arange(n) % 3)


@pytest.mark.parametrize("on_device", ["never", "always"])
def test_training_batches_are_augmented_and_the_stored_rows_are_not(on_device: str) -> None:
    data = _images()
    stored = data.x.dense.clone()
    problem = Problem("multiclass", 36, 3, (1, 6, 6), (-5.0,))
    augment = engine_augment(DataConfig(augment="crop_flip"), problem, seed=0, rank=1)
    assert isinstance(augment, CropFlip) and augment.fill == (-5.0,)
    plain = Batches(data, torch.device("cpu"), True, 0, on_device)
    augmented = Batches(data, torch.device("cpu"), True, 0, on_device, augment)
    x, y = augmented.get(0, 0, 16)
    x0, y0 = plain.get(0, 0, 16)
    assert torch.equal(y, y0) and torch.equal(x0, stored[plain.order(0)[:16]])
    assert x.shape == x0.shape and not torch.equal(x, x0)
    assert (x == -5.0).any()  # some padding came in
    assert torch.equal(data.x.dense, stored)  # what evaluation reads is untouched
    shard = ShardBatches(data, torch.device("cpu"), True, 0, on_device, augment=augment)
    assert shard.augment is augment and not torch.equal(shard.get(0, 0, 16)[0], x0)


def idx(array: np.ndarray) -> bytes:
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + \
        array.astype(np.uint8).tobytes()


@pytest.fixture
def fashion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A tiny Fashion-MNIST in IDX files (the real one is only here with Debian's package)."""
    monkeypatch.setenv("HETSGD_DATA", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    directory = tmp_path / "fashion"
    directory.mkdir()
    for prefix, n in (("train", 48), ("t10k", 12)):
        (directory / f"{prefix}-images-idx3-ubyte.gz").write_bytes(
            gzip.compress(idx(rng.integers(0, 256, (n, 28, 28)))))
        (directory / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(
            gzip.compress(idx(np.arange(n) % 10)))
    return directory


def _cnn_run(directory: Path, augment: str) -> tuple[list[StepRecord], torch.Tensor, Worker]:
    cfg = run_config("algo=sync", "dataset=fashion_mnist", f"dataset.path={directory}",
                     "model=cnn", "budget.epochs=1", "seed=2", f"data.augment={augment}",
                     "devices.groups.cpu.threads=1", "devices.groups.cpu.batch_size=16")
    dataset = load_dataset(cfg.dataset, cfg.seed, progress=False)
    problem = Problem.of(dataset)
    data = SharedData.from_arrays(dataset.x_train, dataset.y_train)
    state = SharedState.create(data, SharedMaster.initial(cfg.model, problem, cfg.seed), 1, 1,
                               mp.get_context("spawn"))
    spec, = expand(cfg.devices)
    records: list[StepRecord] = []
    worker = Worker(spec, cfg, problem, state)
    worker.run(records.append)
    return records, state.master.params.clone(), worker


def test_a_tiny_cnn_run_with_crop_flip_is_reproducible(fashion: Path) -> None:
    first, params, worker = _cnn_run(fashion, "crop_flip")
    assert isinstance(worker.batches.augment, CropFlip)
    assert worker.batches.augment.fill[0] < 0  # a black pixel, standardised
    assert len(first) == 3 and all(np.isfinite(r.loss) for r in first)
    second, params_again, _ = _cnn_run(fashion, "crop_flip")
    assert [r.loss for r in first] == [r.loss for r in second]
    assert torch.equal(params, params_again)
    plain, params_plain, plain_worker = _cnn_run(fashion, "none")
    assert plain_worker.batches.augment is None
    assert [r.loss for r in plain][0] != first[0].loss and not torch.equal(params, params_plain)


def test_each_rank_draws_its_own_crops() -> None:
    x = torch.randn(32, 3 * 8 * 8)
    a, b = (training_augment("crop_flip", (3, 8, 8), (0.0,) * 3, seed=0, rank=r) for r in (0, 1))
    assert a is not None and b is not None and not torch.equal(a(x), b(x))
    assert training_augment("none", None, None, seed=0, rank=0) is None


@pytest.mark.gpu
def test_a_seed_gives_the_same_crops_on_a_gpu() -> None:
    x = torch.randn(64, 3 * 32 * 32)
    on_cpu = CropFlip((3, 32, 32), (-1.0, -2.0, -3.0), seed=7)(x)
    on_gpu = CropFlip((3, 32, 32), (-1.0, -2.0, -3.0), seed=7)(x.to("cuda"))
    assert on_gpu.device.type == "cuda" and torch.equal(on_gpu.cpu(), on_cpu)
