"""Config keys renamed to say a role (accel or host) rather than a device kind: for one release
the old name still sets the new key, from the command line or an old run's config.yaml, with a
one-line warning. The accelerator group some mixes called `gpu`, `accel` in every mix now: an
old run's files read with the new name."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd
import pytest
from conftest import compose_config, run_config
from omegaconf import OmegaConf

from hetsgd.config import AdaptiveConfig, LocalSGDConfig
from hetsgd.config.algorithms import RENAMED_KEYS
from hetsgd.config.compose import rebuild_config
from hetsgd.config.group_names import by_group_name, group_name
from hetsgd.outputs.index import index_dirs, load_csv
from hetsgd.outputs.summary import RunSummary


def test_an_old_key_on_the_command_line_sets_the_new_one_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hetsgd"):
        algo = run_config("algo=adaptive", "algo.min_gpu_batch=8", "algo.max_cpu_batch=16").algo
    assert isinstance(algo, AdaptiveConfig)
    assert (algo.min_accel_batch, algo.max_accel_batch, algo.max_host_batch) == (8, None, 16)
    assert (algo.min_gpu_batch, algo.max_gpu_batch, algo.max_cpu_batch) == (None, None, None)
    assert caplog.messages == ["algo.min_gpu_batch is deprecated: use algo.min_accel_batch",
                               "algo.max_cpu_batch is deprecated: use algo.max_host_batch"]


def test_an_old_runs_config_with_the_old_keys_rebuilds(tmp_path: Path) -> None:
    recorded = OmegaConf.to_container(compose_config("algo=adaptive"))
    assert isinstance(recorded, dict)
    algo = recorded["algo"]
    for old, new in RENAMED_KEYS.items():  # as a run before the rename wrote it
        algo[old] = algo.pop(new)
    algo["min_gpu_batch"] = 16
    algo["max_cpu_batch"] = 48  # neither is today's default: each must come from the file
    file = tmp_path / "config.yaml"
    OmegaConf.save(OmegaConf.create(recorded), file)
    assert "min_accel_batch" not in file.read_text()
    _, run = rebuild_config(file, ["algo=adaptive"], "cannot rebuild")
    assert isinstance(run.algo, AdaptiveConfig)
    assert (run.algo.min_accel_batch, run.algo.max_accel_batch, run.algo.max_host_batch) == (
        16, None, 48)


def test_a_run_recorded_before_the_split_seed_is_rebuilt_on_its_own_seeds_split(
        tmp_path: Path) -> None:
    """Its seed 3 drew its test split; today's default (0) would evaluate its recovery or resume
    on rows it trained on."""
    recorded = OmegaConf.to_container(compose_config("seed=3"))
    assert isinstance(recorded, dict)
    del recorded["dataset"]["split_seed"]
    file = tmp_path / "config.yaml"
    OmegaConf.save(OmegaConf.create(recorded), file)
    _, run = rebuild_config(file, ["seed=3"], "cannot rebuild")
    assert run.dataset.split_seed is None and run.seed == 3
    OmegaConf.save(OmegaConf.create(OmegaConf.to_container(compose_config("seed=3"))), file)
    assert rebuild_config(file, ["seed=3"], "cannot rebuild")[1].dataset.split_seed == 0


def _old_run(run_dir: Path, groups: tuple[str, str]) -> Path:
    """A run directory as a run on a mix whose groups are ``groups`` (accelerator, host) wrote
    it."""
    accel, host = groups
    run_dir.mkdir()
    summary = {
        "status": "completed", "error": None, "algo": "hogbatch", "dataset": "digits",
        "model": "mlp", "devices": "cpu+gpu", "seed": 0,
        "mix": {accel: {"kind": "cuda", "role": "accel", "count": 1, "threads": 1,
                        "batch_size": 1024, "devices": ["cuda:0"]},
                host: {"kind": "cpu", "role": "host", "count": 2, "threads": 1,
                       "batch_size": 8, "devices": ["cpu", "cpu"]}},
        "updates": 40, "updates_by_group": {accel: 10, host: 30},
        "update_share": {accel: 0.25, host: 0.75},
        "staleness": {"mean": 1.0, "max": 3, "by_group": {accel: 2.0, host: 0.5}},
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    pd.DataFrame({"time_s": [0.0, 1.0], "epoch": [0.0, 1.0], "train_loss": [2.0, 1.0],
                  f"updates_{accel}": [0, 10], f"updates_{host}": [0, 30]}
                 ).to_csv(run_dir / "convergence.csv", index=False)
    pd.DataFrame({"worker": [0, 1, 2], "group": [accel, host, host]}
                 ).to_csv(run_dir / "workers.csv", index=False)
    return run_dir


def test_an_old_runs_gpu_group_reads_as_accel(tmp_path: Path) -> None:
    """A run from when `cpu+gpu` named its accelerator group `gpu` (and the mix called a
    group's label its `kind`) reads with today's names in its summary, its tables and the index
    the report and figures are built from."""
    run_dir = _old_run(tmp_path / "old", ("gpu", "cpu"))
    summary = RunSummary.read(run_dir)
    assert summary.mix is not None and list(summary.mix.groups) == ["accel", "cpu"]
    assert (summary.mix.groups["accel"].role, summary.mix.groups["accel"].label) == ("accel",
                                                                                   "cuda")
    assert summary.updates_by_group == {"accel": 10, "cpu": 30}
    assert summary.update_share == {"accel": 0.25, "cpu": 0.75}
    assert summary.staleness is not None and summary.staleness.by_group == {"accel": 2.0,
                                                                            "cpu": 0.5}
    convergence = load_csv(run_dir, "convergence")
    assert convergence is not None
    assert convergence["updates_accel"].tolist() == [0, 10]
    assert "updates_gpu" not in convergence.columns
    workers = load_csv(run_dir, "workers")
    assert workers is not None and workers["group"].tolist() == ["accel", "cpu", "cpu"]
    row = index_dirs([run_dir]).iloc[0]
    assert (row["update_share.accel"], row["updates_by_group.accel"]) == (0.25, 10)
    assert row["mix.accel.label"] == "cuda" and "mix.accel.kind" not in row


def test_a_mix_that_has_an_accel_group_keeps_its_gpu_group() -> None:
    """Only a run without an `accel` group named its accelerator `gpu`: a mix of a user's that
    has both keeps both."""
    names = ["accel", "gpu", "cpu"]
    assert [group_name(n, names) for n in names] == names
    assert by_group_name({"accel": 1, "gpu": 2}) == {"accel": 1, "gpu": 2}
    assert by_group_name({"gpu": 2, "cpu": 1}) == {"accel": 2, "cpu": 1}


def test_an_old_runs_config_with_a_gpu_group_rebuilds_with_accel(tmp_path: Path) -> None:
    """Recovering or resuming a run from when the paper mixes named their accelerator group
    `gpu`: its recorded config and overrides name that group as today, so the mix keeps its two
    groups in their order, with the values the run set on each."""
    overrides = ["algo=local_sgd", "devices=paper_hogbatch_v100", "devices.groups.cpu.count=2",
                 "devices.groups.gpu.batch_size=256", "algo.tau={gpu:4,cpu:1}",
                 "devices.only=[gpu,cpu]"]
    recorded = OmegaConf.to_container(
        compose_config(*(o.replace("gpu", "accel") for o in overrides)))
    assert isinstance(recorded, dict)
    devices = recorded["devices"]
    devices["groups"] = {("gpu" if name == "accel" else name): group
                         for name, group in devices["groups"].items()}
    devices["only"] = ["gpu", "cpu"]
    recorded["algo"]["tau"] = {"gpu": 4, "cpu": 1}
    file = tmp_path / "config.yaml"
    OmegaConf.save(OmegaConf.create(recorded), file)
    _, run = rebuild_config(file, overrides, "cannot rebuild")
    assert list(run.devices.groups) == ["accel", "cpu"]
    assert (run.devices.groups["accel"].batch_size, run.devices.groups["cpu"].count) == (256, 2)
    assert run.devices.only == ["accel", "cpu"]
    assert isinstance(run.algo, LocalSGDConfig) and run.algo.tau.steps == {"accel": 4, "cpu": 1}
