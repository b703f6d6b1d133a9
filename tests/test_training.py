"""The training core: flat models, the SGD arithmetic, the epoch cursor, sparse rows, and the
single-worker loop against a bare PyTorch loop."""

from __future__ import annotations

import math
import multiprocessing as mp
import threading

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from conftest import run_config

from hetsgd.data import load_dataset
from hetsgd.engines.common import worker as worker_module
from hetsgd.engines.common.cursor import EpochCursor
from hetsgd.engines.common.memory import SharedData, SharedMaster, SharedRows
from hetsgd.engines.common.state import SharedState
from hetsgd.engines.common.worker import StepRecord, Worker
from hetsgd.engines.snapshots import Snapshot, Snapshots
from hetsgd.model.architectures import build_model
from hetsgd.model.flat import FlatModel
from hetsgd.model.losses import loss_fn
from hetsgd.model.problem import Problem
from hetsgd.model.sgd import SGD
from hetsgd.workers import expand


def _tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(),
                               torch.nn.Linear(4, 3))


def test_flat_model_binds_parameters_gradients_and_buffers() -> None:
    module = _tiny_model()
    before = [p.detach().clone() for p in module.parameters()]
    flat = FlatModel(module)
    assert all(torch.equal(a, p) for a, p in zip(before, module.parameters()))
    flat.params.add_(1.0)  # a flat update is seen by every parameter
    assert all(torch.equal(a + 1, p) for a, p in zip(before, module.parameters()))
    module(torch.randn(8, 5)).sum().backward()
    assert flat.grads.abs().sum() > 0  # autograd accumulated into the flat gradient in place
    module(torch.randn(8, 5))
    assert torch.equal(flat.buffers[:4], module[1].running_mean)


@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.9, 1e-4)])
def test_flat_sgd_matches_torch_optim_sgd(momentum: float, weight_decay: float) -> None:
    cfg = run_config(f"optim.momentum={momentum}", f"optim.weight_decay={weight_decay}",
                     "optim.lr=0.05").optim
    ours, theirs = _tiny_model(), _tiny_model()
    flat = FlatModel(ours)
    sgd = SGD(cfg, flat)
    reference = torch.optim.SGD(theirs.parameters(), lr=0.05, momentum=momentum,
                                weight_decay=weight_decay)
    for step in range(5):
        x = torch.randn(16, 5, generator=torch.Generator().manual_seed(step))
        flat.zero_grad()
        ours(x).square().mean().backward()
        with torch.no_grad():
            sgd.step(sgd.lr(epoch=0.0, batch_size=16))
        reference.zero_grad()
        theirs(x).square().mean().backward()
        reference.step()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_lr_schedule_and_batch_scaling() -> None:
    cfg = run_config("optim.lr=0.1", "optim.milestones=[2,4]", "optim.lr_scaling=linear",
                     "optim.base_batch=32").optim
    sgd = SGD(cfg, FlatModel(_tiny_model()))
    assert sgd.lr(0.0, 32) == pytest.approx(0.1)
    assert sgd.lr(2.5, 32) == pytest.approx(0.01)
    assert sgd.lr(4.0, 64) == pytest.approx(0.002)
    root = SGD(run_config("optim.lr=0.1", "optim.lr_scaling=sqrt", "optim.base_batch=32").optim,
               FlatModel(_tiny_model()))
    assert root.lr(0.0, 128) == pytest.approx(0.2)  # 4x the batch: 2x the rate


def test_cursor_hands_out_each_epoch_exactly_once() -> None:
    cursor = EpochCursor(num_examples=10, epochs=2.5, lock=mp.get_context("spawn").Lock())
    claims = []
    while (claim := cursor.claim(4)) is not None:
        claims.append(claim)
    assert claims == [(0, 0, 4), (0, 4, 4), (0, 8, 2), (1, 0, 4), (1, 4, 4), (1, 8, 2),
                      (2, 0, 4), (2, 4, 1)]


def test_a_claim_beats_while_another_holds_the_lock_and_gives_up_when_training_ends() -> None:
    # a worker stopped inside the lock must not make the others look hung: they beat
    lock = threading.Lock()
    cursor = EpochCursor(num_examples=10, epochs=1.0, lock=lock)
    beat, ended, results = threading.Event(), threading.Event(), []

    def waiting() -> bool:
        beat.set()
        return ended.is_set()

    def claimant() -> threading.Thread:
        # a daemon: a broken claim that never returns fails this test, not the session's exit
        thread = threading.Thread(target=lambda: results.append(cursor.claim_numbered(4, waiting)),
                                  daemon=True)
        thread.start()
        return thread

    lock.acquire()  # another worker is inside
    try:
        thread = claimant()
        assert beat.wait(timeout=60)  # it says it is alive while it waits
        lock.release()
        thread.join(timeout=60)
        assert results == [(0, 0, 4, 1)]
        lock.acquire()  # one that never lets go: the claim gives up once training has ended
        beat.clear()
        thread = claimant()
        assert beat.wait(timeout=60) and thread.is_alive()  # still waiting, and saying so
        ended.set()
        thread.join(timeout=60)
        assert not thread.is_alive() and results[-1] is None
        lock.release()
        # nothing went to the one that gave up
        assert cursor.claim_numbered(4, waiting) == (0, 4, 4, 2)
    finally:  # whatever failed: no claimant left waiting on a lock held for good
        ended.set()
        if lock.locked():
            lock.release()


def test_sparse_rows_equal_dense_rows() -> None:
    dense = sp.random(20, 7, density=0.3, format="csr", dtype=np.float32, random_state=0)
    sparse_rows, dense_rows = SharedRows.from_array(dense), SharedRows.from_array(dense.toarray())
    idx = torch.tensor([3, 0, 19, 3, 7])
    torch.testing.assert_close(sparse_rows.rows(idx).to_dense(), dense_rows.rows(idx))


def _single_worker(overrides: tuple[str, ...]) -> Worker:
    """The one worker of a single-device mix, in this process, on the run's initial model."""
    cfg = run_config(*overrides)
    dataset = load_dataset(cfg.dataset, cfg.seed, progress=False)
    problem = Problem.of(dataset)
    data = SharedData.from_arrays(dataset.x_train, dataset.y_train)
    state = SharedState.create(data, SharedMaster.initial(cfg.model, problem, cfg.seed),
                               cfg.budget.epochs, 1, mp.get_context("spawn"))
    spec, = expand(cfg.devices)
    return Worker(spec, cfg, problem, state)


def _single_worker_losses(overrides: tuple[str, ...]) -> tuple[list[StepRecord], torch.Tensor]:
    worker = _single_worker(overrides)
    records: list[StepRecord] = []
    worker.run(records.append)
    return records, worker.state.master.params.clone()


SYNC = ("algo=sync", "dataset=digits", "model=mlp", "budget.epochs=2", "optim.lr=0.05", "seed=3",
        "devices.groups.cpu.threads=1", "devices.groups.cpu.batch_size=32")


def test_single_worker_sync_is_bitwise_reproducible() -> None:
    first, params_first = _single_worker_losses(SYNC)
    second, params_second = _single_worker_losses(SYNC)
    assert [r.loss for r in first] == [r.loss for r in second]
    assert torch.equal(params_first, params_second)


def test_single_worker_sync_matches_a_bare_pytorch_loop() -> None:
    records, params = _single_worker_losses(SYNC)
    cfg = run_config(*SYNC)
    dataset = load_dataset(cfg.dataset, cfg.seed, progress=False)
    x, y = torch.from_numpy(dataset.x_train), torch.from_numpy(dataset.y_train)
    model = build_model(cfg.model, dataset.num_features, dataset.num_outputs, None, cfg.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    criterion = loss_fn(dataset.task)
    losses = []
    for epoch in range(2):
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(3 * 1_000_003 + epoch))
        for batch in order.split(32):
            optimizer.zero_grad()
            loss = criterion(model(x[batch]), y[batch])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert len(losses) == len(records)
    np.testing.assert_allclose([r.loss for r in records], losses, rtol=0, atol=1e-6)
    reference = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.testing.assert_close(params, reference, rtol=0, atol=1e-6)


def test_snapshots_are_due_by_time_or_epoch_and_thin_out_past_their_cap() -> None:
    snaps = Snapshots(every_s=1.0, every_epochs=0.5, max_count=4, max_bytes=1e9, snapshot_bytes=1)
    for t in range(5):
        assert snaps.due(float(t), 0.0)
        snaps.add(Snapshot(float(t), 0.0, [], torch.zeros(1), torch.zeros(0)), 0.0)
    assert [s.time_s for s in snaps.items] == [0.0, 2.0, 4.0]  # the first and newest kept
    assert not snaps.due(5.0, 0.9)  # both spacings doubled: next at 6 s or at epoch 1.0
    assert snaps.due(6.0, 0.0) and snaps.due(5.0, 1.0)
    # the memory cap: 10 bytes of 2-byte snapshots hold 5, however many the count allows;
    # never fewer than 4 (the first, the newest, and room to thin)
    assert Snapshots(1.0, None, max_count=80, max_bytes=10, snapshot_bytes=2).capacity == 5
    assert Snapshots(1.0, None, max_count=80, max_bytes=1, snapshot_bytes=2).capacity == 4


def test_a_checkpoints_snapshots_are_thinned_as_a_whole_where_a_resume_keeps_fewer() -> None:
    """50 snapshots 0.01 s apart into a cap of 8: halved three times (26, 14, 8), the spacing
    doubled as often. Added one by one they were thinned at almost every add: the spacing
    doubled 11 times, to 20.48 s, and the resumed run took no snapshot before its end."""
    kept = [Snapshot(t / 100, 0.0, [], torch.zeros(1), torch.zeros(0)) for t in range(50)]
    snaps = Snapshots(every_s=0.5, every_epochs=None, max_count=8, max_bytes=1e9,
                      snapshot_bytes=1)
    dropped = snaps.restore(kept, (0.01, math.inf), epoch=0.0)
    assert (snaps.every_s, len(snaps.items), len(dropped)) == (0.08, 8, 42)
    assert snaps.items[0] is kept[0] and snaps.items[-1] is kept[-1]
    assert snaps.next_time == pytest.approx(0.49 + 0.08)
    snaps = Snapshots(every_s=0.5, every_epochs=1.0, max_count=80, max_bytes=1e9,
                      snapshot_bytes=1)
    assert snaps.restore(kept, (0.04, 2.0), epoch=3.0) == [] and snaps.items == kept
    assert (snaps.every_s, snaps.next_time, snaps.next_epoch) == (0.04, pytest.approx(0.53), 4.0)


def test_a_worker_computes_a_steps_loss_only_when_it_reads_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused step never needs the mean loss; the worker reads it every LOSS_READ_S (here
    never, but at the first step and the last), so only those two steps compute it."""
    monkeypatch.setattr(worker_module, "LOSS_READ_S", 1e9)
    worker = _single_worker(SYNC)
    computed = []
    mean_loss = worker.train_step.loss
    worker.train_step.loss = lambda *args: computed.append(1) or mean_loss(*args)
    worker.run()
    assert int(worker.state.counters.row(0)["updates"]) > 10
    assert len(computed) == 2
