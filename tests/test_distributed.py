"""Distributed ranks: sync on two gloo ranks against DistributedDataParallel, local SGD against
PeriodicModelAverager, a dead rank ending the run, and two torchrun "nodes" on one machine."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import compose_config, run_config
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
from torch.nn.parallel import DistributedDataParallel

from hetsgd import algorithms
from hetsgd.algorithms.sync import split
from hetsgd.config import RunConfig, to_run_config
from hetsgd.data import load_dataset
from hetsgd.engines import processes
from hetsgd.engines.common.memory import SharedData, SharedMaster
from hetsgd.engines.factory import build_engine
from hetsgd.engines.ranks.group import RankLost, free_port
from hetsgd.engines.reports import reporting
from hetsgd.engines.training import OnTick, Training
from hetsgd.model.architectures import build_model
from hetsgd.model.flat import FlatModel
from hetsgd.model.losses import loss_fn
from hetsgd.model.problem import Problem
from hetsgd.runs import runner
from hetsgd.workers import expand

ROOT = Path(__file__).resolve().parents[1]
# Two groups on the CPU, the second one 10x slower by emulation.
EMULATED = ("dataset=digits", "model=mlp", "devices=emulated", "devices.groups.accel.batch_size=32",
            "devices.groups.cpu.batch_size=8", "devices.groups.cpu.slowdown=10")
TWO_RANKS = ("dataset=digits", "model=mlp", "devices=cpu", "devices.groups.cpu.count=2",
             "devices.groups.cpu.batch_size=32", "seed=5", "eval.every_s=100",
             "eval.every_epochs=null")


class NoMonitor:
    def __init__(self, pids: Callable[[], list[int]]) -> None:
        self.pids = pids

    def start(self) -> None: ...

    def set_time_origin(self, t0: float) -> None: ...

    def stop(self) -> list:
        return []


def _train(cfg: RunConfig, on_tick: OnTick | None = None,
           monitors: list[NoMonitor] | None = None) -> tuple[Training, torch.Tensor]:
    """The coordinator of cfg's algorithm, run in-process; the master's final parameters."""
    dataset = load_dataset(cfg.dataset, cfg.seed, progress=False)
    problem = Problem.of(dataset)
    data = SharedData.from_arrays(dataset.x_train, dataset.y_train)
    master = SharedMaster.initial(cfg.model, problem, cfg.seed)
    algorithm = algorithms.get(cfg.algo.name)
    plan = algorithm.plan(cfg, expand(cfg.devices))

    def monitor(pids: Callable[[], list[int]]) -> NoMonitor:
        made = NoMonitor(pids)
        if monitors is not None:
            monitors.append(made)
        return made

    engine = build_engine(plan, algorithm.hooks(plan), problem, data, master, on_tick)
    training = engine.run(monitor)
    return training, master.params.clone()


def _run(run_dir: Path, *overrides: str) -> dict:
    """One whole run through the runner, as `hetsgd run` does it."""
    cfg = compose_config(*overrides, "progress=false")
    summary = runner.run(to_run_config(cfg), run_dir, cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    return summary


def _reference(fn: Callable, cfg: RunConfig, *args) -> torch.Tensor:
    """Run fn(rank, port, cfg, out, *args) on two gloo ranks; rank 0's parameters. The ranks
    are forks of the forkserver the run's own ranks came from (torch imported once), not
    fresh interpreters."""
    out = torch.zeros_like(FlatModel(_model(cfg)).params).share_memory_()
    processes.warm_up("forkserver")
    mp.start_processes(fn, args=(free_port("127.0.0.1"), cfg, out, *args), nprocs=2,
                       start_method="forkserver")
    return out


def _model(cfg: RunConfig) -> torch.nn.Module:
    dataset = load_dataset(cfg.dataset, cfg.seed, progress=False)
    return build_model(cfg.model, dataset.num_features, dataset.num_outputs, None, cfg.seed)


def _join(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)


def _leave(rank: int, model: torch.nn.Module, out: torch.Tensor) -> None:
    if rank == 0:
        out.copy_(torch.cat([p.detach().flatten() for p in model.parameters()]))
    dist.barrier()  # nobody tears the group down while the other still uses it
    dist.destroy_process_group()
    # DDP's C++ threads can abort the interpreter's teardown ("terminate called without an active
    # exception"); the result is in shared memory already, so leave without one.
    os._exit(0)


def _permutation(cfg: RunConfig, n: int, epoch: int) -> torch.Tensor:
    """The documented data order: one seeded permutation per epoch (or reshuffle period)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch))


def test_split_is_equal_or_proportional_and_gives_everyone_a_share() -> None:
    assert split(64, [1.0, 1.0]) == [32, 32]
    assert split(5, [1.0, 1.0]) == [3, 2]
    assert split(100, [3.0, 1.0]) == [75, 25]
    assert split(10, [1000.0, 1.0]) == [9, 1]
    assert split(1, [1.0, 1.0]) == [1, 0]
    # 3.33 and 6.67 floor to 3 and 6: the example left goes to the larger remainder
    assert split(10, [1.0, 2.0]) == [3, 7]
    assert split(10, [2.0, 1.0]) == [7, 3]  # not the last worker's: the larger remainder's


def test_one_sync_worker_steps_on_the_global_batch_asked_for() -> None:
    """One worker: its batch is algo.global_batch where one is given (it was left unread)."""
    for given, batch in ((None, 64), (48, 48)):
        cfg = run_config("algo=sync", "devices=single_cpu", "devices.groups.cpu.batch_size=64",
                         f"algo.global_batch={'null' if given is None else given}")
        algorithm, cfg = algorithms.choose(cfg)
        plan = algorithm.plan(cfg, expand(cfg.devices))
        assert [w.batch_size for w in plan.workers] == [batch]
        assert plan.settled == ({} if given is None else {"global_batch": 48})


def test_a_sync_rank_s_batch_sizes_are_its_shard_of_the_global_batch(tmp_path: Path) -> None:
    """workers.csv said each rank took its group's 16 where it took 20 of a global 40: the time
    split's milliseconds per update were then of another batch size than shown."""
    _run(tmp_path, "algo=sync", "devices=cpu", "devices.groups.cpu.count=2",
         "devices.groups.cpu.batch_size=16", "algo.global_batch=41", "devices.simulated=true",
         "devices.groups.cpu.profile=xeon_e5_2686v4_core", "budget.epochs=0.2",
         "budget.seconds=null")
    workers = pd.read_csv(tmp_path / "workers.csv")
    # unequal shards, so that a rank given another's would show
    assert workers["first_batch"].tolist() == workers["last_batch"].tolist() == [21, 20]


@pytest.mark.integration
@pytest.mark.wall
def test_sync_splits_the_global_batch_in_proportion_to_measured_speed(tmp_path: Path) -> None:
    summary = _run(tmp_path, "algo=sync", "algo.split=proportional", *EMULATED,
                   "devices.groups.cpu.batch_size=32", "budget.epochs=0.5")
    shares = summary["sync"]["batch_share"]
    assert shares["accel"] > shares["cpu"]  # the emulated 10x slower group gets the smaller part
    assert sum(shares.values()) == pytest.approx(1.0)
    assert summary["examples"] == round(0.5 * 1437)


def _ddp_rank(rank: int, port: int, cfg: RunConfig, out: torch.Tensor, steps: int) -> None:
    _join(rank, port)
    dataset = load_dataset(cfg.dataset, cfg.seed, progress=False)
    x, y = torch.from_numpy(dataset.x_train), torch.from_numpy(dataset.y_train)
    model = _model(cfg)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr, momentum=cfg.optim.momentum,
                          weight_decay=cfg.optim.weight_decay)
    criterion = loss_fn(dataset.task)
    order = _permutation(cfg, len(y), 0)
    shard = 32
    for step in range(steps):
        idx = order[step * 2 * shard + rank * shard:][:shard]
        opt.zero_grad()
        criterion(ddp(x[idx]), y[idx]).backward()
        opt.step()
    _leave(rank, model, out)


@pytest.mark.integration
@pytest.mark.wall
def test_sync_with_an_equal_split_equals_distributed_data_parallel() -> None:
    steps = 8
    cfg = run_config(*TWO_RANKS, "algo=sync", "algo.split=equal", "optim.lr=0.05",
                     "optim.momentum=0.9", "optim.weight_decay=1e-4",
                     f"budget.epochs={steps * 64 / 1437!r}")
    training, ours = _train(cfg)
    assert training.status == "completed", training.error
    assert [int(c["updates"]) for c in training.counters] == [steps, steps]
    assert sum(c["examples"] for c in training.counters) == steps * 64
    theirs = _reference(_ddp_rank, cfg, steps)
    assert (ours - FlatModel(_model(cfg)).params).abs().max() > 1e-3  # it did train
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def _averager_rank(rank: int, port: int, cfg: RunConfig, out: torch.Tensor, tau: int,
                   rounds: int) -> None:
    _join(rank, port)
    dataset = load_dataset(cfg.dataset, cfg.seed, progress=False)
    x, y = torch.from_numpy(dataset.x_train), torch.from_numpy(dataset.y_train)
    model = _model(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr)
    averager = PeriodicModelAverager(period=tau, warmup_steps=tau - 1)  # after every tau steps
    criterion = loss_fn(dataset.task)
    batch, n = 32, len(y)
    per_round = 2 * tau * batch
    period = n // per_round  # rounds between reshuffles; each rank walks its contiguous shard
    for round_ in range(rounds):
        reshuffle, offset = divmod(round_, period)
        shard = _permutation(cfg, n, reshuffle)[rank * period * tau * batch:]
        for step in range(tau):
            idx = shard[(offset * tau + step) * batch:][:batch]
            opt.zero_grad()
            criterion(model(x[idx]), y[idx]).backward()
            opt.step()
            averager.average_parameters(model.parameters())
    _leave(rank, model, out)


@pytest.mark.integration
@pytest.mark.wall
def test_balanced_local_sgd_equals_periodic_model_averaging() -> None:
    tau, rounds = 3, 9  # 7 rounds per reshuffle on digits: the second period is covered too
    cfg = run_config(*TWO_RANKS, "algo=local_sgd", f"algo.tau={tau}", "algo.aggregation=uniform",
                     "optim.lr=0.05", "optim.momentum=0",
                     f"budget.epochs={rounds * 2 * tau * 32 / 1437!r}")
    training, ours = _train(cfg)
    assert training.status == "completed", training.error
    assert [int(c["updates"]) for c in training.counters] == [rounds * tau] * 2
    theirs = _reference(_averager_rank, cfg, tau, rounds)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


@pytest.mark.integration
@pytest.mark.wall
@pytest.mark.serial  # bounds the wall time from the kill to the failure
def test_a_killed_rank_fails_the_run_within_the_collective_timeout() -> None:
    timeout_s = 10.0
    cfg = run_config(*TWO_RANKS, "algo=local_sgd", "algo.tau=2", "budget.epochs=null",
                     "budget.seconds=120", f"dist.timeout_s={timeout_s}")
    monitors: list[NoMonitor] = []
    killed: list[float] = []

    def kill_rank_1(elapsed: float, counters) -> None:
        if not killed and counters.column("updates")[1] >= 20:
            os.kill(monitors[0].pids()[1], signal.SIGKILL)
            killed.append(time.perf_counter())

    training, _ = _train(cfg, kill_rank_1, monitors)
    assert killed, "rank 1 was never killed"
    assert training.status == "failed"
    assert time.perf_counter() - killed[0] < timeout_s + 20
    assert "rank 1" in training.error or "collective failed" in training.error


def _torchrun_nodes(tmp_path: Path, overrides: dict[int, list[str]]) -> tuple[list[int], str]:
    """`hetsgd run` as node 0 and node 1 of a two-node torchrun launch on this machine, each with
    its overrides: the nodes' exit codes and their output."""
    port = free_port("127.0.0.1")
    env = dict(os.environ, HETSGD_RESULTS=str(tmp_path / "results"), PYTHONPATH=str(ROOT))
    torchrun = Path(sys.executable).with_name("torchrun")
    nodes = [subprocess.Popen(
        [str(torchrun), "--nnodes=2", "--nproc-per-node=1", f"--node-rank={node}",
         "--master-addr=127.0.0.1", f"--master-port={port}", "-m", "hetsgd", "run",
         *overrides[node], "progress=false"],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node in (0, 1)]
    try:
        outputs = [node.communicate(timeout=120)[0] for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    return [node.returncode for node in nodes], "\n".join(outputs)


def _reported(exc: BaseException) -> str:
    """What a rank's process reports when its body raised ``exc``."""
    reports: queue.SimpleQueue = queue.SimpleQueue()
    state = SimpleNamespace(signals=SimpleNamespace(retire=lambda rank: None,
                                                    stop=threading.Event()))
    with reporting(1, state, reports):  # type: ignore[arg-type]
        raise exc
    return reports.get()[2]


def test_a_follower_says_a_peers_end_in_one_line_and_its_own_failure_with_its_traceback() -> None:
    """A rank that another's end released prints its RankLost line alone: its traceback is the
    broken collective's, not the cause. Its own failure keeps the traceback, which a follower
    (which writes no files) keeps nowhere else."""
    from hetsgd.runs.follow import _said

    released = _reported(RankLost("rank 1: a collective failed (another rank died)"))
    assert "Traceback" in released
    assert _said(released) == released.splitlines()[0]
    assert _said(released).startswith("RankLost: rank 1: a collective failed")
    own = _reported(ValueError("a bad shape"))
    assert _said(own) == own and "Traceback" in own


@pytest.mark.integration
@pytest.mark.wall
def test_two_torchrun_nodes_on_one_machine_leave_one_run_directory(tmp_path: Path) -> None:
    """Node 1 is given other overrides on purpose: followers train with the plan rank 0
    resolved and handed over, never with a config of their own."""
    codes, output = _torchrun_nodes(tmp_path, {
        0: ["algo=local_sgd", "algo.tau=2", *TWO_RANKS, "budget.epochs=1"],
        1: ["algo=local_sgd", "algo.tau=5", *TWO_RANKS, "budget.epochs=3"]})
    assert codes == [0, 0], output
    runs = list((tmp_path / "results" / "runs").iterdir())
    assert len(runs) == 1, runs
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["status"] == "completed", summary["error"]
    assert 1 <= summary["epochs"] < 1.5
    assert summary["updates_by_group"]["cpu"] > 0
    assert summary["local_sgd"]["tau"] == {"cpu": 2}


@pytest.mark.integration
@pytest.mark.wall
def test_a_run_that_diverges_under_torchrun_says_so_in_its_directory(tmp_path: Path) -> None:
    """Every rank sees the divergence at the same exchange; the follower's node ending first
    (exit 1) leaves rank 0 to evaluate and write the run's end."""
    args = ["algo=sync", *TWO_RANKS, "budget.epochs=3", "optim.lr=1e30"]
    codes, output = _torchrun_nodes(tmp_path, {0: args, 1: args})
    assert codes[0] != 0 and codes[1] != 0, output  # torchrun's own code for a failed rank
    run_dir, = (tmp_path / "results" / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "diverged", output
    assert "rank 1 diverged" in output, output


@pytest.mark.integration
@pytest.mark.wall
@pytest.mark.parametrize("checkpoints", ["checkpoint.every_s=1", "resume=results/runs/x"])
def test_checkpoints_under_torchrun_are_a_one_line_error_on_every_node(
        tmp_path: Path, checkpoints: str) -> None:
    args = ["algo=local_sgd", *TWO_RANKS, "budget.epochs=1", checkpoints]
    codes, output = _torchrun_nodes(tmp_path, {0: args, 1: args})
    assert codes[0] != 0 and codes[1] != 0, output
    assert output.count("checkpoints are not supported under torchrun") == 2, output
    assert f'File "{ROOT / "hetsgd"}' not in output, output  # torchrun's own traceback only
    run_dir, = (tmp_path / "results" / "runs").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"


@pytest.mark.integration
@pytest.mark.wall
@pytest.mark.gpu
@pytest.mark.parametrize("algo", ["sync", "local_sgd"])
def test_a_gpu_rank_and_a_cpu_rank_train_together_over_gloo(tmp_path: Path, algo: str) -> None:
    summary = _run(tmp_path, f"algo={algo}", "dataset=digits", "model=mlp", "devices=cpu+gpu",
                   "devices.groups.cpu.count=1", "devices.groups.accel.batch_size=256",
                   "budget.epochs=3")
    assert summary["final"]["train_loss"] < summary["initial"]["train_loss"]
    assert set(summary["updates_by_group"]) == {"accel", "cpu"}


@pytest.mark.integration
@pytest.mark.wall
@pytest.mark.gpu(2)
@pytest.mark.parametrize("algo", ["sync", "local_sgd"])
def test_gpu_ranks_train_over_nccl(tmp_path: Path, algo: str) -> None:
    summary = _run(tmp_path, f"algo={algo}", "dataset=digits", "model=mlp", "devices=gpus",
                   "devices.groups.accel.count=2", "dist.backend=nccl", "budget.epochs=3")
    assert summary["final"]["train_loss"] < summary["initial"]["train_loss"]
