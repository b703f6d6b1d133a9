"""Directory names made from override values: one safe folder each, whatever the user typed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hetsgd.config import compose_run
from hetsgd.config.paths import MAX_COMPONENT, results_folder, safe_component

SAFE = re.compile(r"[A-Za-z0-9=,+\-_]([A-Za-z0-9=,+\-_.]*[A-Za-z0-9=,+\-_])?")


def is_safe(name: str) -> bool:
    return bool(SAFE.fullmatch(name)) and ".." not in name and len(name) <= MAX_COMPONENT


@pytest.mark.parametrize("value", ["../../x", "..", ".", "/abs", "a/b", "a\\b", "C:\\x", ".hidden",
                                   "x/..", "a\x00b", "line\nbreak\ttab\x7f", "", " ", "héllo wörld",
                                   "日本語", "x" * 1000, "a=1," * 100, "dist.master_addr=../../ESCAPE"])
def test_hostile_values_become_one_safe_name(value: str) -> None:
    name = safe_component(value)
    assert is_safe(name), name
    assert safe_component(name) == name  # idempotent


@pytest.mark.parametrize("name", ["sync", "0_algo=sync,seed=1", "model.hidden=_16_",
                                  "2026-11-30_21-17-41-123456_sync_digits_single_cpu", "a+b-c.d"])
def test_safe_names_are_kept(name: str) -> None:
    assert safe_component(name) == name


def test_long_values_keep_a_readable_prefix_and_stay_distinct() -> None:
    first = ",".join(f"key{i}=value{i}" for i in range(40))
    second = first + ",one=more"
    names = {safe_component(v) for v in (first, second, first.replace("value3", "VALUE3"))}
    assert len(names) == 3
    assert all(len(n) == MAX_COMPONENT and n.startswith("key0=value0,key1=value1") for n in names)
    assert safe_component(first) == safe_component(first)  # stable
    # two values that read the same once made safe ("a_" x 100) stay two: the digest is of
    # the value as given
    assert safe_component("a/" * 100) != safe_component("a\\" * 100)
    assert safe_component(123) == "123"


@pytest.mark.integration
@pytest.mark.usefixtures("two_cores")  # hogwild's mix: one worker per core
@pytest.mark.wall
def test_a_hostile_long_sweep_writes_only_safe_job_folders(tmp_path: Path, results_dir: Path) -> None:
    overrides = ["algo=sync,hogwild", "dataset=digits", "budget.epochs=null", "budget.seconds=1",
                 "eval.every_s=0.5", "eval.every_epochs=null", "optim.lr=0.05", "optim.momentum=0",
                 "optim.weight_decay=0", "monitor.interval_s=0.5", "seed=1", "data.shuffle=true",
                 "eval.train_subset=500", "eval.batch_size=512", "model=mlp", "model.hidden=[16]",
                 "model.activation=relu", "dist.timeout_s=30", "progress=false",
                 "dist.master_addr=../../../../ESCAPE"]
    assert len(",".join(overrides)) > 255  # the old `<num>_<override_dirname>` name was too long
    result = subprocess.run([sys.executable, "-m", "hetsgd", "run", "-m", *overrides],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    outside = [p for p in tmp_path.rglob("*") if p.is_file() and results_dir not in p.parents]
    assert outside == []
    sweep, = (results_dir / "sweeps").iterdir()
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir() and p.name[0].isdigit())
    assert [job.split("_", 1)[0] for job in jobs] == ["0", "1"]
    assert all(is_safe(job) for job in jobs), jobs
    assert all((sweep / job / "summary.json").exists() for job in jobs)


def test_an_empty_results_variable_is_unset_for_runs_and_for_listing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`export HETSGD_RESULTS=$DIR` with DIR unset: runs went to /runs and /sweeps at the root,
    while `hetsgd runs` looked in the current folder."""
    monkeypatch.setenv("HETSGD_RESULTS", "")
    cfg = compose_run([], hydra_config=True)
    assert cfg.results_dir == "results" and results_folder() == Path("results")
    assert str(cfg.hydra.run.dir).startswith("results/runs/")
    monkeypatch.setenv("HETSGD_RESULTS", "/elsewhere")
    assert compose_run([]).results_dir == "/elsewhere" == str(results_folder())
