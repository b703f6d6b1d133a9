"""Config keys renamed to say a role (accel or host) rather than a device kind: for one release
the old name still sets the new key, from the command line or an old run's config.yaml, with a
one-line warning."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import compose_config, run_config
from omegaconf import OmegaConf

from hetsgd.config import AdaptiveConfig
from hetsgd.config.algorithms import RENAMED_KEYS
from hetsgd.config.compose import rebuild_config


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
    file = tmp_path / "config.yaml"
    OmegaConf.save(OmegaConf.create(recorded), file)
    assert "min_accel_batch" not in file.read_text()
    _, run = rebuild_config(file, ["algo=adaptive"], "cannot rebuild")
    assert isinstance(run.algo, AdaptiveConfig)
    assert (run.algo.min_accel_batch, run.algo.max_host_batch) == (16, AdaptiveConfig.max_host_batch)
