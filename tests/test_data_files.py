"""The user's own data: ``dataset=files`` (npz, npy, CSV, Parquet, LIBSVM) and ``dataset=folder``.

Digits, the embedded set, has no published test split, so ``dataset=digits`` and the same arrays
written to a file both get their test part from the one seeded stratified split in
:mod:`hetsgd.data.prepare`: every prepared array must be exactly the same.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import compose_config

from hetsgd.config import DatasetConfig, to_run_config
from hetsgd.config.problem import FilesConfig, FolderConfig
from hetsgd.data import load_dataset
from hetsgd.data.dataset import Dataset
from hetsgd.errors import UserError
from hetsgd.runs import runner

COLUMNS = [f"p{i}" for i in range(64)]


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HETSGD_DATA", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits; imported here, not at collection (1 s of every test process)."""
    from sklearn.datasets import load_digits

    return load_digits(return_X_y=True)


def table(x: np.ndarray, y: np.ndarray | list) -> pd.DataFrame:
    frame = pd.DataFrame(x, columns=COLUMNS[:x.shape[1]])
    frame["label"] = y
    return frame


def write_digits(directory: Path, fmt: str, x: np.ndarray, y: np.ndarray) -> FilesConfig:
    """The digits written in ``fmt``; the config that reads them."""
    if fmt == "npz":
        np.savez(directory / "d.npz", X=x, y=y)
        return FilesConfig(path=str(directory / "d.npz"))
    if fmt == "npy":
        np.save(directory / "x.npy", x)
        np.save(directory / "y.npy", y)
        return FilesConfig(path=str(directory / "x.npy"), labels_path=str(directory / "y.npy"))
    if fmt == "csv":
        table(x, y).to_csv(directory / "d.csv", index=False)
        return FilesConfig(path=str(directory / "d.csv"))
    table(x, y).to_parquet(directory / "d.parquet")
    return FilesConfig(path=str(directory / "d.parquet"))


def assert_same(got: Dataset, want: Dataset) -> None:
    for key in ("x_train", "y_train", "x_test", "y_test"):
        np.testing.assert_array_equal(getattr(got, key), getattr(want, key), err_msg=key)
    assert (got.task, got.num_classes, got.scaling) == (want.task, want.num_classes, want.scaling)


@pytest.mark.parametrize("fmt", ["npz", "npy", "csv", "parquet"])
def test_each_format_prepares_exactly_what_dataset_digits_does(
        tmp_path: Path, digits: tuple[np.ndarray, np.ndarray], fmt: str) -> None:
    cfg = write_digits(tmp_path, fmt, *digits)
    want = load_dataset(DatasetConfig(name="digits"), seed=5, progress=False)
    assert_same(load_dataset(cfg, seed=5, progress=False), want)
    if fmt == "csv":  # the second load reads the parsed cache
        assert_same(load_dataset(cfg, seed=5, progress=False), want)


def test_a_relative_path_is_read_from_the_current_directory(
        tmp_path: Path, digits: tuple[np.ndarray, np.ndarray],
        monkeypatch: pytest.MonkeyPatch) -> None:
    write_digits(tmp_path, "npz", *digits)
    monkeypatch.chdir(tmp_path)
    assert load_dataset(FilesConfig(path="d.npz"), seed=0, progress=False).num_features == 64


def test_a_libsvm_file_is_read_as_dataset_libsvm_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "small.svm"
    path.write_text("".join(f"{1 if i % 2 else -1} 1:{i} 3:0.5\n" for i in range(20)))
    got = load_dataset(FilesConfig(path=str(path)), seed=0, progress=False)
    want = load_dataset(DatasetConfig(name="libsvm", path=str(path)), seed=0, progress=False)
    assert got.scaling == "none"
    assert_same(got, want)


def test_text_labels_are_numbered_in_sorted_order_and_named(tmp_path: Path) -> None:
    names = ["zebra", "ant", "moth"]
    x = np.arange(60, dtype=np.float32).reshape(30, 2)
    table(x, [names[i % 3] for i in range(30)]).to_csv(tmp_path / "t.csv", index=False)
    data = load_dataset(FilesConfig(path=str(tmp_path / "t.csv"), scale="none"), seed=0,
                        progress=False)
    assert data.class_names == ("ant", "moth", "zebra") and data.task == "multiclass"
    label_of = {"ant": 0, "moth": 1, "zebra": 2}
    train_and_test = np.concatenate([data.x_train, data.x_test])
    labels = np.concatenate([data.y_train, data.y_test])
    for row, label in zip(train_and_test, labels):
        assert label == label_of[names[int(row[0]) // 2 % 3]]


def test_two_text_labels_make_a_binary_set(tmp_path: Path) -> None:
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    table(x, ["yes", "no"] * 5).to_parquet(tmp_path / "b.parquet")
    data = load_dataset(FilesConfig(path=str(tmp_path / "b.parquet")), seed=0, progress=False)
    assert data.task == "binary" and data.class_names == ("no", "yes")
    assert data.y_train.dtype == np.float32


@pytest.mark.parametrize("fmt", ["csv", "npy"])
def test_the_test_file_is_the_test_part(tmp_path: Path, digits: tuple[np.ndarray, np.ndarray],
                                        fmt: str) -> None:
    x, y = digits
    (tmp_path / "train").mkdir()
    (tmp_path / "test").mkdir()
    train = write_digits(tmp_path / "train", fmt, x[:1500], y[:1500])
    test = write_digits(tmp_path / "test", fmt, x[1500:], y[1500:])
    cfg = FilesConfig(path=train.path, labels_path=train.labels_path, test_path=test.path,
                      test_labels_path=test.labels_path, scale="none")
    data = load_dataset(cfg, seed=0, progress=False)
    np.testing.assert_array_equal(data.x_train, x[:1500].astype(np.float32))
    np.testing.assert_array_equal(data.x_test, x[1500:].astype(np.float32))
    np.testing.assert_array_equal(data.y_test, y[1500:])
    assert "split" not in data.source


def test_a_test_table_with_its_columns_in_another_order_is_read_by_name(tmp_path: Path) -> None:
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    table(x, [0, 1] * 10).to_csv(tmp_path / "train.csv", index=False)
    table(x[:4], [0, 1] * 2)[["label", "p1", "p0"]].to_csv(tmp_path / "test.csv", index=False)
    data = load_dataset(FilesConfig(path=str(tmp_path / "train.csv"), scale="none",
                                    test_path=str(tmp_path / "test.csv")), seed=0, progress=False)
    np.testing.assert_array_equal(data.x_test, x[:4])


# --------------------------------------------------------------------------------------------
# errors: one line each, naming the file (and row and column)
# --------------------------------------------------------------------------------------------


def load_error(cfg: DatasetConfig) -> str:
    with pytest.raises(UserError) as caught:
        load_dataset(cfg, seed=0, progress=False)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_cell_that_is_not_a_number_is_named(tmp_path: Path) -> None:
    frame = table(np.ones((10, 3)), [0, 1] * 5)
    frame["p1"] = frame["p1"].astype(object)
    frame.loc[6, "p1"] = "seven"
    frame.to_csv(tmp_path / "bad.csv", index=False)
    assert load_error(FilesConfig(path=str(tmp_path / "bad.csv"))).startswith(
        f"{tmp_path / 'bad.csv'}: row 7, column 'p1' holds 'seven', not a number")


def test_a_missing_label_column_lists_the_columns(tmp_path: Path) -> None:
    table(np.ones((10, 2)), [0, 1] * 5).to_csv(tmp_path / "t.csv", index=False)
    assert load_error(FilesConfig(path=str(tmp_path / "t.csv"), label="class")) == (
        f"{tmp_path / 't.csv'} has no column 'class' (dataset.label); its columns: p0, p1, label")


@pytest.mark.parametrize("header", ["p0,label,label", "\ufeffp0,p0,label"])
def test_a_csv_header_that_names_a_column_twice_is_refused(tmp_path: Path, header: str) -> None:
    """pandas would read the second as `label.1`, a feature: the label trained on as an input."""
    (tmp_path / "t.csv").write_text(header + "\n" + "".join(f"{i},{i % 2},{i % 2}\n"
                                                             for i in range(20)))
    repeated = header.split(",")[1]
    assert load_error(FilesConfig(path=str(tmp_path / "t.csv"))) == (
        f"{tmp_path / 't.csv'}: its header names column(s) {repeated} more than once; give each "
        "column a name of its own")


def test_a_missing_npz_array_lists_the_arrays(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", features=np.ones((4, 2)), y=np.arange(4))
    assert load_error(FilesConfig(path=str(tmp_path / "d.npz"))) == (
        f"{tmp_path / 'd.npz'} has no array 'X' (dataset.x_array); it holds: features, y")


@pytest.mark.parametrize("fmt", ["csv", "npz"])
def test_a_nan_feature_is_named_with_its_row(tmp_path: Path, fmt: str) -> None:
    x = np.ones((10, 3))
    x[4, 2] = np.nan
    cfg = write_digits(tmp_path, fmt, x, np.arange(10) % 2)
    expected = {"csv": ("row 5, column 'p2' has no value; 1 row(s) miss a value: "
                        "dataset.missing=drop leaves them out, dataset.drop=[p2] the column"),
                "npz": "X[4, 2] is nan, not a finite number"}[fmt]
    assert load_error(cfg) == f"{cfg.path}: {expected}"


def test_an_infinite_npy_feature_is_named(tmp_path: Path) -> None:
    x = np.ones((10, 3), dtype=np.float32)
    x[8, 0] = np.inf
    cfg = write_digits(tmp_path, "npy", x, np.arange(10) % 2)
    assert load_error(cfg) == (f"{cfg.path} (labels {cfg.labels_path}): x[8, 0] is inf, not a "
                               "finite number")


@pytest.mark.parametrize("fmt,shape", [("npz", (200, 0)), ("npy", (200, 0)),
                                       ("npy", (200, 0, 3)), ("libsvm", None)])
def test_data_without_a_feature_is_refused(tmp_path: Path, fmt: str,
                                           shape: tuple[int, ...] | None) -> None:
    """Zero feature columns (LIBSVM: labels alone, read as scikit-learn's placeholder column)
    trained on nothing and completed at chance, where a CSV without one is refused."""
    y = np.arange(200) % 2
    if shape is None:
        cfg = FilesConfig(path=str(tmp_path / "labels.svm"))
        Path(cfg.path).write_text("".join(f"{label * 2 - 1:+d}\n" for label in y))
        said = "labels but not one feature value (index:value) to learn from"
    else:
        cfg = write_digits(tmp_path, fmt, np.zeros(shape), y)
        said = f"features of shape {shape} hold no feature to learn from"
    where = f"{cfg.path} (labels {cfg.labels_path})" if fmt == "npy" else cfg.path
    assert load_error(cfg) == f"{where}: {said}"
    if fmt == "libsvm":
        assert load_error(DatasetConfig(name="libsvm", path=cfg.path)) == f"{where}: {said}"


def test_a_float64_feature_past_float32s_range_is_named(tmp_path: Path) -> None:
    """Finite in the file, infinite in the float32 a model trains on (NaN once scaled)."""
    x = np.ones((10, 3))
    x[6, 1] = -1e39
    cfg = write_digits(tmp_path, "npz", x, np.arange(10) % 2)
    assert load_error(cfg) == (f"{cfg.path}: X[6, 1] is -1e+39, past float32's range "
                               "(±3.4e+38) that training computes in")


@pytest.mark.parametrize("fmt", ["npz", "csv"])
def test_a_timestamp_feature_keeps_its_seconds_through_standard_scaling(tmp_path: Path,
                                                                         fmt: str) -> None:
    """Rounded to float32 before it is centred, 1.7e9 + s keeps a step of 128 s: the 1000
    times in 0..100 s became two values."""
    rng = np.random.default_rng(0)
    seconds = rng.uniform(0, 100, 1000)
    stamps = np.stack([1.7e9 + seconds, seconds * 1e20], axis=1)  # squares past float32's range
    cfg = write_digits(tmp_path, fmt, stamps, (seconds > 50).astype(int))
    data = load_dataset(cfg, seed=0, progress=False)
    x = np.concatenate([data.x_train, data.x_test])
    assert len(np.unique(x[:, 0])) == 1000
    train = data.x_train.astype(np.float64)
    np.testing.assert_allclose(train.mean(axis=0), 0, atol=1e-6)
    np.testing.assert_allclose(train.std(axis=0), 1, rtol=1e-6)
    # the two columns are one quantity, offset and scaled: standardised, they are equal
    np.testing.assert_allclose(x[:, 0], x[:, 1], atol=1e-5)


def test_a_row_without_a_label_is_named(tmp_path: Path) -> None:
    frame = table(np.ones((10, 2)), [0.0, 1.0] * 5)
    frame.loc[3, "label"] = np.nan
    frame.to_csv(tmp_path / "t.csv", index=False)
    assert load_error(FilesConfig(path=str(tmp_path / "t.csv"))).startswith(
        f"{tmp_path / 't.csv'}: row 4 has no label")


def test_a_bad_label_is_named_by_its_row_in_the_file_after_rows_are_dropped(
        tmp_path: Path) -> None:
    frame = table(np.ones((10, 2)), [0.0, 1.0] * 5)
    frame.iloc[0, 0] = np.nan  # row 1 misses a feature: dataset.missing=drop leaves it out
    frame.loc[2, "label"] = np.inf  # row 3's label
    frame.to_csv(tmp_path / "t.csv", index=False)
    assert load_error(FilesConfig(path=str(tmp_path / "t.csv"), missing="drop")) == (
        f"{tmp_path / 't.csv'}: row 3 has no label (inf)")


def test_a_fifo_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    assert load_error(FilesConfig(path=str(fifo))).startswith(
        f"cannot read {fifo}: not a regular file but a FIFO or pipe")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    assert load_error(FilesConfig(path=str(tmp_path / "nope.npz"))) == (
        f"dataset file not found: {tmp_path / 'nope.npz'}")


def test_npy_features_need_their_labels(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.ones((4, 2)))
    assert "dataset.labels_path=LABELS.npy" in load_error(FilesConfig(path=str(tmp_path / "x.npy")))


def test_parquet_without_pyarrow_says_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table(np.ones((4, 2)), [0, 1] * 2).to_parquet(tmp_path / "t.parquet")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now fails
    assert load_error(FilesConfig(path=str(tmp_path / "t.parquet"))) == (
        "reading Parquet needs pyarrow: pip install 'hetsgd[tables]'")


# --------------------------------------------------------------------------------------------
# one run each: a CSV and dataset=digits train alike
# --------------------------------------------------------------------------------------------


SEEDED = ("algo=sync", "model=logreg", "budget.epochs=1", "budget.seconds=null",
          "eval.every_s=10", "eval.every_epochs=0.5", "seed=3")


def _run(run_dir: Path, *overrides: str) -> dict:
    cfg = compose_config(*SEEDED, *overrides)
    summary = runner.run(to_run_config(cfg), run_dir, cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.integration
def test_a_run_on_the_csv_ends_where_a_run_on_digits_does(
        tmp_path: Path, digits: tuple[np.ndarray, np.ndarray], results_dir: Path) -> None:
    cfg = write_digits(tmp_path, "csv", *digits)
    on_file = _run(tmp_path / "files", "dataset=files", f"dataset.path={cfg.path}")
    on_digits = _run(tmp_path / "digits", "dataset=digits")
    assert on_file["final"]["train_loss"] == pytest.approx(on_digits["final"]["train_loss"],
                                                           rel=1e-6)
    assert on_file["updates"] == on_digits["updates"]


# --------------------------------------------------------------------------------------------
# dataset=folder
# --------------------------------------------------------------------------------------------


@pytest.fixture
def torchvision() -> None:
    """A skip, saying why, where torchvision does not import (absent, or built for another
    torch: a CUDA build beside a CPU torch fails with a RuntimeError)."""
    try:
        import torchvision  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any failure to import means: not usable here
        pytest.skip(f"torchvision does not import here: {' '.join(str(exc).split())[:120]}")


def write_images(root: Path, sizes: dict[str, list[tuple[int, int]]]) -> None:
    """Tiny PNGs, each of its class's own shade, one subfolder per class."""
    from PIL import Image

    for shade, (name, shapes) in enumerate(sorted(sizes.items())):
        (root / name).mkdir(parents=True)
        for i, (height, width) in enumerate(shapes):
            pixels = np.full((height, width, 3), 40 * shade + i, np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")


def folder(path: Path, **kwargs: object) -> Dataset:
    return load_dataset(FolderConfig(path=str(path), **kwargs), seed=0, progress=False)


@pytest.mark.usefixtures("torchvision")
def test_a_folder_is_read_class_per_subfolder(tmp_path: Path) -> None:
    write_images(tmp_path / "train", {"cat": [(6, 5)] * 4, "dog": [(6, 5)] * 4,
                                      "bird": [(6, 5)] * 4})
    write_images(tmp_path / "test", {"cat": [(6, 5)], "dog": [(6, 5)], "bird": [(6, 5)]})
    data = folder(tmp_path / "train", test_path=str(tmp_path / "test"), scale="none")
    assert data.class_names == ("bird", "cat", "dog") and data.task == "multiclass"
    assert data.image_shape == (3, 6, 5) and data.x_train.shape == (12, 90)
    assert data.num_test == 3 and list(data.y_test) == [0, 1, 2]
    # each class's own shade: bird 0.., cat 40.., dog 80..
    assert {(int(y), int(x[0]) // 40) for x, y in zip(data.x_train, data.y_train)} == {
        (0, 0), (1, 1), (2, 2)}
    grey = folder(tmp_path / "train", channels=1)
    assert grey.image_shape == (1, 6, 5) and grey.num_features == 30


@pytest.mark.usefixtures("torchvision")
def test_images_of_another_size_are_named_or_resized(tmp_path: Path) -> None:
    write_images(tmp_path, {"a": [(6, 6)] * 3, "b": [(6, 6), (9, 7), (6, 6)]})
    with pytest.raises(UserError) as caught:
        folder(tmp_path)
    assert str(caught.value).startswith(f"{tmp_path / 'b' / '1.png'} is 9x7 pixels")
    assert "dataset.image_size" in str(caught.value) and "\n" not in str(caught.value)
    data = folder(tmp_path, image_size=[4, 3])
    assert data.image_shape == (3, 4, 3) and data.num_train + data.num_test == 6
    assert data.task == "binary" and data.class_names == ("a", "b")


@pytest.mark.usefixtures("torchvision")
@pytest.mark.parametrize("layout", ["empty", "no subfolder", "bad image"])
def test_a_folder_that_is_not_one_is_one_line(tmp_path: Path, layout: str) -> None:
    root = tmp_path / "images"
    root.mkdir()
    if layout == "no subfolder":
        (root / "x.png").write_bytes(b"")
        expected = f"{root} holds no subfolder"
    elif layout == "bad image":
        write_images(root, {"a": [(4, 4)] * 2, "b": [(4, 4)] * 2})
        (root / "b" / "1.png").write_bytes(b"not a png")
        expected = f"cannot read {root / 'b' / '1.png'} as an image"
    else:
        expected = f"{root} is empty"
    with pytest.raises(UserError) as caught:
        folder(root)
    assert str(caught.value).startswith(expected) and "\n" not in str(caught.value)


def test_a_folder_without_torchvision_says_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision now fails
    with pytest.raises(UserError) as caught:
        folder(tmp_path)
    assert str(caught.value) == "dataset=folder needs torchvision: pip install 'hetsgd[images]'"
