"""The worked examples of docs/own_method.md, as a user runs them: the page's package written to
a scratch folder; DiLoCo with outer lr 1 and no momentum ending on built-in balanced local SGD's
parameters (on the virtual clock, where the ranks' order is fixed); each example training on
the engines the page names; every command it shows composing, the package's settings typed;
and the page's bad plugins failing with the lines it prints."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import compose_config, run_config
from test_checkpoint import _final_model, _new_run
from test_distributed import TWO_RANKS, _torchrun_nodes
from test_doc_commands import SHELL, Command, blocks, commands, run_overrides, shown_files

from hetsgd import algorithms
from hetsgd.config import compose_run, to_run_config
from hetsgd.config.algorithms import CustomAlgoConfig
from hetsgd.engines.common.memory import SharedMaster
from hetsgd.engines.factory import build_engine
from hetsgd.outputs.index import read_summary
from hetsgd.runs import runner
from hetsgd.runs.setup import load_run_data
from hetsgd.workers import expand

PAGE = "docs/own_method.md"
SIMULATED = ("devices=paper_hogbatch_v100", "devices.groups.cpu.count=2",
             "devices.groups.accel.batch_size=64", "model=mlp", "budget.seconds=0.05",
             "budget.epochs=null", "eval.every_s=0.01", "progress=false")


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The files the page shows in full, in a folder of their own that is on sys.path and on
    PYTHONPATH (spawned workers and ranks import the package from there)."""
    root = tmp_path_factory.mktemp("own_method")
    for name, text in shown_files(PAGE).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(root))
        patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root),
                                                               os.environ.get("PYTHONPATH")])))
        patch.chdir(root)
        yield root
        for module in [m for m in sys.modules if m.split(".")[0] == "mymethods"]:
            del sys.modules[module]


def test_the_page_shows_the_package_in_full(package: Path) -> None:
    assert {"mymethods/__init__.py", "mymethods/diloco.py", "mymethods/proportional.py",
            "mymethods/bad.py", "myconf/algo/diloco.yaml"} <= set(shown_files(PAGE))


RUNS = [c for b in blocks(PAGE) if b.lang in SHELL for c in commands(b) if c.args[:1] == ("run",)]


@pytest.mark.parametrize("command", RUNS, ids=lambda c: c.where)
def test_a_command_of_the_page_composes_and_its_settings_are_typed(package: Path,
                                                                   command: Command) -> None:
    for overrides in run_overrides(command.args):
        cfg = to_run_config(compose_run(overrides))
        algorithm, typed = algorithms.choose(cfg)
        assert typed.algo.name == algorithm.NAME
        config = getattr(algorithm, "CONFIG", None) or CustomAlgoConfig
        assert isinstance(typed.algo, config)  # its own dataclass, not the untyped settings
        for key, _, value in (o.lstrip("+").partition("=") for o in overrides):
            if key.startswith("algo.") and key != "algo._target_":
                assert str(getattr(typed.algo, key.removeprefix("algo."))) == value, key


def _trained(*overrides: str) -> torch.Tensor:
    """The master's parameters after a local SGD-like run of three simulated ranks (a V100
    and two CPU sockets of the biased local SGD paper's machine), 2 epochs."""
    cfg = run_config("devices=paper_biased_local", "devices.groups.accel.count=1", "model=mlp",
                     "budget.epochs=2",
                     "budget.seconds=null", "eval.every_s=100", "eval.every_epochs=null",
                     *overrides)
    algorithm, cfg = algorithms.choose(cfg)
    data = load_run_data(cfg, progress=False)
    plan = algorithm.plan(cfg, expand(cfg.devices))
    master = SharedMaster.initial(cfg.model, data.problem, cfg.seed)
    training = build_engine(plan, algorithm.hooks(plan), data.problem, data.train, master,
                            None).run(None)  # type: ignore[arg-type]  # the virtual clock's
    assert training.status == "completed", training.error
    return master.params.clone()


def test_diloco_at_outer_lr_1_without_momentum_ends_on_balanced_local_sgds_parameters(
        package: Path) -> None:
    local = _trained("algo=local_sgd", "algo.tau=4")
    initial = _trained("algo=local_sgd", "algo.tau=4", "budget.epochs=0.001")
    plain = _trained("algo=custom", "algo._target_=mymethods.diloco", "+algo.tau=4",
                     "+algo.outer_lr=1", "+algo.outer_momentum=0")
    nesterov = _trained("algo=custom", "algo._target_=mymethods.diloco", "+algo.tau=4")
    torch.testing.assert_close(plain, local)
    assert not torch.allclose(local, initial, atol=1e-3)  # it trained
    assert not torch.allclose(nesterov, local, atol=1e-3)  # the outer step counts


def _run(tmp_path: Path, *overrides: str) -> dict:
    cfg = compose_config(*overrides)
    summary = runner.run(to_run_config(cfg), tmp_path / "run", cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    assert summary["final"]["train_loss"] < summary["initial"]["train_loss"]
    return summary


def test_the_proportional_controller_steers_a_simulated_paper_machine(package: Path,
                                                                      tmp_path: Path) -> None:
    summary = _run(tmp_path, "algo=custom", "algo._target_=mymethods.proportional",
                   "+algo.period_s=0.005", "+algo.target_share=0.5", *SIMULATED)
    assert summary["algo"] == "proportional" and summary["simulated"]
    assert summary["plugin"]["proportional"]["accel_batch"] < 64  # too few accelerator updates
    assert summary["staleness"] is not None and summary["utilization"]["gpu_util_mean"] > 0


@pytest.mark.integration
@pytest.mark.parametrize("example", [
    ("algo._target_=mymethods.proportional", "+algo.period_s=0.2"),
    ("algo._target_=mymethods.diloco", "+algo.tau=4"),  # two gloo ranks
], ids=["proportional", "diloco"])
def test_each_example_trains_on_the_emulated_mix(package: Path, tmp_path: Path,
                                                 example: tuple[str, ...]) -> None:
    summary = _run(tmp_path, "algo=custom", *example, "devices=emulated", "model=mlp",
                   "budget.epochs=3", "budget.seconds=null", "eval.every_s=0.2", "progress=false")
    assert summary["algo"] == example[0].rsplit(".", 1)[-1]
    assert set(summary["updates_by_group"]) == {"accel", "cpu"}


@pytest.mark.integration
def test_diloco_resumed_from_its_checkpoint_ends_where_a_straight_run_ends(
        package: Path, results_dir: Path) -> None:
    """Its outer model and Nesterov momentum go into the checkpoint (``state_dict``) and come
    back (``load_state_dict``): without them the resumed run's outer steps would differ."""
    diloco = ("algo=custom", "algo._target_=mymethods.diloco")
    run = (*diloco, "+algo.tau=3", "+algo.outer_lr=0.7", "+algo.outer_momentum=0.9",
           "dataset=digits", "model=mlp", "devices=cpu", "devices.groups.cpu.count=2",
           "devices.groups.cpu.batch_size=16", "optim.momentum=0.9", "optim.lr=0.05",
           "checkpoint.every_s=600", "progress=false")
    straight = _new_run(*run, "budget.epochs=2")
    first = _new_run(*run, "budget.epochs=1")
    checkpointed = _final_model(first)
    assert _new_run(f"resume={first}", *diloco, "budget.epochs=2", "progress=false") == first
    assert torch.allclose(_final_model(first), _final_model(straight), atol=1e-6)
    assert not torch.equal(checkpointed, _final_model(straight))
    assert read_summary(first)["algo"] == "diloco"


ROW = re.compile(r"^\| .* \| `(algo\._target_=(\S+): .*)` \|$")


def test_the_pages_bad_plugins_fail_with_the_lines_it_prints(package: Path,
                                                             tmp_path: Path) -> None:
    rows = [m.groups() for line in (Path(__file__).parents[1] / PAGE).read_text().splitlines()
            if (m := ROW.match(line))]
    assert len(rows) == 4
    for number, (line, target) in enumerate(rows):
        cfg = compose_config("algo=custom", f"algo._target_={target}", *SIMULATED)
        summary = runner.run(to_run_config(cfg), tmp_path / str(number), cfg).to_dict()
        assert (summary["status"], summary["error"]) == ("failed", line)


@pytest.mark.integration
@pytest.mark.wall
def test_diloco_under_torchrun_is_called_only_where_each_nodes_command_names_it(
        tmp_path: Path) -> None:
    """Two torchrun nodes with the page's package in their working folder (``python -m``
    puts it on sys.path): each rank runs the plugin; a follower whose own command does not
    name the target refuses to call what rank 0's plan names."""
    for folder in ("named", "unnamed"):
        for name, text in shown_files(PAGE).items():
            (tmp_path / folder / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / folder / name).write_text(text)
    diloco = ["algo=custom", "algo._target_=mymethods.diloco", "+algo.tau=2", *TWO_RANKS,
              "budget.epochs=1"]
    codes, output = _torchrun_nodes(tmp_path / "named", {0: diloco, 1: diloco})
    assert codes == [0, 0], output
    run, = (tmp_path / "named" / "results" / "runs").iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["status"], summary["algo"]) == ("completed", "diloco"), summary["error"]
    assert summary["plugin"]["local_sgd"]["tau"] == {"cpu": 2}
    assert summary["final"]["train_loss"] < summary["initial"]["train_loss"]
    codes, output = _torchrun_nodes(tmp_path / "unnamed", {0: diloco, 1: [
        "algo=local_sgd", *TWO_RANKS]})
    assert codes[1] != 0
    assert ("names algo._target_ 'mymethods.diloco', which hetsgd would import and call" in
            output), output
