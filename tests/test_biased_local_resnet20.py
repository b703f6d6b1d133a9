"""Lim et al.'s comparison with ResNet20 (``+experiment=biased_local_resnet20``):
the jobs the sweeps launch, the step times the simulated paper mix gives ResNet20, and the
helpers of ``scripts/biased_local_resnet20.py``. Nothing here trains."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import load_script
from hydra import compose
from test_report import write_overrides, write_run
from test_sweeps import hydra_conf  # noqa: F401  (a fixture)
from torch import nn

from hetsgd.config import RunConfig, to_run_config
from hetsgd.config.compose import sweep_jobs
from hetsgd.data.images import read_idx
from hetsgd.engines.virtual.model_cost import ModelCost
from hetsgd.errors import UserError
from hetsgd.model.problem import Problem

SCRIPT = Path(__file__).parents[1] / "scripts" / "biased_local_resnet20.py"
FASHION = Problem("multiclass", 784, 10, (1, 28, 28))


def script() -> ModuleType:
    """The script as a module (scripts/ is no package)."""
    return load_script(SCRIPT)


def jobs_of(experiment: str) -> list[tuple[str, int, RunConfig]]:
    """(method, seed, composed config) of each job the experiment's sweep launches."""
    jobs = []
    for job in sweep_jobs([f"+experiment={experiment}"]):
        swept = dict(o.lstrip("+").split("=", 1) for o in job)
        jobs.append((swept["method"], int(swept["seed"]),
                     to_run_config(compose("config", overrides=job))))
    return jobs


@pytest.mark.usefixtures("hydra_conf")
def test_the_sweep_runs_five_methods_on_the_paper_mix_with_three_seeds() -> None:
    jobs = jobs_of("biased_local_resnet20")
    methods = ("sync", "local_balanced", "local_unbalanced", "local_biased", "fast_alone")
    assert sorted((m, s) for m, s, _ in jobs) == sorted((m, s) for m in methods
                                                        for s in (0, 1, 2))
    first = jobs[0][2]
    for method, _, cfg in jobs:
        assert cfg.algo.name == ("sync" if method in ("sync", "fast_alone") else "local_sgd")
        assert cfg.devices.only == (["accel"] if method == "fast_alone" else [])
        # one problem and one budget for all fifteen: the comparison is of methods alone
        assert (cfg.model.name, cfg.dataset.name, cfg.devices.name) == (
            "resnet20", "fashion_mnist", "paper_biased_local")
        assert (cfg.budget.epochs, cfg.budget.seconds) == (first.budget.epochs, None)
        assert (cfg.dataset.limit, cfg.optim) == (first.dataset.limit, first.optim)


@pytest.mark.usefixtures("hydra_conf")
def test_the_resnet20_step_ratio_on_the_paper_mix_is_the_profiles() -> None:
    """Each group's step is its own device's roofline of ResNet20's counts, as the script's
    parts show it; and the ratio follows the model, not the mix."""
    module = script()
    _, _, cfg = jobs_of("biased_local_resnet20")[0]
    profiles = module.group_profiles(cfg, FASHION)
    assert {g: (p.device.name, b) for g, (b, p) in profiles.items()} == {
        g: (cfg.devices.groups[g].profile, cfg.devices.groups[g].batch_size)
        for g in ("accel", "cpu")}
    for batch, profile in profiles.values():
        launches, flops, traffic = module.roofline_parts(profile, batch)
        assert profile.compute_s(batch) == pytest.approx(launches + max(flops, traffic))
    assert profiles["accel"][1].cost == ModelCost.of(FASHION.build_model(cfg.model, 0), (784,),
                                                   "multiclass", cfg.optim.step)
    steps = {g: p.compute_s(b) for g, (b, p) in profiles.items()}
    # a V100 is the fast side for ResNet20, and by more than for the MLP of the w8a simulation
    mlp = to_run_config(compose("config", overrides=["+experiment=biased_local_paper_sim",
                                                     "devices=paper_biased_local"]))
    mlp_steps = {g: p.compute_s(b) for g, (b, p) in
                 module.group_profiles(mlp, Problem("binary", 300, 1, None)).items()}
    assert steps["cpu"] / steps["accel"] > mlp_steps["cpu"] / mlp_steps["accel"] > 1


def test_activations_of_functional_operators_count_as_memory_traffic() -> None:
    """torch.relu and a residual + write activations just as nn.ReLU does."""

    class Functional(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.linear(x)) + x

    modules = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    functional = ModelCost.of(Functional(), (3,), "multiclass").bytes_per_example
    # input, linear, relu, and the sum: four passes of four bytes over 3 elements each
    assert functional == 4 * 4 * 3 * 4
    assert ModelCost.of(modules, (3,), "multiclass").bytes_per_example == 4 * 4 * 3 * 3


def write_fake_fashion(folder: Path, n_train: int, n_test: int) -> list[str]:
    """Random images with labels 0..9 in turn under Fashion-MNIST's four file names."""
    module = script()
    names = module.fashion_files()
    folder.mkdir()
    rng = np.random.default_rng(0)
    for images, labels, n in ((*names[:2], n_train), (*names[2:], n_test)):
        module.write_idx(folder / images, rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        module.write_idx(folder / labels, np.arange(n, dtype=np.uint8) % 10)
    return names


def test_the_test_subset_is_stratified_and_keeps_the_training_files(tmp_path: Path) -> None:
    images_train, _, images_test, labels_test = write_fake_fashion(tmp_path / "published",
                                                                   n_train=20, n_test=200)
    subset = script().with_test_subset(tmp_path / "published", tmp_path / "subset", 50)
    assert np.bincount(read_idx(subset / labels_test)).tolist() == [5] * 10
    assert read_idx(subset / images_test).shape == (50, 28, 28)
    # each image kept with its own label (the published image j has label j % 10)
    published = read_idx(tmp_path / "published" / images_test)
    kept = [next(j for j in range(200) if (published[j] == image).all())
            for image in read_idx(subset / images_test)]
    assert len(set(kept)) == 50 and [j % 10 for j in kept] == read_idx(
        subset / labels_test).tolist()
    assert (subset / images_train).resolve() == (tmp_path / "published" / images_train).resolve()


def test_the_table_times_an_accuracy_held_to_the_end_between_snapshots() -> None:
    table = script()
    curve = pd.DataFrame({"time_s": [0.0, 1.0, 2.0, 3.0], "epoch": [0.0, 1.0, 2.5, 3.0],
                          "test_acc": [0.1, 0.5, 0.7, 0.65]})
    assert table.held(curve, 0.6, "time_s") == pytest.approx(1.5)
    assert table.held(curve, 0.6, "epoch") == pytest.approx(1.75)
    assert table.held(curve, 0.05, "epoch") == 0.0
    assert np.isnan(table.held(curve, 0.8, "time_s"))  # never reached
    assert np.isnan(table.held(curve, 0.68, "time_s"))  # touched at 2 s, left at the end
    dip = curve.assign(test_acc=[0.1, 0.7, 0.5, 0.8])  # reached at 1 s, held only from 2 s on
    assert table.held(dip, 0.6, "time_s") == pytest.approx(2 + 1 / 3)
    assert table.at_epoch(curve, 2.0) == pytest.approx(0.5 + 0.2 * (1.0 / 1.5))
    assert np.isnan(table.at_epoch(curve, 4.0))
    other = curve.assign(test_acc=[0.1, 0.9, 0.456, 0.458])  # its best is not held to the end
    assert table.common_accuracy(pd.DataFrame({"curve": [curve, other]})) == pytest.approx(0.45)


def test_the_tables_speedup_carries_its_interval() -> None:
    table = script()
    # sync's mean 3 over 1: log-scale standard error sqrt(var(4, 2, 3) / (3 * 3²)) on Welch's
    # 2 degrees of freedom, t = 4.3027...
    half = 4.302652729911275 * math.sqrt(1 / 27)
    assert table.speedup(pd.Series([4.0, 2.0, 3.0]), pd.Series([1.0, 1.0, 1.0])) == \
        f"3.00 [{3 * math.exp(-half):.2f}, {3 * math.exp(half):.2f}]" == "3.00 [1.31, 6.87]"
    assert table.speedup(pd.Series([4.0]), pd.Series([2.0])) == "2.00"  # one each: no interval
    # a run that never held the accuracy: no ratio of the others' mean, on either side
    assert table.speedup(pd.Series([4.0]), pd.Series([2.0, np.nan])) == "—"
    assert table.speedup(pd.Series([np.nan, 4.0]), pd.Series([1.0])) == "—"


def test_the_table_reads_the_experiments_runs_and_names_what_it_cannot_read(
        tmp_path: Path) -> None:
    table = script()
    other = write_run(tmp_path / "sweeps" / "a" / "0_other", algo="sync", devices="gpu", seed=0)
    write_overrides(other, ["+method=gpu", "seed=0"])
    with pytest.raises(UserError, match="^no completed sync run of "
                                        "\\+experiment=biased_local_resnet20 under "):
        table.table(tmp_path)
    for job, method in enumerate(("sync", "local_biased")):
        run_dir = write_run(tmp_path / "sweeps" / "b" / f"{job}_{method}", algo="sync",
                            devices="paper_biased_local", seed=0, speed=1 + job)
        write_overrides(run_dir, [f"+method={method}", "seed=0"])
        (run_dir / "config.yaml").write_text("budget: {epochs: 3.0, seconds: null}\n")
    written = table.table(tmp_path)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in written.splitlines()
            if line.startswith("| ") and " | 1/1 | " in line}
    assert set(rows) == {"sync", "local_biased"}  # the other experiment's run passed over
    assert "common budget 3 epochs" in written
    # write_run's accuracy 0.1 + 0.85 (1 - exp(-speed t)), a snapshot each 0.25 s: both end
    # above 0.93 (0.934 and 0.950), which sync holds from 3.750 s and local_biased (speed 2) from
    # 1.890 s; its speedup 3.750 / 1.890 = 1.98 over sync, and at the same rate, the same
    # through its epochs (0.75 t each)
    cells = {method: [cell.strip() for cell in line.strip().strip("|").split(" | ")]
             for method, line in rows.items()}
    assert "common test accuracy 0.93" in written
    assert (cells["sync"][4], cells["local_biased"][4], cells["local_biased"][9]) == (
        "1.00", "1.98", "1.98")
    (run_dir / "config.yaml").unlink()
    write_overrides(run_dir, ["+method=local_biased", "seed=²"])  # a digit int() refuses
    curve = pd.read_csv(run_dir / "convergence.csv")
    curve.assign(test_acc=curve["test_acc"].astype(str) + "%").to_csv(
        run_dir / "convergence.csv", index=False)
    with pytest.raises(UserError) as refused:
        table.table(tmp_path)
    assert str(refused.value) == (f"{run_dir} lacks a seed override, convergence.csv's test_acc "
                                  "in numbers, config.yaml's budget.epochs")


def test_run_passes_on_the_sweeps_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that failed or diverged makes the sweep exit 1: so does the script, after its
    table of the runs that completed."""
    module = script()
    monkeypatch.setenv("HETSGD_RESULTS", str(tmp_path))
    monkeypatch.setattr(module, "with_test_subset", lambda *args: tmp_path / "data")
    for codes, status in (((1, 0), 1), ((0, 2), 2), ((1, 2), 1), ((0, 0), 0)):  # sweep, report
        given = iter(codes)
        monkeypatch.setattr(module, "subprocess", SimpleNamespace(  # the script's alone
            DEVNULL=subprocess.DEVNULL,
            run=lambda *args, given=given, **kwargs: SimpleNamespace(returncode=next(given))))
        out, got = module.run([], 10)
        assert got == status and out.parent == tmp_path / "biased_local_resnet20"
