"""The command line as a user meets it: help, whole runs, and bad input as one clear error line."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import run_config
from typer.testing import CliRunner

from hetsgd import api
from hetsgd.cli import app
from hetsgd.config.compose import hydra_arguments
from hetsgd.engines.common.coordinator import FIRST_STEP_FACTOR
from hetsgd.engines.virtual.profiles import EXCHANGE_COLUMNS, load_calibration
from hetsgd.errors import UserError
from hetsgd.machine import cuda_devices
from hetsgd.runs.calibrate import calibrate

# every test here runs the `hetsgd` command: as a process where the process is what is checked
# (help and listings as a shell shows them, representative error lines and exit statuses),
# otherwise in this process (hetsgd.api or Typer's runner: the command's own code, no start)
pytestmark = pytest.mark.integration

def hetsgd(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetsgd", *args], capture_output=True, text=True,
                          timeout=timeout)


def only_run_dir(results: Path) -> Path:
    runs = list((results / "runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["data", "--help"],
                                  ["machine", "--help"], ["report", "--help"], ["plot", "--help"]])
def test_every_command_has_help(args: list[str]) -> None:
    result = hetsgd(*args)
    assert result.returncode == 0
    assert "Usage" in result.stdout


def test_data_list_and_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HETSGD_DATA", str(tmp_path))
    listing = hetsgd("data", "list")
    assert listing.returncode == 0 and "w8a" in listing.stdout and "digits" in listing.stdout
    machine = json.loads(hetsgd("machine", "--json").stdout)
    assert machine["cores"] >= 1 and isinstance(machine["gpus"], list)
    assert "simulated devices (devices.groups.<group>.profile=...): xeon_e5_2686v4_core, " in (
        hetsgd("machine").stdout)
    # the command's old name still answers, with a notice on stderr, and is gone from the help
    renamed = hetsgd("devices", "--json")
    assert json.loads(renamed.stdout) == machine and "is now `hetsgd machine`" in renamed.stderr
    help_ = hetsgd("--help").stdout
    assert "machine" in help_ and " devices " not in help_


def test_calibrate_measures_every_group(results_dir: Path) -> None:
    result = CliRunner().invoke(app, ["machine", "--calibrate", "devices=emulated",
                                      "progress=false", "--seconds", "0.02"])
    assert result.exit_code == 0, result.stderr
    saved, = (results_dir / "calibration").glob("*_mlp_digits_emulated.csv")
    table = pd.read_csv(saved)
    assert set(table["group"]) == {"accel", "cpu"}
    assert (table["examples_per_s"] > 0).all() and (table["slowdown"] == 1.0).all()
    assert list(table[table["group"] == "accel"]["label"].unique()) == ["emulated"]
    assert (table["step"] == "fused").all()  # mlp's, under optim.step=auto: what a run checks
    # a replica is copied in and merged back every step; Hogwild steps on the master in place
    accel, cpu = (table[table["group"] == group] for group in ("accel", "cpu"))
    assert ((0 < accel["comm_ms_per_step"]) & (accel["comm_ms_per_step"] < accel["ms_per_step"])
            ).all()
    assert (cpu["comm_ms_per_step"] == 0.0).all()
    # the mix's exchange, in every row: three kinds of round, the ranks stepping about as long
    # (they hardly wait), one step each (the faster waits the difference), several steps each
    # (it waits several times that)
    assert table["exchange_wait_ms"].nunique() == table["exchange_ms"].nunique() == 1
    waits, costs = ([float(v) for v in table[c].iloc[0].split()] for c in EXCHANGE_COLUMNS)
    assert len(waits) == len(costs) == 3 and waits == sorted(waits)
    # at least two steps each (the file rounds each wait to 6 digits: 2 x 2.2735 reads 4.54699)
    assert waits[2] >= 2 * waits[1] * (1 - 1e-5) and waits[1] > 0
    assert all(cost >= 0 for cost in costs)
    # that the rounds time the exchange at all (a cost above 0) depends on the machine's load:
    # test_calibration_times_the_exchange checks it alone on the machine
    # rounds at one wait count as their mean: where the emulated accelerator steps less than
    # 1.5x as fast as a core (the machine's load decides), the first two patterns tie
    first = statistics.mean(c for w, c in zip(waits, costs) if w == waits[0])
    profiles = load_calibration(saved)
    assert profiles["accel"].copy_s() > 0 and profiles["cpu"].copy_s() == 0
    assert profiles["cpu"].exchange_s(0.0) == pytest.approx(first / 1000)
    assert profiles["cpu"].exchange_s(1.0) == pytest.approx(costs[2] / 1000)
    output = " ".join(result.stdout.split())
    assert (f"hetsgd run devices=emulated devices.simulated=true devices.calibration={saved}"
            in output)
    assert (f"exchange of the model, a round beyond its slowest step: {first:.3f} ms at a "
            f"wait of {waits[0]:.3f} ms" in output)


@pytest.mark.integration
@pytest.mark.wall
def test_a_batch_size_measured_for_longer_than_the_stall_window_is_no_hang(
        results_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--seconds past 4 x workers.stall_s read as a hung worker: the wait for each batch
    size's report did not count the seconds it is measured for. The wait each report is given
    is read, not raced against: how long the measuring process takes to start is the
    machine's."""
    from hetsgd.runs import calibrate as calibration

    waits: list[float] = []
    measured = calibration._next
    monkeypatch.setattr(calibration, "_next", lambda results, wait_s: (
        waits.append(wait_s), measured(results, wait_s))[1])
    # three examples: batch size 1 alone
    result = CliRunner().invoke(app, ["machine", "--calibrate", "devices=single_cpu",
                                      "dataset.limit=3", "progress=false", "--seconds", "0.5"])
    assert result.exit_code == 0, result.output
    saved, = (results_dir / "calibration").glob("*.csv")
    assert pd.read_csv(saved)["batch_size"].tolist() == [1]
    stall_s = run_config().workers.stall_s
    assert waits and set(waits) == {FIRST_STEP_FACTOR * stall_s + 0.5}


@pytest.mark.serial
def test_calibration_times_the_exchange() -> None:
    """Alone on the machine (``serial``): under the parallel tier's load a round can read no
    slower than its profiled steps, so the clamped excess is 0 for a correct calibration too. A
    calibration whose rounds timed the steps but not the exchange reads 0 here as well."""
    rows = calibrate(run_config("devices=emulated"), seconds=0.02)
    costs = [float(v) for v in rows[0]["exchange_ms"].split()]
    assert len(costs) == 3 and sum(costs) > 0, rows[0]

def _write_libsvm(path: Path) -> Path:
    lines = []
    for i in range(400):
        label = i % 2
        lines.append(f"{2 * label - 1} 1:{0.2 + 0.6 * label + 0.01 * (i % 7)} 2:{(i % 5) / 5} "
                     f"4:{1 - label}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_run_trains_on_an_unseen_libsvm_file(tmp_path: Path, results_dir: Path) -> None:
    data = _write_libsvm(tmp_path / "unseen.svm")
    result = api.run("algo=sync", "dataset=libsvm", f"dataset.path={data}", "model=mlp",
                     "budget.epochs=2", "progress=false")
    assert result.exit_code == 0, result.summary.error
    run_dir = only_run_dir(results_dir)
    assert run_dir == result.run_dir
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["final"]["test_loss"] < summary["initial"]["test_loss"]
    for name in ("config.yaml", "convergence.csv", "utilization.csv", "workers.csv",
                 "figures/loss_vs_time.png", ".hydra/overrides.yaml"):
        assert (run_dir / name).exists(), name


# (overrides, what the error line says); the first three run as the command's own process: one
# refused before any run directory exists, one failed run, and Hydra's assertion without a
# message (pytest rewrites the assertions of its plugins' packages, Hydra's among them, to give
# one). The rest run in this process: the same code prints the same line, without a start of
# torch and a forkserver each.
BAD_INPUT = [
    (["algo=nope"], "algo/nope"),
    (["dataset=libsvm", "dataset.path=CORRUPT"], "line 2"),
    (["algo=${hetsgd.cores:}"], "cannot be composed"),  # Hydra's error has no message
    (["dataset=libsvm", "dataset.path=/no/such/file"], "dataset file not found: /no/such/file"),
    (["optim.lr=-1"], "optim.lr"),
    (["budget.epochs=0"], "budget.epochs"),
    (["budget.epochs=abc"], "budget.epochs"),
    (["optim.nope=1"], "optim.nope"),
    (["+model.nope=1"], "model.nope"),
    (["devices.groups.cpu.slowdown=1e9"], "slowdown"),  # it would sleep for ever after a step
    (["devices.groups.cpu.count=100000"], "count"),  # it would start that many processes
    (["seed=-1"], "seed"),
]
if not cuda_devices():
    BAD_INPUT.append((["devices=gpu"], "no CUDA GPU"))
AS_PROCESS = 3


def _command(args: list[str], as_process: bool) -> tuple[int, str, str]:
    """`hetsgd ARGS`: its exit status, standard output and standard error."""
    if as_process:
        done = hetsgd(*args)
        return done.returncode, done.stdout, done.stderr
    result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("number", range(len(BAD_INPUT)),
                         ids=[says for _, says in BAD_INPUT])
def test_bad_input_is_one_clear_error_line(number: int, tmp_path: Path, results_dir: Path) -> None:
    overrides, says = BAD_INPUT[number]
    corrupt = tmp_path / "corrupt.svm"
    corrupt.write_text("1 1:0.5 3:1\n0 2:x\n")
    overrides = [o.replace("CORRUPT", str(corrupt)) for o in overrides]
    code, stdout, stderr = _command(["run", *overrides, "progress=false"], number < AS_PROCESS)
    assert code != 0
    assert "Traceback" not in stderr + stdout
    errors = [line for line in stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("hetsgd: error:"), stderr
    assert says in errors[0]
    runs = results_dir / "runs"
    for run_dir in runs.iterdir() if runs.exists() else []:  # a run that started says it failed
        assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"


def test_a_sweep_finishes_its_other_jobs_when_one_fails(results_dir: Path) -> None:
    result = api.sweep("dataset=digits,libsvm", "budget.epochs=1", "progress=false")
    assert result.exit_code != 0  # the failure is not hidden ...
    sweep, = (results_dir / "sweeps").iterdir()
    assert sweep == result.sweep_dir
    summary = pd.read_csv(sweep / "summary.csv")
    statuses = dict(zip(summary["overrides"].astype(str), summary["status"]))
    assert sorted(statuses.values()) == ["completed", "failed"]  # ... and did not stop the sweep
    assert "needs dataset.path" in " ".join(summary["error"].dropna())
    assert (sweep / "report.md").exists()
    # the comparison is drawn at the sweep's end; a job's own figures only by `hetsgd plot`
    assert list((sweep / "figures").glob("*.png"))
    job = Path(summary.loc[summary["status"] == "completed", "run_dir"].iloc[0])
    assert not (job / "figures").exists()
    assert hetsgd("plot", str(sweep)).returncode == 0
    assert (job / "figures" / "loss_vs_time.png").is_file()


def test_run_reads_its_arguments_as_a_shell_user_types_them() -> None:
    """`-m` anywhere among the overrides starts a sweep; what Hydra's parser refuses is one
    line, not argparse's usage and exit."""
    _, parsed = hydra_arguments(["seed=0", "-m", "algo=sync,hogwild"])
    # the swept group's first choice goes just before its sweep (with_first_group_choices)
    assert parsed.multirun and parsed.overrides == ["seed=0", "algo=sync", "algo=sync,hogwild"]
    _, parsed = hydra_arguments(["seed=0"])
    assert not parsed.multirun
    with pytest.raises(UserError, match=r"^hetsgd run: unrecognized arguments: --bogus$"):
        hydra_arguments(["seed=0", "--bogus"])
