"""The virtual-clock engine: when steps read and land, shares, the controller on virtual time,
determinism, and what a simulated run says about itself."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from conftest import compose_config, run_config

from hetsgd import algorithms
from hetsgd.algorithms import adaptive
from hetsgd.algorithms.hogbatch import hogbatch_link
from hetsgd.config import RunConfig, to_run_config
from hetsgd.engines.common.links import default_link
from hetsgd.engines.common.memory import SharedMaster
from hetsgd.engines.common.worker import LOSS_READ_S
from hetsgd.engines.counters import RANK_COUNTERS
from hetsgd.engines.factory import build_engine
from hetsgd.engines.hooks import RankLoopHooks, step_choice
from hetsgd.engines.virtual.busy import BusyTime
from hetsgd.engines.virtual.coordinator import VirtualCoordinator
from hetsgd.engines.virtual.group import Meeting
from hetsgd.engines.virtual.mix import profiles_for
from hetsgd.engines.virtual.model_cost import ModelCost
from hetsgd.engines.virtual.profiles import ExchangeCost, RooflineProfile, load_calibration
from hetsgd.engines.virtual.ranks import VirtualRanks
from hetsgd.errors import UserError
from hetsgd.model.step import Step
from hetsgd.outputs.figure_style import time_label
from hetsgd.outputs.report import mix_label
from hetsgd.runs import runner
from hetsgd.runs.setup import RunData, load_run_data
from hetsgd.workers import WorkerSpec, expand


@dataclass(frozen=True)
class Fixed:
    """A device whose steps take ``per_step + per_example * batch`` seconds."""

    per_step: float
    per_example: float = 0.0
    copy: float = 0.0
    exchange: ExchangeCost | None = None
    name: str = "fixed"

    def compute_s(self, batch_size: int) -> float:
        return self.per_step + self.per_example * batch_size

    def copy_s(self) -> float:
        return self.copy

    def exchange_s(self, wait_s: float) -> float | None:
        return None if self.exchange is None else self.exchange(wait_s)


def _hogwild(*overrides: str) -> tuple[RunConfig, RunData]:
    cfg = run_config("algo=hogwild", "dataset=digits", "model=logreg", "devices=cpu",
                     "devices.simulated=true", "devices.groups.cpu.count=2",
                     "devices.groups.cpu.batch_size=16", "data.shuffle=false", "progress=false",
                     *overrides)
    return cfg, load_run_data(cfg, progress=False)


def _simulate(cfg: RunConfig, data: RunData, profiles: list, link=default_link,
              controller=None) -> tuple[VirtualCoordinator, SharedMaster]:
    master = SharedMaster.initial(cfg.model, data.problem, cfg.seed)
    engine = VirtualCoordinator(cfg, expand(cfg.devices), data.problem, data.train, master, None,
                                link, controller, profiles)
    engine.training = engine.run(None)
    return engine, master


def test_a_step_reads_the_model_at_its_start_and_lands_at_its_end() -> None:
    """Two Hogwild workers, steps of 1.0 and 2.5 virtual seconds, five chunks: worker 1's first
    step reads the initial model and lands at 2.5, after two of worker 0's, so it is stale by
    two updates. Replayed here with autograd from the definition."""
    num_examples = load_run_data(run_config("dataset=digits"), progress=False).train.num_examples
    cfg, data = _hogwild(f"budget.epochs={5 * 16 / num_examples}", "budget.seconds=null")
    _, master = _simulate(cfg, data, [Fixed(1.0), Fixed(2.5)])

    x, y = data.train.x.dense, data.train.y

    def update(params: torch.Tensor, chunk: int) -> torch.Tensor:
        model = data.problem.build_model(cfg.model, cfg.seed)
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(params, model.parameters())
        rows = slice(16 * chunk, 16 * chunk + 16)
        loss = torch.nn.functional.cross_entropy(model(x[rows]), y[rows].long())
        grads = torch.autograd.grad(loss, list(model.parameters()))
        return -cfg.optim.lr * torch.nn.utils.parameters_to_vector(grads)

    m0 = SharedMaster.initial(cfg.model, data.problem, cfg.seed).params
    m1 = m0 + update(m0, 0)  # t=1.0: worker 0's first step (chunk 0, read at 0)
    m2 = m1 + update(m1, 2)  # t=2.0: worker 0, chunk 2, read at 1.0
    m3 = m2 + update(m0, 1)  # t=2.5: worker 1, chunk 1, read at 0: two updates stale
    m4 = m3 + update(m2, 3)  # t=3.0: worker 0, chunk 3, read at 2.0
    m5 = m4 + update(m3, 4)  # t=5.0: worker 1, chunk 4, read at 2.5
    torch.testing.assert_close(master.params, m5, rtol=0, atol=1e-6)


def test_update_shares_and_busy_time_follow_the_profiles() -> None:
    cfg, data = _hogwild("budget.seconds=3.0", "budget.epochs=null", "monitor.interval_s=0.5")
    engine, _ = _simulate(cfg, data, [Fixed(0.013), Fixed(0.037)])
    training = engine.training
    # steps start until the budget (3.0 s) and the ones in flight then land: 231 x 0.013 = 3.003,
    # 82 x 0.037 = 3.034
    assert [row["updates"] for row in training.counters] == [231, 82]
    assert training.time_s == pytest.approx(3.034)
    assert [row["busy_s"] for row in training.counters] == pytest.approx([3.003, 3.034])
    # both host workers are busy all the time until the budget: two cores' worth; what is left
    # after the last sample, under half an interval, is not a row of its own
    rows = training.utilization
    assert [r["time_s"] for r in rows] == pytest.approx([0.5, 1.0, 1.5, 2.0, 2.5, 3.0])
    assert [r["workers_cpu_percent"] for r in rows] == pytest.approx([200.0] * 6)


def test_a_replica_pays_its_copies_and_its_device_idles_during_them() -> None:
    cfg = run_config("algo=hogbatch", "dataset=digits", "model=logreg", "devices=emulated",
                     "devices.simulated=true", "budget.seconds=1.98", "budget.epochs=null",
                     "monitor.interval_s=1.0", "progress=false")
    data = load_run_data(cfg, progress=False)
    engine, _ = _simulate(cfg, data, [Fixed(0.03, copy=0.01), Fixed(0.007)],
                          link=partial(hogbatch_link, merge="delta"))
    accel, host = engine.training.counters
    assert accel["updates"] == 40  # a step: a 0.01 s copy in, 0.03 s of compute, a copy out
    assert accel["comm_s"] == pytest.approx(0.8) and accel["busy_s"] == pytest.approx(1.2)
    assert accel["copy_s"] == pytest.approx(0.4)  # the copies in; the merges are the rest
    assert host["updates"] == 283 and host["comm_s"] == 0.0  # 283 x 0.007 = 1.981
    assert engine.training.utilization[0]["time_s"] == pytest.approx(1.0)
    assert engine.training.utilization[0]["gpu0_util"] == pytest.approx(60.0)
    assert engine.training.utilization[0]["workers_cpu_percent"] == pytest.approx(100.0)


@pytest.mark.parametrize("target", [0.25, 0.5])
def test_adaptive_steers_the_shares_toward_its_target_on_virtual_time(target: float) -> None:
    """Accelerator steps cost 0.02 s whatever the batch; the host's 0.00025 s per example: at
    the start (host batch 8) the accelerator makes 1/11 of the updates, and only a smaller host
    share lets it reach its target — which the controller gets by growing the host batches (the
    accelerator sits at its floor, 32). The accelerator's 50 updates a second are a share s of
    all where the host makes 50 (1 - s) / s, that is, at host batch 4000 / that = 80 s / (1 - s):
    27 at 0.25 (a controller that steered to 1 - s would settle at 240), 80 at 0.5."""
    cfg = run_config("algo=adaptive", "dataset=digits", "model=logreg", "devices=emulated",
                     "devices.simulated=true", "budget.seconds=20", "budget.epochs=null",
                     f"algo.target_share={target}", "algo.period_s=0.5", "algo.window_s=1.0",
                     "algo.max_host_batch=256", "progress=false")
    data = load_run_data(cfg, progress=False)
    plan = adaptive.plan(cfg, expand(cfg.devices))
    hooks = adaptive.hooks(plan)
    engine, _ = _simulate(plan.cfg, data, [Fixed(0.02), Fixed(0.0, per_example=0.00025)],
                          link=hooks.link, controller=hooks.controller)
    summary = engine.training.extra["adaptive"]
    assert summary["last_window_share"] == pytest.approx(target, abs=0.05)
    accel, host = summary["final_batch_sizes"][0], summary["final_batch_sizes"][1]
    assert accel == 32 and host == pytest.approx(80 * target / (1 - target), rel=0.1)
    assert len(engine.training.batches) > 2  # it resized, at virtual times within the budget
    assert all(0 < row["time_s"] <= 20 for row in engine.training.batches[2:])


def _whole_run(tmp_path: Path, name: str, *overrides: str) -> tuple[dict, Path]:
    """A run in ``tmp_path/run``, then moved to ``tmp_path/name`` (summary.json says where the
    run was written)."""
    cfg = compose_config(*overrides)
    summary = runner.run(to_run_config(cfg), tmp_path / "run", cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    run_dir = (tmp_path / "run").rename(tmp_path / name)
    return json.loads((run_dir / "summary.json").read_text()), run_dir


def _calibration(path: Path) -> Path:
    rows = [{"group": group, "device": "cpu", "kind": "cpu", "threads": 1, "batch_size": b,
             "examples_per_s": b / ms * 1000, "ms_per_step": ms, "comm_ms_per_step": comm}
            for group, comm in (("accel", 0.2), ("cpu", 0.0))
            for b, ms in ((1, 0.5), (16, 1.0), (256, 6.0))]
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


@pytest.mark.parametrize("algo", [
    ("algo=adaptive", "algo.period_s=0.2", "algo.window_s=0.4"),
    # ranks as threads: the same whatever the interleaving
    ("algo=local_sgd", "algo.tau=auto", "algo.biased.sampling=true"),
], ids=["adaptive", "local_sgd"])
def test_a_simulated_run_is_deterministic_and_says_it_is_simulated(tmp_path: Path,
                                                                   algo: tuple[str, ...]) -> None:
    overrides = (*algo, "dataset=digits", "model=mlp", "devices=emulated",
                 "devices.simulated=true",
                 f"devices.calibration={_calibration(tmp_path / 'calibration.csv')}",
                 "budget.seconds=1.5", "budget.epochs=null", "eval.every_s=0.25",
                 "monitor.interval_s=0.25", "progress=false")
    first, first_dir = _whole_run(tmp_path, "first", *overrides)
    _, second_dir = _whole_run(tmp_path, "second", *overrides)
    for name in ("convergence.csv", "workers.csv", "utilization.csv"):
        assert (first_dir / name).read_bytes() == (second_dir / name).read_bytes(), name
    # the same summary but for what the run cost, in real seconds: around its training, and
    # its training (the estimate from its first steps)
    second = json.loads((second_dir / "summary.json").read_text())
    assert first.pop("timing")["before_training_s"] > 0 and second.pop("timing")
    assert first.pop("simulation")["real_s"] > 0 and second.pop("simulation")
    # and how busy this machine was meanwhile: the simulator's CPU share, and its warning if any
    for summary in (first, second):
        assert summary.pop("contention")["measured"] == "simulator"
        summary["warnings"] = [w for w in summary.pop("warnings", None) or []
                               if not w.startswith("contention:")]
    assert first == second
    if algo[0] == "algo=adaptive":
        assert (first_dir / "batches.csv").read_bytes() == (second_dir / "batches.csv").read_bytes()
    assert len(pd.read_csv(first_dir / "convergence.csv")) >= 6
    assert first["simulated"] is True and first["emulated"] is False
    assert {g["label"] for g in first["mix"].values()} == {"simulated"}
    assert first["time_s"] == pytest.approx(1.5, abs=0.02)
    assert first["utilization"]["gpu_util_mean"] > 0
    assert mix_label(first) == "emulated (simulated)"
    assert time_label([first["simulated"]]) == "virtual time [s]"
    assert time_label([True, False]) == "time [s] (virtual for simulated runs)"


def test_what_the_virtual_clock_cannot_run_is_a_clear_error(tmp_path: Path) -> None:
    calibration = _calibration(tmp_path / "calibration.csv")
    cfg = run_config("dataset=digits")
    data = load_run_data(cfg, progress=False)
    master = SharedMaster.initial(cfg.model, data.problem, cfg.seed)
    cfg = run_config("algo=hogwild", "devices=cpu", "devices.simulated=true")
    plan = algorithms.get("hogwild").plan(cfg, expand(cfg.devices))
    with pytest.raises(UserError, match=r"^simulated group 'cpu' of devices=cpu has no device "
                                        r"profile: .*devices.calibration is not set"):
        build_engine(plan, algorithms.get("hogwild").hooks(plan), data.problem, data.train,
                    master, None)
    cfg = run_config("algo=sync", "devices=emulated", "devices.only=[cpu]",
                     "devices.simulated=true", f"devices.calibration={calibration}",
                     "checkpoint.every_s=5")
    plan = algorithms.get("sync").plan(cfg, expand(cfg.devices))
    with pytest.raises(UserError, match="^checkpoints on a simulated mix are taken for methods "
                                        "on ranks .*, not for workers on one shared model"):
        build_engine(plan, algorithms.get("sync").hooks(plan), data.problem, data.train,
                    master, None)


def test_a_simulated_cuda_group_needs_no_gpu() -> None:
    cfg = run_config("devices=cpu+gpu", "devices.simulated=true")
    specs = expand(cfg.devices)
    assert [(s.kind, s.device, s.label, s.emulated) for s in specs][0] == (
        "cuda", "cpu", "simulated", False)


# -- the distributed family ------------------------------------------------------------------------

@pytest.mark.parametrize("exchange", [None, ExchangeCost((0.0, 0.04), (0.001, 0.009))])
def test_simulated_sync_steps_at_the_slowest_ranks_pace(exchange: ExchangeCost | None) -> None:
    """Two ranks, 0.01 s and 0.03 s a step: every step ends at the slower one's pace plus the
    exchange (free between CPU cores, unless a calibration measured it: then its cost at the
    faster rank's wait, 0.02 s), and the faster one waits the difference in its exchange."""
    num_examples = load_run_data(run_config("dataset=digits"), progress=False).train.num_examples
    cfg = run_config("algo=sync", "dataset=digits", "model=logreg", "devices=cpu",
                     "devices.simulated=true", "devices.groups.cpu.count=2",
                     "devices.groups.cpu.batch_size=16", "progress=false",
                     f"budget.epochs={10 * 32 / num_examples}", "budget.seconds=null")
    data = load_run_data(cfg, progress=False)
    algorithm = algorithms.get("sync")
    plan = algorithm.plan(cfg, expand(cfg.devices))
    master = SharedMaster.initial(cfg.model, data.problem, cfg.seed)
    hooks = algorithm.hooks(plan)
    assert isinstance(hooks, RankLoopHooks)
    training = VirtualRanks(plan.cfg, plan.workers, data.problem, data.train, master, None,
                            hooks.loop, hooks.setup_summary,
                            [Fixed(0.01, exchange=exchange), Fixed(0.03, exchange=exchange)]
                            ).run(None)
    # each step's exchange carries the 650 gradients of logreg on digits, 3 flags and both
    # ranks' counters (RANK_COUNTERS), at a wait of 0.02 s (0.005 s); the counters' last
    # exchange, which both ranks reach together, is smaller than the model and costs a whole one
    # at no wait
    measured = exchange is not None
    per_step = 0.005 * (650 + 3 + 2 * len(RANK_COUNTERS)) / 650 if measured else 0.0
    assert training.time_s == pytest.approx(10 * (0.03 + per_step) + (0.001 if measured else 0.0))
    assert [row["updates"] for row in training.counters] == [10, 10]
    assert [row["busy_s"] for row in training.counters] == pytest.approx([0.1, 0.3])
    assert training.counters[0]["comm_s"] == pytest.approx(10 * (0.02 + per_step))
    assert training.counters[1]["comm_s"] == pytest.approx(10 * per_step)


# a model that draws from torch's global stream as it trains
DROPOUT_NET = """
from torch import nn


def mlp(in_features, num_outputs):
    return nn.Sequential(nn.Linear(in_features, 32), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(32, num_outputs))
"""


@pytest.fixture
def dropout_net(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, ...]:
    """The overrides of DROPOUT_NET, importable here and in spawned ranks."""
    (tmp_path / "dropnets.py").write_text(DROPOUT_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [
        str(tmp_path), os.environ.get("PYTHONPATH")])))
    return ("model=custom", "model._target_=dropnets.mlp")


@pytest.mark.integration
@pytest.mark.parametrize("dropout", [
    pytest.param(False, id="mlp"),
    pytest.param(True, id="dropout", marks=pytest.mark.wall)])  # a second pair of whole runs
def test_simulated_local_sgd_trains_the_real_engines_model_exactly(
        tmp_path: Path, request: pytest.FixtureRequest, dropout: bool) -> None:
    """The virtual clock runs the algorithm's own rank loop: biased local SGD on two ranks,
    fixed taus, ends with the very model the real engine's processes train (the all-reduce of
    two ranks is a sum either way round), and so does a model that draws dropout masks from
    the global stream (each simulated rank had the draws the threads' interleaving dealt it,
    run after run another model)."""
    model = request.getfixturevalue("dropout_net") if dropout else ("model=mlp",)
    common = ("algo=local_sgd", "dataset=digits", *model, "devices=emulated",
              "algo.tau={accel:2,cpu:3}", "algo.biased.sampling=true", "algo.aggregation=samples",
              "budget.epochs=2", "budget.seconds=null", "progress=false")
    real, _ = _whole_run(tmp_path, "real", *common)
    simulated, _ = _whole_run(tmp_path, "simulated", *common, "devices.simulated=true",
                              f"devices.calibration={_calibration(tmp_path / 'c.csv')}")
    assert simulated["simulated"] and not real["simulated"]
    assert simulated["updates_by_group"] == real["updates_by_group"]
    assert simulated["final"] == real["final"]


def test_a_local_sgd_rank_reads_its_loss_on_the_workers_cadence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a step's loss waits for a GPU, so a rank reads one every LOSS_READ_S of its
    clock and each round's last (the exchange's divergence flag), never every step; its busy
    time is still every step's profile time. Every read of a step's mean loss is counted."""
    reads: list[int] = []

    class CountedLoss(torch.Tensor):
        def __float__(self) -> float:
            reads.append(1)
            return super().__float__()

        def item(self) -> float:
            reads.append(1)
            return super().item()

    train = Step.__call__

    def counted(self: Step, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
        loss, losses = train(self, *args, **kwargs)
        return loss.as_subclass(CountedLoss), losses

    monkeypatch.setattr(Step, "__call__", counted)
    calibration = _calibration(tmp_path / "c.csv")
    summary, run_dir = _whole_run(
        tmp_path, "run", "algo=local_sgd", "algo.tau={accel:40,cpu:20}", "dataset=digits",
        "model=mlp", "devices=emulated", "devices.simulated=true",
        f"devices.calibration={calibration}", "budget.seconds=1", "budget.epochs=null",
        "progress=false")
    workers = pd.read_csv(run_dir / "workers.csv")
    rounds = workers["updates"] / workers["group"].map({"accel": 40, "cpu": 20})
    assert (rounds == rounds[0]).all() and rounds[0] >= 3
    # at least each round's last step, at most that plus one a LOSS_READ_S (virtual seconds)
    per_rank = rounds + summary["time_s"] / LOSS_READ_S + 1
    assert rounds.sum() <= len(reads) <= per_rank.sum() < workers["updates"].sum() / 4
    profiles = load_calibration(calibration)
    step_s = [profiles[w.group].compute_s(w.first_batch) for w in workers.itertuples()]
    assert workers["busy_s"].tolist() == pytest.approx((workers["updates"] * step_s).tolist())


def test_busy_time_counts_a_busy_workers_threads_and_an_accelerators_share() -> None:
    socket = WorkerSpec(0, "cpu", "cpu", "cpu", 18, 64, 1.0, False, simulated=True)
    gpu = WorkerSpec(1, "accel", "cuda", "cpu", 1, 64, 1.0, True, simulated=True)
    busy = BusyTime([socket, gpu])
    busy.compute(0, 0.0, 1.0)
    busy.compute(1, 0.25, 0.75)
    assert busy.sample(0.5) == {"time_s": 0.5, "workers_cpu_percent": 1800.0, "gpu0_util": 50.0}
    busy.compute(1, 0.8, 1.2)  # its next step, partly after the next sample
    assert busy.sample(1.0) == pytest.approx(
        {"time_s": 1.0, "workers_cpu_percent": 1800.0, "gpu0_util": 100 * (0.25 + 0.2) / 0.5})
    assert not busy.due(1.2, 0.5, closing=True) and busy.due(1.25, 0.5, closing=True)


def test_a_simulated_world_of_gpus_needs_no_collective_backend() -> None:
    """NCCL is what a real all-GPU world would take; a CPU build of torch has none, and a
    simulated world needs none."""
    cfg = run_config("algo=local_sgd", "algo.tau=auto", "devices=paper_biased_local",
                     "devices.only=[accel]", "dist.backend=nccl")
    plan = algorithms.get("local_sgd").plan(cfg, expand(cfg.devices))
    assert plan.settled["tau"] == "from the device profiles"
    # nccl with CPU ranks is an error on any real machine, with or without NCCL
    for algo in ("local_sgd", "sync"):
        cfg = run_config(f"algo={algo}", "devices=paper_biased_local", "dist.backend=nccl")
        assert algorithms.get(algo).plan(cfg, expand(cfg.devices)).workers


def test_a_lone_simulated_worker_is_snapshotted_as_it_trains() -> None:
    cfg, data = _hogwild("devices.groups.cpu.count=1", "budget.seconds=1.0", "budget.epochs=null",
                         "eval.every_s=0.1", "eval.every_epochs=null")
    engine, _ = _simulate(cfg, data, [Fixed(0.013)])
    times = [s.time_s for s in engine.training.snapshots]
    assert len(times) == 11 and times[0] == 0.0 and times[-1] == pytest.approx(1.001)
    assert max(b - a for a, b in zip(times, times[1:])) < 0.12


def test_a_setup_collective_advances_the_clocks_but_runs_no_duties() -> None:
    """The setup's broadcasts meet as training's collectives do, but before the clocks start:
    a snapshot, a sample or the cost probe's first tick there would time the setup."""
    met: list[float] = []
    profile = Fixed(0.0, exchange=lambda wait_s: 0.25)  # type: ignore[arg-type]
    clocks = [SimpleNamespace(time=0.0, times=SimpleNamespace(copy_s=lambda: 0.0,
                                                               profile=profile))]
    meeting = Meeting(clocks, 4, met.append)  # type: ignore[arg-type]
    meeting.slots[0] = torch.ones(1)
    meeting.barrier.wait()  # the parameters' broadcast
    assert (clocks[0].time, met) == (0.25, [])
    meeting.start(rank=0)
    assert clocks[0].time == 0.0
    meeting.barrier.wait()  # training's first all-reduce
    assert (clocks[0].time, met) == (0.25, [0.25])


@pytest.mark.parametrize(("overrides", "said"), [
    (("devices.groups.cpu.batch_size=128",),
     "devices.groups.cpu.batch_size=128 is above algo.max_host_batch=64"),
    (("algo.max_accel_batch=128",),
     "devices.groups.accel.batch_size=256 is above algo.max_accel_batch=128")])
def test_adaptive_refuses_a_batch_that_starts_above_its_bound(overrides: tuple[str, ...],
                                                             said: str) -> None:
    """The controller would report the bound as the batch and never resize the worker to it
    (a host at 128 under a bound of 64), or halve a batch it meant to grow."""
    cfg = run_config("algo=adaptive", "devices=emulated", *overrides)
    with pytest.raises(UserError, match=f"^{re.escape(said)}, the most Adaptive resizes it to"):
        adaptive.plan(cfg, expand(cfg.devices))
    default = run_config("algo=adaptive", "devices=emulated")
    assert adaptive.plan(default, expand(default.devices)).workers  # within their bounds


def test_sync_on_ranks_is_costed_as_the_autograd_step_it_takes() -> None:
    """Its ranks exchange the gradient between a step's halves, so they take the autograd step
    whatever optim.step says: the virtual clock costs that step, not the fused one."""
    cfg = run_config("algo=sync", "dataset=digits", "model=mlp", "devices=paper_biased_local")
    algorithm, cfg = algorithms.choose(cfg)
    plan = algorithm.plan(cfg, expand(cfg.devices))
    hooks = algorithm.hooks(plan)
    assert (plan.cfg.optim.step, step_choice(plan.cfg, hooks)) == ("auto", "autograd")
    problem = load_run_data(plan.cfg, progress=False).problem
    taken = profiles_for(plan.cfg, plan.workers, problem, step_choice(plan.cfg, hooks))[0]
    fused = profiles_for(plan.cfg, plan.workers, problem, plan.cfg.optim.step)[0]
    assert isinstance(taken, RooflineProfile) and isinstance(fused, RooflineProfile)
    assert taken.cost == ModelCost.of(problem.build_model(plan.cfg.model, plan.cfg.seed),
                                      (problem.num_features,), "multiclass", "autograd")
    assert taken.compute_s(64) > fused.compute_s(64)  # more kernels, more passes
    algorithm, hogwild = algorithms.choose(run_config("algo=hogwild", "devices=cpu"))
    workers = algorithm.hooks(algorithm.plan(hogwild, expand(hogwild.devices)))
    assert step_choice(hogwild, workers) == "auto"  # workers take optim.step


def test_a_calibration_of_another_step_than_the_runs_is_refused(tmp_path: Path) -> None:
    """A default calibration times the fused step of mlp; sync's ranks take the autograd step,
    up to twice as slow, so simulated sync on it ran that much too fast."""
    path = _calibration(tmp_path / "c.csv")
    rows = pd.read_csv(path)
    algorithm, cfg = algorithms.choose(run_config(
        "algo=sync", "dataset=digits", "model=mlp", "devices=emulated", "devices.simulated=true",
        f"devices.calibration={path}"))
    plan = algorithm.plan(cfg, expand(cfg.devices))
    taken = step_choice(plan.cfg, algorithm.hooks(plan))
    problem = load_run_data(plan.cfg, progress=False).problem
    assert len(profiles_for(plan.cfg, plan.workers, problem, taken)) == 2  # a file of before
    rows.assign(step="fused").to_csv(path, index=False)
    with pytest.raises(UserError, match=re.escape(
            f"devices.calibration={path} timed group 'accel' taking the fused step, and this "
            "run's workers take the autograd step: calibrate with `hetsgd machine --calibrate "
            "optim.step=autograd ...`")):
        profiles_for(plan.cfg, plan.workers, problem, taken)
    assert profiles_for(plan.cfg, plan.workers, problem, "auto")  # Hogbatch's workers: fused
    rows.assign(step="autograd").to_csv(path, index=False)
    assert profiles_for(plan.cfg, plan.workers, problem, taken)
    rows.assign(step=["fused", "autograd"] * (len(rows) // 2)).to_csv(path, index=False)
    with pytest.raises(UserError, match="step=autograd is not allowed: one of fused, autograd, "
                                        "the same in every row of the group"):
        profiles_for(plan.cfg, plan.workers, problem, taken)


def test_simulated_workers_draw_from_streams_seeded_by_the_run_and_give_the_caller_s_back(
) -> None:
    """A researcher's dropout on the virtual clock drew from whatever the caller's global
    streams held (the same masks in every seed of a sweep, and a caller's stream moved)."""
    import random

    import numpy as np

    from hetsgd.engines.virtual.mix import simulated_math

    def draws(seed: int) -> tuple:
        cfg = run_config("devices=cpu", "devices.simulated=true", f"seed={seed}")
        with simulated_math(cfg, expand(cfg.devices)):
            return torch.rand(2).tolist(), np.random.rand(), random.random()

    saved = np.random.get_state(), random.getstate()  # this test process's, put back after
    with torch.random.fork_rng(devices=[]):
        try:
            torch.manual_seed(123)
            np.random.seed(123)
            random.seed(123)
            mine = torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()
            first = draws(1)
            assert draws(1) == first  # the same seed, the same draws, wherever the caller's were
            other = draws(2)
            assert all(a != b for a, b in zip(first, other))
            assert torch.equal(torch.get_rng_state(), mine[0])
            assert np.array_equal(np.random.get_state()[1], mine[1])
            assert random.getstate() == mine[2]
        finally:
            np.random.set_state(saved[0])
            random.setstate(saved[1])
