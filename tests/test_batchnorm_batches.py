"""Under batch norm a training batch has at least two rows: a shorter chunk (the last of an epoch,
or a sync rank's one example of it) is merged with its neighbours in the epoch's order, and what
torch still refuses in a model's forward is one line, never a traceback."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from hetsgd.config.optim import SGDConfig
from hetsgd.engines.batches import Batches, min_rows
from hetsgd.engines.common.memory import SharedData
from hetsgd.errors import UserError
from hetsgd.model.flat import FlatModel
from hetsgd.model.step import build_step

ROWS = 7


def _batch_norm_net() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


def _batches(least: int) -> Batches:
    x = np.arange(ROWS * 3, dtype=np.float32).reshape(ROWS, 3)
    data = SharedData.from_arrays(x, np.arange(ROWS) % 2)
    return Batches(data, torch.device("cpu"), shuffle=True, seed=0, on_device="never",
                   min_rows=least)


def test_only_a_model_with_batch_norm_needs_two_rows() -> None:
    assert min_rows(_batch_norm_net()) == 2
    assert min_rows(nn.Sequential(nn.Unflatten(1, (1, 2, 2)), nn.BatchNorm2d(1))) == 2
    assert min_rows(nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2))) == 1


def test_a_chunk_of_one_row_is_merged_with_its_neighbour_under_batch_norm() -> None:
    batches, plain = _batches(2), _batches(1)
    order = batches.order(0)
    rows = torch.from_numpy(np.arange(ROWS * 3, dtype=np.float32).reshape(ROWS, 3))
    x, y = batches.get(0, ROWS - 1, 1)  # the epoch's last row: merged with the one before it
    assert torch.equal(x, rows[order[ROWS - 2:]]) and len(y) == 2
    x, _ = batches.get(0, 2, 1)  # a sync rank's one row inside the batch: with the one after it
    assert torch.equal(x, rows[order[2:4]])
    x, _ = batches.get(0, 3, 3)  # a chunk long enough stays as it is
    assert torch.equal(x, rows[order[3:6]])
    assert len(plain.get(0, ROWS - 1, 1)[0]) == 1  # without batch norm, one row is a batch


def test_a_merged_last_batch_trains_a_batch_norm_model() -> None:
    torch.manual_seed(0)
    net = _batch_norm_net().train()
    step = build_step("auto", FlatModel(net), SGDConfig(), "multiclass")
    before = torch.nn.utils.parameters_to_vector(net.parameters()).clone()
    x, y = _batches(min_rows(net)).get(0, ROWS - 1, 1)
    loss, _ = step(x, y, 0.0, 1)
    assert torch.isfinite(loss)
    assert not torch.equal(torch.nn.utils.parameters_to_vector(net.parameters()), before)


def test_what_a_models_forward_raises_in_training_is_one_line() -> None:
    step = build_step("auto", FlatModel(_batch_norm_net().train()), SGDConfig(), "multiclass")
    with pytest.raises(UserError, match=r"^the model's forward on a training batch \[1, 3\] "
                                        r"raised ValueError: Expected more than 1 value per "
                                        r"channel when training[^\n]*$"):
        step(torch.zeros(1, 3), torch.zeros(1, dtype=torch.int64), 0.0, 1)
