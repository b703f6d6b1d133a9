"""Loss-based top-k sampling of biased local SGD (Lim et al.), as the authors' code does it.

Every rank keeps a table of one loss per training example, +inf until the example is first
trained on (so unseen examples rank first). Each training step writes the per-sample losses of
its forward pass (parameters before the update) into the table, at every row it trained on (a
batch-norm model's 1-row batch is trained merged with its neighbour: both are written); nothing
is evaluated extra, so a score is as old as the last time its example was trained. At every
reshuffle the ranks' tables are merged with an element-wise minimum (the authors' MPI MIN: a
stale low score on one rank can override a fresher high one), and the side that samples by loss
takes the k highest-scored examples of a uniformly drawn pool of ``pool_ratio * k``, k being
exactly the number of examples that side consumes until the next reshuffle.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.distributed as dist

from hetsgd.algorithms.api import Group


class LossTable:
    """One training loss per example, on the host."""

    def __init__(self, num_examples: int) -> None:
        self.values = torch.full((num_examples,), math.inf, dtype=torch.float32)

    def record(self, idx: torch.Tensor, losses: torch.Tensor) -> None:
        self.values[idx.to("cpu")] = losses.to("cpu", torch.float32)

    def merge(self, group: Group) -> None:
        """Element-wise minimum over every rank's table (a collective)."""
        group.all_reduce_(self.values, op=dist.ReduceOp.MIN)


def generator(seed: int, period: int) -> torch.Generator:
    """The seeded stream of a reshuffle period's pool and shuffle: the same on every rank, so
    every rank computes the same top-k and nothing needs to be broadcast."""
    state = np.random.SeedSequence([seed, period, 0xB1A5]).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


def top_k_of_pool(scores: torch.Tensor, k: int, pool_ratio: float,
                  rng: torch.Generator) -> torch.Tensor:
    """The k highest-scored indices of a uniform pool of ceil(pool_ratio * k) indices (at most
    all of them), in a random order. When the pool is the whole set, k is capped at its size."""
    n = scores.numel()
    pool = torch.randperm(n, generator=rng)[:min(n, math.ceil(pool_ratio * k))]
    top = pool[torch.topk(scores[pool], min(k, pool.numel())).indices]
    return top[torch.randperm(top.numel(), generator=rng)]
