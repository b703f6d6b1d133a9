"""Local SGD: tau per group, the fast group, aggregation weights, reshuffle periods, epoch
accounting, loss-based top-k sampling, and whole runs on a two-group mix."""

from __future__ import annotations

import gzip
import json
import math
import struct
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.distributed as dist
from conftest import compose_config, run_config

from hetsgd.algorithms import local_sgd
from hetsgd.algorithms.biased_sampling import LossTable, generator, top_k_of_pool
from hetsgd.algorithms.local_sgd import (
    RoundPlan,
    ShardBatches,
    fast_group,
    group_taus,
    needs_step_times,
)
from hetsgd.config import GroupConfig, to_run_config
from hetsgd.engines.batches import Batches
from hetsgd.engines.common.memory import SharedData
from hetsgd.engines.ranks.exchange import Verdict
from hetsgd.engines.ranks.rank import Rank
from hetsgd.errors import UserError
from hetsgd.runs import runner
from hetsgd.workers import expand

# Two groups on the CPU: `accel` (batch 32) and `cpu` (batch 8, 10x slower by emulation).
MIX = ("dataset=digits", "model=mlp", "devices=emulated", "devices.groups.accel.batch_size=32",
       "devices.groups.cpu.batch_size=8", "devices.groups.cpu.slowdown=10")
GROUPS = ["accel", "cpu"]


def _algo(*overrides: str):
    return run_config("algo=local_sgd", *MIX, *overrides).algo


def test_tau_per_group_balanced_or_fast_slow_or_auto() -> None:
    times = {"accel": 0.01, "cpu": 0.1}
    assert group_taus(_algo("algo.tau={accel:32,cpu:1}"), GROUPS, None) == {"accel": 32, "cpu": 1}
    assert group_taus(_algo("algo.tau=4"), GROUPS, None) == {"accel": 4, "cpu": 4}
    assert group_taus(_algo("algo.tau={fast:8,slow:2}"), GROUPS, times) == {"accel": 8, "cpu": 2}
    assert group_taus(_algo("algo.tau={fast:8,slow:2}"), GROUPS,
                      {"accel": 0.1, "cpu": 0.01}) == {"accel": 2, "cpu": 8}
    assert group_taus(_algo("algo.tau=auto"), GROUPS, times) == {"accel": 10, "cpu": 1}
    assert group_taus(_algo("algo.tau=auto", "algo.tau_min=2"), GROUPS, times) == {"accel": 20,
                                                                                 "cpu": 2}


def test_the_fast_group_has_the_largest_tau_or_on_a_tie_the_shortest_step() -> None:
    assert fast_group({"accel": 1, "cpu": 4}, None) == "cpu"
    assert fast_group({"accel": 4, "cpu": 4}, {"accel": 0.01, "cpu": 0.1}) == "accel"
    with pytest.raises(ValueError, match="tie"):
        fast_group({"accel": 4, "cpu": 4}, None)


def test_step_times_are_measured_only_when_something_needs_them() -> None:
    assert needs_step_times(_algo("algo.tau=auto"), GROUPS)
    assert needs_step_times(_algo("algo.tau={fast:8,slow:1}"), GROUPS)
    assert not needs_step_times(_algo("algo.tau=4"), GROUPS)
    assert needs_step_times(_algo("algo.tau=4", "algo.aggregation=fast_weighted"), GROUPS)
    assert not needs_step_times(_algo("algo.tau=4", "algo.biased.sampling=true"), GROUPS)
    assert not needs_step_times(_algo("algo.tau={accel:8,cpu:1}", "algo.biased.sampling=true"),
                                GROUPS)


ONE_GROUP = ("dataset=digits", "model=mlp", "devices=cpu", "devices.groups.cpu.count=2")


@pytest.mark.parametrize("overrides,message", [
    ((*MIX, "algo.tau={accel:8,gpu:1}"), "give one tau per group"),
    ((*ONE_GROUP, "algo.biased.sampling=true"), "picks its side by device role"),
    ((*ONE_GROUP, "algo.aggregation=fast_weighted"), "needs a fast and a slow group"),
    ((*MIX, "dist.backend=nccl"), "needs every rank on a GPU"),
])
def test_layouts_local_sgd_cannot_run_are_clear_errors(overrides: tuple[str, ...],
                                                        message: str) -> None:
    cfg = run_config("algo=local_sgd", *overrides)
    with pytest.raises(UserError, match=message):
        local_sgd.plan(cfg, expand(cfg.devices))


def test_fast_and_slow_name_the_two_groups_of_a_two_group_mix() -> None:
    cfg = run_config("algo=local_sgd", *MIX, "algo.tau={fast:8,slow:1}")
    cfg.devices.groups["third"] = GroupConfig()
    with pytest.raises(UserError, match="two-group mix"):
        local_sgd.plan(cfg, expand(cfg.devices))


def _plan(*overrides: str, times: list[float] | None = None, n: int = 1000) -> RoundPlan:
    cfg = run_config("algo=local_sgd", *MIX, *overrides)
    return RoundPlan.build(cfg, expand(cfg.devices), n, times)


@pytest.mark.parametrize("aggregation,weights", [
    ("uniform", [0.5, 0.5]),
    ("samples", [4 * 32 / (4 * 32 + 1 * 8), 8 / (4 * 32 + 1 * 8)]),
    ("fast_weighted", [3 / 4, 1 / 4]),
])
def test_aggregation_weights(aggregation: str, weights: list[float]) -> None:
    plan = _plan("algo.tau={accel:4,cpu:1}", f"algo.aggregation={aggregation}", "algo.alpha=3")
    assert plan.weights == pytest.approx(weights)


def test_biased_sampling_goes_to_the_side_named_by_device_role(
        caplog: pytest.LogCaptureFixture) -> None:
    assert _plan("algo.tau={accel:4,cpu:1}", "algo.biased.sampling=true").side == {1}
    assert _plan("algo.tau={accel:4,cpu:1}", "algo.biased.sampling=true",
                 "algo.biased.side=fast").side == {0}
    # the CPU group steps faster here, yet side=slow stays the CPU (host) group, with a warning
    swapped = _plan("algo.tau={accel:1,cpu:4}", "algo.biased.sampling=true")
    assert swapped.side == {1}
    world = expand(run_config("algo=local_sgd", *MIX).devices)
    with caplog.at_level("WARNING", logger="hetsgd"):
        local_sgd.warn_if_the_side_is_not_as_named(world, swapped, "slow")
    assert "by device role" in caplog.text and "fast side" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="hetsgd"):
        local_sgd.warn_if_the_side_is_not_as_named(
            world, _plan("algo.tau={accel:4,cpu:1}", "algo.biased.sampling=true"), "slow")
    assert caplog.text == ""
    assert _plan("algo.tau={accel:4,cpu:1}").side == set()


def test_epoch_accounting_examples_or_the_authors_rounds() -> None:
    # 136 examples per round (4 x 32 + 1 x 8) of 1000: 7 rounds between reshuffles.
    examples = _plan("algo.tau={accel:4,cpu:1}", "budget.epochs=2")
    assert examples.period == 7
    assert examples.rounds_per_epoch == pytest.approx(1000 / 136)
    assert examples.total_rounds == math.ceil(2000 / 136)
    assert examples.epoch(68) == pytest.approx(68 * 136 / 1000)
    # The authors': N / (sum of batch sizes x tau_fast) = 1000 // (40 x 4) = 6 rounds an epoch.
    authors = _plan("algo.tau={accel:4,cpu:1}", "budget.epochs=2",
                    "algo.epoch_accounting=authors")
    assert authors.rounds_per_epoch == 6
    assert authors.total_rounds == 12
    assert authors.epoch(3) == 0.5
    assert not authors.done(11) and authors.done(12)


def test_uniform_shards_are_contiguous_and_proportional_to_tau() -> None:
    plan = _plan("algo.tau={accel:4,cpu:1}")
    permutation = torch.randperm(1000, generator=torch.Generator().manual_seed(0))
    fast, slow = (plan.shard(rank, 0, permutation, None) for rank in (0, 1))
    assert fast.numel() == 7 * 4 * 32 and slow.numel() == 7 * 1 * 8
    assert torch.equal(torch.cat([fast, slow]), permutation[:fast.numel() + slow.numel()])


def test_a_round_of_more_than_n_examples_takes_each_once_before_any_twice() -> None:
    """400 examples a round on 300: one permutation, wrapped, gave the accelerator 100 examples
    twice in one round and the host a shard that repeated the accelerator's first ones."""
    plan = _plan("algo.tau=10", n=300)
    assert (plan.period, plan.blocks) == (1, 2)  # 10 x 32 + 10 x 8 = 400 examples a round
    data = SharedData.from_arrays(np.zeros((300, 2), np.float32), np.arange(300) % 2)
    batches = ShardBatches(data, torch.device("cpu"), True, 0, "never")
    for period in (0, 1):
        order = batches.permutation(period, plan.blocks)
        stream = torch.cat([plan.shard(rank, period, order, None) for rank in (0, 1)])
        assert stream.numel() == 400
        assert sorted(stream[:300].tolist()) == list(range(300))  # each once, then again
        assert len(set(stream[300:].tolist())) == 100
    assert not torch.equal(batches.permutation(0, 2), batches.permutation(1, 2))
    # a round of N examples or fewer: the one permutation a period had before blocks
    assert torch.equal(batches.permutation(3), Batches.order(batches, 3))


def test_top_k_of_a_pool_takes_the_highest_losses_of_the_pool() -> None:
    scores = torch.arange(100, dtype=torch.float32)
    pool = torch.randperm(100, generator=torch.Generator().manual_seed(1))[:40]
    never = int(pool[scores[pool].argmin()])
    scores[never] = math.inf  # never trained on: ranks first, though it scored the pool's lowest
    rng = torch.Generator().manual_seed(1)
    chosen = top_k_of_pool(scores, 10, 4.0, rng)
    assert chosen.numel() == 10 and never in chosen.tolist()
    assert set(chosen.tolist()) == set(pool[scores[pool].argsort(descending=True)[:10]].tolist())
    # in a random order, not the ranking's: no batch holds only the highest losses
    assert chosen.tolist() != sorted(chosen.tolist(), key=lambda i: -scores[i])
    assert top_k_of_pool(scores, 500, 4.0, rng).numel() == 100  # capped at the whole set


def test_the_slow_side_trains_on_the_top_k_of_the_merged_table() -> None:
    # a host batch of 12: 140 examples a round, 7 rounds a period; the fast side's 896 examples
    # are no multiple of the slow side's k = 84, so a shard of the top-k offset as if it were
    # the permutation's (by 896) would be rotated by 56
    plan = _plan("algo.tau={accel:4,cpu:1}", "algo.biased.sampling=true",
                 "devices.groups.cpu.batch_size=12")
    table = LossTable(1000)
    table.values.copy_(torch.rand(1000, generator=torch.Generator().manual_seed(3)))
    permutation = torch.randperm(1000)
    slow = plan.shard(1, 5, permutation, table)
    k = 7 * 1 * 12
    assert torch.equal(slow, top_k_of_pool(table.values, k, 4.0, generator(plan.seed, 5)))
    assert torch.equal(plan.shard(0, 5, permutation, table), permutation[:7 * 4 * 32])


class _MinWith:
    """A stand-in group whose other rank holds `other`."""

    def __init__(self, other: torch.Tensor) -> None:
        self.other = other

    def all_reduce_(self, tensor: torch.Tensor, op: dist.ReduceOp) -> torch.Tensor:
        assert op == dist.ReduceOp.MIN
        return torch.minimum(tensor, self.other, out=tensor)


def test_loss_table_starts_at_infinity_records_losses_and_min_merges() -> None:
    table = LossTable(4)
    assert torch.isinf(table.values).all()
    table.record(torch.tensor([0, 2]), torch.tensor([0.5, 2.0]))
    table.merge(_MinWith(torch.tensor([1.0, math.inf, 1.5, math.inf])))  # type: ignore[arg-type]
    assert table.values.tolist() == [0.5, math.inf, 1.5, math.inf]


@pytest.mark.integration
def test_biased_local_sgd_with_the_authors_accounting_runs_its_rounds(tmp_path: Path) -> None:
    # digits: 1437 examples, sum of batch sizes 40, tau_fast 4: R = 1437 // 160 = 8 rounds/epoch.
    overrides = ("algo=local_sgd", *MIX, "algo.tau={accel:4,cpu:1}", "algo.biased.sampling=true",
                 "algo.epoch_accounting=authors", "algo.aggregation=samples", "budget.epochs=0.5",
                 "progress=false")
    cfg = compose_config(*overrides)
    summary = runner.run(to_run_config(cfg), tmp_path, cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    assert json.loads((tmp_path / "summary.json").read_text())["local_sgd"] == {
        "tau": {"accel": 4, "cpu": 1},
        "aggregation_weight": {"accel": pytest.approx(128 / 136), "cpu": pytest.approx(8 / 136)},
        "step_s": {"accel": None, "cpu": None}}  # nothing needed a speed measurement
    assert summary["updates_by_group"] == {"accel": 4 * 4, "cpu": 4 * 1}
    workers = pd.read_csv(tmp_path / "workers.csv")
    assert workers["examples"].tolist() == [4 * 4 * 32, 4 * 1 * 8]
    assert summary["final"]["train_loss"] < summary["initial"]["train_loss"]


def test_each_reshuffle_ranks_the_slow_side_by_the_losses_both_sides_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The table the slow side's top-k is drawn from at a reshuffle is +inf where nothing trained
    yet and finite exactly at the examples that either rank trained on since: its own steps'
    losses recorded, the other's merged in. On the virtual clock, whose ranks are threads of this
    process, so the plan's shards can be read as they are cut."""
    shards: dict[tuple[int, int], torch.Tensor] = {}
    scores: dict[int, torch.Tensor] = {}
    shard = RoundPlan.shard

    def recorded(self: RoundPlan, rank: int, period: int, permutation: torch.Tensor,
                 table: LossTable | None) -> torch.Tensor:
        if table is not None and rank in self.side:
            scores[period] = table.values.clone()
        shards[rank, period] = chosen = shard(self, rank, period, permutation, table)
        return chosen

    monkeypatch.setattr(RoundPlan, "shard", recorded)
    # 136 examples a round of 1437: a reshuffle every 10 rounds; an epoch is 11 rounds
    cfg = compose_config("algo=local_sgd", *MIX, "algo.tau={accel:4,cpu:1}",
                         "algo.biased.sampling=true", "budget.epochs=1", "budget.seconds=null",
                         "devices.simulated=true", "devices.groups.accel.profile=v100_sxm2_16gb",
                         "devices.groups.cpu.profile=xeon_e5_2686v4_core", "progress=false")
    summary = runner.run(to_run_config(cfg), tmp_path, cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    assert sorted(shards) == [(0, 0), (0, 1), (1, 0), (1, 1)] and sorted(scores) == [0, 1]
    assert torch.isinf(scores[0]).all()
    trained = set(shards[0, 0].tolist()) | set(shards[1, 0].tolist())
    assert set(torch.isfinite(scores[1]).nonzero().flatten().tolist()) == trained
    assert (scores[1][list(trained)] > 0).all()  # cross-entropy losses, not indices or zeros


def test_biased_sampling_records_the_rows_a_batch_norm_merge_trained_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under batch norm a host batch of 1 is merged with its neighbour into 2 rows: the table took
    the 2 rows' losses at the 1 index of the batch and the run died on a shape mismatch. On the
    virtual clock, whose ranks are threads of this process."""
    recorded: list[tuple[list[int], int]] = []
    record = LossTable.record

    def seen(self: LossTable, idx: torch.Tensor, losses: torch.Tensor) -> None:
        recorded.append((idx.tolist(), losses.numel()))
        record(self, idx, losses)

    monkeypatch.setattr(LossTable, "record", seen)
    data = _fake_fashion(tmp_path / "fashion", 256, 32)
    cfg = compose_config("algo=local_sgd", "dataset=fashion_mnist", f"dataset.path={data}",
                         "model=cnn", "model.channels=[2]", "model.batch_norm=true",
                         "devices=emulated", "devices.groups.accel.batch_size=32",
                         "devices.groups.cpu.batch_size=1", "algo.tau={accel:1,cpu:2}",
                         "algo.biased.sampling=true", "budget.epochs=0.25",
                         "budget.seconds=null", "devices.simulated=true",
                         "devices.groups.accel.profile=v100_sxm2_16gb",
                         "devices.groups.cpu.profile=xeon_e5_2686v4_core", "progress=false")
    summary = runner.run(to_run_config(cfg), tmp_path / "run", cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    assert summary["updates_by_group"] == {"accel": 2, "cpu": 2 * 2}  # 34 examples a round
    assert all(len(idx) == losses for idx, losses in recorded)
    assert sorted(len(idx) for idx, _ in recorded) == [2] * 4 + [32] * 2
    assert all(len(set(idx)) == len(idx) for idx, _ in recorded)  # distinct rows, none twice


@pytest.mark.parametrize("at_round", ["keep", "reset", "average"])
def test_momentum_at_each_aggregation_is_kept_reset_or_averaged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_round: str) -> None:
    """Each rank's momentum just before and just after each round's aggregation, on the
    virtual clock: after it, its own (the authors' code), zero, or the ranks' average weighted
    as the models are (by examples: 128 and 8 a round), the same on both ranks."""
    before: dict[tuple[int, int], torch.Tensor] = {}
    after: dict[tuple[int, int], torch.Tensor] = {}
    weights: list[float] = []
    aggregate = local_sgd.LocalSGDLoop.aggregate

    def recorded(self: local_sgd.LocalSGDLoop) -> Verdict:
        momentum = self.rank.optimizer.momentum_buffer
        assert momentum is not None
        key = self.rank.spec.rank, self.position
        before[key] = momentum.clone()
        verdict = aggregate(self)
        after[key] = momentum.clone()
        weights[:] = self.plan.weights
        return verdict

    monkeypatch.setattr(local_sgd.LocalSGDLoop, "aggregate", recorded)
    cfg = compose_config("algo=local_sgd", *MIX, "algo.tau={accel:4,cpu:1}", "optim.momentum=0.9",
                         "algo.aggregation=samples", f"algo.momentum_at_round={at_round}",
                         "budget.epochs=0.5", "budget.seconds=null", "devices.simulated=true",
                         "devices.groups.accel.profile=v100_sxm2_16gb",
                         "devices.groups.cpu.profile=xeon_e5_2686v4_core", "progress=false")
    summary = runner.run(to_run_config(cfg), tmp_path, cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    assert weights == pytest.approx([128 / 136, 8 / 136])
    rounds = sorted({position for _, position in after})
    assert len(rounds) >= 3 and sorted(after) == [(r, p) for r in (0, 1) for p in rounds]
    for position in rounds:
        mine = [before[rank, position] for rank in (0, 1)]
        expected = {"keep": mine, "reset": [torch.zeros_like(m) for m in mine],
                    "average": [weights[0] * mine[0] + weights[1] * mine[1]] * 2}[at_round]
        for rank in (0, 1):
            torch.testing.assert_close(after[rank, position], expected[rank])
        assert not torch.equal(mine[0], mine[1])  # there was something to average


def test_momentum_at_round_acts_on_plain_sgd_only() -> None:
    cfg = run_config("algo=local_sgd", *MIX, "algo.tau=2", "algo.momentum_at_round=reset",
                     "optim=torch")
    with pytest.raises(UserError, match="^algo.momentum_at_round=reset acts on plain SGD's "
                                        "momentum \\(optim=sgd\\); optim=torch keeps"):
        local_sgd.plan(cfg, expand(cfg.devices))


def _fake_fashion(folder: Path, n_train: int, n_test: int) -> Path:
    """A tiny learnable stand-in for Fashion-MNIST's four IDX files (the label sets the mean)."""
    rng = np.random.default_rng(0)
    folder.mkdir()
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 50, (n, 28, 28)) + 20 * labels[:, None, None]
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            header = b"\0\0\x08" + bytes([array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
            with gzip.open(folder / f"{prefix}-{kind}-ubyte.gz", "wb") as f:
                f.write(header + array.astype(np.uint8).tobytes())
    return folder


def _batchnorm_statistics(module: torch.nn.Module) -> torch.Tensor:
    """Every BatchNorm layer's running mean and variance, in one vector."""
    return torch.cat([torch.cat([m.running_mean, m.running_var]) for m in module.modules()
                      if isinstance(m, torch.nn.BatchNorm2d)])


def test_resnet20_trains_with_local_sgd_and_averaged_batchnorm_statistics(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After each round every rank's BatchNorm running statistics are the aggregation-weighted
    average of what the ranks' own steps made of them. On the virtual clock, whose ranks run the
    real engine's rank loop and exchange as threads of this process, where each rank's module
    can be read around its exchange."""
    seen: dict[int, list[tuple[float, torch.Tensor, torch.Tensor]]] = {0: [], 1: []}
    exchange = Rank.exchange

    def recorded(self: Rank, first: torch.Tensor, second: torch.Tensor, weight: float,
                 loss: float | None):
        before = _batchnorm_statistics(self.module).clone()
        verdict = exchange(self, first, second, weight, loss)
        seen[self.spec.rank].append((weight, before, _batchnorm_statistics(self.module).clone()))
        return verdict

    monkeypatch.setattr(Rank, "exchange", recorded)
    data = _fake_fashion(tmp_path / "fashion", 256, 64)
    overrides = ("algo=local_sgd", "dataset=fashion_mnist", f"dataset.path={data}", "model=resnet20",
                 "devices=emulated", "devices.groups.accel.batch_size=32",
                 "devices.groups.cpu.batch_size=16", "algo.tau={accel:2,cpu:1}",
                 "algo.aggregation=samples", "optim.lr=0.1", "optim.momentum=0.9",
                 "optim.weight_decay=1e-4", "budget.epochs=1", "budget.seconds=null",
                 "devices.simulated=true", "devices.groups.accel.profile=v100_sxm2_16gb",
                 "devices.groups.cpu.profile=xeon_e5_2686v4_core", "progress=false")
    cfg = compose_config(*overrides)
    summary = runner.run(to_run_config(cfg), tmp_path / "run", cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    assert summary["updates_by_group"] == {"accel": 2 * 4, "cpu": 4}  # 80 examples a round
    assert summary["final"]["train_loss"] < summary["initial"]["train_loss"]
    assert len(seen[0]) == len(seen[1]) == 4
    for (w0, before0, after0), (w1, before1, after1) in zip(seen[0], seen[1]):
        assert (w0, w1) == (pytest.approx(64 / 80), pytest.approx(16 / 80))  # examples a round
        assert not torch.equal(before0, before1)  # the ranks' own steps moved them apart
        average = w0 * before0 + w1 * before1
        torch.testing.assert_close(after0, average)
        torch.testing.assert_close(after1, average)
