"""Real tables: text and categorical columns one-hot, columns chosen or dropped, rows with a
missing value refused or dropped, each said in the dataset and the run's summary."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import compose_config

from hetsgd.config import to_run_config
from hetsgd.config.checks import ConfigError
from hetsgd.config.problem import FilesConfig
from hetsgd.data import load_dataset
from hetsgd.data.dataset import Dataset
from hetsgd.errors import UserError
from hetsgd.runs import runner

ISLANDS = ("Biscoe", "Dream", "Torgersen")


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HETSGD_DATA", str(tmp_path / "cache"))
    return tmp_path / "cache"


def penguins(rows: int = 60) -> pd.DataFrame:
    """A table like palmerpenguins': a text label, a text and a two-valued column, numbers, an
    identifier; row 3 misses its mass, row 5 its sex. ``mass`` is 1000 x the island's number
    plus the sex's, so each row's one-hot features can be read back from its mass."""
    i = np.arange(rows)
    frame = pd.DataFrame({
        "species": np.array(["Adelie", "Gentoo"])[i % 2],
        "island": np.array(ISLANDS)[i % 3],
        "bill": 30.0 + i % 7,
        "sex": np.array(["female", "male"])[i // 2 % 2],
        "mass": 1000.0 * (i % 3) + i // 2 % 2,
        "id": [f"P{n:03d}" for n in i]})
    frame.loc[3, "mass"] = np.nan
    frame.loc[5, "sex"] = None
    return frame


def write(frame: pd.DataFrame, path: Path) -> str:
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path)
    return str(path)


def load(**keys: object) -> Dataset:
    return load_dataset(FilesConfig(label="species", scale="none", **keys),  # type: ignore[arg-type]
                        seed=0, progress=False)


def error(**keys: object) -> str:
    with pytest.raises(UserError) as caught:
        load(**keys)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_a_missing_value_is_named_and_the_way_to_drop_it_said(tmp_path: Path) -> None:
    path = write(penguins(), tmp_path / "p.csv")
    assert error(path=path, drop=["id"]) == (
        f"{path}: row 4, column 'mass' has no value; 2 row(s) miss a value: dataset.missing=drop "
        "leaves them out, dataset.drop=[mass] the column")


# reversed, the categories seen first are Torgersen and male: their order is not the sorted one
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_text_columns_are_one_hot_and_missing_rows_dropped(tmp_path: Path, suffix: str,
                                                          reverse: bool) -> None:
    frame = penguins().iloc[::-1] if reverse else penguins()
    if suffix == ".parquet":  # a pandas categorical, stored as a Parquet dictionary column
        frame["island"] = frame["island"].astype("category")
    data = load(path=write(frame, tmp_path / f"p{suffix}"), drop=["id"], missing="drop")
    assert data.table == {"columns": 4, "one_hot": {"island": 3, "sex": 2}, "rows_dropped": 2}
    assert data.num_features == 3 + 1 + 2 + 1  # island, bill, sex, mass: in the table's order
    assert data.num_train + data.num_test == 58
    x = np.concatenate([data.x_train, data.x_test])
    island, sex, mass = x[:, 0:3], x[:, 4:6], x[:, 6]
    np.testing.assert_array_equal(island.argmax(1), mass // 1000)  # the categories, sorted
    np.testing.assert_array_equal(sex.argmax(1), mass % 1000)
    assert (island.sum(1) == 1).all() and (sex.sum(1) == 1).all()


def test_a_categorical_of_number_codes_is_one_hot_not_a_quantity(tmp_path: Path) -> None:
    """Region codes "10", "20", "30" name categories: as one standardised number, 30 would sit
    twice as far from 10 as 20 does."""
    frame = penguins().drop(columns="id").dropna()
    frame["code"] = pd.Categorical(np.array(["10", "20", "30"])[np.arange(len(frame)) % 3])
    data = load(path=write(frame, tmp_path / "p.parquet"), features=["bill", "code"])
    assert data.table == {"columns": 2, "one_hot": {"code": 3}, "rows_dropped": 0}
    x = np.concatenate([data.x_train, data.x_test])
    assert set(np.unique(x[:, 1:])) == {0.0, 1.0} and (x[:, 1:].sum(axis=1) == 1).all()


def test_the_features_chosen_are_the_only_ones_read(tmp_path: Path) -> None:
    data = load(path=write(penguins(), tmp_path / "p.csv"), features=["island", "bill"])
    assert data.table == {"columns": 2, "one_hot": {"island": 3}, "rows_dropped": 0}
    assert data.num_features == 4


def test_a_test_files_unseen_category_encodes_as_zeros(tmp_path: Path) -> None:
    frame = penguins().drop(columns="id").dropna()
    train = write(frame[frame.island != "Torgersen"], tmp_path / "train.csv")
    test = frame[frame.island == "Torgersen"].iloc[:, [3, 2, 1, 0, 4]]  # columns in another order
    data = load(path=train, test_path=write(test, tmp_path / "test.csv"))
    assert data.table is not None and data.table["one_hot"] == {"island": 2, "sex": 2}
    assert (data.x_test[:, 0:2] == 0).all() and (data.x_test[:, 2] == test["bill"]).all()
    # read by name, not position: its sex and mass are the training file's columns 3:5 and 5
    # (a Torgersen row's mass is 2000 plus its sex)
    sex = data.x_test[:, 3:5]
    assert (sex.sum(1) == 1).all()
    np.testing.assert_array_equal(sex.argmax(1), test["mass"].to_numpy() - 2000)
    assert (data.x_test[:, 5] == test["mass"]).all()


def test_an_identifier_column_is_refused_with_the_way_out(tmp_path: Path) -> None:
    path = write(penguins(), tmp_path / "p.csv")
    assert error(path=path, missing="drop", max_categories=50) == (
        f"{path}: column 'id' holds 58 distinct values, more than dataset.max_categories=50 to "
        "one-hot encode: leave it out (dataset.drop=[id]) or raise dataset.max_categories")


def test_a_number_column_with_text_in_it_is_refused(tmp_path: Path) -> None:
    frame = penguins().drop(columns="id").dropna().reset_index(drop=True)
    frame["bill"] = frame["bill"].astype(object)
    frame.loc[7, "bill"] = "?"
    path = write(frame, tmp_path / "p.csv")
    assert error(path=path).startswith(f"{path}: row 8, column 'bill' holds '?', not a number, "
                                       "among numbers (row 1: ")


@pytest.mark.parametrize(("keys", "message"), [
    ({"features": ["island", "beak"]}, "has no column 'beak' (dataset.features)"),
    ({"drop": ["ID"]}, "has no column 'ID' (dataset.drop)"),
])
def test_a_column_named_that_is_not_there_is_one_line(tmp_path: Path, keys: dict,
                                                      message: str) -> None:
    path = write(penguins(), tmp_path / "p.csv")
    assert error(path=path, **keys).startswith(f"{path} {message}; its columns: species, ")


@pytest.mark.parametrize(("keys", "message"), [
    ({"drop": ["species"]}, "the label column dataset.label='species' is never a feature"),
    ({"features": ["species"]}, "the label column dataset.label='species' is never a feature"),
    ({"features": ["bill"], "drop": ["id"]}, "not both"),
    ({"missing": "fill"}, "choose one of error, drop"),
])
def test_keys_that_contradict_are_refused(keys: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FilesConfig(path="p.csv", label="species", **keys)


def test_table_keys_on_an_array_file_are_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", X=np.ones((4, 2)), y=np.arange(4) % 2)
    assert error(path=str(tmp_path / "a.npz"), missing="drop") == (
        f"dataset.missing is for CSV and Parquet tables; {tmp_path / 'a.npz'} is read as npz")


def test_the_parsed_cache_keeps_the_encoding_and_knows_the_keys(tmp_path: Path,
                                                                home: Path) -> None:
    path = write(penguins(), tmp_path / "p.csv")
    first = load(path=path, drop=["id"], missing="drop")
    again = load(path=path, drop=["id"], missing="drop")  # read from the parsed cache
    assert len(list((home / "parsed").iterdir())) == 1  # parsed once, kept once
    assert again.table == first.table
    np.testing.assert_array_equal(again.x_train, first.x_train)
    assert load(path=path, drop=["id", "sex"], missing="drop").table == {
        "columns": 3, "one_hot": {"island": 3}, "rows_dropped": 1}
    # each table key is part of the cache's key: none is served another's parse
    assert error(path=path, drop=["id"]).startswith(f"{path}: row 4, column 'mass' has no value")
    assert load(path=path, features=["island", "bill"], missing="drop").table["columns"] == 2
    assert error(path=path, drop=["id"], missing="drop", max_categories=2) == (
        f"{path}: column 'island' holds 3 distinct values, more than dataset.max_categories=2 "
        "to one-hot encode: leave it out (dataset.drop=[island]) or raise "
        "dataset.max_categories")


@pytest.mark.integration
def test_a_table_with_text_trains_and_its_summary_says_how(tmp_path: Path,
                                                           results_dir: Path) -> None:
    path = write(penguins(200), tmp_path / "p.csv")
    cfg = compose_config("dataset=files", f"dataset.path={path}", "dataset.label=species",
                         "dataset.drop=[id]", "dataset.missing=drop", "budget.epochs=3",
                         "budget.seconds=null", "eval.every_s=0.2", "eval.every_epochs=null")
    summary = runner.run(to_run_config(cfg), tmp_path / "run", cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    assert summary["features"] == {"dtype": "float32", "count": 7, "columns": 4,
                                   "one_hot": {"island": 3, "sex": 2}, "rows_dropped": 2}
    assert summary["classes"] == ["Adelie", "Gentoo"]
    assert summary["final"]["train_loss"] < summary["initial"]["train_loss"]
