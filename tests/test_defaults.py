"""Defaults a reader can trust: a run with the defaults learns as well as a plain PyTorch loop.

The data is a LIBSVM file of binary 0/1 features, as published sets such as a8a and w8a are:
the run must train on it as it is. Standardising it by default (the old behaviour) turns a rare
indicator into a value near 10, and SGD at lr 0.1 then ends near the majority class at batch 1
and far above the plain loop at batch 256: both cases below fail that way.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import compose_config
from torch import nn

from hetsgd.config import to_run_config
from hetsgd.data.prepare import split_rows
from hetsgd.runs import runner

ROWS, FEATURES = 3750, 100  # the default 0.2 test split: 3000 train / 750 test rows
HIDDEN = 128  # the mlp's default hidden widths are [128, 128]
LR = 0.1  # optim.lr's default
SEED = 0  # the run's default seed
TOLERANCE = 0.05


def binary_features(seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """0/1 features, most of them rare (1 % to 30 % ones); the label is (x0 XOR x1) AND x2 with
    3 % of the labels flipped: about 27 % positives, learnable only by a nonlinear model."""
    rng = np.random.default_rng(seed)
    ones = np.exp(rng.uniform(math.log(0.01), math.log(0.3), FEATURES))
    ones[:3] = 0.5
    x = (rng.random((ROWS, FEATURES)) < ones).astype(np.float32)
    y = (x[:, 0] != x[:, 1]) & (x[:, 2] == 1)
    y ^= rng.random(ROWS) < 0.03
    return x, y.astype(np.float32)


def write_libsvm(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    lines = (f"{'+1' if label else '-1'} " + " ".join(f"{j + 1}:1" for j in np.flatnonzero(row))
             for row, label in zip(x, y, strict=True))
    path.write_text("\n".join(lines) + "\n")


def plain_loop(x: np.ndarray, y: np.ndarray, batch: int, epochs: int) -> tuple[float, float]:
    """The reference: torch.optim.SGD on the file's values, same split, model shape, lr, batch
    and epochs. Returns (test loss, majority-class test loss)."""
    train, test, _ = split_rows(y, "binary", SEED, test_size=0.2)
    x_train, y_train = torch.from_numpy(x[train]), torch.from_numpy(y[train])
    x_test, y_test = torch.from_numpy(x[test]), torch.from_numpy(y[test])
    torch.manual_seed(SEED)
    model = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN),
                          nn.ReLU(), nn.Linear(HIDDEN, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    order = torch.Generator().manual_seed(SEED)
    for _ in range(epochs):
        perm = torch.randperm(len(y_train), generator=order)
        for start in range(0, len(perm), batch):
            rows = perm[start:start + batch]
            optimizer.zero_grad()
            F.binary_cross_entropy_with_logits(model(x_train[rows]).squeeze(1),
                                               y_train[rows]).backward()
            optimizer.step()
    with torch.no_grad():
        loss = F.binary_cross_entropy_with_logits(model(x_test).squeeze(1), y_test).item()
    prior = torch.full_like(y_test, math.log(y_train.mean() / (1 - y_train.mean())))
    return loss, F.binary_cross_entropy_with_logits(prior, y_test).item()


@pytest.mark.integration
@pytest.mark.wall
@pytest.mark.parametrize("batch,epochs", [(1, 3), (256, 100)])
def test_defaults_on_a_binary_libsvm_file_match_a_plain_pytorch_loop(
        batch: int, epochs: int, tmp_path: Path, results_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETSGD_DATA", str(tmp_path / "cache"))
    x, y = binary_features()
    assert 0.2 < y.mean() < 0.3
    path = tmp_path / "unseen.svm"
    write_libsvm(path, x, y)
    overrides = ("algo=sync", "devices=single_cpu", "dataset=libsvm", f"dataset.path={path}",
                 "model=mlp", f"devices.groups.cpu.batch_size={batch}", f"budget.epochs={epochs}",
                 "eval.every_epochs=null", "eval.every_s=5")  # evaluation cadence only
    cfg = compose_config(*overrides)
    run_cfg = to_run_config(cfg)
    assert (run_cfg.dataset.scale, run_cfg.optim.lr, run_cfg.model.hidden) == ("auto", LR,
                                                                               [HIDDEN, HIDDEN])
    summary = runner.run(run_cfg, tmp_path / "run", cfg).to_dict()
    assert summary["status"] == "completed", summary.get("error")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())

    reference, majority = plain_loop(x, y, batch, epochs)
    ours = summary["final"]["test_loss"]
    print(f"batch {batch}, {epochs} epochs: hetsgd {ours:.4f}, plain loop {reference:.4f}, "
          f"majority class {majority:.4f}")
    assert reference < 0.6 * majority  # the reference itself learned the rule
    assert ours <= reference + TOLERANCE, (ours, reference)
    assert ours < 0.6 * majority, (ours, majority)
