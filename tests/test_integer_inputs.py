"""Integer features: a file's token ids stay int64, unscaled, from the file to a user's model.

An ``.npz`` or ``.npy`` of integers read for ``model=custom`` is prepared as int64 without scaling
(``dataset.scale=auto``); ``standard`` or ``maxabs`` asked of it scale it as float32, and every
built-in model gets float32 as before. The int64 rows go through shared memory and the batches of
every engine to an ``nn.Embedding``.
"""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import compose_config

from hetsgd.config import to_run_config
from hetsgd.config.problem import CustomModelConfig, FilesConfig
from hetsgd.data import load_dataset
from hetsgd.engines.common.memory import SharedRows
from hetsgd.engines.virtual.model_cost import ModelCost
from hetsgd.errors import UserError
from hetsgd.model.problem import Problem
from hetsgd.runs import runner

PACKAGE = "tokennets"
NETS = '''
from torch import nn


class BagOfTokens(nn.Module):
    """Token ids [B, L] -> the mean of their embeddings -> logits."""

    def __init__(self, num_outputs, vocab=40, dim=8):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, num_outputs)

    def forward(self, ids):
        return self.head(self.embed(ids).mean(dim=1))


def linear(in_features, num_outputs):
    return nn.Sequential(nn.Linear(in_features, num_outputs))
'''
VOCAB, LENGTH = 40, 6


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HETSGD_DATA", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The package ``tokennets`` on sys.path and on PYTHONPATH (spawned workers import it)."""
    root = tmp_path_factory.mktemp("user_code")
    (root / f"{PACKAGE}.py").write_text(textwrap.dedent(NETS))
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root),
                                                               os.environ.get("PYTHONPATH")])))
        yield
        sys.modules.pop(PACKAGE, None)


def tokens(directory: Path, dtype: type = np.int32, rows: int = 400) -> Path:
    """Token ids whose first column numbers the row, labelled by whether token 0 is in the
    first half of the vocabulary (learnable from the bag of embeddings)."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, VOCAB, size=(rows, LENGTH))
    x[:, 1] = x[:, 0]  # the label's token twice: a clear signal
    x[:, -1] = np.arange(rows) % VOCAB
    path = directory / "tokens.npz"
    np.savez(path, X=x.astype(dtype), y=(x[:, 0] < VOCAB // 2).astype(np.int64))
    return path


def test_integers_stay_int64_and_unscaled_for_a_users_model(tmp_path: Path) -> None:
    path = tokens(tmp_path, np.uint16)
    data = load_dataset(FilesConfig(path=str(path)), seed=0, progress=False, integers=True)
    assert (data.x_train.dtype, data.x_test.dtype, data.scaling) == (np.int64, np.int64, "none")
    with np.load(path) as f:
        written = {tuple(row) for row in f["X"].astype(np.int64)}
    assert {tuple(row) for row in np.concatenate([data.x_train, data.x_test])} == written


@pytest.mark.parametrize("scale", ["standard", "maxabs"])
def test_a_scaling_asked_of_integers_makes_them_float32_as_for_any_model(tmp_path: Path,
                                                                         scale: str) -> None:
    cfg = FilesConfig(path=str(tokens(tmp_path)), scale=scale)
    kept = load_dataset(cfg, seed=0, progress=False, integers=True)
    builtin = load_dataset(cfg, seed=0, progress=False)
    assert (kept.x_train.dtype, kept.scaling) == (np.float32, scale)
    np.testing.assert_array_equal(kept.x_train, builtin.x_train)


def test_a_built_in_model_and_float_files_get_float32_as_before(tmp_path: Path) -> None:
    ints = load_dataset(FilesConfig(path=str(tokens(tmp_path))), seed=0, progress=False)
    assert (ints.x_train.dtype, ints.scaling) == (np.float32, "standard")
    with np.load(tokens(tmp_path)) as f:
        np.savez(tmp_path / "floats.npz", X=f["X"].astype(np.float64), y=f["y"])
    floats = FilesConfig(path=str(tmp_path / "floats.npz"))
    kept = load_dataset(floats, seed=0, progress=False, integers=True)
    assert kept.x_train.dtype == np.float32
    np.testing.assert_array_equal(kept.x_train, load_dataset(floats, seed=0, progress=False).x_train)


def test_uint64_past_int64_is_one_line(tmp_path: Path) -> None:
    np.savez(tmp_path / "big.npz", X=np.full((8, 2), 2**63, np.uint64), y=np.arange(8) % 2)
    with pytest.raises(UserError, match="uint64 features exceed int64"):
        load_dataset(FilesConfig(path=str(tmp_path / "big.npz")), seed=0, progress=False,
                     integers=True)


def test_shared_rows_hand_out_int64_batches() -> None:
    x = np.arange(12, dtype=np.int64).reshape(4, 3) + 2**40  # past float32's exact integers
    batch = SharedRows.from_array(x).rows(torch.tensor([2, 0]))
    assert batch.dtype == torch.int64
    assert batch.tolist() == [x[2].tolist(), x[0].tolist()]


def test_an_embedding_model_is_probed_and_priced_on_int64(nets: None) -> None:
    problem = Problem("binary", LENGTH, 1, None, features_dtype="int64")
    model = problem.build_model(CustomModelConfig(_target_=f"{PACKAGE}.BagOfTokens"), seed=0)
    assert model(torch.zeros(3, LENGTH, dtype=torch.int64)).shape == (3, 1)
    assert ModelCost.of(model, (LENGTH,), "binary", input_dtype=torch.int64).flops_per_example > 0


def test_a_model_that_multiplies_integers_is_told_how_to_get_floats(nets: None) -> None:
    problem = Problem("binary", LENGTH, 1, None, features_dtype="int64")
    with pytest.raises(UserError, match=r"kept as torch.int64: dataset.scale=standard gives "
                                        "float32 features instead"):
        problem.build_model(CustomModelConfig(_target_=f"{PACKAGE}.linear"), seed=0)


@pytest.mark.integration
@pytest.mark.parametrize("engine", [
    ("algo=hogbatch", "devices=emulated"),
    ("algo=local_sgd", "devices=emulated", "algo.tau=4"),
    ("algo=hogbatch", "devices=paper_hogbatch_v100", "devices.groups.cpu.count=2",
     "devices.groups.accel.batch_size=64", "budget.seconds=0.05", "eval.every_s=0.01"),
], ids=["shared_memory", "ranks", "virtual_clock"])
def test_an_embedding_model_trains_on_token_ids_on_every_engine(
        nets: None, tmp_path: Path, results_dir: Path, engine: tuple[str, ...]) -> None:
    cfg = compose_config("dataset=files", f"dataset.path={tokens(tmp_path)}", "model=custom",
                         f"model._target_={PACKAGE}.BagOfTokens", "optim.lr=0.5",
                         "budget.epochs=3", "budget.seconds=null", "eval.every_s=0.2",
                         "eval.every_epochs=null", *engine)
    summary = runner.run(to_run_config(cfg), tmp_path / "run", cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    assert (summary["scaling"], summary["features"]) == ("none", {"dtype": "int64",
                                                                 "count": LENGTH})
    assert summary["final"]["train_loss"] < summary["initial"]["train_loss"]
