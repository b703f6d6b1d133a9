"""hetsgd.data: sources, parsers, cache, downloads (from 127.0.0.1 only), preparation."""

from __future__ import annotations

import bz2
import functools
import gzip
import hashlib
import io
import lzma
import os
import pickle
import re
import shutil
import socket
import struct
import subprocess
import sys
import tarfile
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from conftest import W8A, W8A_NAME
from typer.testing import CliRunner

from hetsgd.cli import app
from hetsgd.config import DatasetConfig
from hetsgd.config.problem import SCALINGS, FilesConfig, SyntheticConfig
from hetsgd.data import data_home, fetch, images, libsvm, list_sources, load_dataset, source_info
from hetsgd.data.download import RemoteFile, download
from hetsgd.data.images import CIFAR_MEAN, CIFAR_STD, read_idx
from hetsgd.data.registry import SOURCES, get_source, resolve_scale
from hetsgd.errors import UserError

COMPRESS = {".xz": lzma.compress, ".bz2": bz2.compress, ".gz": gzip.compress, "": bytes}


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache per test, and nothing that could reach past 127.0.0.1: the mirror is a
    port nothing listens on (a missing published test file is downloaded), unless a test's own."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("HETSGD_DATA", str(cache))
    monkeypatch.setenv("HETSGD_DATA_MIRROR", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setattr(images, "DEBIAN_FASHION_DIR", tmp_path / "no-debian")
    return cache


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@pytest.fixture
def server(tmp_path: Path):
    """A static file server on 127.0.0.1; yields (base URL, served directory)."""
    root = tmp_path / "served"
    root.mkdir()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0),
                                functools.partial(_QuietHandler, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}", root
    httpd.shutdown()
    httpd.server_close()
    thread.join()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cfg(name: str, **kwargs: object) -> DatasetConfig:
    schema = SyntheticConfig if name == "synthetic" else DatasetConfig
    return schema(name=name, **kwargs)  # type: ignore[arg-type]


def libsvm_text(labels: list[str], seed: int = 0, width: int = 6) -> str:
    rng = np.random.default_rng(seed)
    lines = []
    for label in labels:
        cols = sorted(rng.choice(np.arange(1, width + 1), size=3, replace=False))
        lines.append(label + "".join(f" {c}:{rng.integers(1, 9)}" for c in cols))
    return "\n".join(lines) + "\n"


def write(path: Path, text: str | bytes) -> Path:
    data = text.encode() if isinstance(text, str) else text
    path.parent.mkdir(parents=True, exist_ok=True)
    compress = next((c for suffix, c in COMPRESS.items() if suffix and path.name.endswith(suffix)),
                    bytes)
    path.write_bytes(compress(data))
    return path


# --------------------------------------------------------------------------------------------
# digits, split, limit, scaling
# --------------------------------------------------------------------------------------------


def test_digits_standardised_with_training_statistics() -> None:
    data = load_dataset(cfg("digits"), seed=0, progress=False)
    raw = load_dataset(cfg("digits", scale="none"), seed=0, progress=False)
    assert (data.num_train + data.num_test, data.num_features, data.num_classes) == (1797, 64, 10)
    assert data.task == "multiclass" and data.num_outputs == 10 and data.image_shape is None
    assert data.x_train.dtype == np.float32 and data.y_train.dtype == np.int64
    assert data.scaling == "standard" and raw.scaling == "none"  # the default stays standard
    assert np.abs(data.x_train.mean(axis=0)).max() < 1e-4
    mean, std = raw.x_train.mean(axis=0), raw.x_train.std(axis=0)
    std[std == 0] = 1
    np.testing.assert_allclose(data.x_test, (raw.x_test - mean) / std, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(data.y_test, raw.y_test)


@pytest.mark.parametrize("rows", [7, 40, 101, 1797])
@pytest.mark.parametrize("sizes", [{"test_size": 0.1}, {"test_size": 0.25}, {"test_size": 1 / 3},
                                   {"test_size": 0.77}, {"train_size": 5}])
def test_the_split_cache_expects_as_many_kept_rows_as_scikit_learn_keeps(rows: int,
                                                                         sizes: dict) -> None:
    """The count a cached entry is checked against is the draw's own, at every rounding."""
    from hetsgd.data.splits import _draw, _kept_count

    y = np.arange(rows) % 2
    flags, _ = _draw(y, "binary", 0, sizes.get("test_size"), sizes.get("train_size"))
    assert int(flags.sum()) == _kept_count(rows, sizes.get("test_size"), sizes.get("train_size"))


def test_split_is_seeded_and_stratified() -> None:
    """``dataset.split_seed`` draws the split, whatever the run's seed; null leaves it to that."""
    a = load_dataset(cfg("digits", scale="none", split_seed=1), seed=1, progress=False)
    b = load_dataset(cfg("digits", scale="none", split_seed=1), seed=2, progress=False)
    c = load_dataset(cfg("digits", scale="none", split_seed=2), seed=1, progress=False)
    np.testing.assert_array_equal(a.x_test, b.x_test)  # another run seed, the same split
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.y_test, c.y_test)  # another split seed, another split
    for seed, same in ((1, a), (2, c)):  # null: the run's seed draws the split
        by_run = load_dataset(cfg("digits", scale="none", split_seed=None), seed=seed,
                              progress=False)
        np.testing.assert_array_equal(by_run.y_test, same.y_test)
    whole = np.bincount(np.concatenate([a.y_train, a.y_test])) * 0.2
    assert np.abs(np.bincount(a.y_test) - whole).max() <= 1
    assert "stratified" in a.source


def test_limit_is_a_stratified_subset_of_the_training_part() -> None:
    full = load_dataset(cfg("digits", scale="none"), seed=0, progress=False)
    small = load_dataset(cfg("digits", scale="none", limit=200), seed=0, progress=False)
    assert small.num_train == 200 and small.num_test == full.num_test
    assert np.abs(np.bincount(small.y_train, minlength=10) - 20).max() <= 1
    rows = {r.tobytes() for r in full.x_train}
    assert all(r.tobytes() in rows for r in small.x_train)


# what a process that loads digits prints: whether it imported scikit-learn, then its data
_LOAD_DIGITS = ("import sys; from hetsgd.config import DatasetConfig; "
                "from hetsgd.data import load_dataset; "
                "d = load_dataset(DatasetConfig(name='digits'), seed=3, progress=False); "
                "print('sklearn' in sys.modules, d.num_train, d.y_test.tobytes().hex(), "
                "float(d.x_train.sum()), d.source)")


@pytest.mark.integration
def test_a_second_load_of_digits_needs_no_scikit_learn(home: Path) -> None:
    """digits' arrays and its split are cached: a machine's second process loads the same data
    without importing scikit-learn (2 s of a short run's start)."""
    env = {**os.environ, "HETSGD_DATA": str(home)}
    first, second = (subprocess.run([sys.executable, "-c", _LOAD_DIGITS], env=env, text=True,
                                    capture_output=True, check=True).stdout.split(" ", 1)
                     for _ in range(2))
    assert (first[0], second[0]) == ("True", "False")
    assert first[1] == second[1]


def test_task_that_does_not_fit_the_source_is_rejected() -> None:
    with pytest.raises(UserError, match="digits is a multiclass dataset"):
        load_dataset(cfg("digits", task="binary"), seed=0, progress=False)
    with pytest.raises(UserError, match="dataset.path is not used by the digits source"):
        load_dataset(cfg("digits", path="/tmp/x"), seed=0, progress=False)


# --------------------------------------------------------------------------------------------
# LIBSVM files
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [("-1", "+1"), ("0", "1"), ("1", "2")])
def test_libsvm_binary_labels_become_zero_one(tmp_path: Path, values: tuple[str, str]) -> None:
    labels = [values[i % 2] for i in range(40)]
    path = write(tmp_path / "b.txt", libsvm_text(labels))
    data = load_dataset(cfg("libsvm", path=str(path), scale="none"), seed=0, progress=False)
    assert data.task == "binary" and data.num_outputs == 1 and data.num_features == 6
    assert data.y_train.dtype == np.float32 and set(np.unique(data.y_train)) == {0.0, 1.0}
    assert data.num_train + data.num_test == 40


def test_libsvm_multiclass_and_multilabel(tmp_path: Path) -> None:
    multi = write(tmp_path / "m.txt", libsvm_text(["3", "5", "9"] * 10))
    data = load_dataset(cfg("libsvm", path=str(multi)), seed=0, progress=False)
    assert data.task == "multiclass" and data.num_classes == 3
    assert set(np.unique(data.y_train)) == {0, 1, 2}
    tags = write(tmp_path / "t.txt", libsvm_text(["1,4", "4", "2,7,9", "1"] * 5))
    data = load_dataset(cfg("libsvm", path=str(tags)), seed=0, progress=False)
    assert data.task == "multilabel" and data.num_classes == 5
    assert data.y_train.shape == (data.num_train, 5) and data.y_train.dtype == np.float32
    assert set(data.y_train.sum(axis=1)) <= {1.0, 2.0, 3.0}
    # columns in the tags' sorted order 1, 2, 4, 7, 9 (in order of appearance: 1, 4, 2, 7, 9)
    np.testing.assert_array_equal(np.concatenate([data.y_train, data.y_test]).sum(axis=0),
                                  [10, 5, 10, 5, 5])


def test_libsvm_corrupt_line_is_named(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.txt", "1 1:2 3:4\n-1 2:1\n1 2:1 x:3\n-1 1:1\n")
    with pytest.raises(UserError, match=rf"{path}: line 3 is not valid LIBSVM"):
        load_dataset(cfg("libsvm", path=str(path)), seed=0, progress=False)


@pytest.mark.parametrize("value,problem", [
    ("1e39", "has a value past float32's range (±3.4e+38): 1:1e39"),
    ("nan", "has a value that is not a finite number: 1:nan")])
def test_a_libsvm_value_no_float32_holds_is_named_with_its_line(tmp_path: Path, value: str,
                                                                problem: str) -> None:
    """1e39 is finite as a Python float, infinite as the float32 scikit-learn reads it as."""
    path = write(tmp_path / "big.txt", libsvm_text(["-1", "+1"] * 10) + f"+1 1:{value} 2:1\n")
    with pytest.raises(UserError, match=re.escape(
            f"{path}: line 21 {problem} ('+1 1:{value} 2:1')")):
        load_dataset(cfg("libsvm", path=str(path)), seed=0, progress=False)


@pytest.mark.parametrize("empty", ["train", "test"])
def test_a_libsvm_file_of_no_examples_is_refused_before_training(tmp_path: Path,
                                                                  empty: str) -> None:
    """An empty test file would fail only at the first evaluation, after training."""
    files = {part: write(tmp_path / f"{part}.txt", "" if part == empty else
                         libsvm_text(["-1", "+1"] * 10)) for part in ("train", "test")}
    with pytest.raises(UserError, match=f"^{files[empty]} holds no examples$"):
        load_dataset(FilesConfig(path=str(files["train"]), test_path=str(files["test"]),
                                 format="libsvm"), seed=0, progress=False)


def test_a_libsvm_test_file_of_labels_alone_leaves_the_training_files_columns(
        tmp_path: Path) -> None:
    """Its missing indices say nothing of the base: the training file's 1-based ones still are."""
    train = write(tmp_path / "train.txt", "1 1:1 2:1\n0 2:2\n" * 5)
    test = write(tmp_path / "test.txt", "1\n0\n")
    data = load_dataset(FilesConfig(path=str(train), test_path=str(test), format="libsvm",
                                    scale="none"), seed=0, progress=False)
    assert data.num_features == 2
    np.testing.assert_array_equal(data.x_train[:2], [[1, 1], [0, 2]])
    assert not data.x_test.any()


def test_a_test_file_labelled_otherwise_than_its_training_file_is_refused(tmp_path: Path) -> None:
    """{-1, +1} for training and {0, 1} for test read as three classes, one never trained."""
    train = write(tmp_path / "train.txt", libsvm_text(["-1", "+1"] * 10))
    test = write(tmp_path / "test.txt", libsvm_text(["0", "1"] * 5))
    with pytest.raises(UserError, match=re.escape(
            f"{train} and {test}: the test part holds label 0.0 (1 such value(s)), which the "
            "training part does not")):
        load_dataset(FilesConfig(path=str(train), test_path=str(test), format="libsvm"),
                     seed=0, progress=False)
    names = pd.DataFrame({"f": range(20), "label": ["cat", "dog"] * 10})
    names.to_csv(tmp_path / "train.csv", index=False)
    names.assign(label=["cat", "dog", "cow", "cat"] * 5).to_csv(tmp_path / "test.csv", index=False)
    with pytest.raises(UserError, match="the test part holds label 'cow' .1 such value.s..,"):
        load_dataset(FilesConfig(path=str(tmp_path / "train.csv"),
                                 test_path=str(tmp_path / "test.csv")), seed=0, progress=False)


def test_libsvm_path_is_required_and_must_exist() -> None:
    with pytest.raises(UserError, match="needs dataset.path"):
        load_dataset(cfg("libsvm"), seed=0, progress=False)
    with pytest.raises(UserError, match="^dataset file not found: /no/such/file$"):
        load_dataset(cfg("libsvm", path="/no/such/file"), seed=0, progress=False)


def test_regression_labels_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "r.txt", libsvm_text(["0.5", "1.25", "2"] * 4))
    with pytest.raises(UserError, match="non-integer labels"):
        load_dataset(cfg("libsvm", path=str(path)), seed=0, progress=False)


@pytest.mark.parametrize("suffix", [".xz", ".bz2", ".gz"])
def test_compressed_files_load_identically(tmp_path: Path, suffix: str) -> None:
    text = libsvm_text(["-1", "1"] * 20, seed=3)
    plain = load_dataset(cfg("libsvm", path=str(write(tmp_path / "f.txt", text))), seed=0,
                         progress=False)
    packed = load_dataset(cfg("libsvm", path=str(write(tmp_path / f"f.txt{suffix}", text))),
                          seed=0, progress=False)
    np.testing.assert_array_equal(plain.x_train, packed.x_train)
    np.testing.assert_array_equal(plain.y_test, packed.y_test)


def test_second_load_reads_the_parsed_cache(tmp_path: Path, home: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "f.txt", libsvm_text(["-1", "1"] * 20))
    first = load_dataset(cfg("libsvm", path=str(path)), seed=0, progress=False)
    entry, = (home / "parsed").glob("libsvm-*")
    assert sorted(p.name for p in entry.iterdir()) == ["meta.json", "x_train.npy", "y_train.npy"]

    def no_parse(*args: object, **kwargs: object) -> None:
        raise AssertionError("parsed again")

    monkeypatch.setattr(libsvm, "read_libsvm", no_parse)
    second = load_dataset(cfg("libsvm", path=str(path)), seed=0, progress=False)
    np.testing.assert_array_equal(first.x_train, second.x_train)
    path.write_text(libsvm_text(["-1", "1"] * 21))  # a changed file is parsed again
    with pytest.raises(AssertionError, match="parsed again"):
        load_dataset(cfg("libsvm", path=str(path)), seed=0, progress=False)
    # rewritten in place with its size and modification time set back: parsed again too
    before = path.stat()
    path.write_text(libsvm_text(["1", "-1"] * 21))
    assert path.stat().st_size == before.st_size
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(AssertionError, match="parsed again"):
        load_dataset(cfg("libsvm", path=str(path)), seed=0, progress=False)


def test_sparse_set_stays_sparse_and_test_file_is_widened(home: Path) -> None:
    """rcv1: the published test file may use fewer feature indices than the train file; both
    get the published width. A decompressed copy of the published .bz2 is accepted."""
    write(home / "rcv1_train.binary", "1 1:1 9:2\n-1 3:1\n" * 10)
    write(home / "rcv1_test.binary.gz", "1 2:1\n-1 1:1\n" * 3)
    data = load_dataset(cfg("rcv1"), seed=0, progress=False)
    assert data.is_sparse and isinstance(data.x_train, sp.csr_matrix)
    assert data.x_train.dtype == np.float32
    assert data.num_features == data.x_test.shape[1] == 47236
    assert (data.num_train, data.num_test) == (20, 6)
    assert data.scaling == "none" and data.x_train.max() == 2.0  # loaded as published


# Raw values on purpose: a loader that scaled them would change them.
PUBLISHED = np.array([[0.0, 3.0, 0.0, -2.0, 0.5], [1.0, 0.0, 7.0, 0.0, 0.25],
                      [0.0, 0.0, 0.0, 4.0, 1.0], [2.0, 5.0, 0.0, 0.0, 0.0]], dtype=np.float32)


def published_text(rows: np.ndarray, labels: list[int]) -> str:
    return "".join(f"{label}" + "".join(f" {j + 1}:{v:g}" for j, v in enumerate(row) if v) + "\n"
                   for label, row in zip(labels, rows, strict=True))


def sorted_rows(x: np.ndarray) -> np.ndarray:
    return x[np.lexsort(x.T[::-1])]


def test_libsvm_file_loads_as_published_by_default(tmp_path: Path) -> None:
    rows = np.tile(PUBLISHED, (10, 1))
    path = write(tmp_path / "f.txt", published_text(rows, [0, 1] * 20))
    data = load_dataset(cfg("libsvm", path=str(path)), seed=0, progress=False)
    assert DatasetConfig(name="libsvm").scale == "auto" and data.scaling == "none"
    assert not data.is_sparse and data.x_train.dtype == np.float32
    both = np.concatenate([data.x_train, data.x_test])
    np.testing.assert_array_equal(sorted_rows(both), sorted_rows(rows))


def test_libsvm_set_loads_as_published_sparse_and_in_file_order(home: Path) -> None:
    write(home / "rcv1_train.binary", published_text(np.tile(PUBLISHED, (3, 1)), [1, -1] * 6))
    write(home / "rcv1_test.binary", published_text(PUBLISHED[:2], [1, -1]))
    data = load_dataset(cfg("rcv1"), seed=0, progress=False)
    assert data.scaling == "none" and isinstance(data.x_train, sp.csr_matrix)
    np.testing.assert_array_equal(data.x_train[:, :5].toarray(), np.tile(PUBLISHED, (3, 1)))
    np.testing.assert_array_equal(data.x_test[:, :5].toarray(), PUBLISHED[:2])
    assert data.x_train.nnz == 3 * np.count_nonzero(PUBLISHED)
    # +1 is the positive class: 1, not 0
    np.testing.assert_array_equal(data.y_train, [1.0, 0.0] * 6)
    np.testing.assert_array_equal(data.y_test, [1.0, 0.0])


def test_standard_still_scales_dense_to_unit_variance_and_sparse_by_max_abs(
        tmp_path: Path, home: Path) -> None:
    rng = np.random.default_rng(0)
    rows = np.round(rng.uniform(-3, 9, (60, 5)) * (rng.random((60, 5)) < 0.6), 2)
    path = write(tmp_path / "f.txt", published_text(rows, [0, 1] * 30))
    dense = load_dataset(cfg("libsvm", path=str(path), scale="standard"), seed=0, progress=False)
    raw = load_dataset(cfg("libsvm", path=str(path), scale="none"), seed=0, progress=False)
    assert dense.scaling == "standard" and dense.x_train.dtype == np.float32
    np.testing.assert_allclose(dense.x_train.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(dense.x_train.std(axis=0), 1, rtol=1e-4)
    mean, std = raw.x_train.mean(axis=0), raw.x_train.std(axis=0)  # training statistics only
    np.testing.assert_allclose(dense.x_test, (raw.x_test - mean) / std, rtol=1e-4, atol=1e-4)

    write(home / "rcv1_train.binary", published_text(rows, [1, -1] * 30))
    sparse = load_dataset(cfg("rcv1", scale="standard"), seed=0, progress=False)
    unscaled = load_dataset(cfg("rcv1", scale="none"), seed=0, progress=False)
    assert sparse.scaling == "maxabs" and isinstance(sparse.x_train, sp.csr_matrix)
    assert isinstance(sparse.x_test, sp.csr_matrix) and sparse.x_train.dtype == np.float32
    assert sparse.x_train.nnz == unscaled.x_train.nnz  # never densified, zeros stay zeros
    col_max = abs(unscaled.x_train).max(axis=0).toarray().ravel()
    col_max[col_max == 0] = 1
    np.testing.assert_allclose(sparse.x_train.toarray(), unscaled.x_train.toarray() / col_max,
                               rtol=1e-6)
    np.testing.assert_allclose(sparse.x_test.toarray(), unscaled.x_test.toarray() / col_max,
                               rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int64, np.float32])
def test_maxabs_divides_by_a_signed_minimums_magnitude(tmp_path: Path, dtype: type) -> None:
    """abs(-128) is -128 in int8 (any signed minimum wraps in its own type): the divisor was the
    next largest value, and the scaled features fell outside [-1, 1]."""
    low = np.iinfo(dtype).min if np.issubdtype(dtype, np.integer) else -128
    x = np.array([[low, 1], [low // 2, 2], [-5, 3], [7, 4]] * 3, dtype=dtype)
    np.savez(tmp_path / "train.npz", X=x, y=np.array([0, 1] * 6))
    np.savez(tmp_path / "test.npz", X=x[:4], y=np.array([0, 1] * 2))
    data = load_dataset(FilesConfig(path=str(tmp_path / "train.npz"), scale="maxabs",
                                    test_path=str(tmp_path / "test.npz")), seed=0, progress=False)
    np.testing.assert_array_equal(data.x_train[:4], [[-1, 0.25], [-0.5, 0.5],
                                                     [-5 / -float(low), 0.75], [7 / -float(low), 1]])
    np.testing.assert_array_equal(data.x_test, data.x_train[:4])


LIBSVM_AS_PUBLISHED = {"libsvm", "w8a", "real_sim", "rcv1", "news20"}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_auto_scale_resolves_per_source(name: str) -> None:
    """LIBSVM files are published scaled; covtype_binary's holds raw quantities (as covtype)."""
    source = get_source(name)
    expected = "none" if name in LIBSVM_AS_PUBLISHED else "standard"
    assert resolve_scale("auto", source) == source.default_scale == expected
    for explicit in (s for s in SCALINGS if s != "auto"):
        assert resolve_scale(explicit, source) == explicit


def test_every_libsvm_format_source_is_covered() -> None:
    libsvm_format = {s.name for s in SOURCES.values()
                     if isinstance(s, libsvm.LibsvmFile | libsvm.LibsvmSet)}
    assert libsvm_format == LIBSVM_AS_PUBLISHED | {"covtype_binary"}


@pytest.mark.skipif(not W8A.exists(), reason=f"the real w8a file is absent ({W8A}; set HETSGD_W8A)")
def test_w8a_from_the_shared_file(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """w8a alone in the cache: a test part is split off it, as its source says, and nothing
    is downloaded (the mirror is a closed port: a try would warn)."""
    home.mkdir()
    shutil.copy(W8A, home / W8A_NAME)
    assert source_info("w8a").cached
    data = load_dataset(cfg("w8a", scale="none"), seed=0, progress=False)
    assert data.num_train + data.num_test == 49749 and data.num_features == 300
    assert data.task == "binary" and not data.is_sparse
    assert set(np.unique(data.x_train)) == {0.0, 1.0}
    assert "no w8a.t beside it" in data.source and "split" in data.source
    assert "could not be downloaded" not in capsys.readouterr().err


def test_a_tampered_cached_file_fails_its_checksum_in_a_load_and_in_a_fetch(home: Path) -> None:
    """`hetsgd data fetch` says it verifies checksums: a copy already cached is checked too, and
    fails as a load does, in one line, exit status 1."""
    write(home / "w8a.bz2", libsvm_text(["-1", "1"] * 10))
    with pytest.raises(UserError, match="checksum mismatch: .*w8a.bz2 does not hold the "
                                        "published w8a .*; delete it and fetch again$") as loaded:
        load_dataset(cfg("w8a"), seed=0, progress=False)
    done = CliRunner().invoke(app, ["data", "fetch", "w8a"])
    assert done.exit_code == 1
    assert done.stderr.splitlines() == [f"hetsgd: error: {loaded.value}"]


# --------------------------------------------------------------------------------------------
# downloads (127.0.0.1 only)
# --------------------------------------------------------------------------------------------


def test_download_checks_the_known_checksum(server: tuple[str, Path], home: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    base, root = server
    monkeypatch.delenv("HETSGD_DATA_MIRROR")
    payload = b"1 1:1\n-1 2:1\n"
    (root / "good.txt").write_bytes(payload)
    sha = hashlib.sha256(payload).hexdigest()
    path = download(RemoteFile("good.txt", f"{base}/good.txt", sha), "good", progress=False)
    assert path == home / "good.txt" and path.read_bytes() == payload
    md5 = "md5:" + hashlib.md5(payload).hexdigest()
    assert download(RemoteFile("good.txt", f"{base}/good.txt", md5), "good", False) == path
    with pytest.raises(UserError, match="checksum mismatch for .*/good.txt"):
        download(RemoteFile("bad.txt", f"{base}/good.txt", "0" * 64), "bad", progress=False)
    assert not (home / "bad.txt").exists()


def test_a_file_is_trusted_once_it_has_parsed_then_checked(server: tuple[str, Path], home: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    base, root = server
    monkeypatch.setenv("HETSGD_DATA_MIRROR", base)
    write(root / "real-sim.bz2", libsvm_text(["-1", "1"] * 20))
    tofu = home / "real-sim.bz2.sha256"
    assert not source_info("real_sim").cached
    assert fetch("real_sim", progress=False) == [home / "real-sim.bz2"]
    assert source_info("real_sim").cached and not tofu.exists()  # downloaded, not yet used
    data = load_dataset(cfg("real_sim"), seed=0, progress=False)
    assert data.num_train + data.num_test == 40 and data.is_sparse
    recorded = tofu.read_text().split()[0]
    assert recorded == hashlib.sha256((home / "real-sim.bz2").read_bytes()).hexdigest()
    write(home / "real-sim.bz2", libsvm_text(["-1", "1"] * 20, seed=9))
    with pytest.raises(UserError, match=re.escape(f"recorded in {tofu}); delete it and {tofu}, "
                                                  "and it is fetched again")):
        load_dataset(cfg("real_sim"), seed=0, progress=False)
    (home / "real-sim.bz2").unlink()  # a new download must match the first one too
    write(root / "real-sim.bz2", libsvm_text(["-1", "1"] * 20, seed=9))
    with pytest.raises(UserError, match=f"checksum mismatch for .*real-sim.bz2: .* delete "
                                        f"{re.escape(str(tofu))} and fetch it again$"):
        fetch("real_sim", progress=False)
    tofu.unlink()  # as the message says: the new file is downloaded, and trusted once it parses
    assert fetch("real_sim", progress=False) == [home / "real-sim.bz2"]


@pytest.mark.parametrize("served,refused", [
    (b"<!DOCTYPE html><html><body>Please log in</body></html>", "the server sent a web page"),
    (bz2.compress(libsvm_text(["-1", "1"] * 400).encode())[:300], r"cannot read \S*real-sim\.bz2")])
def test_a_download_that_is_no_data_file_is_never_trusted(
        server: tuple[str, Path], home: Path, monkeypatch: pytest.MonkeyPatch, served: bytes,
        refused: str) -> None:
    """A web page served with status 200 (a captive portal's) is refused at once; a body cut
    short fails to parse. Neither records its checksum, which would refuse the real file later."""
    base, root = server
    monkeypatch.setenv("HETSGD_DATA_MIRROR", base)
    (root / "real-sim.bz2").write_bytes(served)
    with pytest.raises(UserError, match=refused):
        load_dataset(cfg("real_sim"), seed=0, progress=False)
    assert not (home / "real-sim.bz2.sha256").exists()
    (home / "real-sim.bz2").unlink(missing_ok=True)
    write(root / "real-sim.bz2", libsvm_text(["-1", "1"] * 20))
    assert load_dataset(cfg("real_sim"), seed=0, progress=False).num_features == 20958


def test_a_recorded_checksum_of_an_unknown_hash_names_its_file(home: Path) -> None:
    write(home / "real-sim.bz2", libsvm_text(["-1", "1"] * 20))
    (home / "real-sim.bz2.sha256").write_text("md6:abc\n")
    with pytest.raises(UserError, match=re.escape(
            f"{home / 'real-sim.bz2.sha256'} holds no checksum hetsgd can compute (md6 is no hash "
            "it knows): delete it, and the next use records one")):
        load_dataset(cfg("real_sim"), seed=0, progress=False)


def test_a_published_test_file_comes_with_its_train_file_and_a_cached_set_stays_offline(
        server: tuple[str, Path], home: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A run that downloads the train file downloads the test file with it; one whose train
    file is cached takes what the cache holds (a split where the test file is not there, said
    in its source) without reaching for the network."""
    base, root = server
    monkeypatch.setenv("HETSGD_DATA_MIRROR", base)
    write(root / "rcv1_train.binary.bz2", "1 1:1 9:2\n-1 3:1\n" * 10)
    write(root / "rcv1_test.binary.bz2", "1 2:1\n-1 1:1\n" * 3)
    data = load_dataset(cfg("rcv1"), seed=0, progress=False)
    assert (data.num_train, data.num_test) == (20, 6)
    assert data.source.endswith(f" + {home / 'rcv1_test.binary.bz2'}")
    (home / "rcv1_test.binary.bz2").unlink()
    monkeypatch.setenv("HETSGD_DATA_MIRROR", f"http://127.0.0.1:{closed_port()}")
    capsys.readouterr()
    data = load_dataset(cfg("rcv1"), seed=0, progress=False)
    assert (data.num_train, data.num_test) == (16, 4)
    assert "; no rcv1_test.binary.bz2 beside it; test: stratified 0.2 split" in data.source
    assert "could not be downloaded" not in capsys.readouterr().err


def test_a_test_file_that_cannot_be_downloaded_is_named_and_the_split_said(
        server: tuple[str, Path], home: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The run that downloads the train file but cannot get the test file warns, naming it, and
    splits, as the next run (the train file cached) does; `hetsgd data fetch` fails on it."""
    base, root = server
    monkeypatch.setenv("HETSGD_DATA_MIRROR", base)
    write(root / "rcv1_train.binary.bz2", "1 1:1 9:2\n-1 3:1\n" * 10)
    failed = (f"rcv1's rcv1_test.binary.bz2 is not in the cache and could not be downloaded from "
              f"{base}/rcv1_test.binary.bz2 (HTTPError): put the file at "
              f"{home / 'rcv1_test.binary.bz2'}")
    for first in (True, False):
        data = load_dataset(cfg("rcv1"), seed=0, progress=False)
        assert (data.num_train, data.num_test) == (16, 4) and "split" in data.source
        warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith(failed)]
        assert warned == ([failed + " (or the same content as rcv1_test.binary, rcv1_test.binary.xz "
                           "or rcv1_test.binary.gz); until then, the test part is split off "
                           "rcv1_train.binary.bz2, not the published one"] if first else [])
    with pytest.raises(UserError, match=f"^{re.escape(failed)} "):
        fetch("rcv1", progress=False)


def test_offline_error_names_url_and_path(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("HETSGD_DATA_MIRROR", base)
    with pytest.raises(UserError) as caught:
        load_dataset(cfg("w8a"), seed=0, progress=False)
    message = str(caught.value)
    assert message.startswith(
        f"w8a is not in the cache and could not be downloaded from {base}/w8a ")
    assert f"put the file at {home / 'w8a'} (or a .xz/.bz2/.gz of it)" in message
    assert "\n" not in message


def test_load_downloads_through_the_mirror(server: tuple[str, Path],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    base, root = server
    monkeypatch.setenv("HETSGD_DATA_MIRROR", base)
    rows = [",".join([str((i * j) % 7) for j in range(54)] + [str(1 + i % 7)]) for i in range(35)]
    write(root / "covtype.data.gz", "\n".join(rows) + "\n")
    data = load_dataset(cfg("covtype", scale="none"), seed=0, progress=False)
    assert data.num_features == 54 and data.num_classes == 7
    assert set(np.unique(data.y_train)) == set(range(7))


@pytest.mark.parametrize("row,column,cell,said", [(2, 4, "", "column 5 is nan"),
                                                  (1, 54, "inf", "the class is inf")])
def test_a_covtype_cell_that_is_no_finite_number_is_named(tmp_path: Path, row: int, column: int,
                                                          cell: str, said: str) -> None:
    """An empty cell reads as NaN, which standard scaling would spread through its column."""
    rows = [[str((i * j) % 7) for j in range(54)] + [str(1 + i % 7)] for i in range(35)]
    rows[row][column] = cell
    path = write(tmp_path / "covtype.data", "\n".join(map(",".join, rows)) + "\n")
    with pytest.raises(UserError, match=f"^{path}: line {row + 1}, {said}, not a finite number$"):
        load_dataset(cfg("covtype", path=str(path)), seed=0, progress=False)


# --------------------------------------------------------------------------------------------
# other sources
# --------------------------------------------------------------------------------------------


def test_synthetic_is_seeded_and_labelled() -> None:
    config = cfg("synthetic", n_samples=500, n_features=7, n_classes=3)
    a = load_dataset(config, seed=4, progress=False)
    b = load_dataset(config, seed=4, progress=False)
    assert a.synthetic and "synthetic" in a.source
    assert (a.num_train + a.num_test, a.num_features, a.num_classes) == (500, 7, 3)
    assert set(np.unique(a.y_train)) == {0, 1, 2}
    np.testing.assert_array_equal(a.x_train, b.x_train)

    def values(seed: int) -> np.ndarray:  # the set's first feature, whatever the split
        data = load_dataset(cfg("synthetic", n_samples=500, n_features=7, n_classes=3,
                                split_seed=seed, scale="none"), seed=0, progress=False)
        return np.sort(np.concatenate([data.x_train, data.x_test])[:, 0])

    assert not np.array_equal(values(0), values(5))  # another seed draws another set
    binary = load_dataset(cfg("synthetic", n_samples=100, n_features=3), seed=0, progress=False)
    assert binary.task == "binary" and binary.y_train.dtype == np.float32


def idx(array: np.ndarray) -> bytes:
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + \
        array.astype(np.uint8).tobytes()


def test_fashion_mnist_idx_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    debian = tmp_path / "debian"
    for prefix, n in (("train", 30), ("t10k", 10)):
        write(debian / f"{prefix}-images-idx3-ubyte.gz",
              idx(rng.integers(0, 256, (n, 28, 28))))
        write(debian / f"{prefix}-labels-idx1-ubyte.gz", idx(np.arange(n) % 10))
    monkeypatch.setattr(images, "DEBIAN_FASHION_DIR", debian)
    assert source_info("fashion_mnist").cached
    data = load_dataset(cfg("fashion_mnist"), seed=0, progress=False)
    assert data.image_shape == (1, 28, 28) and data.num_features == 784
    assert (data.num_train, data.num_test, data.num_classes) == (30, 10, 10)
    assert abs(float(data.x_train.mean())) < 1e-4 and abs(float(data.x_train.std()) - 1) < 1e-3
    by_path = load_dataset(cfg("fashion_mnist", path=str(debian), scale="none"), seed=0,
                           progress=False)
    assert by_path.x_train.max() > 1  # raw 0..255
    write(tmp_path / "junk.gz", b"not an idx file")
    with pytest.raises(UserError, match="not an IDX file"):
        read_idx(tmp_path / "junk.gz")
    # four dimensions of 65536: 2**64 bytes, which numpy's int64 product makes 0, as the body
    write(tmp_path / "huge.gz", bytes([0, 0, 0x08, 4]) + struct.pack(">4I", *[65536] * 4))
    with pytest.raises(UserError, match=r"the IDX header says \(65536, 65536, 65536, 65536\) "
                                        "but the file holds 0 bytes"):
        read_idx(tmp_path / "huge.gz")


def _cifar_tarball(tar_path: Path, test_labels: list[int]) -> Path:
    rng = np.random.default_rng(0)
    with tarfile.open(tar_path, "w:gz") as tar:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            batch = {b"data": rng.integers(0, 256, (4, 3072)).astype(np.uint8),
                     b"labels": test_labels if name == "test_batch" else [0, 1, 2, 9]}
            raw = pickle.dumps(batch, protocol=2)
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return tar_path


def test_cifar10_tarball(tmp_path: Path) -> None:
    tar_path = _cifar_tarball(tmp_path / "cifar.tar.gz", [0, 1, 2, 9])
    data = load_dataset(cfg("cifar10", path=str(tar_path)), seed=0, progress=False)
    raw_data = load_dataset(cfg("cifar10", path=str(tar_path), scale="none"), seed=0,
                            progress=False)
    assert data.image_shape == (3, 32, 32) and (data.num_train, data.num_test) == (20, 4)
    for channel in range(3):
        pixel = raw_data.x_train[0, channel * 1024]
        expected = (pixel / 255 - CIFAR_MEAN[channel]) / CIFAR_STD[channel]
        assert data.x_train[0, channel * 1024] == pytest.approx(expected, rel=1e-5)


def test_delicious_text_format_with_split_files(home: Path) -> None:
    lines = ["8 5 4"] + [f"{i % 4},{(i + 1) % 4} 0:1 {1 + i % 4}:0.5" for i in range(8)]
    write(home / "Delicious_data.txt", "\n".join(lines) + "\n")
    write(home / "delicious_trSplit.txt", "1 2\n2 3\n3 4\n4 5\n5 6\n6 1\n")
    write(home / "delicious_tstSplit.txt", "7 7\n8 8\n")
    data = load_dataset(cfg("delicious", scale="none"), seed=0, progress=False)
    assert data.task == "multilabel" and data.num_classes == 4
    assert (data.num_train, data.num_test, data.num_features) == (6, 2, 5)
    np.testing.assert_array_equal(data.y_test, [[0, 0, 1, 1], [1, 0, 0, 1]])
    # the train split is the first column (rows 1-6 in order), not the second (2-6, then 1)
    np.testing.assert_array_equal(data.y_train, [[1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1],
                                                 [1, 0, 0, 1], [1, 1, 0, 0], [0, 1, 1, 0]])


@pytest.mark.parametrize("labels,bad", [([0, 1, 57, 9], 57), ([0, -3, 2, 9], -3)])
def test_a_cifar10_label_outside_its_ten_classes_is_named(tmp_path: Path, labels: list[int],
                                                          bad: int) -> None:
    tar_path = _cifar_tarball(tmp_path / "cifar.tar.gz", labels)
    with pytest.raises(UserError, match=f"^{tar_path}: a CIFAR-10 label is {bad}, not one of"):
        load_dataset(cfg("cifar10", path=str(tar_path)), seed=0, progress=False)


@pytest.mark.parametrize("test_split,error", [
    ("", "delicious_tstSplit.txt names no example"),
    ("6 6\n8 8\n", r"delicious_tstSplit.txt names example 6 \(1 in all\) that "
                    ".*delicious_trSplit.txt names too"),
])
def test_a_delicious_test_split_that_is_empty_or_trained_on_is_refused(
        home: Path, test_split: str, error: str) -> None:
    lines = ["8 5 4"] + [f"{i % 4},{(i + 1) % 4} 0:1 {1 + i % 4}:0.5" for i in range(8)]
    write(home / "Delicious_data.txt", "\n".join(lines) + "\n")
    write(home / "delicious_trSplit.txt", "1 2\n2 3\n3 4\n4 5\n5 6\n6 1\n")
    write(home / "delicious_tstSplit.txt", test_split)
    with pytest.raises(UserError, match=error):
        load_dataset(cfg("delicious", scale="none"), seed=0, progress=False)


def test_delicious_missing_names_the_repository_and_path(home: Path) -> None:
    with pytest.raises(UserError, match=r"Extreme Classification Repository.*Delicious_data.txt"):
        fetch("delicious", progress=False)
    assert str(home) in source_info("delicious").files[0].as_posix()


def test_registry_lists_every_source() -> None:
    names = {info.name for info in list_sources()}
    assert names >= {"digits", "libsvm", "w8a", "real_sim", "covtype_binary", "rcv1", "news20",
                     "covtype", "fashion_mnist", "cifar10", "synthetic", "delicious"}
    assert fetch("digits", progress=False) == []
    with pytest.raises(UserError, match="unknown dataset 'nope'; known: digits"):
        source_info("nope")


def test_data_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert data_home() == home
    monkeypatch.delenv("HETSGD_DATA")
    assert data_home() == Path.home() / ".cache" / "hetsgd"
