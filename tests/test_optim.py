"""The ``optim`` group and outer optimizers: ``optim=torch`` steps as torch's own optimizer and
scheduler do, its state and an outer optimizer's survive a checkpoint, plain SGD stays the
default with its fused step, a wrong class or argument is one line, and an engine that cannot
use a torch optimizer refuses it; the check of issue 46: DiLoCo with AdamW inside and Nesterov
outside, stopped at a checkpoint and resumed, ends where a straight run ends, on gloo ranks and
on the virtual clock."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import run_config
from test_checkpoint import _final_model, _new_run
from test_cli_basics import errors
from test_cli_basics import hetsgd as hetsgd_command
from test_own_method import package  # noqa: F401 - the page's package, a fixture

import hetsgd
from hetsgd.config import SGDConfig, Target, TorchOptimConfig
from hetsgd.engines.checkpoint import Checkpoint
from hetsgd.errors import UserError
from hetsgd.model.flat import FlatModel
from hetsgd.model.optimizer import OuterOptimizer, check_optimizers
from hetsgd.model.step import AutogradStep, FusedMlpStep, build_step
from hetsgd.outputs import journal
from hetsgd.outputs.index import read_summary

ADAMW = ("optim=torch", "optim._target_=torch.optim.AdamW", "optim.lr=0.01",
         "+optim.weight_decay=0.05")
COSINE = "optim.scheduler={_target_:torch.optim.lr_scheduler.CosineAnnealingLR,T_max:4}"


def _net() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 6, generator=generator), torch.randint(0, 3, (16,), generator=generator))
            for _ in range(n)]


def test_sgd_is_the_default_and_torch_takes_its_arguments_from_the_command_line() -> None:
    assert type(run_config().optim) is SGDConfig
    optim = run_config(*ADAMW, COSINE).optim
    assert isinstance(optim, TorchOptimConfig)
    assert optim.optimizer == Target("optim._target_", "torch.optim.AdamW",
                                     {"lr": 0.01, "weight_decay": 0.05})
    assert optim.lr_scheduler == Target("optim.scheduler._target_",
                                        "torch.optim.lr_scheduler.CosineAnnealingLR", {"T_max": 4})


def test_a_torch_optimizer_and_scheduler_step_as_torchs_own() -> None:
    net, reference = _net(), _net()
    step = build_step("auto", FlatModel(net), run_config(*ADAMW, COSINE).optim, "multiclass")
    assert isinstance(step, AutogradStep)  # `auto` on an MLP: no fused step for AdamW
    optimizer = torch.optim.AdamW(reference.parameters(), lr=0.01, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4)
    for x, y in _batches(6):
        step(x, y, 0.0, len(x))
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        optimizer.step()
        scheduler.step()
    for ours, theirs in zip(net.parameters(), reference.parameters()):
        assert torch.equal(ours, theirs)


def test_torchs_sgd_by_target_steps_as_the_built_in_sgd() -> None:
    built_in = FlatModel(_net())
    by_target = FlatModel(_net())
    steps = [build_step("autograd", built_in, run_config("optim.momentum=0.9", "optim.lr=0.05",
                                                         "optim.weight_decay=0.01").optim,
                        "multiclass"),
             build_step("auto", by_target, run_config(
                 "optim=torch", "optim.lr=0.05", "+optim.momentum=0.9",
                 "+optim.weight_decay=0.01").optim, "multiclass")]
    for x, y in _batches(5):
        for step in steps:
            step(x, y, 0.0, len(x))
    torch.testing.assert_close(by_target.params, built_in.params)
    assert not torch.equal(by_target.params, FlatModel(_net()).params)  # it trained


def test_without_a_scheduler_the_runs_lr_schedule_holds() -> None:
    optim = run_config("optim=torch", "optim.lr=0.5", "optim.milestones=[1]").optim
    step = build_step("autograd", FlatModel(_net()), optim, "multiclass")
    assert step.optimizer.lr(0.5, 16) == 0.5 and step.optimizer.lr(1.0, 16) == pytest.approx(0.05)
    x, y = _batches(1)[0]
    step(x, y, 1.0, 16)
    assert [g["lr"] for g in step.optimizer.state_dict()["optimizer"]["param_groups"]] == \
        [pytest.approx(0.05)]


def test_plain_sgd_keeps_the_fused_step() -> None:
    assert isinstance(build_step("auto", FlatModel(_net()), SGDConfig(), "multiclass"),
                      FusedMlpStep)
    with pytest.raises(ValueError, match="the fused step is plain SGD's"):
        run_config("optim=torch", "optim.step=fused")


def _trained(optim: TorchOptimConfig, batches: list[tuple[torch.Tensor, torch.Tensor]],
             params: torch.Tensor | None = None, state: dict | None = None
             ) -> tuple[torch.Tensor, dict]:
    """The flat parameters after ``batches`` (from ``params`` and optimizer ``state`` if given),
    and the optimizer's state then, as a checkpoint takes it."""
    flat = FlatModel(_net())
    step = build_step("auto", flat, optim, "multiclass")
    if params is not None:
        flat.params.copy_(params)
    if state is not None:
        step.optimizer.load_state_dict(state)
    for x, y in batches:
        step(x, y, 0.0, len(x))
    return flat.params.clone(), step.optimizer.state_dict()


def test_a_resumed_optimizer_steps_as_one_that_never_stopped() -> None:
    optim = run_config(*ADAMW, COSINE).optim
    assert isinstance(optim, TorchOptimConfig)
    batches = _batches(6)
    straight, _ = _trained(optim, batches)
    at_3, state = _trained(optim, batches[:3])
    resumed, _ = _trained(optim, batches[3:], at_3, state)
    assert torch.equal(resumed, straight)
    forgot, _ = _trained(optim, batches[3:], at_3)
    assert not torch.allclose(forgot, straight, atol=1e-4)


def test_the_state_a_checkpoint_takes_is_a_copy() -> None:
    step = build_step("auto", FlatModel(_net()), run_config(*ADAMW).optim, "multiclass")
    x, y = _batches(1)[0]
    step(x, y, 0.0, 16)
    taken = step.optimizer.state_dict()["optimizer"]["state"][0]["exp_avg"]
    before = taken.clone()
    step(x, y, 0.0, 16)
    assert torch.equal(taken, before)
    assert not torch.equal(step.optimizer.state_dict()["optimizer"]["state"][0]["exp_avg"], before)


def test_an_outer_sgd_step_is_nesterov_on_the_rounds_change() -> None:
    params = torch.randn(5)
    outer = OuterOptimizer(Target("algo.outer._target_", "torch.optim.SGD",
                                  {"lr": 0.7, "momentum": 0.9, "nesterov": True}), params)
    model, velocity = params.clone(), torch.zeros(5)
    for _ in range(3):
        params.add_(torch.randn(5))  # the round's average
        change = model - params
        velocity.mul_(0.9).add_(change)
        model -= 0.7 * (change + 0.9 * velocity)
        outer.step()
        torch.testing.assert_close(params, model)
    averaging = OuterOptimizer(Target("algo.outer._target_", "torch.optim.SGD", {"lr": 1.0}),
                               params)
    params.add_(1.0)
    expected = params.clone()
    averaging.step()
    torch.testing.assert_close(params, expected)  # lr 1: the average itself
    halfway = OuterOptimizer(Target("algo.outer._target_", "torch.optim.SGD", {"lr": 0.5}),
                             params)
    start = params.clone()
    params.add_(1.0)
    halfway.step()
    torch.testing.assert_close(params, start + 0.5)  # lr 0.5: half the way to the average


@pytest.mark.parametrize(("overrides", "line"), [
    ((*ADAMW, "+optim.momentum=0.9"),
     "optim._target_=torch.optim.AdamW: building it raised TypeError"),
    (("optim=torch", "optim._target_=torch.nn.Linear"),
     "optim._target_=torch.nn.Linear: not a torch.optim.optimizer.Optimizer class"),
    (("optim=torch", "optim.scheduler={_target_:torch.optim.lr_scheduler.NoSuch}"),
     "optim.scheduler._target_=torch.optim.lr_scheduler.NoSuch: torch.optim.lr_scheduler has "
     "no attribute 'NoSuch'"),
    (("algo=local_sgd", "algo.outer={_target_:torch.optim.SGD,lr:-1.0}"),
     "algo.outer._target_=torch.optim.SGD: building it raised ValueError: Invalid learning rate"),
], ids=["kwarg", "not_an_optimizer", "scheduler", "outer"])
def test_a_wrong_class_or_argument_is_one_line(overrides: tuple[str, ...], line: str) -> None:
    with pytest.raises(UserError) as raised:
        check_optimizers(run_config(*overrides))
    assert str(raised.value).startswith(line) and "\n" not in str(raised.value)


@pytest.mark.integration
@pytest.mark.wall  # three commands, one of them a whole run
def test_a_wrong_optimizer_on_the_command_line_is_one_line_in_a_dry_run_and_a_run(
        results_dir: Path) -> None:
    bad = ("optim=torch", "optim._target_=torch.optim.AdamW", "+optim.momentum=0.9")
    line = ("hetsgd: error: optim._target_=torch.optim.AdamW: building it raised TypeError: "
            "AdamW.__init__() got an unexpected keyword argument 'momentum'")
    dry = hetsgd_command("run", *bad, "--dry-run")
    assert dry.returncode == 1 and errors(dry.stderr) == [
        line.replace("hetsgd: error: ", "hetsgd: error: the run would fail: ")]
    done = hetsgd_command("run", *bad, "budget.epochs=1", "progress=false")
    said, = errors(done.stderr)  # one line, then where the run's folder is
    assert done.returncode == 1 and said.startswith(f"{line} (details in ")
    hogwild = hetsgd_command("run", "algo=hogwild", "devices=cpu", "devices.groups.cpu.count=2",
                             *ADAMW, "--dry-run")
    refused, = errors(hogwild.stderr)
    assert hogwild.returncode == 1 and refused.startswith(
        "hetsgd: error: the run would fail: optim=torch: algo=hogwild has 2 workers update one "
        "shared model lock-free")
    assert "Traceback" not in done.stderr + dry.stderr + hogwild.stderr


def test_hogwild_refuses_a_torch_optimizer_before_any_work(results_dir: Path) -> None:
    result = hetsgd.run("algo=hogwild", "devices=cpu", "devices.groups.cpu.count=2", *ADAMW,
                        "budget.epochs=1", "progress=false")
    assert result.exit_code != 0 and result.summary.error.startswith(
        "optim=torch: algo=hogwild has 2 workers update one shared model lock-free")


@pytest.mark.integration
def test_a_lone_worker_with_adamw_learns_and_resumes_as_a_straight_run(results_dir: Path) -> None:
    """The shared-memory engine's one worker keeps AdamW's state in its checkpoint too."""
    run = ("algo=sync", "devices=single_cpu", *ADAMW, "checkpoint.every_s=600", "progress=false")
    straight = _new_run(*run, "budget.epochs=2")
    summary = read_summary(straight)
    assert summary["plan"]["step"] == "autograd"  # no fused step for AdamW
    assert summary["final"]["train_loss"] < 0.5 * summary["initial"]["train_loss"]
    first = _new_run(*run, "budget.epochs=1")
    assert _new_run(f"resume={first}", "budget.epochs=2", "progress=false") == first
    torch.testing.assert_close(_final_model(first), _final_model(straight), atol=1e-6, rtol=0)


@pytest.mark.integration
@pytest.mark.wall
def test_diloco_with_adamw_inside_and_nesterov_outside_resumes_as_a_straight_run(
        package: Path, results_dir: Path) -> None:  # noqa: F811 - the fixture imported above
    """Issue 46's check, on two gloo ranks: AdamW's moments and step counts (each rank's own),
    the outer model and its Nesterov momentum all go into the checkpoint; without any of them
    the resumed rounds would differ."""
    diloco = ("algo=custom", "algo._target_=mymethods.diloco")
    run = (*diloco, *ADAMW, "optim.lr=0.001", "+algo.tau=3", "+algo.outer_lr=0.7",
           "+algo.outer_momentum=0.9",
           "dataset=digits", "model=mlp", "devices=cpu", "devices.groups.cpu.count=2",
           "devices.groups.cpu.batch_size=16", "checkpoint.every_s=600", "progress=false")
    straight = _new_run(*run, "budget.epochs=2")
    first = _new_run(*run, "budget.epochs=1")
    checkpointed = _final_model(first)
    assert _new_run(f"resume={first}", *diloco, "budget.epochs=2", "progress=false") == first
    torch.testing.assert_close(_final_model(first), _final_model(straight), atol=1e-6, rtol=0)
    assert not torch.allclose(checkpointed, _final_model(straight), atol=1e-3)


@pytest.mark.parametrize("method", [("algo=custom", "algo._target_=mymethods.diloco"),
                                    ("algo=sync",)], ids=["diloco", "sync"])
def test_a_method_on_ranks_with_adamw_resumes_on_the_virtual_clock(
        package: Path, results_dir: Path,  # noqa: F811 - the fixture imported above
        monkeypatch: pytest.MonkeyPatch, method: tuple[str, ...]) -> None:
    """DiLoCo's rounds (AdamW inside, Nesterov outside) and sync's steps on three simulated
    ranks of the biased local SGD paper's machine (a V100 and two CPU sockets, their step times
    jittered): the clocks, and the jitter's streams, continue from the checkpoint's virtual
    time; a request every 0.001 virtual s checkpoints mid-run."""
    run = (*method, *ADAMW, "optim.lr=0.001", *(("+algo.tau=3",) if len(method) > 1 else ()),
           "devices=paper_biased_local", "devices.groups.accel.count=1", "model=mlp",
           "budget.seconds=null", "eval.every_s=100", "eval.every_epochs=null",
           "checkpoint.every_s=0.001", "progress=false")
    written: list[float] = []
    write = journal.write_checkpoint

    def counted(run_dir: Path, checkpoint: Checkpoint) -> None:
        written.append(checkpoint.time_s)
        write(run_dir, checkpoint)

    monkeypatch.setattr(journal, "write_checkpoint", counted)
    straight = _new_run(*run, "budget.epochs=2")
    assert len(written) >= 2 and written == sorted(set(written))  # mid-run, then the final
    first = _new_run(*run, "budget.epochs=1")
    checkpointed = _final_model(first)
    assert _new_run(f"resume={first}", *method, "budget.epochs=2", "progress=false") == first
    torch.testing.assert_close(_final_model(first), _final_model(straight), atol=1e-6, rtol=0)
    assert not torch.allclose(checkpointed, _final_model(straight), atol=1e-3)
    assert read_summary(first)["time_s"] == pytest.approx(read_summary(straight)["time_s"])
