"""Output that cannot crash: messages holding brackets, stdout or stderr whose reader left, and
reports over run directories whose summaries are not what the runner writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import typer
from test_report import write_run
from typer.testing import CliRunner

from hetsgd.cli import _fail, app
from hetsgd.lasting_output import LastingStream

SHORT = ("budget.epochs=null", "budget.seconds=1", "progress=false")
TIMEOUT_S = 300  # a bound, so that a run that hangs fails the test instead of the suite
GLOO = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
        "closed by peer [127.0.0.1]:29500")


def hetsgd(*args: str, stdout: int = subprocess.PIPE, stderr: int = subprocess.PIPE,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetsgd", *args], stdout=stdout, stderr=stderr,
                          text=True, timeout=TIMEOUT_S, env={**os.environ, **(env or {})})


def into_a_gone_reader(*args: str, stream: str = "stdout",
                       env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``hetsgd ARGS`` with ``stream`` a pipe whose reader left before the first line."""
    read, write = os.pipe()
    os.close(read)
    try:
        return hetsgd(*args, env=env, **{stream: write})
    finally:
        os.close(write)


def assert_clean(stderr: str) -> None:
    assert "Traceback" not in stderr and "Logging error" not in stderr, stderr


def test_a_message_with_brackets_is_printed_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as exit_:
        _fail(f"rank 1 failed: {GLOO}\n[bold]not a style[/bold]")
    assert exit_.value.exit_code == 1
    assert capsys.readouterr().err == (
        f"hetsgd: error: rank 1 failed: {GLOO} [bold]not a style[/bold]\n")


def test_a_lasting_stream_survives_a_reader_that_left() -> None:
    read, write = os.pipe()
    os.close(read)
    stream = LastingStream(open(write, "w"))  # closed below
    stream.write("x" * (1 << 20))  # more than the pipe and the buffer hold: the write fails
    stream.flush()
    assert os.write(write, b"y") == 1  # the descriptor now leads to /dev/null
    stream.close()


@pytest.mark.integration
def test_a_bracketed_path_is_one_error_line_naming_it(results_dir: Path) -> None:
    result = hetsgd("run", "dataset=libsvm", "dataset.path='no such [/file].svm'", *SHORT)
    assert result.returncode == 1
    assert_clean(result.stderr + result.stdout)
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("hetsgd: error: "), result.stderr
    assert "no such [/file].svm" in errors[0]
    run_dir, = (results_dir / "runs").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"


@pytest.mark.integration
@pytest.mark.wall
def test_a_run_whose_stdout_reader_left_writes_everything_and_exits_0(results_dir: Path) -> None:
    result = into_a_gone_reader("run", *SHORT)
    assert result.returncode == 0, result.stderr
    assert_clean(result.stderr)
    run_dir, = (results_dir / "runs").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    for name in ("convergence.csv", "workers.csv", "utilization.csv", "figures/loss_vs_time.png"):
        assert (run_dir / name).is_file(), name


@pytest.mark.integration
@pytest.mark.wall
def test_a_sweep_whose_stdout_reader_left_runs_every_job_and_reports(results_dir: Path) -> None:
    result = into_a_gone_reader("run", "-m", "seed=0,1", *SHORT)
    assert result.returncode == 0, result.stderr
    assert_clean(result.stderr)
    sweep, = (results_dir / "sweeps").iterdir()
    summary = pd.read_csv(sweep / "summary.csv")
    assert summary["job"].tolist() == [0, 1]
    assert summary["status"].tolist() == ["completed", "completed"]
    assert (sweep / "report.md").is_file() and (sweep / "report.csv").is_file()


@pytest.mark.integration
@pytest.mark.wall
def test_a_progress_bar_whose_terminal_left_does_not_stop_the_run(results_dir: Path) -> None:
    # TTY_COMPATIBLE: rich draws the bar as on a terminal, into a pipe nobody reads any more
    result = into_a_gone_reader("run", *SHORT[:2], "progress=true", stream="stderr",
                                env={"TTY_COMPATIBLE": "1"})
    assert result.returncode == 0
    assert "completed" in result.stdout  # the summary table, printed after the bar
    run_dir, = (results_dir / "runs").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"


@pytest.mark.integration
def test_a_report_warns_once_per_odd_summary_and_keeps_the_good_run(tmp_path: Path) -> None:
    write_run(tmp_path / "good", algo="sync", devices="gpu", seed=0)
    listed = write_run(tmp_path / "listed", algo="hogwild", devices="gpu", seed=0)
    summary = json.loads((listed / "summary.json").read_text())
    (listed / "summary.json").write_text(json.dumps({**summary, "dataset": ["digits"]}))
    (tmp_path / "array").mkdir()
    (tmp_path / "array" / "summary.json").write_text("[1, 2]")
    result = hetsgd("report", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert_clean(result.stderr)
    assert "| sync | gpu | 1 | 1/1 completed |" in result.stdout
    warnings = result.stderr.splitlines()
    assert len(warnings) == 2, result.stderr
    assert f"{listed / 'summary.json'}: dataset is a list" in warnings[1]
    assert f"{tmp_path / 'array' / 'summary.json'}: not a JSON object" in warnings[0]
    failed = (tmp_path / "report.md").read_text().split("## Failed runs", 1)[1]
    assert "`listed`" in failed and "`array`" in failed


@pytest.mark.parametrize("command,blocked", [("report", "report.md"), ("plot", "figures")])
def test_a_report_or_plot_that_cannot_write_is_one_line_naming_the_file(
        tmp_path: Path, command: str, blocked: str) -> None:
    """A folder where report.md goes, a file where the comparison's figures/ goes: as a
    read-only or full disk, one line and exit 1, not a traceback."""
    write_run(tmp_path / "sync", algo="sync", devices="gpu", seed=0)
    write_run(tmp_path / "hogwild", algo="hogwild", devices="gpu", seed=0)
    if command == "report":
        (tmp_path / blocked).mkdir()
    else:
        (tmp_path / blocked).write_text("")
    result = CliRunner().invoke(app, [command, str(tmp_path)])
    assert result.exit_code == 1
    why = "Is a directory" if command == "report" else "File exists"
    assert result.stderr.splitlines() == [f"hetsgd: error: cannot write {tmp_path / blocked}: {why}"]


@pytest.mark.parametrize("args,line", [
    (["--calibrate", "--seconds", "-1"], "--seconds must be a positive number of seconds, not -1.0"),
    (["--calibrate", "--seconds", "nan"], "--seconds must be a positive number of seconds, not nan"),
    (["--jsno"], "hetsgd machine takes overrides only with --calibrate, not --jsno (see hetsgd "
                 "machine --help)"),
    (["algo=sync"], "hetsgd machine takes overrides only with --calibrate, not algo=sync (see "
                    "hetsgd machine --help)"),
])
def test_hetsgd_machine_refuses_what_it_would_ignore(args: list[str], line: str) -> None:
    result = CliRunner().invoke(app, ["machine", *args])
    assert result.exit_code == 1 and result.stderr.splitlines() == [f"hetsgd: error: {line}"]


def test_ctrl_c_while_the_command_loads_is_a_stop_not_a_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`timeout -s INT 0.2 hetsgd run`: the stop landed in an import of hetsgd.cli, before its
    handlers exist, and printed a 20-line traceback."""
    import sys
    import types

    from hetsgd import entry

    class Stopped(types.ModuleType):
        def __getattr__(self, name: str) -> object:
            raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "hetsgd.cli", Stopped("hetsgd.cli"))
    with pytest.raises(SystemExit) as ended:
        entry.main()
    assert ended.value.code == 130 and capsys.readouterr().err == "Aborted!\n"
