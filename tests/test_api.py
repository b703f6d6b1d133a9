"""hetsgd from Python (hetsgd/api.py): the same run as the command line's, read back typed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from test_report import write_run

import hetsgd
from hetsgd import invocation
from hetsgd.errors import UserError
from hetsgd.invocation import invoke
from hetsgd.outputs.summary import GroupMix, Losses, Mix, RunSummary, TargetLosses
from hetsgd.runs import runner

# seeded and bounded in epochs, so two runs of it take the same steps and end the same
SEEDED = ("algo=sync", "dataset=digits", "model=logreg", "budget.epochs=1", "budget.seconds=null",
          "eval.every_s=10", "eval.every_epochs=0.5", "seed=3", "progress=false")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("api") / "results"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HETSGD_RESULTS", str(path))
        yield path


@pytest.fixture(scope="module")
def from_python(results: Path) -> hetsgd.RunResult:
    return hetsgd.run(*SEEDED)


@pytest.mark.integration
def test_run_from_python_is_the_command_lines_run(from_python: hetsgd.RunResult,
                                                  results: Path) -> None:
    shell = subprocess.run([sys.executable, "-m", "hetsgd", "run", *SEEDED], capture_output=True,
                           text=True, timeout=300, env={**os.environ, "HETSGD_RESULTS": str(results)})
    assert shell.returncode == 0, shell.stderr
    (shell_dir,) = [d for d in (results / "runs").iterdir() if d != from_python.run_dir]
    by_shell = json.loads((shell_dir / "summary.json").read_text())
    assert from_python.exit_code == 0 and from_python.status == "completed"
    summary = from_python.summary
    assert (summary.algo, summary.dataset, summary.model, summary.seed) == ("sync", "digits",
                                                                            "logreg", 3)
    by_python = json.loads((from_python.run_dir / "summary.json").read_text())
    # one entry: the same fields, whichever way in; warnings (a coordinator not scheduled for a
    # while, on a loaded machine) are written only by the run they happened to
    assert by_python.keys() - {"warnings"} == by_shell.keys() - {"warnings"}
    for field in ("updates", "examples", "epochs", "updates_by_group", "plan", "mix", "scaling"):
        assert summary.to_dict()[field] == by_shell[field], field
    for when in ("initial", "final"):
        assert getattr(summary, when) == Losses(**by_shell[when]), when
    # the snapshots between are taken when the coordinator looks (time-dependent); the ends are not
    shell_curve = pd.read_csv(shell_dir / "convergence.csv").drop(columns="time_s")
    curve = from_python.convergence.drop(columns="time_s")
    for row in (0, -1):
        pd.testing.assert_series_equal(curve.iloc[row], shell_curve.iloc[row], check_names=False)


@pytest.mark.integration
def test_load_reads_a_run_back(from_python: hetsgd.RunResult) -> None:
    loaded = hetsgd.load(from_python.run_dir)
    assert loaded.summary == from_python.summary
    assert loaded.exit_code is None
    assert loaded.summary.run_dir == str(from_python.run_dir)
    for table in ("convergence", "utilization", "workers"):
        pd.testing.assert_frame_equal(getattr(loaded, table),
                                      pd.read_csv(from_python.run_dir / f"{table}.csv"))
    assert len(loaded.convergence) >= 2  # the start and the end at least
    assert loaded.summary.final.train_loss < loaded.summary.initial.train_loss


@pytest.mark.integration
def test_a_failed_run_is_a_result_with_its_exit_status(results: Path) -> None:
    failed = hetsgd.run("optim.lr=-1", "progress=false")
    assert failed.exit_code == 1 and failed.status == "failed"
    assert "optim.lr" in failed.summary.error
    assert failed.convergence is None and failed.summary.final is None


@pytest.mark.integration
def test_each_invocation_reports_only_its_own_runs_and_errors(results: Path) -> None:
    """Nothing one invocation learns is kept in a module: a second one in the same process (a
    notebook, a script) starts from nothing."""
    first = invoke(["optim.lr=-1", "progress=false"])  # refused by the checks: no training
    second = invoke(["optim.lr=-2", "progress=false"])
    assert (first.code, second.code) == (1, 1)
    assert len(first.runs) == len(second.runs) == 1 and first.runs != second.runs
    assert first.statuses == second.statuses == ["failed"]
    assert [e.split(" is ")[0] for e in first.errors + second.errors] == ["optim.lr=-1.0",
                                                                           "optim.lr=-2.0"]


def test_a_stop_is_handled_without_importing_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM lands where it will: in a module's import, say pandas'. The handler of the stop
    must import nothing, or it fails on the half-imported module and the command ends in a
    traceback instead of its exit status. An import that fails stands in for one."""
    def stopped(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(invocation, "_launch", stopped)
    monkeypatch.setitem(sys.modules, "hetsgd.tuning.phases", None)  # importing it raises
    assert invocation.invoke(["progress=false"]).code == 130


def test_a_stopped_call_raises_the_stop(monkeypatch: pytest.MonkeyPatch, results: Path) -> None:
    """Ctrl-C in a notebook's loop of runs stops the loop: the call raises it, after the run
    said so in its folder (it returned the run as interrupted, and the loop went on). A run
    that failed is returned, not raised."""
    assert hetsgd.run("optim.lr=-1", "progress=false").exit_code == 1

    def ctrl_c(*args: object) -> None:
        signal.raise_signal(signal.SIGINT)  # as a Ctrl-C arrives, while the run trains

    with monkeypatch.context() as patch:
        patch.setattr(runner, "_train", ctrl_c)
        with pytest.raises(KeyboardInterrupt, match="was interrupted; what it wrote is in ") as got:
            hetsgd.run("progress=false")
    run_dir = Path(str(got.value).rsplit(" is in ", 1)[1])
    assert hetsgd.load(run_dir).status == "interrupted"

    def sigterm(*args: object) -> None:
        signal.raise_signal(signal.SIGTERM)  # a scheduler's stop: not the user's Ctrl-C

    with monkeypatch.context() as patch:
        patch.setattr(runner, "_train", sigterm)
        with pytest.raises(KeyboardInterrupt, match="was stopped by SIGTERM; what it wrote is in "
                           ) as got:
            hetsgd.run("progress=false")
    stopped_run = hetsgd.load(Path(str(got.value).rsplit(" is in ", 1)[1]))
    assert (stopped_run.status, stopped_run.summary.error) == ("interrupted", "stopped by SIGTERM")

    def stopped(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(invocation, "_launch", stopped)
    with pytest.raises(KeyboardInterrupt, match="^hetsgd run progress=false was interrupted$"):
        hetsgd.run("progress=false")
    with pytest.raises(KeyboardInterrupt, match="^hetsgd run -m seed=0,1 was interrupted$"):
        hetsgd.sweep("seed=0,1")


def test_a_refused_resume_or_sweep_is_raised_not_read_back_as_a_run(results: Path) -> None:
    """A resume of a run that left no checkpoint trains nothing and writes nothing: the run
    it names is not this call's result (it read as completed, with exit status 1); a sweep
    none of whose jobs composes started no run."""
    done = write_run(results / "done", algo="sync", devices="cpu", seed=0)
    with pytest.raises(UserError, match=f"^resume={done}: the run left no checkpoint"):
        hetsgd.run(f"resume={done}", "progress=false")
    with pytest.raises(UserError, match="^the config has no key devices.groups.accel.batch_size"):
        hetsgd.sweep("+method=sync,hogwild", "devices.groups.accel.batch_size=64")


def test_overrides_that_compose_no_run_raise_the_one_line_error(results: Path) -> None:
    with pytest.raises(UserError, match=r"^no config 'algo/nope': choose one of .*sync"):
        hetsgd.run("algo=nope")


@pytest.mark.integration
def test_sweep_reads_back_each_job_in_order(results: Path) -> None:
    swept = hetsgd.sweep("seed=0,1", "budget.epochs=0.5", "budget.seconds=null", "progress=false")
    assert swept.exit_code == 0
    assert [run.summary.seed for run in swept.runs] == [0, 1]
    assert all(run.status == "completed" for run in swept.runs)
    assert (swept.sweep_dir / "report.md").is_file()


@pytest.mark.integration
@pytest.mark.usefixtures("two_cores")  # hogwild's mix: one worker per core
def test_a_sweeps_jobs_of_the_same_data_prepare_it_once(results: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from hetsgd.runs import setup

    prepared: list[int] = []
    prepare = setup._prepare

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        prepared.append(1)
        return prepare(*args, **kwargs)

    monkeypatch.setattr(setup, "_prepare", counted)
    monkeypatch.setattr(setup, "_prepared", type(setup._prepared)())
    swept = hetsgd.sweep("+method=gpu,hogwild", "seed=0,1", "budget.epochs=0.25",
                         "budget.seconds=null", "progress=false")
    assert [(run.summary.algo, run.summary.seed) for run in swept.runs] == [
        ("sync", 0), ("sync", 1), ("hogwild", 0), ("hogwild", 1)]
    assert all(run.status == "completed" for run in swept.runs)
    # dataset.split_seed (0 by default), not the run's seed, draws the split: one copy for all
    assert len(prepared) == 1
    # a run of its own (no sweep) prepares its data afresh
    assert hetsgd.run(*SEEDED).status == "completed" and len(prepared) == 2
    # split_seed=null: each seed's split is other data, prepared once per seed
    by_seed = hetsgd.sweep("+method=gpu", "seed=0,1", "dataset.split_seed=null",
                           "budget.epochs=0.25", "budget.seconds=null", "progress=false")
    assert [run.status for run in by_seed.runs] == ["completed"] * 2 and len(prepared) == 4


@pytest.mark.integration
def test_a_runs_timing_splits_its_wall_time_around_training(results: Path) -> None:
    started = time.time()
    ran = hetsgd.run("algo=hogwild", "devices=cpu", "devices.groups.cpu.count=2", "dataset=digits",
                     "budget.seconds=0.5", "budget.epochs=null", "progress=false")
    wall = time.time() - started
    timing = ran.summary.timing
    assert ran.status == "completed" and timing is not None
    # workers started and the data loaded before the clock; evaluation and files after it
    assert timing.before_training_s > 0 and timing.after_training_s > 0
    assert timing.before_training_s + ran.summary.time_s + timing.after_training_s < wall
    assert json.loads((ran.run_dir / "summary.json").read_text())["timing"] == {
        "before_training_s": timing.before_training_s,
        "after_training_s": timing.after_training_s}


def test_load_of_no_directory_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such run directory"):
        hetsgd.load(tmp_path / "absent")
    (tmp_path / "sweep" / "0_seed=0").mkdir(parents=True)  # a sweep's folder, not its job's
    (tmp_path / "sweep" / "0_seed=0" / "config.yaml").write_text("seed: 0\n")
    for folder in (tmp_path / "sweep", tmp_path):  # was read as a crashed run
        with pytest.raises(UserError, match=rf"^{re.escape(str(folder))} is not a run directory"):
            hetsgd.load(folder)
    assert hetsgd.load(tmp_path / "sweep" / "0_seed=0").summary.status == "crashed"


def test_a_summary_keeps_what_it_does_not_name() -> None:
    summary = RunSummary.from_dict({"status": "completed", "adaptive": {"max_gpu_batch": 64},
                                    "final": {"train_loss": 1.0, "test_loss": 2.0,
                                              "test_acc": 0.5}})
    assert summary.extra == {"adaptive": {"max_gpu_batch": 64}}
    assert summary.final == Losses(1.0, 2.0, 0.5) and summary.algo is None
    # an entry named like the field that holds the others is one of them, and written back
    named_extra = RunSummary.from_dict({"status": "completed", "extra": [1]})
    assert named_extra.extra == {"extra": [1]} and named_extra.to_dict()["extra"] == [1]


def test_a_summary_writes_what_the_run_reached_and_reads_back_the_same() -> None:
    failed = RunSummary(status="failed", error="boom", algo="sync", dataset="digits",
                        model="mlp", devices="cpu", seed=0)
    assert failed.to_dict() == {"status": "failed", "error": "boom", "algo": "sync",
                                "dataset": "digits", "model": "mlp", "devices": "cpu", "seed": 0}
    ran = replace(failed, status="completed", error=None, emulated=False, plan={},
                  mix=Mix({"cpu": GroupMix("cpu", "host", 2, 1, 32, ["cpu", "cpu"])}),
                  time_s=0.0, examples_per_s=None, final=Losses(1.0, 2.0, 0.5),
                  target_losses=TargetLosses([0.5], "eval.target_losses"),
                  extra={"adaptive": {"bound": None}})
    written = ran.to_dict()
    assert written["emulated"] is False and written["plan"] == {}
    assert "examples_per_s" in written and "initial" not in written
    assert written["mix"]["cpu"]["devices"] == ["cpu", "cpu"] and ran.mix.cores == 2
    assert written["adaptive"] == {"bound": None}
    assert RunSummary.from_dict(written) == ran


@pytest.mark.integration
def test_importing_hetsgd_loads_no_training_stack() -> None:
    code = "import sys, hetsgd; print(sorted(m for m in ('torch', 'hetsgd.cli') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr
