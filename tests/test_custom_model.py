"""A user's own model by `model=custom model._target_=PKG.FACTORY`: built from a package outside
hetsgd (importable by every spawned worker and rank), trained by every engine, equal to the
in-tree model it copies, and refused in one line when it cannot be trained."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import compose_config
from torch import nn
from typer.testing import CliRunner

from hetsgd import algorithms
from hetsgd.cli import app
from hetsgd.config import SGDConfig, to_run_config
from hetsgd.config.problem import CustomModelConfig
from hetsgd.data import load_dataset
from hetsgd.engines.common.memory import SharedData, SharedMaster
from hetsgd.engines.factory import build_engine
from hetsgd.errors import UserError
from hetsgd.model.problem import Problem
from hetsgd.model.step import mlp_layers, resolved_step
from hetsgd.runs import runner
from hetsgd.workers import expand

PACKAGE = "mynets"
NETS = '''
import torch
from torch import nn

calls = []


def small_cnn(num_classes, input_shape, width=8):
    """Layer for layer what model=cnn model.channels=[width] model.batch_norm=true builds."""
    channels, height, breadth = input_shape
    return nn.Sequential(
        nn.Unflatten(1, tuple(input_shape)), nn.Conv2d(channels, width, 3, padding=1),
        nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(width * (height // 2) * (breadth // 2), num_classes))


def mlp(in_features, num_outputs, task, **kw):
    calls.append({"in_features": in_features, "num_outputs": num_outputs, "task": task, **kw})
    return nn.Sequential(nn.Linear(in_features, 16), nn.ReLU(), nn.Linear(16, num_outputs))


def only_classes(num_classes):
    return nn.Linear(64, num_classes)


class Sub(nn.Sequential):
    pass


def subclassed(in_features, num_outputs):
    return Sub(nn.Linear(in_features, 16), nn.ReLU(), nn.Linear(16, num_outputs))


def hooked(in_features, num_outputs):
    module = nn.Sequential(nn.Linear(in_features, 16), nn.ReLU(), nn.Linear(16, num_outputs))
    module[1].register_forward_hook(lambda m, i, o: o * 2)
    return module


def double(in_features, num_outputs):
    return nn.Linear(in_features, num_outputs).double()


def tensor(in_features):
    return torch.zeros(in_features)


def wrong_classes(in_features):
    return nn.Linear(in_features, 7)


def no_parameters():
    return nn.ReLU()


def raises(width=3):
    raise ValueError(f"width {width} must be even")
'''
DIGITS = ("dataset=digits", "+model.input_shape=[1,8,8]")  # digits has no image shape
SHORT = ("budget.epochs=null", "budget.seconds=1", "eval.every_s=0.2",
         "eval.every_epochs=null", "progress=false")


@pytest.fixture(scope="module")
def nets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The package ``mynets`` in a folder of its own, on sys.path and on PYTHONPATH (spawned
    workers and ranks import it from there)."""
    root = tmp_path_factory.mktemp("user_code")
    (root / PACKAGE).mkdir()
    (root / PACKAGE / "__init__.py").write_text(textwrap.dedent(NETS))
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root),
                                                               os.environ.get("PYTHONPATH")])))
        patch.delitem(sys.modules, PACKAGE, raising=False)
        import mynets
        yield mynets
        sys.modules.pop(PACKAGE, None)


def _custom(factory: str, **kwargs: object) -> CustomModelConfig:
    return CustomModelConfig(_target_=f"{PACKAGE}.{factory}", kwargs=dict(kwargs))


DIGIT_IMAGES = Problem("multiclass", 64, 10, (1, 8, 8))
BINARY = Problem("binary", 64, 1, None)


def test_the_factory_gets_what_the_data_says_and_a_users_kwarg_wins(nets: object) -> None:
    calls: list[dict] = nets.calls  # type: ignore[attr-defined]
    calls.clear()
    BINARY.build_model(_custom("mlp", hidden=5, input_shape=[1, 8, 8]), seed=0)
    assert calls == [{"in_features": 64, "num_outputs": 1, "task": "binary",
                      "input_shape": [1, 8, 8], "hidden": 5}]
    calls.clear()
    BINARY.build_model(_custom("mlp", task="mine"), seed=0)  # a parameter the data offers too
    assert calls == [{"in_features": 64, "num_outputs": 1, "task": "mine"}]
    calls.clear()
    Problem("multilabel", 20, 4, None).build_model(_custom("mlp"), seed=0)
    # the data's sizes go to the parameters the factory names, never into its **kwargs
    assert calls == [{"in_features": 20, "num_outputs": 4, "task": "multilabel"}]
    assert DIGIT_IMAGES.build_model(_custom("only_classes"), seed=0).out_features == 10


def test_a_custom_model_is_seeded_and_leaves_the_global_stream_alone(nets: object) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    a = DIGIT_IMAGES.build_model(_custom("small_cnn"), seed=7)
    b = DIGIT_IMAGES.build_model(_custom("small_cnn"), seed=7)
    assert torch.equal(torch.rand(3), expected)
    c = DIGIT_IMAGES.build_model(_custom("small_cnn"), seed=8)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a[1].weight, c[1].weight)
    # the shape probe left BatchNorm's statistics as they were built
    assert torch.equal(a[2].running_mean, torch.zeros(8)) and int(a[2].num_batches_tracked) == 0


def test_another_floating_precision_is_converted_to_float32(nets: object) -> None:
    model = BINARY.build_model(_custom("double"), seed=0)
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("factory, message", [
    ("nope", r"^model._target_=mynets.nope: mynets has no attribute 'nope'$"),
    ("no_parameters", r"^model._target_=mynets.no_parameters: the ReLU it returns has no "
                      "parameters to train$"),
    ("raises", r"^model._target_=mynets.raises: building it raised ValueError: width 3 must be "
               "even$"),
])
def test_what_cannot_be_built_is_one_line_naming_the_target(nets: object, factory: str,
                                                              message: str) -> None:
    with pytest.raises(UserError, match=message):
        DIGIT_IMAGES.build_model(_custom(factory), seed=0)


def test_the_fused_step_only_where_it_computes_the_forward(nets: object) -> None:
    plain = BINARY.build_model(_custom("mlp"), seed=0)
    assert mlp_layers(plain) is not None
    assert resolved_step(plain, "auto", SGDConfig()) == "fused"
    assert resolved_step(plain, "autograd", SGDConfig()) == "autograd"
    for factory in ("subclassed", "hooked"):
        module = BINARY.build_model(_custom(factory), seed=0)
        assert mlp_layers(module) is None
        assert resolved_step(module, "auto", SGDConfig()) == "autograd"
        with pytest.raises(UserError, match="optim.step=fused needs an MLP"):
            resolved_step(module, "fused", SGDConfig())
    handle = nn.modules.module.register_module_forward_hook(lambda m, i, o: None)
    try:
        assert resolved_step(plain, "auto", SGDConfig()) == "autograd"  # a global hook runs on every module
    finally:
        handle.remove()
    assert resolved_step(plain, "auto", SGDConfig()) == "fused"
    cnn = DIGIT_IMAGES.build_model(_custom("small_cnn"), seed=0)
    assert resolved_step(cnn, "auto", SGDConfig()) == "autograd"


def _altered(change: str) -> nn.Sequential:
    module = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 1))
    if change == "parametrized":
        nn.utils.parametrize.register_parametrization(module[0], "weight", nn.Identity())
    elif change == "gradient hook":
        module[2].weight.register_hook(lambda g: g * 0)
    elif change == "instance forward":
        module[2].forward = lambda x: x  # type: ignore[method-assign]
    elif change == "buffer":
        module[0].register_buffer("scale", torch.ones(1))
    elif change == "pre-hook":
        module.register_forward_pre_hook(lambda m, i: i)
    return module


@pytest.mark.parametrize("change", ["parametrized", "gradient hook", "instance forward", "buffer",
                                    "pre-hook"])
def test_anything_that_changes_a_call_takes_the_autograd_step(change: str) -> None:
    assert mlp_layers(_altered("none")) is not None
    assert mlp_layers(_altered(change)) is None


def _run(run_dir: Path, *overrides: str) -> dict:
    cfg = compose_config(*overrides)
    summary = runner.run(to_run_config(cfg), run_dir, cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    return summary


@pytest.mark.integration
@pytest.mark.parametrize("algo", [
    ("algo=sync",),
    ("algo=hogbatch", "devices=emulated"),
    ("algo=adaptive", "devices=emulated", "algo.period_s=0.2", "algo.window_s=0.4"),
    ("algo=local_sgd", "devices=emulated", "algo.tau=4"),
    ("algo=hogbatch", "devices=paper_hogbatch_v100", "devices.groups.cpu.count=2",
     "devices.groups.accel.batch_size=64", "budget.seconds=0.05", "eval.every_s=0.01"),
], ids=["sync", "hogbatch", "adaptive", "local_sgd", "simulated"])
def test_a_custom_model_trains_on_every_engine(nets: object, tmp_path: Path, results_dir: Path,
                                              algo: tuple[str, ...]) -> None:
    summary = _run(tmp_path / "run", *DIGITS, "model=custom", f"model._target_={PACKAGE}.small_cnn",
                   "+model.width=4", "optim.lr=0.05", *SHORT, *algo)
    assert summary["model"] == "small_cnn"  # labelled by its factory, not its schema's "custom"
    assert summary["simulated"] == ("devices=paper_hogbatch_v100" in algo)  # priced by its FLOPs
    assert summary["final"]["train_loss"] < summary["initial"]["train_loss"]


def _trained(*model: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One sync worker for one epoch on digits as 8x8 images: the master's final parameters
    and floating buffers (BatchNorm's running statistics)."""
    cfg = to_run_config(compose_config("algo=sync", "dataset=digits", *model, "budget.epochs=1",
                                       "budget.seconds=null", "eval.every_epochs=null",
                                       "eval.every_s=100", "progress=false"))
    dataset = load_dataset(cfg.dataset, cfg.seed, progress=False)
    problem = Problem(dataset.task, dataset.num_features, dataset.num_outputs, (1, 8, 8))
    data = SharedData.from_arrays(dataset.x_train, dataset.y_train)
    master = SharedMaster.initial(cfg.model, problem, cfg.seed)
    algorithm = algorithms.get(cfg.algo.name)
    plan = algorithm.plan(cfg, expand(cfg.devices))
    training = build_engine(plan, algorithm.hooks(plan), problem, data, master, None).run(
        _NoMonitor)
    assert training.status == "completed", training.error
    return master.params.clone(), master.buffers.clone()


class _NoMonitor:
    def __init__(self, pids: object) -> None: ...

    def start(self) -> None: ...

    def set_time_origin(self, t0: float) -> None: ...

    def stop(self) -> list:
        return []


@pytest.mark.integration
def test_a_custom_model_ends_where_the_in_tree_model_it_copies_ends(nets: object,
                                                                  results_dir: Path) -> None:
    custom = _trained("model=custom", f"model._target_={PACKAGE}.small_cnn", "+model.width=8")
    in_tree = _trained("model=cnn", "model.channels=[8]", "model.batch_norm=true")
    params, buffers = custom
    assert buffers.numel() == 16 and not torch.equal(buffers, torch.cat([torch.zeros(8),
                                                                         torch.ones(8)]))
    torch.testing.assert_close(params, in_tree[0])
    torch.testing.assert_close(buffers, in_tree[1])


@pytest.mark.integration
@pytest.mark.parametrize("factory, message", [
    ("missing.net", "model._target_=missing.net: no module named 'missing'; is its package on "
                    "PYTHONPATH?"),
    (f"{PACKAGE}.tensor", f"model._target_={PACKAGE}.tensor: it returns a Tensor, not an "
                          "nn.Module"),
    (f"{PACKAGE}.wrong_classes", f"model._target_={PACKAGE}.wrong_classes: on a batch [2, 64] it "
                                 "returns [2, 7] logits; the data has 10 classes, so the model "
                                 "must return [B, 10]"),
    (f"{PACKAGE}.raises", f"model._target_={PACKAGE}.raises: building it raised ValueError: "
                          "width 3 must be even"),
], ids=["missing", "tensor", "wrong_classes", "raises"])
def test_a_model_that_cannot_train_fails_the_run_in_one_line(nets: object, results_dir: Path,
                                                             factory: str, message: str) -> None:
    result = CliRunner().invoke(app, ["run", "dataset=digits", "model=custom",
                                      f"model._target_={factory}", *SHORT])
    assert result.exit_code != 0
    assert message in result.output.replace("\n", " ") or message in result.output
    assert "Traceback" not in result.output
    summary_file, = (results_dir / "runs").glob("*/summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary["status"] == "failed" and summary["error"] == message


@pytest.mark.integration
def test_a_users_own_model_yaml_gives_the_factory_its_arguments(nets: object, tmp_path: Path,
                                                                results_dir: Path) -> None:
    """`--config-dir DIR` with DIR/model/mynet.yaml: its keys reach the factory (here one that
    refuses them, so that no training is needed to see them arrive)."""
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "model" / "mynet.yaml").write_text(
        f"defaults: [custom, _self_]\n_target_: {PACKAGE}.raises\nwidth: 5\n")
    result = CliRunner().invoke(app, ["run", "--config-dir", str(tmp_path / "conf"),
                                      "model=mynet", *SHORT])
    assert result.exit_code != 0
    assert f"model._target_={PACKAGE}.raises: building it raised ValueError: width 5 must be " \
           "even" in result.output


def _global_draws(seed: int, rank: int, results: object) -> None:
    """What a worker process's model draws from the global streams (dropout's, a user's numpy
    or random), its math set up as a run sets it up."""
    import random

    import numpy as np

    from hetsgd.engines.common.worker import set_up_math

    cfg = to_run_config(compose_config("devices=cpu", "devices.groups.cpu.count=2",
                                       f"seed={seed}"))
    set_up_math(expand(cfg.devices)[rank], cfg)
    results.put((torch.rand(4).tolist(), np.random.rand(2).tolist(), random.random()))  # type: ignore[attr-defined]


@pytest.mark.integration
def test_each_worker_and_seed_draws_its_own_dropout_masks() -> None:
    """A worker starts (forkserver) with torch's fixed default seed: without seeding, dropout
    masked the same units in every worker of a run and in every seed of a sweep."""
    from hetsgd.engines import processes

    ctx = processes.context("forkserver")  # where a run's workers come from
    results = ctx.Queue()
    draws = []
    for seed, rank in [(1, 0), (1, 1), (2, 0), (1, 0)]:
        child = ctx.Process(target=_global_draws, args=(seed, rank, results))
        child.start()
        draws.append(results.get(timeout=120))
        child.join()
    first, other_rank, other_seed, again = draws
    assert again == first  # reproducible: the same seed and rank draw the same
    for stream in range(3):
        assert other_rank[stream] != first[stream] and other_seed[stream] != first[stream]
