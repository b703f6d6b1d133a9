"""The report's split of each worker's time (hetsgd/outputs/time_split.py)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from hetsgd.outputs.time_split import split_markdown, worker_split

KEYS = ("algo", "devices", "variant")


def _run(root: Path, name: str, seconds: tuple[float, float, float, float], status: str = "completed",
         split: bool = True) -> dict:
    run_dir = root / name
    run_dir.mkdir()
    compute, copy, merge, wait = seconds
    row = {"worker": 0, "group": "accel", "device": "cpu", "label": "emulated", "threads": 1,
           "updates": 100, "busy_s": compute, "wait_s": wait, "comm_s": copy + merge}
    if split:
        row.update(compute_s=compute, copy_s=copy, merge_s=merge)
    pd.DataFrame([row]).to_csv(run_dir / "workers.csv", index=False)
    return {"algo": "hogbatch", "devices": "emulated", "variant": "", "status": status,
            "run_dir": str(run_dir)}


def test_each_worker_s_split_is_averaged_over_the_completed_runs(tmp_path: Path) -> None:
    runs = pd.DataFrame([_run(tmp_path, "a", (0.6, 0.1, 0.2, 0.1)),
                         _run(tmp_path, "b", (0.8, 0.1, 0.0, 0.1)),
                         _run(tmp_path, "c", (9.0, 9.0, 9.0, 9.0), status="failed"),
                         _run(tmp_path, "d", (9.0, 9.0, 9.0, 9.0), split=False)])
    split = worker_split(runs, KEYS)
    assert len(split) == 1
    row = split.iloc[0]
    assert row["compute_ms"] == pytest.approx(7.0)  # (6 + 8) / 2 ms per update
    assert row["merge_ms"] == pytest.approx(1.0)
    assert row["copy_pct"] == pytest.approx(10.0)
    assert row["merge_pct"] == pytest.approx(10.0)  # (20 % + 0 %) / 2
    text = split_markdown(runs, KEYS)
    assert "| hogbatch | emulated |  | 0 accel (emulated) | 7.000 (70%) | 1.000 (10%) |" in text


def test_runs_without_the_split_add_no_section(tmp_path: Path) -> None:
    runs = pd.DataFrame([_run(tmp_path, "old", (1.0, 0.0, 0.0, 0.0), split=False)])
    assert split_markdown(runs, KEYS) == ""
