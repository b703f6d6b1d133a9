"""Figures from hand-made run directories: which files appear, and that redrawing is exact."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from test_report import write_failed, write_run, write_sweep

from hetsgd.errors import UserError
from hetsgd.outputs.index import read_summary
from hetsgd.outputs.plots import plot_all
from hetsgd.outputs.run_figures import plot_run, run_title

RUN_FIGURES = {"loss_vs_time", "loss_vs_epoch", "accuracy_vs_time", "utilization",
               "update_shares"}
COMPARISON_FIGURES = {f"{name}_digits" for name in
                      ("loss_vs_time", "loss_vs_epoch", "accuracy_vs_time", "update_shares")}


def _hashes(paths: list[Path]) -> dict[Path, str]:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


@pytest.mark.slow
def test_plot_all_draws_every_figure_and_redraws_the_same_bytes(tmp_path: Path) -> None:
    results = tmp_path / "results"
    sweep = write_sweep(results / "sweeps" / "s1")
    paths = plot_all(results)
    assert len(paths) == len(set(paths)) and all(p.suffix == ".png" for p in paths)
    by_dir: dict[Path, set[str]] = {}
    for p in paths:
        by_dir.setdefault(p.parent, set()).add(p.stem)
    for job in sorted(d for d in sweep.iterdir() if d.name[0].isdigit()):
        drawn = by_dir.get(job / "figures", set())
        if "hogbatch" in job.name:  # the failed job: no files to draw from
            assert drawn == set() and not (job / "figures").exists()
        elif "adaptive" in job.name:
            assert drawn == RUN_FIGURES | {"batch_sizes"}
        else:
            assert drawn == RUN_FIGURES
    assert by_dir[sweep / "figures"] == COMPARISON_FIGURES  # the sweep's comparison
    assert by_dir[results / "figures"] == COMPARISON_FIGURES  # everything under results/

    before = _hashes(paths)
    for figures in results.rglob("figures"):
        shutil.rmtree(figures)
    assert not any(p.exists() for p in paths)
    assert _hashes(plot_all(results)) == before


def test_svg_and_pdf_are_reproducible(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", algo="hogbatch", devices="emulated", seed=0,
                    emulated=True)
    first = _hashes(plot_run(run, formats=("svg", "pdf")))
    assert {p.suffix for p in first} == {".svg", ".pdf"}
    shutil.rmtree(run / "figures")
    assert _hashes(plot_run(run, formats=("SVG", "pdf"))) == first


def test_titles_name_dataset_and_mark_emulated_mixes(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", algo="sync", devices="auto", seed=3, emulated=True)
    assert run_title(read_summary(run)) == "digits · mlp: sync on auto (emulated), seed 3"
    real = write_run(tmp_path / "real", algo="sync", devices="gpu", seed=0)
    assert "(emulated)" not in run_title(read_summary(real))
    failed = write_failed(tmp_path / "failed", algo="sync", devices="gpu", seed=0, error="x")
    assert run_title(read_summary(failed)).endswith("seed 0 [failed]")


def test_failed_run_and_bad_format(tmp_path: Path) -> None:
    failed = write_failed(tmp_path / "failed", algo="sync", devices="gpu", seed=0,
                          error="boom")
    assert plot_run(failed) == []
    with pytest.raises(UserError, match="unknown figure format 'jpg'"):
        plot_run(failed, formats=("jpg",))
    with pytest.raises(UserError, match="not a directory"):
        plot_all(tmp_path / "missing")
