"""The bench's accelerator section (scripts/bench/accel.py) runs through on the CPU: the emulated
accelerator against the textbook loop, with tiny sizes (CI's smoke test of it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from scripts.bench.accel import bench_accel
from scripts.bench.jobs import W8A_LIKE, Jobs

SMALL = (*W8A_LIKE[:1], "dataset.n_samples=512", "dataset.n_features=16")


@pytest.mark.wall
def test_the_accel_section_times_hetsgd_and_the_textbook_loop(tmp_path: Path) -> None:
    section = bench_accel(Jobs(tmp_path, SMALL), 0.4, models=("mlp",), batches=(8, 32))
    assert section.error is None
    assert [row[:3] for row in section.rows] == [["mlp", "8", "fp32"], ["mlp", "32", "fp32"]]
    for key, row in zip(("mlp_batch8_fp32", "mlp_batch32_fp32"), section.rows, strict=True):
        numbers = section.data[key]
        assert numbers["steps"] >= 3
        assert all(numbers[f"{loop}_s"] > 0 for loop in ("plain", "replica", "alone"))
        # each cell is its own loop's time, over the plain loop's
        cells = dict(zip(section.columns, row, strict=True))
        assert cells["plain ms"] == f"{numbers['plain_s'] * 1e3:.3f}"
        assert cells["replica / plain"] == f"{numbers['replica_s'] / numbers['plain_s']:.2f}x"
        assert cells["alone / plain"] == f"{numbers['alone_s'] / numbers['plain_s']:.2f}x"
        if not torch.cuda.is_available():  # no graph, profile or copies without CUDA
            assert numbers["graphed_s"] is None and numbers["kernels_per_step"] is None
            assert numbers["replica_graphed_s"] is None
            assert numbers["replica_graphed_4_threads_s"] is None
        assert len(section.rows[0]) == len(section.columns)


@pytest.mark.gpu
def test_the_accel_section_on_cuda_counts_kernels_and_copies(tmp_path: Path) -> None:
    section = bench_accel(Jobs(tmp_path, SMALL), 0.4, models=("mlp",), batches=(64,))
    numbers = section.data["mlp_batch64_fp32"]
    assert numbers["graphed_s"] > 0 and numbers["kernels_per_step"][1] > 0
    assert numbers["replica_graphed_s"] > 0 and numbers["replica_graphed_4_threads_s"] > 0
    # the profile saw the timed steps alone: about one host wait each (and one an epoch for its
    # order, one a loss read), not the setup's
    assert numbers["waits_per_step"][0] < 2.0
    assert set(section.data["copy_gb_per_s"]) == {"pageable", "pinned", "registered"}
    assert [row[2] for row in section.rows] == ["fp32", "tf32"]
