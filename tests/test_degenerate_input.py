"""Degenerate input is one clear UserError, naming the file (and line), before any work."""

from __future__ import annotations

import errno
import gzip
import lzma
from pathlib import Path

import numpy as np
import pytest

from hetsgd.config import DatasetConfig, compose_run, to_run_config
from hetsgd.data import cache, load_dataset
from hetsgd.data.libsvm import MAX_FEATURES
from hetsgd.errors import UserError
from hetsgd.runs.setup import check_fills_a_batch, load_run_data
from hetsgd.workers import expand

GOOD = "".join(f"{label} 1:{i} 3:0.5\n" for i, label in enumerate(["-1", "1"] * 10))


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HETSGD_DATA", str(tmp_path / "cache"))
    return tmp_path / "cache"


def load(path: Path, **kwargs: object):
    return load_dataset(DatasetConfig(name="libsvm", path=str(path), **kwargs), seed=0,
                        progress=False)


@pytest.mark.parametrize(("line", "problem"), [
    (f"1 1:1 {MAX_FEATURES + 1}:1", f"has feature index {MAX_FEATURES + 1}, past the bound"),
    ("1 1:1 99999999:1", "has feature index 99999999, past the bound"),
    ("1 1:abc", "is not valid LIBSVM"),
    ("1 1:nan", "has a value that is not a finite number: 1:nan"),
    ("inf 1:1", "has a label that is not a finite number: inf"),
    ("1 3:1 2:1", "is not valid LIBSVM"),
])
def test_bad_line_is_named_with_its_file_and_number(tmp_path: Path, line: str,
                                                     problem: str) -> None:
    path = tmp_path / "bad.svm"
    path.write_text(GOOD + line + "\n" + GOOD)
    with pytest.raises(UserError) as caught:
        load(path)
    assert str(caught.value).startswith(f"{path}: line 21 {problem}")
    assert "\n" not in str(caught.value)


def test_an_index_at_the_bound_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "wide.svm"
    path.write_text(GOOD + f"1 1:1 {MAX_FEATURES}:1\n")
    assert load(path).num_features == MAX_FEATURES


@pytest.mark.parametrize(("name", "content"), [
    ("plain.svm.gz", GOOD.encode()),  # named .gz, not gzip
    ("cut.svm.gz", gzip.compress(GOOD.encode(), mtime=0)[:-12]),  # truncated
    ("cut.svm.xz", lzma.compress(GOOD.encode())[:-30]),
], ids=["plain.svm.gz", "cut.svm.gz", "cut.svm.xz"])  # xdist workers must collect equal ids
def test_unreadable_file_is_named(tmp_path: Path, name: str, content: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(UserError, match=rf"^cannot read {path}: "):
        load(path)


def test_a_directory_given_as_the_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=rf"^cannot read {tmp_path}: Is a directory$"):
        load(tmp_path)


def test_the_bad_one_of_a_train_and_a_test_file_is_named(home: Path) -> None:
    home.mkdir()
    (home / "rcv1_train.binary").write_text(GOOD)
    (home / "rcv1_test.binary.gz").write_bytes(b"not gzip")
    with pytest.raises(UserError, match=rf"^cannot read {home / 'rcv1_test.binary.gz'}: "):
        load_dataset(DatasetConfig(name="rcv1"), seed=0, progress=False)


def test_a_full_disk_while_caching_warns_naming_the_entry_and_the_load_goes_on(
        tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache.np, "save", full)
    path = tmp_path / "f.svm"
    path.write_text(GOOD)
    assert load(path).num_train == 16
    warning = " ".join(capsys.readouterr().err.split())
    assert f"could not cache the parsed arrays at {home / 'parsed'}/libsvm-" in warning
    assert warning.endswith("No space left on device")
    assert not list((home / "parsed").iterdir())  # no half entry left behind


def test_xc_header_dimensions_are_bounded(home: Path) -> None:
    home.mkdir()
    (home / "Delicious_data.txt").write_text(f"2 {MAX_FEATURES + 1} 3\n0 0:1\n1 1:1\n")
    with pytest.raises(UserError, match=r"Delicious_data.txt: line 1 gives 4194305 features"):
        load_dataset(DatasetConfig(name="delicious"), seed=0, progress=False)


@pytest.mark.parametrize(("line", "problem"), [
    ("0 0:nan", "has a value that is not a finite number: 0:nan"),
    ("0,nan 0:1", "has a label that is not a finite number: nan"),
])
def test_xc_values_are_checked_as_libsvm_values_are(home: Path, line: str, problem: str) -> None:
    home.mkdir()
    path = home / "Delicious_data.txt"
    path.write_text(f"3 4 3\n0 0:1\n{line}\n1 1:1\n")
    with pytest.raises(UserError) as caught:
        load_dataset(DatasetConfig(name="delicious"), seed=0, progress=False)
    assert str(caught.value).startswith(f"{path}: line 3 {problem}")


def test_a_class_too_small_to_split_is_an_error(tmp_path: Path) -> None:
    two = tmp_path / "two.svm"
    two.write_text("1 1:1\n-1 2:1\n")
    with pytest.raises(UserError, match=rf"^{two}: class 0 .* has a single example; splitting"):
        load(two)
    lonely = tmp_path / "lonely.svm"
    lonely.write_text(GOOD + "7 1:1\n")  # a third class with one example
    with pytest.raises(UserError, match="class 2 .* has a single example"):
        load(lonely)


def run_config(*overrides: str):
    return to_run_config(compose_run(["progress=false", *overrides]))


def test_a_training_set_smaller_than_a_batch_stops_before_any_worker() -> None:
    cfg = run_config("dataset=digits", "dataset.limit=1", "devices=single_cpu",
                     "devices.groups.cpu.batch_size=8")
    with pytest.raises(UserError, match=r"^the training set has 1 example\(s\), fewer than one "
                                        r"batch of group 'cpu' \(8\): .*batch_size to at most 1$"):
        load_run_data(cfg, progress=False, workers=expand(cfg.devices))
    exact = run_config("dataset=digits", "dataset.limit=8", "devices=single_cpu",
                       "devices.groups.cpu.batch_size=8")
    assert load_run_data(exact, progress=False, workers=expand(exact.devices)).train.num_examples == 8


def test_the_smallest_batch_of_the_mix_decides() -> None:
    specs = expand(run_config("devices=emulated").devices)
    batches = sorted(spec.batch_size for spec in specs)
    assert batches[0] < batches[-1]
    check_fills_a_batch(batches[0], specs)
    with pytest.raises(UserError, match=rf"fewer than one batch of group '\w+' \({batches[0]}\)"):
        check_fills_a_batch(batches[0] - 1, specs)
    check_fills_a_batch(0, [])  # a calibration sizes its batches to the data
    with pytest.raises(UserError, match=r"batch of group 'cpu' \(8\): .*cpu\.batch_size to at"):
        check_fills_a_batch(7, specs)


def test_the_smallest_batch_decides_wherever_its_group_is_in_the_mix() -> None:
    specs = expand(run_config("devices=emulated", "devices.groups.accel.batch_size=4").devices)
    groups = [(spec.group, spec.batch_size) for spec in specs]
    assert groups[0] == ("accel", 4) and groups[-1] == ("cpu", 8)  # the smallest batch first
    check_fills_a_batch(4, specs)
    with pytest.raises(UserError, match=r"batch of group 'accel' \(4\): .*accel\.batch_size to"):
        check_fills_a_batch(3, specs)


def test_good_file_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "good.svm"
    path.write_text(GOOD)
    data = load(path)
    assert data.num_train + data.num_test == 20
    np.testing.assert_array_equal(np.unique(data.y_train), [0.0, 1.0])
