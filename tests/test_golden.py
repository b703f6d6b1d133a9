"""Simulated runs give the same numbers on any machine: short runs on the virtual clock against
the values checked in under tests/assets/golden/.

The virtual clock decides when each step reads and lands from the device profiles alone, in
Python floats, so update counts and virtual times are exact on every machine. The losses come
from real float32 math on one thread (tests/conftest.py), whose roundings differ from one CPU to
another (the kernels its vector width picks, the BLAS's vendor paths): losses are compared to
``LOSS_RTOL``. That holds only where a run's losses move in proportion to such a difference. At
the default rate (0.1) the MLP runs on a shared master do not: a rate 1e-6 off moved their
losses by 6e-6 but one 1e-5 off by 4e-3, a threshold crossed, and an Intel Xeon (AVX-512)
differed by 3e-3 from the AMD EPYC that had written the values. At ``SMOOTH_LR`` a perturbation
of 1e-7 to 3e-5 of the rate moves them by at most 5 times as much, and this machine's generic
kernels (``ATEN_CPU_CAPABILITY=default``) by 1.5e-6 at most; a rate 1 % off moves the farthest
loss of every run by 4.7e-4 (local SGD) to 1.7e-2.

When the math changes on purpose, regenerate the values and review their diff:

    HETSGD_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/test_golden.py

(each test then writes its file and skips, so that a regeneration never passes for a check).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from conftest import compose_config
from test_virtual_engine import _calibration

from hetsgd.config import to_run_config
from hetsgd.runs import runner

GOLDEN = Path(__file__).parent / "assets" / "golden"
REGENERATE = os.environ.get("HETSGD_REGEN_GOLDEN") == "1"
LOSS_RTOL = 1e-4
# the MLP runs' rate, at which their losses move in proportion to a perturbation (module doc)
SMOOTH_LR = "optim.lr=0.01"
# stands for devices.calibration=<a file of test_virtual_engine's fixed step times>
CALIBRATED = "devices.calibration=FIXED_STEP_TIMES"
# each run's own choices, and COMMON for all
RUNS: dict[str, tuple[str, ...]] = {
    # a device profile's roofline times, and seeded per-step jitter
    "hogwild_roofline": ("algo=hogwild", "model=logreg", "devices=cpu",
                         "devices.groups.cpu.count=2", "devices.groups.cpu.batch_size=16",
                         "devices.groups.cpu.profile=xeon_e5_2686v4_core",
                         "devices.groups.cpu.jitter=0.05", "budget.epochs=1",
                         "budget.seconds=null", "eval.every_s=1000", "eval.every_epochs=0.25"),
    "hogbatch": ("algo=hogbatch", "model=mlp", "devices=emulated", CALIBRATED, SMOOTH_LR,
                 "budget.seconds=0.4", "budget.epochs=null", "eval.every_s=0.1"),
    "adaptive": ("algo=adaptive", "algo.period_s=0.2", "algo.window_s=0.4", "model=mlp",
                 "devices=emulated", CALIBRATED, SMOOTH_LR, "budget.seconds=1",
                 "budget.epochs=null", "eval.every_s=0.25"),
    "local_sgd": ("algo=local_sgd", "algo.tau={accel:4,cpu:2}", "algo.aggregation=samples",
                  "model=mlp", "devices=emulated", "devices.groups.cpu.count=1", CALIBRATED,
                  "budget.epochs=1", "budget.seconds=null", "eval.every_s=1000",
                  "eval.every_epochs=0.25"),
}
COMMON = ("dataset=digits", "devices.simulated=true", "seed=0", "progress=false")
LOSSES = ("train_loss", "test_loss", "test_acc")


def _numbers(overrides: tuple[str, ...], tmp_path: Path) -> dict[str, Any]:
    """What a run must reproduce: its updates and virtual times exactly, its losses and
    accuracy at each snapshot and at the end."""
    calibration = f"devices.calibration={_calibration(tmp_path / 'calibration.csv')}"
    cfg = compose_config(*(calibration if o == CALIBRATED else o for o in overrides), *COMMON)
    summary = runner.run(to_run_config(cfg), tmp_path / "run", cfg).to_dict()
    assert summary["status"] == "completed", summary["error"]
    conv = pd.read_csv(tmp_path / "run" / "convergence.csv")
    workers = pd.read_csv(tmp_path / "run" / "workers.csv")
    return {"time_s": summary["time_s"],
            "updates_by_worker": workers["updates"].tolist(),
            "curve": {column: conv[column].tolist()
                      for column in ("time_s", "epoch", "updates", *LOSSES)},
            "final": {key: summary["final"][key] for key in LOSSES}}


def _close(golden: float, ran: float) -> bool:
    return math.isclose(ran, golden, rel_tol=LOSS_RTOL)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_simulated_run_reproduces_its_golden_numbers(name: str, tmp_path: Path) -> None:
    ran = _numbers(RUNS[name], tmp_path)
    path = GOLDEN / f"{name}.json"
    if REGENERATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"overrides": [*RUNS[name], *COMMON], **ran}, indent=1) + "\n")
        pytest.skip(f"regenerated {path.relative_to(Path.cwd())}: review its diff")
    golden = json.loads(path.read_text())
    assert golden["overrides"] == [*RUNS[name], *COMMON], "the run changed: regenerate"
    assert ran["time_s"] == golden["time_s"]
    assert ran["updates_by_worker"] == golden["updates_by_worker"]
    for column in ("time_s", "epoch", "updates"):
        assert ran["curve"][column] == golden["curve"][column], column
    for column in LOSSES:
        assert len(ran["curve"][column]) == len(golden["curve"][column])
        far = [(i, g, r) for i, (g, r) in enumerate(zip(golden["curve"][column], ran["curve"][column]))
               if not _close(g, r)]
        assert not far, f"{column} (snapshot, golden, ran): {far}"
        assert _close(golden["final"][column], ran["final"][column]), column
