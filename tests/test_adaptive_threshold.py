"""Adaptive Hogbatch's threshold on the simulated paper machines (+experiment=adaptive_threshold,
scripts/adaptive_threshold.py): the jobs the sweep launches, the CPU update shares of the
paper-machine setting (+experiment=adaptive_paper) against the paper's bands, Hogbatch beside
them, the direction the threshold moves the shares, and the script's schedule replay against a
full run. The virtual engine is deterministic, so every number here is the same on any machine
under any load."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest
from conftest import compose_config, load_script, said
from hydra import compose
from test_report import write_run
from test_sweeps import hydra_conf  # noqa: F401  (a fixture)

from hetsgd.config import AdaptiveConfig, to_run_config
from hetsgd.config.compose import sweep_jobs
from hetsgd.errors import UserError
from hetsgd.outputs.safe_text import shown
from hetsgd.runs import runner

SCRIPT = Path(__file__).parents[1] / "scripts" / "adaptive_threshold.py"
EXPERIMENT = "+experiment=adaptive_threshold"
MACHINES = ("paper_hogbatch_v100", "paper_hogbatch_k80")


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return load_script(SCRIPT)


def test_the_experiment_sweeps_the_threshold_on_both_paper_machines(hydra_conf,  # noqa: F811
                                                                    script: ModuleType) -> None:
    jobs = sweep_jobs([EXPERIMENT])
    assert script.jobs() == jobs  # the replay runs the very jobs the sweep launches
    grid = set()
    for job in jobs:
        cfg = to_run_config(compose("config", overrides=job))
        assert isinstance(cfg.algo, AdaptiveConfig)
        assert (cfg.model.name, cfg.dataset.name, cfg.devices.simulated) == ("mlp_paper", "digits", True)
        assert cfg.budget.seconds is not None and cfg.budget.epochs is None
        # every job's own threshold reached the config, the host bound is the paper setting's
        assert f"algo.min_accel_batch={cfg.algo.min_accel_batch}" in job
        assert cfg.algo.max_host_batch == script.paper_setting().max_host_batch
        grid.add((cfg.devices.name, cfg.algo.min_accel_batch))
    thresholds = {t for _, t in grid}
    assert grid == {(m, t) for m in MACHINES for t in thresholds} and len(jobs) == len(grid)
    # the sweep spans the default, the paper setting and the GPU's own batch (no shrinking)
    assert {AdaptiveConfig.min_accel_batch, script.paper_setting().min_accel_batch,
            1024} <= thresholds


@pytest.mark.wall
@pytest.mark.parametrize("machine,band", [("paper_hogbatch_v100", (0.52, 0.60)),
                                          ("paper_hogbatch_k80", (0.71, 0.81))])
def test_the_paper_setting_lands_in_the_papers_cpu_share_on_each_machine(
        script: ModuleType, machine: str, band: tuple[float, float]) -> None:
    """The experiment's controller timing and budget, the bounds of +experiment=adaptive_paper."""
    paper = script.paper_setting()
    point = script.replay([EXPERIMENT, f"devices={machine}",
                           f"algo.min_accel_batch={paper.min_accel_batch}"])
    assert point.threshold == paper.min_accel_batch
    low, high = band
    assert low <= point.cpu_share(point.budget_s / 2) <= high
    # both bounds reached: the GPU at the threshold, the hosts at max_host_batch
    assert point.final_batches == (paper.min_accel_batch, paper.max_host_batch)


@pytest.mark.wall
def test_hogbatch_leaves_the_cpu_nearly_all_the_updates(script: ModuleType) -> None:
    point = script.replay(["algo=hogbatch", "devices=paper_hogbatch_v100", "dataset=digits",
                           "model=mlp_paper", "budget.epochs=null", "budget.seconds=0.2",
                           "eval.every_s=0.05", "eval.every_epochs=null", "monitor.interval_s=0.01"])
    assert point.threshold is None and point.final_batches == (1024, 1)
    assert point.cpu_share() >= 0.9


@pytest.mark.wall
def test_a_higher_threshold_leaves_the_cpu_more_updates_and_the_gpu_busier(
        script: ModuleType) -> None:
    """The documented direction: the threshold trades update balance for GPU utilization."""
    points = [script.replay([EXPERIMENT, "devices=paper_hogbatch_k80",
                             f"algo.min_accel_batch={threshold}"]) for threshold in (128, 512, 1024)]
    shares = [p.cpu_share(p.budget_s / 2) for p in points]
    busy = [p.busy(p.budget_s / 2) for p in points]
    assert shares == sorted(shares) and shares[-1] - shares[0] > 0.1, shares
    assert busy == sorted(busy) and busy[-1] - busy[0] > 10, busy
    assert [p.final_batches[0] for p in points] == [128, 512, 1024]


@pytest.mark.integration
def test_the_schedule_replay_gives_a_full_runs_update_counts(tmp_path: Path,
                                                             script: ModuleType) -> None:
    """What the script's replay rests on: the stand-in's math leaves the schedule as
    the run's own model makes it (here `mlp`, cheap enough to train for real)."""
    job = ["algo=adaptive", "devices=paper_hogbatch_v100", "dataset=digits", "model=mlp",
           "optim.lr=0.01", "budget.epochs=null", "budget.seconds=0.04", "algo.period_s=0.01",
           "algo.window_s=0.02", "eval.every_s=0.01", "eval.every_epochs=null",
           "monitor.interval_s=0.01"]
    cfg = compose_config(*job)
    summary = runner.run(to_run_config(cfg), tmp_path / "run", cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    full = pd.read_csv(tmp_path / "run" / "convergence.csv")
    replayed = script.replay(job)
    assert len(pd.read_csv(tmp_path / "run" / "batches.csv")) > 49  # the controller resized
    assert replayed.updates == list(zip(full["time_s"], full["updates_accel"], full["updates_cpu"]))


def test_a_finished_jobs_numbers_are_read_and_any_other_folder_is_refused_by_name(
        tmp_path: Path, script: ModuleType) -> None:
    job = write_run(tmp_path / "job", algo="adaptive", devices=MACHINES[1], seed=0)
    refusals = []
    for fix in ("plan", "budget", "gpu0_util"):
        with pytest.raises(UserError) as refused:
            script.read_run(job)
        refusals.append(str(refused.value))
        if fix == "plan":
            summary = json.loads((job / "summary.json").read_text())
            (job / "summary.json").write_text(json.dumps({**summary,
                                                          "plan": {"min_accel_batch": 256}}))
        elif fix == "budget":
            (job / "config.yaml").write_text("budget: {seconds: 4.0, epochs: null}\n")
        else:
            utilization = pd.read_csv(job / "utilization.csv").assign(gpu0_util="50.0")
            utilization.loc[1, "gpu0_util"] = "n/a"  # text: not a sample (at 0.25 s)
            utilization.to_csv(job / "utilization.csv", index=False)
    assert refusals == [f"{job}: its summary.json has no plan.min_accel_batch",
                        f"{job}: its config.yaml has no positive budget.seconds",
                        f"{job}: its utilization.csv lacks gpu0_util"]
    point = script.read_run(job)
    convergence = pd.read_csv(job / "convergence.csv")
    assert (point.machine, point.threshold, point.budget_s, point.final_batches) == (
        MACHINES[1], 256, 4.0, (256, 16))
    assert point.updates == list(zip(convergence["time_s"], convergence["updates_accel"],
                                     convergence["updates_cpu"]))
    assert point.busy() == 50.0
    workers = pd.read_csv(job / "workers.csv")  # a second host worker ended elsewhere: the
    pd.concat([workers, workers.tail(1).assign(worker=2, last_batch=64)]).to_csv(  # first counts
        job / "workers.csv", index=False)
    assert script.read_run(job).final_batches == (256, 16)
    # a window without two snapshots or a sample has no share and no busy time, not an error
    empty = script.Point(MACHINES[0], 256, 1.0, [(0.0, 0, 0), (0.2, 5, 5)], [], (256, 1))
    assert math.isnan(empty.cpu_share(0.5)) and math.isnan(empty.busy(0.5))
    # a window is its snapshots from its start to the budget (1 s): (40 - 10) CPU updates of
    # (40 - 10) + (20 - 10); busy over the samples after 0.5 s up to 1 s; from 0, the whole run
    point = script.Point(MACHINES[0], 256, 1.0,
                         [(0.0, 0, 0), (0.5, 10, 10), (1.0, 20, 40), (1.5, 30, 90)],
                         [(0.25, 10.0), (0.5, 20.0), (0.75, 30.0), (1.0, 40.0), (1.5, 90.0)],
                         (256, 1))
    assert (point.cpu_share(0.5), point.busy(0.5), point.busy()) == (0.75, 35.0, 38.0)

    other = write_run(tmp_path / "other\x1b[2J", algo="sync", devices="auto_gpu", seed=0)
    with pytest.raises(UserError, match="is not a job of"):
        script.read_run(other)
    ran = subprocess.run([sys.executable, str(SCRIPT), "--sweep", str(tmp_path),
                          "--figures", str(tmp_path / "figures")],
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 1  # the table of the one job, and the folder left out
    assert "| K80 | 256 |" in ran.stdout
    assert said(ran.stderr, "adaptive_threshold") == (
        f"adaptive_threshold: left out {shown(other)}: algo=sync devices=auto_gpu is not a job "
        f"of {EXPERIMENT}\n")
    shutil.rmtree(job)
    ran = subprocess.run([sys.executable, str(SCRIPT), "--sweep", str(tmp_path),
                          "--figures", str(tmp_path / "figures")],
                         capture_output=True, text=True, timeout=300)
    assert (ran.returncode, ran.stdout) == (1, "")
    assert said(ran.stderr, "adaptive_threshold").startswith(
        f"adaptive_threshold: no completed job of {EXPERIMENT} under "
                                 f"{tmp_path}: 1 run(s), the first {shown(other)}: ")
    assert said(ran.stderr, "adaptive_threshold").count("\n") == 1 and "\x1b" not in ran.stderr
