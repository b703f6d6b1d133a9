"""The virtual clock against this machine: a calibration, then the same configs real and
simulated agree on speed, update shares and time to a loss. It runs alone after the parallel
tests (marker ``serial``): it compares against this machine's own speed."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetsgd.runs.validate import Case, validate

# Loose enough for a noisy machine and one seed; tight enough for a wrong model: a slowdown
# applied twice or not at all, a replica's copies missed or doubled, ranks that do not wait for
# each other would each move a ratio by 2x or more.
TOLERANCE = {"examples/s": 0.3, "host update share": 0.3, "time to loss": 0.5}
SLOWED = ("devices=emulated", "devices.groups.cpu.slowdown=4")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.serial
def test_real_and_simulated_runs_agree(tmp_path: Path) -> None:
    cases = [Case("hogbatch", SLOWED, ("algo=hogbatch",)),
             Case("local SGD, unbalanced", SLOWED, ("algo=local_sgd", "algo.tau=auto"))]
    common = ("dataset=digits", "model=mlp", "budget.epochs=null", "budget.seconds=2",
              "progress=false")
    comparisons = validate(cases, common, seeds=[0], target_loss=0.5, out=tmp_path,
                           calibration_s=0.2)
    assert len(comparisons) == 6
    for c in comparisons:
        assert c.ratio is not None and abs(c.ratio - 1) <= TOLERANCE[c.metric], c
