"""scripts/gpu_probe.py, the GPU check's background probe and Hogwild's warmed-up rates, on CPU."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from scripts import gpu_probe
from scripts.gpu_probe import ours, rates, replayed

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_the_probe_samples_until_stopped_and_names_the_other_processes(tmp_path: Path) -> None:
    out = tmp_path / "probe.csv"
    probe = subprocess.Popen([sys.executable, "-m", "scripts.gpu_probe", "probe", str(out),
                              "--interval", "0.2"], cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 3):
        time.sleep(0.2)
    probe.send_signal(signal.SIGTERM)
    assert probe.wait(timeout=30) == 0
    rows = pd.read_csv(out)
    assert len(rows) >= 2 and (rows["cpu_percent"] >= 0).all()
    assert set(rows.columns) >= {"steal_percent", "pressure_avg10", "involuntary_switches", "ours"}


def test_rates_leave_out_the_first_second(tmp_path: Path) -> None:
    run = tmp_path / "0"
    run.mkdir()
    # 1000 updates in the first second (a start), then 100 a second
    pd.DataFrame({"time_s": [0.0, 1.0, 2.0, 3.0], "updates": [0, 1000, 1100, 1200]}).to_csv(
        run / "convergence.csv", index=False)
    rated = rates(tmp_path, 1.0)
    assert rated.to_dict("records") == [{"run": "0", "updates_per_s_after_warmup": 100.0}]


def _summary(folder: Path, **fields: object) -> None:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"algo": "hogbatch", "devices": "auto",
                                                     "run_dir": str(folder), **fields}))


def test_replayed_rates_each_group_simulated_over_real_beside_its_cpu_share(
        tmp_path: Path) -> None:
    _summary(tmp_path / "replay" / "run", simulated=True, time_s=2.0,
             updates_by_group={"accel": 100, "cpu": 3000})
    sweep = tmp_path / "sweep"
    contention = {"workers_cpu_share": 0.6, "by_group": {"accel": 0.9, "cpu": 0.5}}
    _summary(sweep / "hogbatch", simulated=False, seed=0, time_s=4.0,
             updates_by_group={"accel": 100, "cpu": 12000}, contention=contention)
    _summary(sweep / "hogwild", algo="hogwild", simulated=False, time_s=4.0,
             updates_by_group={"cpu": 1}, contention=contention)  # another method: left out
    _summary(sweep / "elsewhere", devices="cpu+gpu", simulated=False, time_s=4.0,
             updates_by_group={"accel": 1}, contention=contention)  # another mix: left out
    table = replayed(tmp_path / "replay", sweep)
    assert table[["group", "real_updates_per_s", "sim_updates_per_virtual_s", "sim_over_real",
                  "workers_cpu_share", "group_cpu_share"]].to_dict("records") == [
        {"group": "accel", "real_updates_per_s": 25.0, "sim_updates_per_virtual_s": 50.0,
         "sim_over_real": 2.0, "workers_cpu_share": 0.6, "group_cpu_share": 0.9},
        {"group": "cpu", "real_updates_per_s": 3000.0, "sim_updates_per_virtual_s": 1500.0,
         "sim_over_real": 0.5, "workers_cpu_share": 0.6, "group_cpu_share": 0.5}]


def test_the_probe_counts_hetsgds_processes_not_the_checks_own_script() -> None:
    class Proc:
        def __init__(self, *cmdline: str) -> None:
            self.args = list(cmdline)

        def cmdline(self) -> list[str]:
            return self.args

    assert ours(Proc("/opt/hetsgd/.venv/bin/python", "/opt/hetsgd/.venv/bin/hetsgd", "run"))
    assert not ours(Proc("bash", "/opt/hetsgd/scripts/gpu_check.sh"))
    assert not ours(Proc("/opt/hetsgd/.venv/bin/python", "-m", "scripts.gpu_probe", "probe"))
    assert not ours(Proc("/usr/bin/python3", "other.py"))


def test_a_process_s_cpu_share_is_over_the_time_between_its_own_readings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A process read 2 s apart that used 1 s of CPU ran at 50 %, whatever the nominal
    interval: the scan of every process lengthens each sample (it read about a fifth high)."""
    class Proc:
        pid = 4242
        info = {"pid": 4242, "name": "worker"}

        def __init__(self) -> None:
            self.reads = 0

        def cpu_times(self) -> SimpleNamespace:
            self.reads += 1
            return SimpleNamespace(user=0.75 * self.reads, system=0.25 * self.reads)

        def num_ctx_switches(self) -> SimpleNamespace:
            return SimpleNamespace(voluntary=10 * self.reads, involuntary=self.reads)

        def cmdline(self) -> list[str]:
            return ["python", "-m", "hetsgd", "run"]

    proc, clock = Proc(), iter([100.0, 102.0])
    # the probe's own modules replaced, not psutil's and time's: another thread of this test
    # process (a leftover daemon of an earlier test) keeps the real clock and process list
    monkeypatch.setattr(gpu_probe, "psutil", SimpleNamespace(
        Process=gpu_probe.psutil.Process, Error=gpu_probe.psutil.Error,
        process_iter=lambda attrs: [proc]))
    monkeypatch.setattr(gpu_probe, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    last: dict = {}
    assert gpu_probe.processes(last) == []  # first seen: nothing to compare with yet
    assert gpu_probe.processes(last) == [[4242, "worker", 50.0, 10, 1, True]]
