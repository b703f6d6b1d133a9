"""Sweeps: over config groups that bring other groups, through Hydra's submitit launcher,
whose jobs run in other processes, and job folders named by the keys the sweep varies."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from hetsgd import api
from hetsgd.config import CONF_DIR, compose_run, register_configs, to_run_config
from hetsgd.config.compose import sweep_jobs, with_first_group_choices
from hetsgd.config.swept import MULTIRUN, sweep_overrides, swept_keys, swept_name
from hetsgd.invocation import invoke
from hetsgd.outputs.sweep import job_dirs

SHORT = ("dataset=digits", "budget.seconds=1", "budget.epochs=null", "progress=false")


def hetsgd_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetsgd", "run", *args], capture_output=True,
                          text=True, timeout=300)


def the_sweep(results: Path) -> tuple[Path, pd.DataFrame]:
    sweep, = (results / "sweeps").iterdir()
    return sweep, pd.read_csv(sweep / "summary.csv")


def test_a_swept_group_is_given_its_first_choice_before_the_sweep() -> None:
    args = ["-m", "+method=sync,hogwild", "seed=0,1", "devices=choice(cpu,auto)",
            "hydra/launcher=basic,submitit_local", "devices.groups.accel.batch_size=64", "algo=sync"]
    assert with_first_group_choices(args) == [
        "-m", "+method=sync", "+method=sync,hogwild", "seed=0,1", "devices=cpu",
        "devices=choice(cpu,auto)", "hydra/launcher=basic,submitit_local",
        "devices.groups.accel.batch_size=64", "algo=sync"]


# `make run` before it was an experiment: `hetsgd run -m` with these arguments
MAKE_RUN_BEFORE = ("+method=gpu,hogwild,hogbatch,adaptive", "dataset=digits", "model=mlp_paper",
                   "seed=0,1,2", "budget.epochs=null", "budget.seconds=6", "eval.every_s=0.25",
                   "eval.every_epochs=null", "monitor.interval_s=0.25")


@pytest.fixture
def hydra_conf() -> Iterator[None]:
    """Hydra initialized on the config tree, for `compose`; whatever Hydra held (an earlier
    in-process `hetsgd run`'s) is set aside meanwhile, as `compose_run` does."""
    register_configs()
    held = GlobalHydra.instance().hydra
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            yield
    finally:
        GlobalHydra.instance().hydra = held


def test_the_make_run_experiment_runs_the_twelve_jobs_make_run_ran_before(hydra_conf) -> None:
    before, now = sweep_jobs(MAKE_RUN_BEFORE), sweep_jobs(["+experiment=make_run"])
    methods_and_seeds = [[o for o in job if o.startswith(("+method=", "seed="))] for job in before]
    assert len(before) == 12
    assert [[o for o in job if o != "+experiment=make_run"] for job in now] == methods_and_seeds
    # each method's first job composes to the same config (the seeds differ in `seed=` alone)
    for old, new in list(zip(before, now))[::3]:
        assert OmegaConf.to_container(compose("config", overrides=new)) == \
            OmegaConf.to_container(compose("config", overrides=old))


def test_a_job_folder_is_named_by_the_keys_its_sweep_varies_only(tmp_path: Path) -> None:
    # as `hetsgd run -m +method=gpu,sync seed=0,1 dataset=digits` records it, the first
    # choice of the swept group put before its sweep, with an experiment's sweeper params
    (tmp_path / MULTIRUN).write_text(yaml.safe_dump({"hydra": {
        "overrides": {"hydra": ["hydra.mode=MULTIRUN"],
                      "task": ["+method=gpu", "+method=gpu,sync", "seed=0,1", "dataset=digits"]},
        "sweeper": {"params": {"optim.lr": "range(1,3)", "budget.seconds": 6}}}}))
    overrides = sweep_overrides(tmp_path)
    assert swept_keys(overrides) == {"method", "seed", "optim.lr"}
    job = ["optim.lr=2", "budget.seconds=6", "+method=sync", "seed=1", "dataset=digits"]
    assert swept_name(job, swept_keys(overrides)) == "optim.lr=2,+method=sync,seed=1"
    assert sweep_overrides(tmp_path / "elsewhere") == []  # no sweep here: nothing swept
    assert swept_name(job, frozenset()) == ""


def test_a_sweeps_jobs_are_in_job_number_order(tmp_path: Path) -> None:
    """By the number, not by name (where "10_..." comes before "2_..."); a folder that is no
    run directory is not a job, and one without a number comes last."""
    for name in ("10_seed=10", "2_seed=2", "0_seed=0", "extra", "3_empty"):
        (tmp_path / name).mkdir()
        if name != "3_empty":
            (tmp_path / name / "summary.json").write_text("{}")
    assert [d.name for d in job_dirs(tmp_path)] == ["0_seed=0", "2_seed=2", "10_seed=10",
                                                    "extra"]


@pytest.mark.integration
@pytest.mark.wall
def test_a_sweeps_job_folders_name_the_swept_values(results_dir: Path) -> None:
    result = api.sweep("seed=0,1", "budget.epochs=0.2", "dataset=digits", "progress=false")
    assert result.exit_code == 0
    sweep, summary = the_sweep(results_dir)
    assert sweep == result.sweep_dir
    assert [Path(d).name for d in summary["run_dir"]] == ["0_seed=0", "1_seed=1"]
    assert list(summary["job"]) == [0, 1] and list(summary["status"]) == ["completed"] * 2


@pytest.mark.integration
@pytest.mark.wall
def test_a_sweep_over_methods_takes_overrides_of_the_mix_they_bring(results_dir: Path) -> None:
    result = api.sweep("+method=hogbatch,sync", "devices.groups.accel.batch_size=64", *SHORT)
    assert result.exit_code == 0
    sweep, summary = the_sweep(results_dir)
    assert sweep == result.sweep_dir
    assert list(summary["status"]) == ["completed", "completed"]
    assert list(summary["algo"]) == ["hogbatch", "sync"]
    for run_dir in summary["run_dir"]:
        mix = json.loads((Path(run_dir) / "summary.json").read_text())["mix"]
        assert mix["accel"]["batch_size"] == 64


@pytest.mark.integration
def test_a_sweep_job_that_cannot_take_an_override_stops_the_sweep_before_any_job(
        results_dir: Path) -> None:
    # hogwild brings the cpu mix, which has no accel group
    result = hetsgd_run("-m", "+method=hogbatch,hogwild", "devices.groups.accel.batch_size=64",
                        *SHORT)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    error, = result.stderr.strip().splitlines()
    assert error.startswith("hetsgd: error:") and "devices.groups.accel.batch_size" in error
    assert not list((results_dir / "sweeps").rglob("summary.json"))


@pytest.mark.integration
@pytest.mark.wall
def test_a_submitit_sweep_summarises_and_exits_from_the_jobs_folders(results_dir: Path) -> None:
    """The jobs ran in other processes: the summary, the report and the exit code (a failed
    job fails the sweep) can only come from their folders. One sweep of a job that completes
    and one that fails (libsvm without its file): each job starts an interpreter of its own."""
    result = hetsgd_run("-m", "hydra/launcher=submitit_local", "dataset=digits,libsvm",
                        *SHORT[1:])
    assert result.returncode == 1, result.stderr
    sweep, summary = the_sweep(results_dir)
    assert list(summary["status"]) == ["completed", "failed"]
    assert list(summary["dataset"]) == ["digits", "libsvm"]
    assert "needs dataset.path" in summary["error"].iloc[1]
    assert (sweep / "report.md").exists()


@pytest.mark.parametrize("experiment", sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml")))
def test_the_first_job_of_every_experiment_composes_into_a_checked_config(hydra_conf,
                                                                          experiment: str) -> None:
    first, *_ = sweep_jobs([f"+experiment={experiment}"])
    # a tuned comparison's jobs are started with its search taken out (hetsgd/tuning/phases.py)
    tuned = ["tuning=null"] if experiment == "tuned_comparison" else []
    to_run_config(compose("config", overrides=[*first, *tuned]))


def test_the_paper_net_experiment_composes_what_its_overrides_did() -> None:
    before = ("+experiment=hogbatch_paper_sim", "algo=adaptive", "model=mlp_paper", "seed=0",
              "optim.lr=0.01", "eval.every_s=1", "devices=paper_hogbatch_k80")
    now = ("+experiment=hogbatch_paper_sim_net", "algo=adaptive", "devices=paper_hogbatch_k80")
    assert compose_run(now) == compose_run(before)


@pytest.mark.parametrize("moved", ["results_dir=/elsewhere", "hydra.sweep.dir=/elsewhere",
                                   "++hydra.sweep.dir=/elsewhere"])
def test_a_reproduction_refuses_to_write_its_sweep_where_it_does_not_look(moved: str) -> None:
    """scripts/reproduce.sh finds the sweep it ran under $HETSGD_RESULTS: a sweep written
    elsewhere read as 'no sweep was written' after it had run, and failed."""
    script = Path(__file__).parents[1] / "scripts" / "reproduce.sh"
    done = subprocess.run(["bash", str(script), "hogbatch", moved], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stderr == (
        f"reproduce: {moved} would write the sweep where this script does not look for it: "
        "set HETSGD_RESULTS=FOLDER instead\n")


@pytest.mark.integration
def test_a_sweep_of_no_values_is_refused_in_one_line(tmp_path: Path) -> None:
    """It ran no job, wrote a report of no runs, and exited 0."""
    invocation = invoke(["-m", "seed=range(0)", f"hydra.sweep.dir={tmp_path / 's'}"])
    assert invocation.code == 1 and not (tmp_path / "s").exists()
    assert invocation.errors == ["seed=range(0) sweeps no value: the sweep would run no job"]
