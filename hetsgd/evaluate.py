"""Evaluation of model snapshots, normalized loss and time-to-target.

Snapshots are evaluated after training, in the coordinator, so evaluation never takes cycles from
the workers and never counts as training time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from hetsgd.config import RunConfig
from hetsgd.flat import FlatModel
from hetsgd.losses import correct, per_sample_loss
from hetsgd.models import build_model
from hetsgd.shared import Problem, SharedData

TARGETS = (0.9, 0.95, 0.99)


@dataclass
class Metrics:
    train_loss: float
    test_loss: float
    test_acc: float


class Evaluator:
    """Loss on a fixed, seeded subset of the training set; loss and accuracy on the test set."""

    def __init__(self, cfg: RunConfig, problem: Problem, train: SharedData, test: SharedData) -> None:
        self.task = problem.task
        self.batch_size = cfg.eval.batch_size
        module = build_model(cfg.model, problem.num_features, problem.num_outputs,
                             problem.image_shape, cfg.seed)
        self.module = module.eval()
        self.flat = FlatModel(module)
        n = train.num_examples
        if n > cfg.eval.train_subset:
            generator = torch.Generator().manual_seed(cfg.seed)
            self.train_idx = torch.randperm(n, generator=generator)[:cfg.eval.train_subset].sort()[0]
        else:
            self.train_idx = torch.arange(n)
        self.train, self.test = train, test

    @torch.no_grad()
    def _loss_and_acc(self, data: SharedData, idx: torch.Tensor) -> tuple[float, float]:
        total_loss, total_correct = 0.0, 0.0
        for chunk in idx.split(self.batch_size):
            logits = self.module(data.x.rows(chunk))
            y = data.y.index_select(0, chunk)
            total_loss += float(per_sample_loss(self.task, logits, y).sum())
            total_correct += float(correct(self.task, logits, y))
        return total_loss / len(idx), total_correct / len(idx)

    def __call__(self, params: torch.Tensor, buffers: torch.Tensor) -> Metrics:
        self.flat.load_(params, buffers)
        train_loss, _ = self._loss_and_acc(self.train, self.train_idx)
        test_loss, test_acc = self._loss_and_acc(self.test, torch.arange(self.test.num_examples))
        return Metrics(train_loss, test_loss, test_acc)


def normalized_loss(losses: np.ndarray, initial: float, best: float) -> np.ndarray:
    """(L0 - L) / (L0 - L_best): the fraction of the achievable loss reduction, 0 at the start and
    1 at the best loss of the comparison (the papers' plots rise from 0 to 1)."""
    span = initial - best
    if not span > 0:
        return np.zeros_like(losses)
    return (initial - losses) / span


def first_reaching(values: np.ndarray, axis: np.ndarray, targets=TARGETS) -> dict[str, float | None]:
    """For each target, the first `axis` value (time or epoch) at which `values` reaches it."""
    out: dict[str, float | None] = {}
    for target in targets:
        hits = np.flatnonzero(np.nan_to_num(values, nan=-math.inf) >= target)
        out[str(target)] = float(axis[hits[0]]) if len(hits) else None
    return out
