"""Odd values are one clear line before any work: calibration rows out of range, durations that
are not finite, and more worker processes than this machine's memory holds."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import threading
from pathlib import Path

import pytest
from conftest import run_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli import hetsgd

from hetsgd import workers
from hetsgd.config import ConfigError
from hetsgd.config.checks import MAX_SECONDS
from hetsgd.engines.virtual.profiles import (
    CALIBRATION_COLUMNS,
    EXCHANGE_COLUMNS,
    MAX_CALIBRATION_ROWS,
    MeasuredProfile,
    _device,
    load_calibration,
)
from hetsgd.errors import UserError

HEADER = "group,batch_size,ms_per_step,comm_ms_per_step,slowdown,exchange_wait_ms,exchange_ms\n"
ACCEL = "accel,1,2.0,1.0,1,0.1 0.5 4,0.2 0.3 0.5\naccel,256,11.0,3.0,1,0.1 0.5 4,0.2 0.3 0.5\n"


def calibration(tmp_path: Path, cpu_row: str) -> Path:
    """A calibration of the emulated mix whose `cpu` row (line 4) is ``cpu_row``."""
    path = tmp_path / "calibration.csv"
    path.write_text(HEADER + ACCEL + cpu_row + "\n")
    return path


def refusal(path: Path) -> str:
    with pytest.raises(UserError) as raised:
        load_calibration(path)
    message = str(raised.value)
    assert "\n" not in message
    return message


# -- the reproductions, and their kin ------------------------------------------------------

@pytest.mark.parametrize("cpu_row, says", [
    ("cpu,8,inf,0.0,1,0.1 0.5 4,0.2 0.3 0.5", "ms_per_step=inf is not allowed"),  # was a NaN cast
    ("cpu,8,1e9,0.0,1,0.1 0.5 4,0.2 0.3 0.5", "ms_per_step=1e9 is not allowed"),  # ran for minutes
    ("cpu,8,nan,0.0,1,0.1 0.5 4,0.2 0.3 0.5", "ms_per_step=nan is not allowed"),
    ("cpu,8,0.0000001,0.0,1,,", "ms_per_step=0.0000001 is not allowed"),  # below 1 µs
    ("cpu,8,1.0,0.0,1,0.1 0.5 4,nan 0.3 0.5", "exchange_ms=nan 0.3 0.5 is not allowed"),  # IndexError
    ("cpu,8,1.0,0.0,1,0.1 0.5 4,-50 -50 -50", "exchange_ms=-50 -50 -50 is not allowed"),  # a hang
    ("cpu,8,1.0,0.0,1,0.1 0.5 inf,0.2 0.3 0.5", "exchange_wait_ms=0.1 0.5 inf is not allowed"),
    ("cpu,8,1.0,0.0,1,4 0.5 0.1,0.2 0.3 0.5", "exchange_wait_ms=4 0.5 0.1 is not allowed: waits in "
                                              "ascending order"),
    ("cpu,8,1.0,0.0,1,0.1 0.5 4,", "wants exchange_wait_ms and exchange_ms as many numbers each, "
                                   "not 3 and 0"),
    ("cpu,8,1.0,1.0,1,,", "comm_ms_per_step=1.0 is not allowed"),  # nothing left to compute
    ("cpu,8,1.0,-0.1,1,,", "comm_ms_per_step=-0.1 is not allowed"),
    ("cpu,8,1.0,0.0,inf,,", "slowdown=inf is not allowed"),
    ("cpu,8.5,1.0,0.0,1,,", "batch_size=8.5 is not allowed"),
    ("cpu,0,1.0,0.0,1,,", "batch_size=0 is not allowed"),
    ("cpu,8,,0.0,1,,", "ms_per_step is empty"),
    ("cpu,8", "ms_per_step is empty"),  # a short row
])
def test_a_value_out_of_range_names_file_row_group_column_and_value(tmp_path: Path, cpu_row: str,
                                                                     says: str) -> None:
    path = calibration(tmp_path, cpu_row)
    assert refusal(path).startswith(f"calibration file {path}, line 4 (group 'cpu'): {says}")


def test_the_step_bound_is_the_devices_own_step_its_emulated_sleep_taken_out(tmp_path: Path) -> None:
    """An emulated group measured at slowdown 2 over a one-hour step reads two hours."""
    slowed = load_calibration(calibration(tmp_path, "cpu,8,7.2e6,0.0,2,,"))["cpu"]
    assert slowed.compute_s(8) == pytest.approx(3600.0)
    assert "ms_per_step=7.2e6 is not allowed" in refusal(calibration(tmp_path, "cpu,8,7.2e6,0.0,1,,"))


def test_the_one_reader_of_the_exchange_columns_is_used_by_the_profiles(tmp_path: Path) -> None:
    profile = load_calibration(calibration(tmp_path, "cpu,8,1.0,0.0,1,0.1 0.5 4,0.2 0.3 0.5"))["cpu"]
    assert profile.exchange_s(0.0) == pytest.approx(0.2e-3)
    assert profile.exchange_s(1.0) == pytest.approx(0.5e-3)


@pytest.mark.parametrize("text, says", [
    ("", "is empty"),
    ("\xff\xfe garbage\n", "not a CSV text file"),
    ("group,batch_size\ncpu,1\n", "lacks the columns ms_per_step, comm_ms_per_step"),
    ("group,batch_size,ms_per_step,comm_ms_per_step\n" + "cpu,1,1.0,0.0\n" * (MAX_CALIBRATION_ROWS + 1),
     f"has more than {MAX_CALIBRATION_ROWS:,} rows"),
    ("group,batch_size,ms_per_step,comm_ms_per_step\n,1,1.0,0.0\n", "line 2: group is empty"),
])
def test_a_file_that_is_not_a_calibration_is_one_line(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "not_a_calibration.csv"
    path.write_bytes(text.encode("latin-1"))
    message = refusal(path)
    assert str(path) in message and says in message


def test_a_fifo_as_the_calibration_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "calibration.csv"
    os.mkfifo(fifo)
    raised: list[BaseException] = []

    def load() -> None:
        try:
            load_calibration(fifo)
        except BaseException as exc:  # the main thread asserts on it
            raised.append(exc)

    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(timeout=30)
    if reader.is_alive():  # free the blocked reader, so that the thread ends
        with open(fifo, "w"):
            pass
        pytest.fail("loading a FIFO blocked on it")
    assert isinstance(raised[0], UserError) and "not a regular file" in str(raised[0])


def test_a_named_device_must_be_finite_and_reach_at_most_its_peak() -> None:
    entry = {"kind": "cpu", "peak_flops": 1e11, "memory_bandwidth": 1e10, "launch_s": 5e-6,
             "efficiency": 0.5, "sources": dict.fromkeys(
                 ("peak_flops", "memory_bandwidth", "launch_s", "efficiency"), "estimate")}
    assert _device("core", entry).efficiency == 0.5
    with pytest.raises(ValueError, match="core.launch_s must be a positive, finite number, not inf"):
        _device("core", {**entry, "launch_s": math.inf})
    with pytest.raises(ValueError, match="core.efficiency is a share of peak_flops, at most 1"):
        _device("core", {**entry, "efficiency": 1.5})


# -- random calibration files ----------------------------------------------------------------------

NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-3, max_value=2048),
    st.sampled_from([0, 1, 1e9, 1e300, -1e-300, 3.6e6, 3.6e6 + 1, 1e-3, 1e-4]),
)
WILD = st.one_of(
    NUMBERS.map(str),
    st.lists(NUMBERS, max_size=4).map(lambda values: " ".join(map(str, values))),
    st.sampled_from(["", "one", "nan", " ", "1,2", '"', "1e", "0x10"]),
    st.text(max_size=8),
)
MS = st.floats(min_value=0.0, max_value=20.0).map(str)
PLAUSIBLE = {  # cells of a calibration that loads, so that random files load too
    "group": st.sampled_from(["cpu", "accel"]),
    "batch_size": st.integers(1, 1024).map(str),
    "ms_per_step": st.floats(min_value=1.0, max_value=100.0).map(str),
    "comm_ms_per_step": st.sampled_from(["0", "0.0", "0.5"]),
    "slowdown": st.sampled_from(["", "1", "1.0", "2.5"]),
    "exchange_wait_ms": st.lists(st.floats(0.0, 20.0), min_size=3, max_size=3).map(
        lambda waits: " ".join(map(str, sorted(waits)))),
    "exchange_ms": st.lists(MS, min_size=3, max_size=3).map(" ".join),
}


@st.composite
def calibration_texts(draw: st.DrawFn) -> str:
    """A calibration's columns, shuffled, now and then one of them replaced by a stray; rows of
    plausible cells, now and then one of them wild, or the row short or long."""
    optional = draw(st.lists(st.sampled_from([("slowdown",), EXCHANGE_COLUMNS, ("examples_per_s",)]),
                             unique=True))
    columns = draw(st.permutations([*CALIBRATION_COLUMNS, *(c for more in optional for c in more)]))
    if draw(st.integers(0, 7)) == 0:
        columns[draw(st.integers(0, len(columns) - 1))] = "stray"
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(columns)
    for _ in range(draw(st.integers(0, 6))):
        cells = [draw(PLAUSIBLE.get(column, WILD)) for column in columns]
        if draw(st.integers(0, 3)) == 0:
            cells[draw(st.integers(0, len(cells) - 1))] = draw(WILD)
        if draw(st.integers(0, 7)) == 0:
            cells = (cells + ["extra"])[:len(cells) + draw(st.sampled_from([-2, -1, 1]))]
        writer.writerow(cells)
    return out.getvalue()


def check_valid(profiles: dict[str, MeasuredProfile]) -> None:
    for profile in profiles.values():
        sizes = profile.batch_sizes
        assert list(sizes) == sorted(set(sizes)) and sizes[0] >= 1
        for batch in (1, sizes[0], sizes[-1], 2 * sizes[-1] + 1):
            assert math.isfinite(profile.compute_s(batch)) and profile.compute_s(batch) > 0
        assert math.isfinite(profile.copy_s()) and profile.copy_s() >= 0
        for wait in (0.0, 1e-3, 10.0):
            cost = profile.exchange_s(wait)
            assert cost is None or (math.isfinite(cost) and cost >= 0)


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=calibration_texts())
def test_a_random_calibration_loads_valid_profiles_or_is_one_user_error_line(tmp_path: Path,
                                                                           text: str) -> None:
    path = tmp_path / "random.csv"
    path.write_text(text, encoding="utf-8")
    try:
        profiles = load_calibration(path)
    except UserError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
    else:
        check_valid(profiles)


# -- durations -----------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides", [
    ["dist.timeout_s=inf"], ["dist.timeout_s=nan"], ["dist.timeout_s=1e300"],
    ["budget.seconds=inf"], ["budget.epochs=inf"], ["eval.every_s=inf"], ["eval.every_epochs=nan"],
    ["monitor.interval_s=inf"], ["algo=sync", "checkpoint.every_s=inf"],
    ["algo=adaptive", "algo.period_s=inf"], ["algo=adaptive", "algo.window_s=inf"],
    ["optim.lr=inf"], ["optim.weight_decay=inf"], ["optim.milestones=[nan]"],
    ["eval.target_losses=[inf]"], ["eval.max_snapshot_mb=inf"],
    ["algo=local_sgd", "algo.alpha=inf"], ["algo=local_sgd", "algo.biased.pool_ratio=inf"],
])
def test_a_setting_that_is_not_finite_is_refused_by_name(overrides: list[str]) -> None:
    key = overrides[-1].split("=")[0]
    with pytest.raises(ConfigError) as raised:
        run_config(*overrides)
    assert str(raised.value).startswith(f"{key}=") and " is not allowed: " in str(raised.value)


def test_a_duration_may_be_thirty_days_and_no_more() -> None:
    assert run_config(f"dist.timeout_s={MAX_SECONDS}").dist.timeout_s == MAX_SECONDS
    with pytest.raises(ConfigError, match="at most 2,592,000"):
        run_config(f"dist.timeout_s={MAX_SECONDS + 1}")


# -- worker processes against memory ---------------------------------------------------------------

@pytest.fixture
def four_gib(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "available_memory", lambda: 4 << 30)


def test_more_worker_processes_than_memory_holds_are_refused(four_gib: None) -> None:
    fits = (4 << 30) // workers.WORKER_BYTES
    assert len(workers.expand(run_config("devices=cpu", f"devices.groups.cpu.count={fits}").devices)) == fits
    with pytest.raises(UserError, match=rf"starts {fits + 1} worker processes, .* 4.0 GiB of memory "
                                        rf"is available here: at most {fits} fit"):
        workers.expand(run_config("devices=cpu", f"devices.groups.cpu.count={fits + 1}").devices)


def test_the_memory_check_counts_every_group_and_spares_simulated_or_waived_mixes(
        four_gib: None) -> None:
    half = (4 << 30) // workers.WORKER_BYTES // 2
    many = ("devices=emulated", f"devices.groups.cpu.count={half}", f"devices.groups.accel.count={half}")
    assert len(workers.expand(run_config(*many).devices)) == 2 * half
    with pytest.raises(UserError, match="at most"):
        workers.expand(run_config(*many[:2], f"devices.groups.accel.count={half + 1}").devices)
    wide = ("devices=cpu", "devices.groups.cpu.count=256")
    assert len(workers.expand(run_config(*wide, "devices.simulated=true").devices)) == 256
    assert len(workers.expand(run_config(*wide, "devices.memory_check=false").devices)) == 256


# -- the command line ------------------------------------------------------------------------------

def one_error_line(result) -> str:
    """The run's one error line: non-zero exit, no traceback, and a failed summary if it began."""
    assert result.returncode != 0
    assert "Traceback" not in result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("hetsgd: error:"), result.stderr
    return errors[0]


@pytest.mark.integration
@pytest.mark.parametrize("overrides, says", [
    (["devices=emulated", "devices.simulated=true", "devices.calibration=BAD"],
     "line 4 (group 'cpu'): ms_per_step=inf is not allowed"),
    (["algo=local_sgd", "devices=emulated", "dist.timeout_s=inf"], "dist.timeout_s=inf is not allowed"),
])
def test_a_bad_value_on_the_command_line_is_one_line(tmp_path: Path, results_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     overrides: list[str], says: str) -> None:
    monkeypatch.setenv("HETSGD_DATA", str(tmp_path / "data"))
    bad = calibration(tmp_path, "cpu,8,inf,0.0,1,,")
    result = hetsgd("run", "progress=false", "budget.epochs=null", "budget.seconds=0.3",
                    *(o.replace("BAD", str(bad)) for o in overrides))
    assert says in one_error_line(result)
    for run_dir in (results_dir / "runs").iterdir():  # a run that started says it failed, and why
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "failed" and says in summary["error"]
