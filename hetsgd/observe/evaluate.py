"""Evaluation of model snapshots.

Snapshots are evaluated after training, in the coordinator, so evaluation never takes cycles from
the workers and never counts as training time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetsgd.config import RunConfig
from hetsgd.engines.common.memory import SharedData
from hetsgd.model.flat import FlatModel
from hetsgd.model.losses import correct, per_sample_loss
from hetsgd.model.problem import Problem


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
        module = problem.build_model(cfg.model, cfg.seed)
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
