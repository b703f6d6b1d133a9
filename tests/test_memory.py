"""The data exists once: prepared block by block straight into shared memory, never copied there."""

from __future__ import annotations

import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from hetsgd.config import DatasetConfig
from hetsgd.config.problem import SyntheticConfig
from hetsgd.data import dataset, load_dataset
from hetsgd.data.cache import NpyRows
from hetsgd.data.dataset import Parsed
from hetsgd.data.prepare import column_moments, fit_scaler, prepare, split_rows
from hetsgd.data.synthetic import TeacherInputs
from hetsgd.engines.common.memory import SharedArena


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HETSGD_DATA", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of a few rows, so that small arrays span many of them."""
    monkeypatch.setattr(dataset, "BLOCK_BYTES", 7 * 4 * 5)


def test_prepared_arrays_are_shared_as_they_are_and_others_are_copied() -> None:
    arena = SharedArena()
    data = load_dataset(DatasetConfig(name="digits"), seed=0, progress=False,
                        allocate=arena.empty)
    shared = arena.data(data.x_train, data.y_train)
    assert shared.x.dense.is_shared() and shared.y.is_shared()
    assert shared.x.dense.data_ptr() == data.x_train.ctypes.data
    assert shared.y.data_ptr() == data.y_train.ctypes.data
    copy = arena.share(data.x_train.copy())
    assert copy.is_shared() and copy.data_ptr() != data.x_train.ctypes.data


def _resident_shared_bytes() -> int:
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines()
                if line.startswith("RssShmem:")) * 1024


@pytest.mark.skipif(sys.platform != "linux", reason="reads RssShmem from /proc/self/status")
def test_an_arena_array_is_resident_only_once_written() -> None:
    """Allocated shared rather than copied there: not a page is touched before the load fills it."""
    size = 200 << 20
    before = _resident_shared_bytes()
    array = SharedArena().empty((size // 4,), np.dtype(np.float32))
    assert _resident_shared_bytes() - before < 4 << 20
    array.fill(1.0)
    assert _resident_shared_bytes() - before > size // 2


def test_teacher_inputs_read_the_same_whatever_the_slicing(small_blocks: None) -> None:
    x = TeacherInputs(40, 5, seed=3)
    whole = x[0:40]
    np.testing.assert_array_equal(np.concatenate([x[0:3], x[3:17], x[17:40]]), whole)
    assert whole.dtype == np.float32 and whole.shape == (40, 5)
    assert not np.array_equal(TeacherInputs(40, 5, seed=4)[0:40], whole)
    assert len({row.tobytes() for row in whole}) == 40  # no block repeats another


def test_npy_rows_read_blocks_of_the_cached_array(tmp_path: Path) -> None:
    array = np.arange(60, dtype=np.float32).reshape(12, 5)
    np.save(tmp_path / "a.npy", array)
    rows = NpyRows.open(tmp_path / "a.npy")
    assert rows.shape == (12, 5) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows[3:8], array[3:8])
    np.testing.assert_array_equal(rows[10:20], array[10:])
    (tmp_path / "cut.npy").write_bytes((tmp_path / "a.npy").read_bytes()[:-4])
    with pytest.raises(ValueError, match="truncated"):
        NpyRows.open(tmp_path / "cut.npy")


@pytest.mark.parametrize("scaling", ["standard", "maxabs", "none"])
def test_prepare_reads_rows_block_by_block_as_it_reads_an_array(
        tmp_path: Path, small_blocks: None, scaling: str) -> None:
    rng = np.random.default_rng(0)
    x = (rng.normal(5, 3, (50, 7)) * (rng.random((50, 7)) < 0.7)).astype(np.float32)
    y = (np.arange(50) % 2).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    cfg = DatasetConfig(name="libsvm", limit=30)
    parsed = Parsed("binary", 2, x, y, None, None, "s")
    in_memory = prepare(parsed, cfg, 0, scaling)
    from_file = prepare(Parsed("binary", 2, NpyRows.open(tmp_path / "x.npy"), y, None, None, "s"),
                        cfg, 0, scaling)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(in_memory, name), getattr(from_file, name))
    assert in_memory.num_train == 30 and in_memory.num_test == 10
    # the rows prepare picks, taken by numpy indexing rather than by copy_rows
    train, test, _ = split_rows(y, "binary", 0, test_size=cfg.test_fraction)
    keep, _, _ = split_rows(y[train], "binary", 0, train_size=30)
    train = train[keep]
    scaler = fit_scaler(x, train, parsed, scaling)
    for rows, part in ((train, in_memory.x_train), (test, in_memory.x_test)):
        scaled = np.empty(part.shape, np.float32)
        scaler.into(x[rows], scaled)
        np.testing.assert_array_equal(part, scaled)
    # and the scaler's statistics are those of all training rows, not of a block of them
    kept = x[train].astype(np.float64)
    expected = {"standard": (kept - kept.mean(axis=0)) / kept.std(axis=0),
                "maxabs": kept / np.abs(kept).max(axis=0), "none": kept}[scaling]
    np.testing.assert_allclose(in_memory.x_train, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(in_memory.y_train, y[train])
    np.testing.assert_array_equal(in_memory.y_test, y[test])
    rows = {r.tobytes() for r in x}
    if scaling == "none":  # every row is a row of the file, in file order
        assert all(r.tobytes() in rows for r in in_memory.x_train)


def test_maxabs_divides_each_column_by_its_largest_magnitude(small_blocks: None) -> None:
    # more rows than a block: the largest magnitudes (-9 and 8) sit in different blocks
    x = np.ones((12, 2), dtype=np.float32)
    x[1] = (-9.0, 2.0)
    x[10] = (3.0, 8.0)
    parsed = Parsed("binary", 2, x, np.zeros(12, np.float32), None, None, "s")
    np.testing.assert_array_equal(fit_scaler(x, np.arange(12), parsed, "maxabs").divisor, [9.0, 8.0])


def test_column_moments_over_many_blocks(small_blocks: None) -> None:
    x = np.random.default_rng(1).normal(1000, 2, (101, 7)).astype(np.float32)
    rows = np.flatnonzero(np.arange(101) % 3 != 1)  # runs of two rows, across blocks
    for picked in (np.arange(101), rows):
        mean, var = column_moments(x, picked)
        kept = x[picked].astype(np.float64)
        np.testing.assert_allclose(mean, kept.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(var, kept.var(axis=0), rtol=1e-9)


def test_a_load_into_shared_memory_holds_no_second_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """tracemalloc sees numpy's allocations, not the arena's shared tensors: what it sees at the
    peak is what the load held besides its result (blocks of 64 KiB here)."""
    monkeypatch.setattr(dataset, "BLOCK_BYTES", 1 << 16)
    config = SyntheticConfig(name="synthetic", n_samples=60000, n_features=100)
    data_bytes = 60000 * 100 * 4
    tracemalloc.start()
    try:
        data = load_dataset(config, seed=0, progress=False, allocate=SharedArena().empty)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert data.num_train + data.num_test == 60000 and data.scaling == "standard"
    assert peak < data_bytes / 4
