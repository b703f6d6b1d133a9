"""scripts/gpu_probe.py, the GPU check's background probe and Hogwild's warmed-up rates, on CPU."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from scripts.gpu_probe import rates

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
