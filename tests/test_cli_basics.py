"""The command line's everyday basics, as a user types them: --version, shell completion, a dry
run of a sweep, a sweep's job k of N, the list of runs, and the nearest key after a typo."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from typer.testing import CliRunner

from hetsgd.cli import app
from hetsgd.completion import complete_override
from hetsgd.config.hydra_private import BASIC_SWEEPER
from hetsgd.config.keys import nearest_key
from hetsgd.outputs.sweep import claim_folder
from hetsgd.outputs.sweep_progress import job_count, progress_line

pytestmark = pytest.mark.integration


def hetsgd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetsgd", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("hetsgd: error:")]


def test_version_names_the_installed_package_and_torch() -> None:
    done = hetsgd("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"hetsgd {version('hetsgd')} (torch {torch.__version__}, ")
    assert len(done.stdout.splitlines()) == 1


# -- completion ----------------------------------------------------------------------------------


def complete(typed: list[str], incomplete: str) -> list[str]:
    ctx: Any = SimpleNamespace(params={"overrides": typed})
    return complete_override(ctx, incomplete)


def test_completion_offers_choices_and_the_composed_configs_keys() -> None:
    assert complete([], "algo=hog") == ["algo=hogbatch", "algo=hogwild"]
    assert "+method=local_biased" in complete(["-m"], "+method=lo")
    assert complete([], "devices=single") == ["devices=single_cpu"]
    assert complete([], "bud") == ["budget.epochs=", "budget.seconds="]
    assert complete([], "progress=") == ["progress=true", "progress=false"]
    # the keys are those of the config the arguments before it compose: sync has no tau
    assert complete(["algo=local_sgd"], "algo.ta") == ["algo.tau=", "algo.tau_min="]
    assert complete([], "algo.ta") == []
    assert {"algo=", "devices=", "+method=", "+experiment="} <= set(complete([], ""))
    # what is no key completes to nothing, without a traceback in the user's shell
    assert complete([], "..=") == complete([], "a..b=") == []


def test_completion_through_the_shells_protocol() -> None:
    """Typer's completion, as the script `hetsgd --install-completion` installs calls it: the
    commands, an override as zsh passes it, and as bash splits it at `=`."""
    commands = hetsgd(env={"_HETSGD_COMPLETE": "complete_bash", "COMP_WORDS": "hetsgd ru",
                           "COMP_CWORD": "1"})
    assert commands.stdout.split() == ["run", "runs"], commands.stderr
    zsh = hetsgd(env={"_HETSGD_COMPLETE": "complete_zsh",
                      "_TYPER_COMPLETE_ARGS": "hetsgd run -m algo=sync,hogbatch devices=emu"})
    assert "devices=emulated" in zsh.stdout and "single_cpu" not in zsh.stdout, zsh.stderr
    bash = hetsgd(env={"_HETSGD_COMPLETE": "complete_bash",
                       "COMP_WORDS": "hetsgd run -m algo = ho", "COMP_CWORD": "5"})
    assert bash.stdout.split() == ["hogbatch", "hogwild"], bash.stderr
    # `algo=` then tab: bash completes the word `=` itself
    equals = hetsgd(env={"_HETSGD_COMPLETE": "complete_bash", "COMP_WORDS": "hetsgd run algo =",
                         "COMP_CWORD": "3"})
    assert "=local_sgd" in equals.stdout.split(), equals.stderr


def test_hydras_own_completion_is_refused_for_hetsgds() -> None:
    result = CliRunner().invoke(app, ["run", "-sc", "install=bash"])
    assert result.exit_code == 1 and not result.stdout
    assert errors(result.stderr) == [
        "hetsgd: error: hetsgd run: Hydra's shell completion does not know hetsgd's commands: "
        "`hetsgd --install-completion` installs hetsgd's (`--show-completion` prints it)"]


# -- dry run -------------------------------------------------------------------------------------


def test_dry_run_names_the_job_that_would_fail_and_trains_nothing(results_dir: Path) -> None:
    done = hetsgd("run", "-m", "algo=sync,hogbatch", "devices=single_cpu", "--dry-run")
    assert done.returncode == 1
    line, = errors(done.stderr)
    assert line.startswith("hetsgd: error: job 1 (algo=hogbatch devices=single_cpu) would fail:")
    assert "needs an accelerator group" in line
    assert "2 job(s) composed and checked, 1 would fail; nothing trained" in done.stdout
    assert "Traceback" not in done.stderr
    assert not results_dir.exists()  # no run folder, no sweep folder


def dry_run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, ["run", *args, "--dry-run"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def test_dry_run_checks_every_job_without_training(results_dir: Path, tmp_path: Path) -> None:
    code, stdout, stderr = dry_run("-m", "seed=0,1,2", "algo=sync,hogwild")
    assert code == 0 and errors(stderr) == []
    assert "6 job(s) composed and checked, 0 would fail" in stdout
    # the checks a run makes before training: a file's presence, a key, a value's range
    code, _, stderr = dry_run("-m", "dataset=digits,libsvm,files", "dataset.path=/no/such.svm")
    assert code == 1
    assert [line.split(" would fail: ")[1] for line in errors(stderr)] == [
        "dataset.path is not used by the digits source (got /no/such.svm); use dataset=libsvm "
        "dataset.path=... for a file", "dataset file not found: /no/such.svm",
        "dataset file not found: /no/such.svm"]
    code, _, stderr = dry_run("-m", "dataset=digits,libsvm")
    assert code == 1 and len(errors(stderr)) == 1 and "job 1 " in stderr
    assert "needs dataset.path" in stderr
    code, _, stderr = dry_run("-m", "optim.lr=0.1,-1")
    line, = errors(stderr)
    assert line.startswith("hetsgd: error: job 1 (optim.lr=-1) would fail:") and "optim.lr" in line
    # a single run: its one line, and a typo's nearest key
    code, _, stderr = dry_run("budget.second=3")
    assert code == 1 and errors(stderr) == [
        "hetsgd: error: the run would fail: the config has no key budget.second (did you mean "
        "budget.seconds?)"]
    assert not results_dir.exists()


def test_dry_run_of_a_tuned_comparison_checks_its_comparisons_jobs(results_dir: Path) -> None:
    code, stdout, stderr = dry_run("-m", "+experiment=tuned_comparison")
    assert code == 0 and errors(stderr) == [], stderr
    assert "12 job(s) composed and checked, 0 would fail" in stdout  # 4 methods x 3 seeds
    assert not results_dir.exists()


def test_dry_run_checks_the_run_a_resume_continues_and_a_tuning_that_is_no_node(
        results_dir: Path, tmp_path: Path, checkpointed_run: Path) -> None:
    """A resume's run folder and checkpoint were not looked at (a missing one passed), and a
    `tuning=5` ended in a traceback."""
    code, _, stderr = dry_run(f"resume={tmp_path / 'nowhere'}")
    assert code == 1 and errors(stderr) == [
        f"hetsgd: error: the run would fail: resume={tmp_path / 'nowhere'}: no such directory"]
    code, _, stderr = dry_run(f"resume={checkpointed_run}", "optim.lr=0.5")
    assert code == 1 and "optim cannot change" in stderr and len(errors(stderr)) == 1
    code, stdout, stderr = dry_run(f"resume={checkpointed_run}", "budget.seconds=9")
    assert code == 0 and errors(stderr) == [] and "1 job(s) composed and checked" in stdout
    code, _, stderr = dry_run("-m", "tuning=5")
    assert code == 1 and errors(stderr) == [
        "hetsgd: error: tuning=5: a tuned comparison's node is a mapping (methods, search, "
        "objective, trials)"]
    assert not results_dir.exists()


def test_dry_run_refuses_a_sweep_folder_in_use(results_dir: Path, tmp_path: Path) -> None:
    used = tmp_path / "sweep"
    (used / "0").mkdir(parents=True)
    (used / "multirun.yaml").write_text("{}\n")
    code, _, stderr = dry_run("-m", "seed=0,1", f"hydra.sweep.dir={used}")
    assert code == 1 and len(errors(stderr)) == 1 and "already holds a sweep" in stderr
    # one another sweep claimed is refused too; a free one is checked, neither claimed nor made
    claimed = tmp_path / "claimed"
    claim_folder(claimed)
    code, _, stderr = dry_run("-m", "seed=0,1", f"hydra.sweep.dir={claimed}")
    line, = errors(stderr)
    assert code == 1 and f"hydra.sweep.dir {claimed} is claimed by another sweep" in line
    free = tmp_path / "free"
    code, _, stderr = dry_run("-m", "seed=0,1", f"hydra.sweep.dir={free}")
    assert code == 0 and errors(stderr) == [] and not free.exists()


def test_dry_run_refuses_what_the_run_would_a_used_run_folder_and_a_folder_for_a_file(
        results_dir: Path, tmp_path: Path) -> None:
    """Each passed the dry run ('0 would fail'), then failed the run it checked."""
    used = tmp_path / "run"
    used.mkdir()
    (used / "summary.json").write_text("{}")
    code, _, stderr = dry_run(f"hydra.run.dir={used}")
    line, = errors(stderr)
    assert code == 1 and f"hydra.run.dir {used} holds an earlier run" in line
    code, _, stderr = dry_run("-m", "dataset=libsvm,files,folder", f"dataset.path={tmp_path}",
                              "model=mlp")
    assert code == 1 and [line.split(" would fail: ")[1] for line in errors(stderr)] == [
        f"{tmp_path} is a folder: dataset=libsvm reads a file",
        f"{tmp_path} is a folder: dataset=files reads a file"]
    code, _, stderr = dry_run("dataset=folder", f"dataset.path={used / 'summary.json'}")
    assert code == 1 and errors(stderr) == [
        f"hetsgd: error: the run would fail: {used / 'summary.json'} is not a folder: "
        "dataset=folder reads one"]


# -- a sweep's progress --------------------------------------------------------------------------


def test_job_count_is_the_sweeps_expansion() -> None:
    hydra = OmegaConf.create({"sweeper": {"_target_": BASIC_SWEEPER, "params": {"seed": "0,1,2"}},
                              "overrides": {"task": ["algo=sync,hogbatch", "devices=auto"]}})
    assert job_count(hydra) == 6
    other = OmegaConf.create({"sweeper": {"_target_": "a.Sweeper", "n_trials": 20}})
    assert job_count(other) == 20
    assert job_count(OmegaConf.create({"sweeper": {"_target_": "a.Sweeper"}})) is None


def test_progress_line_says_job_k_of_n_and_the_time_left() -> None:
    assert progress_line(0, 5, "0_seed=0", 0.0) == "hetsgd: job 1 of 5 (0_seed=0)"
    # 2 jobs done in 40 s: 20 s a job, 3 to go (this one included)
    assert progress_line(2, 5, "2_seed=2", 40.0) == "hetsgd: job 3 of 5 (2_seed=2), about 60 s left"
    assert progress_line(3, None, "3_x", 9.0) == "hetsgd: job 4 (3_x)"
    assert progress_line(1, 2, "1_\x1b[2J", 1.0) == "hetsgd: job 2 of 2 (1_\\x1b[2J), about 1 s left"


@pytest.mark.wall
def test_a_sweep_prints_job_k_of_n_then_runs_lists_its_runs(results_dir: Path) -> None:
    done = hetsgd("run", "-m", "seed=0,1", "budget.epochs=1", "progress=false")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("hetsgd: job")]
    assert lines[0] == "hetsgd: job 1 of 2 (0_seed=0)"
    assert re.fullmatch(r"hetsgd: job 2 of 2 \(1_seed=1\), about \d+ (s|min) left", lines[1])
    assert len(lines) == 2
    listing = hetsgd("runs")  # $HETSGD_RESULTS
    assert listing.returncode == 0, listing.stderr
    rows = [line.split() for line in listing.stdout.splitlines() if "seed=" in line]
    assert [row[0].rsplit("/", 1)[1] for row in rows] == ["0_seed=0", "1_seed=1"]
    summaries = [json.loads((results_dir / row[0] / "summary.json").read_text()) for row in rows]
    for row, summary in zip(rows, summaries):
        assert row[1:6] == ["completed", "sync", "single_cpu", "digits", "mlp"]
        assert float(row[6]) == pytest.approx(summary["final"]["train_loss"], rel=1e-3)


def test_report_and_plot_default_to_hetsgd_results_as_runs_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not ./results (this repository has one): where $HETSGD_RESULTS moved the runs to."""
    from test_report import write_run
    root = tmp_path / "elsewhere"
    for seed in (0, 1):
        write_run(root / "runs" / f"sync{seed}", algo="sync", devices="gpu", seed=seed)
    monkeypatch.setenv("HETSGD_RESULTS", str(root))
    monkeypatch.chdir(tmp_path)  # a default that ignored it would write here, not in ./results
    runner = CliRunner()
    for command in ("report", "plot"):
        done = runner.invoke(app, [command])
        assert done.exit_code == 0, done.output
    assert (root / "report.md").is_file() and list((root / "figures").glob("*.png"))



def test_plot_that_draws_nothing_fails_and_says_why(tmp_path: Path) -> None:
    """A folder of runs that failed before their first snapshot: an error, not "0 written"."""
    run = tmp_path / "runs" / "r0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"status": "failed", "error": "boom"}))
    done = CliRunner().invoke(app, ["plot", str(tmp_path)])
    assert done.exit_code == 1
    assert f"no figures written under {tmp_path}: no run there has a curve" in done.output
    assert "Traceback" not in done.output

# -- hetsgd runs ---------------------------------------------------------------------------------


def _summary(**fields: Any) -> dict[str, Any]:
    return {"status": "completed", "error": None, "seed": 0, "algo": "sync", "dataset": "digits",
            "model": "mlp", "devices": "single_cpu", "emulated": False, "simulated": False,
            "time_s": 2.5, "epochs": 1.0, "examples": 100, "updates": 10, "examples_per_s": 40.0,
            "final": {"train_loss": 0.125, "test_acc": 0.5}, **fields}


def test_runs_lists_and_filters_run_folders_escaping_them(tmp_path: Path) -> None:
    root = tmp_path / "results"
    for name, summary in (("a", _summary()), ("b", _summary(algo="hogbatch", devices="auto")),
                          ("c\x1b]52;c;x\x07", _summary(status="failed", devices="\x1b[2J"))):
        (root / "runs" / name).mkdir(parents=True)
        (root / "runs" / name / "summary.json").write_text(json.dumps(summary))
    (root / "runs" / "d").mkdir()
    (root / "runs" / "d" / "config.yaml").write_text("algo:\n  name: adaptive\n")  # died early
    done = hetsgd("runs", env={"HETSGD_RESULTS": str(root)})
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()
            if line.strip().startswith("runs/")}
    assert rows["runs/a"] == ["completed", "sync", "single_cpu", "digits", "mlp", "0.125",
                              "0.5000", "2.5"]
    assert rows["runs/b"][:3] == ["completed", "hogbatch", "auto"]
    assert rows["runs/c\\x1b]52;c;x\\x07"][:3] == ["failed", "sync", "\\x1b[2J"]
    assert rows["runs/d"][:2] == ["crashed", "adaptive"]
    assert "\x1b" not in done.stdout
    def listed(*filters: str) -> list[str]:
        only = hetsgd("runs", str(root), *filters)
        return [line.split()[0] for line in only.stdout.splitlines()
                if line.strip().startswith("runs/")]

    assert listed("--status", "completed", "--algo", "hogbatch") == ["runs/b"]
    assert listed("--status", "failed") == ["runs/c\\x1b]52;c;x\\x07"]  # a status alone
    missing = hetsgd("runs", str(tmp_path / "nothing"))
    assert missing.returncode == 1 and errors(missing.stderr) == [
        f"hetsgd: error: no such results folder: {tmp_path / 'nothing'}"]
    typo = hetsgd("runs", str(root), "--status", "complete")  # listed nothing, and said 0
    assert typo.returncode == 1 and errors(typo.stderr) == [
        "hetsgd: error: --status complete is no run's status: one of completed, diverged, "
        "failed, interrupted, crashed, running"]


# -- typos ---------------------------------------------------------------------------------------


def test_a_typo_gets_the_nearest_key_or_choice(results_dir: Path) -> None:
    done = hetsgd("run", "budget.second=3")
    assert done.returncode == 1 and errors(done.stderr) == [
        "hetsgd: error: the config has no key budget.second (did you mean budget.seconds?)"]
    done = hetsgd("run", "algo=hogbach")
    line, = errors(done.stderr)
    assert done.returncode == 1
    assert line.startswith("hetsgd: error: no config 'algo/hogbach' (did you mean hogbatch?): ")
    assert not results_dir.exists()


def run_error(*args: str) -> str:
    result = CliRunner().invoke(app, ["run", *args, "progress=false"])
    assert result.exit_code == 1
    line, = errors(result.stderr)
    return line


@pytest.mark.parametrize("override, key", [
    ("+devices.groups.extra={kind: cpu, count: 1}", "devices.groups.extra"),
    ("++devices.groups.extra.kind=cpu", "devices.groups.extra.kind"),
    ("devices.groups.extra.kind=cpu", "devices.groups.extra.kind"),  # Hydra's advice: add `+`
    ("+devices.groups.extra=5", "devices.groups.extra")])
def test_a_device_group_added_by_an_override_says_how_to_add_one(
        results_dir: Path, tmp_path: Path, override: str, key: str) -> None:
    """OmegaConf cannot type a new devices.groups entry from the command line, which Hydra's own
    error suggests: the line says so and gives the way that works (a mix file of one's own)."""
    assert run_error("algo=hogwild", override) == (
        f"hetsgd: error: {key}: a device group cannot be added by an override (OmegaConf "
        "cannot type a new entry of devices.groups); write the mix in DIR/devices/NAME.yaml "
        "(`defaults: [MIX, _self_]`, MIX the mix it extends, `name: NAME`, then its `groups:`) "
        "and give --config-dir DIR devices=NAME (docs/devices.md)")
    assert not results_dir.exists()
    (tmp_path / "devices").mkdir()
    (tmp_path / "devices" / "mine.yaml").write_text(
        "defaults: [single_cpu, _self_]\nname: mine\ngroups: {extra: {kind: cpu, count: 1}}\n")
    shown = CliRunner().invoke(app, ["run", "--config-dir", str(tmp_path), "algo=hogwild",
                                     "devices=mine", "--cfg", "job"])
    assert shown.exit_code == 0, shown.output
    devices = OmegaConf.create(shown.stdout).devices
    assert (devices.name, devices.groups.extra.kind, devices.groups.extra.count,
            devices.groups.cpu.count) == ("mine", "cpu", 1, 1)


def test_a_mistyped_device_group_added_with_a_plus_gets_the_nearest_key(
        results_dir: Path) -> None:
    assert run_error("algo=hogwild", "+devices.groups.cpuu.count=1") == (
        "hetsgd: error: the config has no key devices.groups.cpuu.count (did you mean "
        "devices.groups.cpu.count?)")


def test_the_nearest_key_is_of_the_chosen_configs(results_dir: Path) -> None:
    assert "did you mean algo.tau?" in run_error("algo=local_sgd", "algo.tauu=2")
    assert "did you mean devices.groups.cpu.count?" in run_error("devices.groups.cpu.cont=2")
    # sync has no key near tauu: Hydra's own message, no guess (algo.name shares 5 characters)
    assert "did you mean" not in run_error("algo.tauu=2")
    # a key added with + that no schema has: the run fails, saying the nearest key
    assert "(did you mean budget.seconds?)" in run_error("+budget.second=3")


def test_nearest_key() -> None:
    keys = ["budget.seconds", "budget.epochs", "algo.name", "optim.lr"]
    assert nearest_key("budget.second", keys) == "budget.seconds"
    assert nearest_key("budgt.seconds", keys) == "budget.seconds"
    assert nearest_key("algo.tauu", keys) is None
    assert nearest_key("optim.lrr", keys) == "optim.lr"


def test_data_info_shows_values_not_reprs_and_calibrate_names_a_mistyped_choice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`files: (PosixPath('...'), ...)` and empty `urls: ()` lines; Hydra's raw error with its
    search path where `hetsgd run` says which choice was meant."""
    monkeypatch.setenv("HETSGD_DATA", str(tmp_path))
    shown = CliRunner().invoke(app, ["data", "info", "w8a"])
    text = " ".join(shown.stdout.split())
    assert shown.exit_code == 0 and f"files: {tmp_path / 'w8a'}, {tmp_path / 'w8a.t'}" in text
    assert "PosixPath" not in text and "('" not in text
    own = " ".join(CliRunner().invoke(app, ["data", "info", "files"]).stdout.split())
    assert "urls:" not in own and "files:" not in own and "sizes:" not in own
    assert "name: files" in own and "note: reads dataset.path=FILE" in own
    typo = CliRunner().invoke(app, ["machine", "--calibrate", "algo=hogbach"])
    assert typo.exit_code == 1 and typo.stderr.strip().splitlines() == [
        "hetsgd: error: no config 'algo/hogbach' (did you mean hogbatch?): choose one of "
        "adaptive, custom, hogbatch, hogwild, local_sgd, sync"]


def test_a_command_line_that_does_not_parse_is_one_line_with_the_usage_code() -> None:
    """A misspelt option or command was a six-line box; no arguments still show the help."""
    for args, line in [(("runs", "--stauts", "failed"),
                        "No such option: --stauts (Possible options: --status) (see hetsgd runs "
                        "--help)"),
                       (("bogus",), "No such command 'bogus'. (see hetsgd --help)"),
                       # an option given no value: Click names no command; the line still does
                       (("runs", "--status"),
                        "Option '--status' requires an argument. (see hetsgd runs --help)"),
                       # Hydra's own parser: `hetsgd run`'s flags, with and without --dry-run
                       (("run", "seed=0", "--bogus"),
                        "unrecognized arguments: --bogus (see hetsgd run --help)"),
                       (("run", "--dry-run", "--cfg", "bogus"),
                        "argument --cfg/-c: invalid choice: 'bogus' (choose from 'job', 'hydra', "
                        "'all') (see hetsgd run --help)")]:
        done = hetsgd(*args)
        assert (done.returncode, done.stderr.splitlines()) == (2, [f"hetsgd: error: {line}"])
    shown = hetsgd("data")
    assert "info" in shown.stdout and "fetch" in shown.stdout and not errors(shown.stderr)
    bundled = CliRunner().invoke(app, ["data", "fetch", "digits"])  # printed nothing at all
    assert (bundled.exit_code, bundled.stdout) == (
        0, "digits: bundled with scikit-learn: nothing to fetch\n")
